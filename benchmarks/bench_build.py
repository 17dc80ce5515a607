"""Build throughput vs the bare encoder, zarr chunk size vs random-read latency, compression ratios.

    python benchmarks/bench_build.py throughput --size tiny --sentences 2000
    python benchmarks/bench_build.py chunks            # random sentence reads vs chunk_rows
    python benchmarks/bench_build.py compression --size small --sentences 500

``throughput`` encodes the same synthetic corpus (Zipf-distributed words, sentence lengths
1..60, mean ~25) with ``Encoder.embed_sentences`` (pure encoder, results discarded) and with
``build`` end to end (reading, hashing, encoding, writing, committing, finishing), alternating
the two ``--repeats`` times, and prints the median tokens/s of each. Models are random-weight
models of the published shapes (``elmo_cache.model.random_model``): the cost of a model depends on its
shape, not on its weights.

``chunks`` writes Original-size rows (3 layers x 1024, float16) into zarr arrays with several
``chunk_rows`` and times random sentence reads through zarr (which decodes whole chunks) and
through ``elmo_cache.open``; it also prints the number of chunk files per million tokens.

``compression`` builds the same corpus with every zarr compressor and prints the ratio of the
vectors' logical size to their size on disk. The vectors come from a random-weight model, whose
activations may compress slightly differently from a trained model's; layer 0 is the token vector
written twice (as in the original), which lossless compressors partly find, so all-layer caches
compress better than caches of layers 1,2.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{platform.node()}: {cpu}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} "
        f"threads, {gpu}, load average {load:.1f}"
    )


def synthetic_corpus(path: Path, sentences: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    vocabulary = [f"w{i}" for i in range(30000)]
    ranks = np.minimum(rng.zipf(1.2, size=sentences * 60), len(vocabulary)) - 1
    lengths = np.clip(rng.gamma(4.0, 6.5, size=sentences).astype(int), 1, 60)
    tokens, start = 0, 0
    with open(path, "w", encoding="utf-8") as f:
        for n in lengths:
            f.write(" ".join(vocabulary[r] for r in ranks[start : start + n]) + "\n")
            start += n
            tokens += int(n)
    return tokens


def load_encoder(args, workdir: Path):
    from elmo_cache import Encoder
    from elmo_cache.model.random_model import write_random_model

    if args.options_file:
        return Encoder.load((args.options_file, args.weight_file), device=args.device, precision=args.precision)
    options, weights = write_random_model(workdir / "model", args.size, seed=0)
    return Encoder.load((options, weights), device=args.device, precision=args.precision)


def _build_options(args, output: Path, batch_tokens: int):
    """The options throughput and pipeline build with: the command line's storage choices, nothing else."""
    from elmo_cache.builder import BuildOptions

    return BuildOptions(
        output=output,
        format=args.format,
        overwrite=True,
        progress=False,
        batch_tokens=batch_tokens,
        layers=args.layers,
        fp16=args.fp16,
        quantize=args.quantize,
        dedupe=args.dedupe,
    )


def _corpus_and_encoder(args, workdir: Path):
    """What throughput and pipeline build from: the corpus (``--corpus`` or a synthetic one in ``workdir``), its
    sentences as a build splits them, the encoder and the tokens per batch (``--batch-tokens``, else the
    encoder's default for its device)."""
    from elmo_cache.text.tokenize import tokenize

    corpus = Path(args.corpus) if args.corpus else workdir / "corpus.txt"
    if not args.corpus:
        synthetic_corpus(corpus, args.sentences)
    sentences = [tokenize(line) for line in corpus.read_text(encoding="utf-8").splitlines()]
    encoder = load_encoder(args, workdir)
    return corpus, sentences, encoder, args.batch_tokens or encoder.default_batch_tokens


def _fresh_output(workdir: Path, fmt: str) -> Path:
    """Where a timed build writes, the previous repeat's cache removed first: deleting gigabytes is not the
    build's time (it was ~1.4 s of a 7 s run in a profile)."""
    output = workdir / ("cache.zarr" if fmt == "zarr" else "cache.h5")
    if output.is_dir():
        shutil.rmtree(output)
    output.unlink(missing_ok=True)
    return output


