"""Build speed against torch threads, on a quiet machine and beside a competing job.

    python benchmarks/bench_threads.py                       # bundled model, 60k tokens
    python benchmarks/bench_threads.py --tokens 200000 --threads 1,2,4

Each configuration runs ``elmo-cache build`` in its own process (``--threads N``, or no flag: the
default, which is the CPUs this process may use) on the same synthetic corpus, and prints tokens/s
and the CPU seconds each token cost. "busy" runs start one competing process per ``--busy`` that
spins a core for the whole build (what other jobs on a shared box do); "pinned" runs the build
under ``taskset`` to one core, as a container or scheduler slot with one CPU would, where the
default then picks one thread instead of torch's machine-wide count.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import make_corpus, write_corpus
from _machine import describe_machine

SPIN = "import time\nend = time.monotonic() + 3600\nwhile time.monotonic() < end: pass\n"


def _build(corpus: Path, output: Path, threads: int | None, pinned: bool) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one `elmo-cache build` in a child process."""
    command = [sys.executable, "-c", "from elmo_cache.cli.main import main; main()", "build", str(corpus)]
    command += ["-o", str(output), "--overwrite", "--no-progress", "--device", "cpu"]
    if threads is not None:
        command += ["--threads", str(threads)]
    if pinned:
        command = ["taskset", "-c", "0", *command]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "ELMO_CACHE_THREADS")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    subprocess.run(command, env=env, check=True, capture_output=True)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=60_000)
    parser.add_argument("--threads", default="1,2", help="explicit --threads values to try besides the default")
    parser.add_argument("--busy", type=int, default=1, help="competing spinning processes in the busy runs")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    for line in describe_machine().lines():
        print(line)
    from elmo_cache.threads import usable_cpus

    print(f"usable CPUs of this process (affinity, cgroup quota): {usable_cpus()}")
    work = Path(tempfile.mkdtemp(prefix="bench-threads-"))
    try:
        sentences = make_corpus(args.tokens, seed=3)
        corpus = write_corpus(sentences, work / "corpus.txt")
        n_tokens = sum(map(len, sentences))
        print(f"corpus: {len(sentences)} sentences, {n_tokens} tokens; bundled model, zarr, fp32")
        choices: list[int | None] = [None, *(int(t) for t in args.threads.split(","))]
        _build(corpus, work / "warm.zarr", 1, False)  # page cache, model file, imports
        print(f"{'machine':8} {'threads':>8} {'tokens/s':>10} {'CPU ms/1k tok':>14}")
        for state in ("quiet", "busy", "pinned"):
            for threads in choices:
                if state == "pinned" and threads not in (None, 2):
                    continue  # pinned: the default against torch's own count
                rates, costs = [], []
                for _ in range(args.repeats):
                    spinners = (
                        [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
                        if state == "busy"
                        else []
                    )
                    try:
                        wall, cpu = _build(corpus, work / "out.zarr", threads, state == "pinned")
                    finally:
                        for spinner in spinners:
                            spinner.kill()
                            spinner.wait()
                    rates.append(n_tokens / wall)
                    costs.append(cpu / n_tokens * 1e6)
                label = "default" if threads is None else str(threads)
                rate, cost = sorted(rates)[len(rates) // 2], sorted(costs)[len(costs) // 2]
                print(f"{state:8} {label:>8} {rate:>10,.0f} {cost:>14.1f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
