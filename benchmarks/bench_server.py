"""Load test of ``elmo-cache serve`` on loopback: requests/s and latency, beside the offline encoder.

It writes a random model of the chosen size, a synthetic corpus (``_corpus.py``) and its
cache (``elmo_cache.builder``), measures the offline encoder's tokens/s on that corpus, then
starts ``elmo-cache serve`` in its own process on 127.0.0.1 and drives it from a separate
client process (httpx + asyncio, ``--concurrency`` clients, a fixed number of requests per
scenario):

* ``hit-json`` / ``hit-npy`` / ``hit-base64``: GET /embed of corpus sentences (cache hits);
* ``live-npy``: GET /embed of sentences absent from the cache (encoded live, micro-batched);
* ``post-hit-npy``: POST /embed of 32 cached sentences per request.

Every figure is printed with the machine. Server and client share this machine's cores,
so requests/s here is a lower bound of what the server does with the CPU to itself; the
server's CPU time per request (from /proc) is the figure that transfers between machines.

    python benchmarks/bench_server.py                         # tiny model, ~1 minute
    python benchmarks/bench_server.py --size small --live-requests 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SCENARIOS = ("hit-json", "hit-npy", "hit-base64", "post-hit-npy", "live-npy")


# -- client process ------------------------------------------------------------------------------


async def _drive(url: str, scenario: str, sentences: list[str], n_requests: int, concurrency: int) -> dict:
    import httpx

    method = "POST" if scenario.startswith("post-") else "GET"
    fmt = scenario.rsplit("-", 1)[1]
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    tokens = 0
    next_index = 0

    def request_args(i: int) -> dict:
        if method == "POST":
            batch = [sentences[(i * 32 + k) % len(sentences)] for k in range(32)]
            return {"json": {"sentences": batch, "format": fmt}}
        return {"params": {"sentence": sentences[i % len(sentences)], "format": fmt}}

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as client:
        for i in range(min(concurrency, 8)):  # warm-up, not counted
            await client.request(method, "/embed", **request_args(i))

        async def worker() -> None:
            nonlocal next_index, tokens
            while next_index < n_requests:  # bounded: each request index is taken once
                i = next_index
                next_index += 1
                args = request_args(i)
                started = time.perf_counter()
                response = await client.request(method, "/embed", **args)
                latencies.append(time.perf_counter() - started)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                if response.status_code == 200:
                    texts = args["json"]["sentences"] if method == "POST" else [args["params"]["sentence"]]
                    tokens += sum(len(t.split()) for t in texts)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        metrics = (await client.get("/metrics")).text
    latencies.sort()
    batches = _metric(metrics, "elmo_cache_live_batch_sentences_count")
    batched = _metric(metrics, "elmo_cache_live_batch_sentences_sum")
    return {
        "scenario": scenario,
        "requests": n_requests,
        "seconds": elapsed,
        "requests_per_s": n_requests / elapsed,
        "tokens_per_s": tokens / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "mean_ms": 1000 * statistics.fmean(latencies),
        "statuses": statuses,
        "live_batches_so_far": batches,
        "live_sentences_so_far": batched,
    }


def _metric(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def client_main(args: argparse.Namespace) -> None:
    sentences = json.loads(Path(args.sentences_file).read_text(encoding="utf-8"))
    result = asyncio.run(_drive(args.url, args.scenario, sentences, args.requests, args.concurrency))
    print(json.dumps(result))


# -- orchestration -------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float = 300.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise SystemExit(f"server not healthy after {timeout_s} s")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux), to report CPU per request."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _serve_command() -> list[str]:
    script = shutil.which("elmo-cache")
    return [script] if script else [sys.executable, "-c", "from elmo_cache.cli.main import main; main()"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="tiny", help="random model size: tiny, small, medium, original")
    parser.add_argument("--cache-tokens", type=int, default=20_000, help="tokens in the cached corpus")
    parser.add_argument("--requests", type=int, default=2000, help="requests per cache-hit scenario")
    parser.add_argument("--live-requests", type=int, default=600, help="requests of the live scenario")
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent clients")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--fp16", action="store_true", help="store the cache in float16")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--json", help="also write the results to this file")
    # client mode (used by the benchmark itself)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--sentences-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return

    import torch
    from _corpus import make_corpus
    from _machine import describe_machine

    import elmo_cache
    from elmo_cache.builder import BuildOptions, build
    from elmo_cache.model.random_model import write_random_model

    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    try:
        machine = describe_machine(args.device)
        print("machine")
        for line in machine.lines():
            print("  " + line)
        options_file, weight_file = write_random_model(work / "model", args.size, seed=0)
        cached = make_corpus(args.cache_tokens, seed=0)
        unseen = [["live"] + s for s in make_corpus(max(4000, args.live_requests * 30), seed=1)]
        corpus = work / "corpus.txt"
        corpus.write_text("".join(" ".join(s) + "\n" for s in cached), encoding="utf-8")

        encoder = elmo_cache.Encoder.load((options_file, weight_file), device=args.device)
        encoder.embed_batch(unseen[:64])  # warm-up
        n_tok = sum(map(len, unseen[:2000]))
        started = time.perf_counter()
        for _ in encoder.embed_sentences(unseen[:2000], batch_tokens=args.batch_tokens):
            pass
        offline = n_tok / (time.perf_counter() - started)
        print(f"offline  Encoder.embed_sentences, {args.size} model, {n_tok} tokens: {offline:,.0f} tokens/s")

        summary = build(
            corpus,
            BuildOptions(output=work / "cache.zarr", fp16=args.fp16, device=args.device, progress=False),
            encoder=encoder,
        )
        print(
            f"cache    {summary.n_sentences} sentences, {summary.n_tokens} tokens, built at "
            f"{summary.tokens_per_s:,.0f} tokens/s"
        )
        del encoder

        hits_file = work / "hits.json"
        hits_file.write_text(json.dumps([" ".join(s) for s in cached]), encoding="utf-8")
        live_file = work / "live.json"
        live_file.write_text(json.dumps([" ".join(s) for s in unseen]), encoding="utf-8")

        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                *_serve_command(),
                "serve",
                str(work / "cache.zarr"),
                "--options-file",
                str(options_file),
                "--weight-file",
                str(weight_file),
                "--device",
                args.device,
                "--port",
                str(port),
                "--max-wait-ms",
                str(args.max_wait_ms),
                "--batch-tokens",
                str(args.batch_tokens),
                "--queue-size",
                str(4 * args.concurrency),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
        )
        results = []
        try:
            _wait_healthy(server, url)
            for scenario in args.scenarios.split(","):
                live = scenario.startswith("live")
                n = args.live_requests if live else args.requests
                if scenario.startswith("post-"):
                    n = max(1, n // 16)
                cpu_before = _cpu_seconds(server.pid)
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--client",
                        "--url",
                        url,
                        "--scenario",
                        scenario,
                        "--sentences-file",
                        str(live_file if live else hits_file),
                        "--requests",
                        str(n),
                        "--concurrency",
                        str(args.concurrency),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                # Includes the warm-up and /metrics requests: a slight over-estimate.
                result["server_cpu_ms_per_request"] = 1000 * (_cpu_seconds(server.pid) - cpu_before) / n
                results.append(result)
                print(
                    f"{scenario:13s} {result['requests']:5d} req  {result['requests_per_s']:8.1f} req/s  "
                    f"{result['tokens_per_s']:10,.0f} tok/s  p50 {result['p50_ms']:7.2f} ms  "
                    f"p99 {result['p99_ms']:7.2f} ms  server CPU {result['server_cpu_ms_per_request']:6.2f} ms/req  "
                    f"statuses {result['statuses']}"
                )
            live_results = [r for r in results if r["scenario"].startswith("live")]
            if live_results and live_results[-1]["live_batches_so_far"]:
                r = live_results[-1]
                print(
                    f"live batching: {r['live_sentences_so_far']:.0f} sentences in {r['live_batches_so_far']:.0f} "
                    f"encoder calls ({r['live_sentences_so_far'] / r['live_batches_so_far']:.1f} per call)"
                )
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=10)
        print(
            f"settings concurrency {args.concurrency}, max_wait_ms {args.max_wait_ms}, batch_tokens "
            f"{args.batch_tokens}, cache dtype {'float16' if args.fp16 else 'float32'}, dim "
            f"{2 * elmo_cache.ModelOptions.from_file(options_file).projection_dim}, torch threads "
            f"{torch.get_num_threads()}"
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {"machine": machine.__dict__, "offline_tokens_per_s": offline, "results": results},
                    indent=2,
                    default=str,
                )
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