def throughput(args) -> None:
    from elmo_cache.builder import build

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        corpus, sentences, encoder, batch_tokens = _corpus_and_encoder(args, workdir)
        tokens = sum(map(len, sentences))
        print(machine())
        print(
            f"model {args.size if not args.options_file else args.options_file} (dim {encoder.output_dim}), device "
            f"{encoder.device}, precision {args.precision}; corpus {len(sentences):,} sentences, {tokens:,} tokens; "
            f"batch_tokens {batch_tokens}; storing {args.layers or 'all layers'}{' fp16' if args.fp16 else ''}"
            f"{' ' + args.quantize if args.quantize else ''}, "
            f"{args.format}"
        )
        encoder.embed_batch(sentences[:50])  # warm-up
        pure, on_device, full = [], [], []
        for repeat in range(args.repeats):
            if encoder.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in encoder.embed_sentences(sentences, batch_tokens=batch_tokens, window=16):
                pass
            if encoder.device.type == "cuda":
                torch.cuda.synchronize()
            pure.append(tokens / (time.perf_counter() - start))
            # The encoder alone with its outputs left on the device: what a build must keep pace with.
            start = time.perf_counter()
            for batch in encoder._plan_batches(sentences, batch_tokens):
                encoder.encode_flat([sentences[i] for i in batch])
            if encoder.device.type == "cuda":
                torch.cuda.synchronize()
            on_device.append(tokens / (time.perf_counter() - start))
            output = _fresh_output(workdir, args.format)
            start = time.perf_counter()
            build(corpus, _build_options(args, output, batch_tokens), encoder=encoder)
            full.append(tokens / (time.perf_counter() - start))
            print(
                f"  run {repeat + 1}: encoder to host arrays {pure[-1]:,.0f} tok/s, encoder alone (outputs left on "
                f"the device) {on_device[-1]:,.0f} tok/s, build {full[-1]:,.0f} tok/s"
            )
        p, d, b = statistics.median(pure), statistics.median(on_device), statistics.median(full)
        print(
            f"median: encoder to host arrays {p:,.0f} tok/s, encoder alone {d:,.0f} tok/s, build end to end "
            f"{b:,.0f} tok/s ({b / d:.0%} of the encoder alone, {b / p:.0%} of the encoder to host arrays)"
        )


def pipeline(args) -> None:
    """The build with the model's forward replaced by a slice of random vectors already on the device: reading,
    hashing, window cutting, selection and cast, copies to the host, block sums, staging, writing and publishing
    at the rate they alone allow. A build cannot be faster than this whatever the encoder's speed."""
    from elmo_cache.builder import build

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        corpus, sentences, encoder, batch_tokens = _corpus_and_encoder(args, workdir)
        tokens = sum(map(len, sentences))
        generator = torch.Generator(device=encoder.device).manual_seed(0)
        shape = (encoder.n_layers, batch_tokens, encoder.output_dim)
        pool = torch.randn(shape, generator=generator, device=encoder.device)

        def encode_flat(batch):
            offsets = np.zeros(len(batch) + 1, dtype=np.int64)
            np.cumsum([len(s) for s in batch], out=offsets[1:])
            return pool[:, : int(offsets[-1])], offsets

        encoder.encode_flat = encode_flat  # type: ignore[method-assign]
        print(machine())
        quantize = f" {args.quantize}" if args.quantize else ""
        print(
            f"the build without the model's forward (random rows of dim {encoder.output_dim}), on {encoder.device}; "
            f"corpus {len(sentences):,} sentences, {tokens:,} tokens; batch_tokens {batch_tokens}; storing "
            f"{args.layers or 'all layers'}{' fp16' if args.fp16 else ''}{quantize}, {args.format}"
        )
        rates = []
        for repeat in range(args.repeats):
            output = _fresh_output(workdir, args.format)
            profiling = args.profile and repeat == args.repeats - 1
            if profiling:
                import yappi  # optional: pip install yappi

                yappi.set_clock_type("wall")
                yappi.start()
            start = time.perf_counter()
            summary = build(corpus, _build_options(args, output, batch_tokens), encoder=encoder)
            seconds = time.perf_counter() - start
            if profiling:
                yappi.stop()
                _print_thread_profiles(yappi)
            rates.append((tokens / seconds, summary.bytes / seconds))
            print(f"  run {repeat + 1}: {rates[-1][0]:,.0f} tok/s, {rates[-1][1] / 1e6:,.0f} MB/s of cache written")
        best = max(rates)
        print(f"best: {best[0]:,.0f} tok/s, {best[1] / 1e6:,.0f} MB/s ({summary.bytes / tokens:,.0f} bytes per token)")


