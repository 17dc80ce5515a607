"""A full build against ``build --update`` after the corpus changed: time and bytes written (issue 32, item 2).

    python benchmarks/bench_update.py --lines 40000                          # 1M tokens, 1% appended
    python benchmarks/bench_update.py --lines 3000 --percent 0.1,1,10 --change append,middle --check

Builds ``--lines`` lines of the synthetic corpus (``_corpus.make_corpus``) with the bundled model on the CPU, then
for each change and share: the corpus with that share of lines appended (``append``) or replaced by new lines in
its middle (``middle``), brought up to date with ``--update`` from a copy of the first cache. Prints seconds and
the bytes the process passed to write(2) (``wchar`` of /proc/self/io) for the full build and each update, and the
windows and lines each update encoded (on a device whose rows are batch-free, only the new lines:
elmo_cache.encoder.batch_free; the check's own probe is in the update's time). ``--check`` also builds each new
corpus afresh and compares the two caches byte for byte (the metadata's ``build`` record aside:
``_compare.cache_difference``), as tests/builder/test_update.py does.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _compare import cache_difference
from _corpus import make_corpus, write_corpus
from _machine import describe_machine

from elmo_cache.builder import BuildOptions, build
from elmo_cache.builder.corpus_record import stored_line_hashes
from elmo_cache.builder.encoding import window_bounds
from elmo_cache.store import open_cache_arrays


def written_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("wchar"))


def copy_cache(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy2(source, target)
    os.sync()  # the copy's dirty pages on disk before an update is timed, not written out during it


def last_window_tokens(cache: Path, window_tokens: int) -> int:
    """The tokens of the cache's last window (cut by the corpus's end), which an append encodes again."""
    _, _, arrays, _ = open_cache_arrays(cache)
    lengths = np.asarray(arrays["lengths"][:], dtype=np.int32)
    keys = stored_line_hashes(cache)
    assert keys is not None
    first, stop = window_bounds(keys, lengths, window_tokens)[-1]
    return int(lengths[first:stop].sum(dtype=np.int64))


def timed_build(corpus: Path, options: BuildOptions):
    start, before = time.perf_counter(), written_bytes()
    summary = build(corpus, options)
    return summary, time.perf_counter() - start, written_bytes() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=40000)
    parser.add_argument("--percent", default="1", help="comma list of the changed share of lines, in percent")
    parser.add_argument("--change", default="append", help="comma list of append, middle")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    parser.add_argument("--window-batches", type=int, default=8)
    parser.add_argument("--format", default="zarr", choices=["zarr", "hdf5"])
    parser.add_argument(
        "--tokenize",
        default="default",
        choices=["default", "whitespace", "ptb"],
        help="how lines are split; default: the model's own (PTB-style for the bundled model), as a user's build",
    )
    parser.add_argument("--check", action="store_true", help="compare each updated cache with a fresh build")
    args = parser.parse_args()

    print("\n".join(describe_machine("cpu").lines()))
    shares = [float(p) for p in args.percent.split(",")]
    spare = max(1, int(args.lines * max(shares) / 100) + 1)
    pool = make_corpus((args.lines + 2 * spare) * 40, seed=3)
    base, extra = pool[: args.lines], pool[args.lines : args.lines + 2 * spare]
    suffix = ".zarr" if args.format == "zarr" else ".h5"
    common = dict(
        batch_tokens=args.batch_tokens,
        window_batches=args.window_batches,
        progress=False,
        device="cpu",
        **({} if args.tokenize == "default" else {"tokenize": args.tokenize}),
    )
    with tempfile.TemporaryDirectory(prefix="bench-update-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.txt"
        write_corpus(base, corpus)
        first = work / f"first{suffix}"
        full, seconds, written = timed_build(corpus, BuildOptions(output=first, **common))
        print(
            f"full build: {full.n_sentences:,} lines, {full.n_tokens:,} tokens, {full.windows_encoded} windows, "
            f"{seconds:.1f} s, {written:,} bytes written; its last window (cut by the corpus's end, encoded again "
            f"by an append): {last_window_tokens(first, args.batch_tokens * args.window_batches):,} tokens"
        )
        for change in args.change.split(","):
            for share in shares:
                n = max(1, int(args.lines * share / 100))
                if change == "append":
                    new = base + extra[:n]
                elif change == "middle":
                    middle = (args.lines - n) // 2
                    new = base[:middle] + extra[:n] + base[middle + n :]
                else:
                    raise SystemExit(f"--change: {change!r} is not one of append, middle")
                write_corpus(new, corpus)
                target = work / f"updated{suffix}"
                copy_cache(first, target)
                summary, u_seconds, u_written = timed_build(corpus, BuildOptions(output=target, update=True, **common))
                print(
                    f"{change} {share:g}% ({n:,} lines): update {u_seconds:.1f} s ({100 * u_seconds / seconds:.1f}% of "
                    f"the full build), {u_written:,} bytes written ({100 * u_written / max(1, written):.1f}%); "
                    f"{summary.windows_encoded} windows encoded, {summary.windows_reused} reused, "
                    f"{summary.lines_encoded:,} lines encoded ("
                    f"{'batch-free rows: single sentences copied' if summary.batch_free else 'whole windows'}), "
                    + (
                        f"{summary.rows_taken:,} rows copied from the old file at the finish (not staged)"
                        if suffix == ".h5"
                        else f"{summary.files_linked} vectors files kept"
                    )
                )
                if args.check:
                    fresh = work / f"fresh{suffix}"
                    build(corpus, BuildOptions(output=fresh, **common))
                    difference = cache_difference(target, fresh)
                    if difference is not None:
                        raise SystemExit(
                            f"{change} {share:g}%: the updated cache differs from a fresh build: {difference}"
                        )
                    print("  updated == fresh build, byte for byte")
                    shutil.rmtree(fresh) if fresh.is_dir() else fresh.unlink()
                shutil.rmtree(target) if target.is_dir() else target.unlink()


if __name__ == "__main__":
    main()
