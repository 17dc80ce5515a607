"""A serving process's resident memory over bursts of live encodings, with and without the heap trim.

    python benchmarks/bench_server_heap.py                      # bundled model, 30 bursts
    python benchmarks/bench_server_heap.py --model original --rounds 20

Builds a 50-line cache (bundled model unless ``--model``), then drives the app in process (httpx over ASGI) with
``--rounds`` bursts of 8, 16, 32 or 60 distinct sentences the cache lacks (each encoded live), pausing 0.3 s after
each, and prints the process's ``RssAnon`` (heap and other anonymous memory: not page cache, not mapped files)
after every burst. Each side runs in a fresh child process: as the server runs (the live batcher trims the C heap
when its queue empties: ``server/batcher.py``), and with that trim switched off.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _corpus import make_corpus
from _machine import describe_machine


def _rss_anon_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no RssAnon in /proc/self/status (Linux only)")


def _child(model: str, rounds: int, trim: bool) -> None:
    import httpx

    import elmo_cache
    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.server import Settings, batcher, create_app

    if not trim:
        batcher.trim_heap = lambda: False  # type: ignore[assignment]
    pool = [" ".join(s) for s in make_corpus(200_000, seed=7)]
    rng = random.Random(0)
    encoder = elmo_cache.Encoder.load(model, device="cpu")
    with tempfile.TemporaryDirectory(prefix="bench-server-heap-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(pool[:50]) + "\n", encoding="utf-8")
        path = Path(tmp) / "corpus.zarr"
        build(corpus, BuildOptions(output=path, device="cpu", progress=False, tokenize="whitespace"), encoder=encoder)
        app = create_app(Settings(cache_path=path, max_wait_ms=2.0), encoder=encoder, cache=elmo_cache.open(path))

        async def bursts() -> None:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as client:
                    start = 50
                    for r in range(rounds):
                        size = rng.choice([8, 16, 32, 60])
                        sentences, start = pool[start : start + size], start + size
                        answers = await asyncio.gather(
                            *(client.get("/embed", params={"sentence": s, "format": "npy"}) for s in sentences)
                        )
                        failed = [a for a in answers if a.status_code != 200]
                        if failed:
                            raise SystemExit(f"burst {r}: {failed[0].status_code} {failed[0].text[:200]}")
                        await asyncio.sleep(0.3)
                        print(f"{r} {size} {_rss_anon_mib():.1f}", flush=True)

        asyncio.run(bursts())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--child", choices=["trim", "none"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.model, args.rounds, args.child == "trim")
        return

    print("\n".join(describe_machine("cpu").lines()))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sides: dict[str, list[tuple[int, float]]] = {}
    for side in ("none", "trim"):
        run = subprocess.run(
            [sys.executable, __file__, "--model", args.model, "--rounds", str(args.rounds), "--child", side],
            capture_output=True,
            text=True,
            check=False,
        )
        if run.returncode != 0:
            raise SystemExit(f"the {side} side failed:\n{run.stderr[-2000:]}")
        rows = [line.split() for line in run.stdout.splitlines() if line[:1].isdigit()]
        sides[side] = [(int(size), float(mib)) for _, size, mib in rows]
    print(f"model {args.model}; RssAnon (MiB) after each burst of distinct misses")
    print(f"{'burst':>5} {'size':>4} {'untrimmed':>10} {'trimmed':>10}")
    for r, ((size, plain), (_, trimmed)) in enumerate(zip(sides["none"], sides["trim"], strict=True)):
        print(f"{r:5d} {size:4d} {plain:10.1f} {trimmed:10.1f}")
    for side, label in (("none", "untrimmed"), ("trim", "trimmed")):
        values = [mib for _, mib in sides[side]]
        print(f"{label:>10}: first {values[0]:.1f}, last {values[-1]:.1f}, max {max(values):.1f} MiB")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