def _print_thread_profiles(yappi, rows: int = 22) -> None:
    """Wall time per thread of the build, and where each of its threads spent it (own time, then with callees)."""
    for thread in yappi.get_thread_stats():
        if thread.ttot < 0.05:
            continue
        print(f"== thread {thread.name} ({thread.ttot:.2f} s of wall time in Python frames)")
        stats = yappi.get_func_stats(ctx_id=thread.id)
        for key in ("tsub", "ttot"):
            stats.sort(key, "desc")
            print(f"-- by {key}")
            for entry in list(stats)[:rows]:
                print(f"  {entry.tsub:8.3f} {entry.ttot:8.3f} {entry.ncall:8d}  {entry.full_name[-90:]}")


def chunks(args) -> None:
    import zarr

    import elmo_cache

    print(machine())
    rng = np.random.default_rng(0)
    n_tokens = args.tokens
    lengths = np.clip(rng.gamma(4.0, 6.5, size=n_tokens // 20).astype(np.int32), 1, 60)
    lengths = lengths[np.cumsum(lengths) <= n_tokens]
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    rows = int(lengths.sum())
    row_shape = (3, 1024)
    print(
        f"{rows:,} rows of 3 x 1024 float16 ({rows * 6144 / 2**30:.2f} GiB), {len(lengths):,} sentences (mean "
        f"{lengths.mean():.1f} tokens); {args.reads} random sentence reads per setting, page cache warm"
    )
    data = (rng.standard_normal((min(rows, 65536), *row_shape)) * 0.5).astype(np.float16)
    picks = rng.integers(0, len(lengths), size=args.reads)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for chunk_rows in args.chunk_rows:
            root = Path(tmp) / f"c{chunk_rows}.zarr"
            group = zarr.create_group(store=str(root), attributes={})
            array = group.create_array(
                "vectors",
                shape=(rows, *row_shape),
                chunks=(chunk_rows, *row_shape),
                dtype="float16",
                compressors=None,
                fill_value=0,
            )
            step = max(chunk_rows, len(data) // chunk_rows * chunk_rows)
            for start in range(0, rows, step):
                block = data[: min(step, rows - start)]
                array[start : start + len(block)] = block
            meta = {
                "format": "elmo-cache",
                "format_version": 1,
                "complete": True,
                "kind": "layers",
                "layers": [0, 1, 2],
                "mix": None,
                "dim": 1024,
                "dtype": "float16",
                "n_sentences": len(lengths),
                "n_tokens": rows,
                "n_rows": rows,
                "n_unique": 0,
                "dedupe": False,
                "compression": None,
                "chunk_rows": chunk_rows,
            }
            for name, values in (
                ("offsets", offsets),
                ("lengths", lengths),
                ("index/hashes", np.zeros(0, np.uint64)),
                ("index/rows", np.zeros(0, np.int64)),
            ):
                group.create_array(name, data=values, chunks=(max(1, min(len(values), 65536)),), compressors=None)
            group.attrs["elmo_cache"] = meta
            reader = zarr.open_array(str(root), path="vectors", mode="r")
            for i in picks[:20]:  # warm the page cache
                reader[offsets[i] : offsets[i] + lengths[i]]
            start = time.perf_counter()
            for i in picks:
                reader[offsets[i] : offsets[i] + lengths[i]]
            through_zarr = (time.perf_counter() - start) / len(picks)
            with elmo_cache.open(root) as cache:
                for i in picks[:20]:
                    np.asarray(cache[int(i)])
                start = time.perf_counter()
                for i in picks:
                    np.asarray(cache[int(i)])
                through_reader = (time.perf_counter() - start) / len(picks)
            files = -(-rows // chunk_rows)
            print(
                f"  chunk_rows {chunk_rows:5d} ({chunk_rows * 6144 / 2**20:5.2f} MiB/chunk): "
                f"zarr {through_zarr * 1e3:6.2f} ms, "
                f"elmo_cache.open {through_reader * 1e3:6.3f} ms per random sentence; "
                f"{files * 1_000_000 // rows:,} chunk files per 1M tokens"
            )
            shutil.rmtree(root)


def compression(args) -> None:
    from elmo_cache.builder import BuildOptions, build

    print(machine())
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        corpus = workdir / "corpus.txt"
        tokens = synthetic_corpus(corpus, args.sentences)
        encoder = load_encoder(args, workdir)
        print(f"model {args.size} (dim {encoder.output_dim}, random weights), {tokens:,} tokens")
        # Ratios are against the logical bytes (rows x row size): the zero padding of the last
        # chunk compresses to nothing and would flatter the compressors on a small corpus.
        for layers, fp16 in (("0,1,2", False), ("0,1,2", True), ("1,2", True)):
            for name in ("none", "zstd", "blosc-lz4", "blosc-zstd"):
                output = workdir / f"{name}.zarr"
                start = time.perf_counter()
                summary = build(
                    corpus,
                    BuildOptions(
                        output=output, compression=name, fp16=fp16, layers=layers, progress=False, chunk_rows=args.chunk
                    ),
                    encoder=encoder,
                )
                stored = sum(p.stat().st_size for p in (output / "vectors").rglob("*") if p.is_file())
                logical = summary.n_rows * len(layers.split(",")) * encoder.output_dim * (2 if fp16 else 4)
                print(
                    f"  layers {layers} {'fp16' if fp16 else 'fp32'} {name:10s}: {logical / 2**20:7.2f} MiB of vectors "
                    f"stored in {stored / 2**20:7.2f} MiB, ratio {logical / stored:.3f}x, build "
                    f"{time.perf_counter() - start:.1f} s"
                )
                shutil.rmtree(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("throughput", "pipeline", "compression"):
        p = sub.add_parser(name)
        p.add_argument(
            "--size", default="tiny", help="random model of this preset shape: tiny, small, medium, original"
        )
        p.add_argument("--options-file")
        p.add_argument("--weight-file")
        p.add_argument("--device", default=None)
        p.add_argument("--precision", default="fp32")
        p.add_argument("--sentences", type=int, default=2000)
        p.add_argument(
            "--threads",
            type=int,
            default=None,
            help="torch intra-op threads (default: torch's). On a "
            "small shared machine, 1 gives stable figures: contending threads make them swing 20x",
        )
    for tp in (sub.choices["throughput"], sub.choices["pipeline"]):
        tp.add_argument("--corpus", help="use this corpus instead of a synthetic one")
        tp.add_argument("--batch-tokens", type=int, default=None)
        tp.add_argument("--repeats", type=int, default=3)
        tp.add_argument("--layers", default=None)
        tp.add_argument("--fp16", action="store_true")
        tp.add_argument("--quantize", default=None, help="int8, pq:M or opq:M (as build's --quantize)")
        tp.add_argument("--dedupe", action="store_true")
        tp.add_argument("--format", default="zarr", choices=["zarr", "hdf5"])
    sub.choices["pipeline"].add_argument(
        "--profile", action="store_true", help="profile the last run's threads with yappi (wall clock)"
    )
    sub.choices["compression"].add_argument("--chunk", type=int, default=64, help="chunk rows (small: little padding)")
    ch = sub.add_parser("chunks")
    ch.add_argument("--tokens", type=int, default=1_000_000)
    ch.add_argument("--reads", type=int, default=2000)
    ch.add_argument("--chunk-rows", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 4096])
    ch.add_argument("--dir", default=None, help="where to write the test arrays (default: the temp dir)")
    args = parser.parse_args()
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    {"throughput": throughput, "pipeline": pipeline, "chunks": chunks, "compression": compression}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
