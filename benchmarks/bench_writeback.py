"""What ``serve --write-back`` costs on a miss and on a later hit (issue 32, items 4 and 7).

    python benchmarks/bench_writeback.py                        # bundled model, 300 cached + 60 unseen lines
    python benchmarks/bench_writeback.py --unseen 100 --concurrent 32

Builds a cache of ``--lines`` lines of the synthetic corpus (``_corpus.make_corpus``) with the bundled model on
the CPU, then drives the app in process (httpx over ASGI: no sockets, so the figures are the server's own work)
with one request at a time, ``GET /embed?format=npy`` of one sentence:

* ``cache hit``: sentences of the cache, on a server without and with ``--write-back``;
* ``miss``: sentences the cache lacks, encoded live, on a server without write-back (one live batch each), then
  the same sentences on a server with write-back (each encoded alone, its stored rows queued for the journal);
* ``written-back hit``: the same sentences asked again once committed (read from the journal: pread, CRC, decode);
* ``--concurrent`` distinct misses sent at once, without and with write-back: the wall time of the burst (the
  live batcher encodes a burst in shared batches; write-back does too where the device's rows are batch-free, else
  it encodes each sentence alone, as a build stores it: the server's /info ``write_back.shared_batches``).

Prints the median and 90th percentile per scenario, the journal's bytes per sentence and its commit times
(write + fsync, from /metrics), with the machine and its load average.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _corpus import make_corpus
from _machine import describe_machine

import elmo_cache
from elmo_cache.builder import BuildOptions, build
from elmo_cache.server import Settings, create_app
from elmo_cache.store.journal import journal_path


def _metric(text: str, name: str) -> float:
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


async def _serve(app, scenario):
    import httpx

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as client:
            return await scenario(client)


async def _sequential(client, sentences: list[str], source: str) -> list[float]:
    times = []
    for sentence in sentences:
        started = time.perf_counter()
        response = await client.get("/embed", params={"sentence": sentence, "format": "npy"})
        times.append(time.perf_counter() - started)
        assert response.status_code == 200 and response.headers["x-elmo-source"] == source, response.text
    return times


async def _burst(client, sentences: list[str]) -> float:
    started = time.perf_counter()
    answers = await asyncio.gather(*(client.get("/embed", params={"sentence": s, "format": "npy"}) for s in sentences))
    assert all(a.status_code == 200 and a.headers["x-elmo-source"] == "live" for a in answers)
    return time.perf_counter() - started


def _line(name: str, times: list[float]) -> str:
    ms = sorted(t * 1000 for t in times)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return f"| {name} | {len(ms)} | {statistics.median(ms):.2f} | {p90:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=300, help="sentences in the cache")
    parser.add_argument("--unseen", type=int, default=60, help="sentences the cache lacks, asked one at a time")
    parser.add_argument("--concurrent", type=int, default=32, help="distinct misses sent at once")
    parser.add_argument("--commit-ms", type=float, default=50.0)
    args = parser.parse_args()

    print("\n".join(describe_machine("cpu").lines()))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    pool = [" ".join(s) for s in make_corpus((args.lines + args.unseen + 2 * args.concurrent + 10) * 30, seed=5)]
    cached = pool[: args.lines]
    unseen = pool[args.lines : args.lines + args.unseen]
    burst_plain = pool[args.lines + args.unseen : args.lines + args.unseen + args.concurrent]
    burst_kept = pool[args.lines + args.unseen + args.concurrent : args.lines + args.unseen + 2 * args.concurrent]
    encoder = elmo_cache.Encoder.load("bundled", device="cpu")
    with tempfile.TemporaryDirectory(prefix="bench-writeback-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n".join(cached) + "\n", encoding="utf-8")
        path = Path(tmp) / "corpus.zarr"
        build(corpus, BuildOptions(output=path, device="cpu", progress=False, tokenize="whitespace"), encoder=encoder)
        cache = elmo_cache.open(path)
        tokens = [len(s.split()) for s in unseen]
        print(
            f"cache: {len(cached)} sentences, float32, layers 0-2, dim {cache.dim}; unseen: {len(unseen)} sentences, "
            f"{statistics.mean(tokens):.1f} tokens on average (max {max(tokens)}); commit every {args.commit_ms:g} ms"
        )
        base = {"cache_path": path, "max_wait_ms": 0.0}

        async def plain(client):
            await _sequential(client, unseen[:3], "live")  # warm-up
            hits = await _sequential(client, cached[:100], "cache")
            misses = await _sequential(client, unseen, "live")
            burst = await _burst(client, burst_plain)
            return hits, misses, burst

        hits_plain, misses_plain, burst_plain_s = asyncio.run(
            _serve(create_app(Settings(**base), encoder=encoder, cache=cache), plain)
        )

        kept_app = create_app(
            Settings(**base, write_back=True, write_back_commit_ms=args.commit_ms), encoder=encoder, cache=cache
        )

        async def kept(client):
            await _sequential(client, pool[-3:], "live")  # warm-up (kept, not measured)
            hits = await _sequential(client, cached[:100], "cache")
            misses = await _sequential(client, unseen, "live")
            assert kept_app.state.service.writeback.journal.flush(60)
            again = await _sequential(client, unseen, "cache")
            burst = await _burst(client, burst_kept)
            assert kept_app.state.service.writeback.journal.flush(60)
            return hits, misses, again, burst, (await client.get("/metrics")).text

        hits_kept, misses_kept, again, burst_kept_s, metrics = asyncio.run(_serve(kept_app, kept))
        size = journal_path(path).stat().st_size
        written = _metric(metrics, "elmo_cache_writeback_written_total")
        commits = _metric(metrics, "elmo_cache_writeback_commit_seconds_count")
        commit_s = _metric(metrics, "elmo_cache_writeback_commit_seconds_sum")

    print("\n| one request at a time, GET /embed npy | requests | median ms | p90 ms |\n|---|---|---|---|")
    print(_line("cache hit, no write-back", hits_plain))
    print(_line("cache hit, --write-back", hits_kept))
    print(_line("miss, no write-back (live batch of one)", misses_plain))
    print(_line("miss, --write-back (a build's bytes, queued)", misses_kept))
    print(_line("written-back hit (from the journal)", again))
    print(
        f"\n{args.concurrent} distinct misses at once: {burst_plain_s * 1000:.0f} ms without write-back, "
        f"{burst_kept_s * 1000:.0f} ms with it ({burst_kept_s / burst_plain_s:.2f}x)"
    )
    print(
        f"journal: {int(written)} sentences written in {int(commits)} commits, {size:,} bytes "
        f"({size / max(written, 1):,.0f} per sentence, {sum(tokens) / len(tokens):.1f} tokens x 3 x {cache.dim} "
        f"float32 = {sum(tokens) / len(tokens) * 3 * cache.dim * 4:,.0f} of rows); mean commit "
        f"(write + fsync) {commit_s / max(commits, 1) * 1000:.2f} ms"
    )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
