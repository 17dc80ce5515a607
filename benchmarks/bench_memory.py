"""Peak memory of ``build`` against corpus size: is it flat?

    python benchmarks/bench_memory.py                                   # the default runs (below)
    python benchmarks/bench_memory.py --runs local:zarr:tiny:1M,local:zarr:tiny:4M
    python benchmarks/bench_memory.py --code /tmp/elmo-base --runs ...  # another checkout's library

A run is ``engine:format:model:tokens`` (tokens: 1M, 250k, 10M...). ``model`` is ``bundled`` (the
package's model) or a random model of a preset size (``tiny``, ``small``...; written once under
``$ELMO_CACHE_BENCH_DIR``). Each run builds a generated corpus (``_corpus.make_corpus``, written once
under ``--work``) in a child process that calls ``elmo_cache.build`` directly (so ``--code`` can point
``PYTHONPATH`` at a checkout installed nowhere), while this process samples the child's process tree
from ``/proc`` every 0.2 s. It reports, per run:

* **driver peak**: the build process's ``VmHWM`` (kernel-kept high-water mark of its resident set);
* **anon end**: its ``RssAnon`` (heap, not page cache nor mapped files) right after ``build`` returns;
* **worker peak**: the largest ``VmHWM`` of a Ray worker process (``ray::`` in its command line), and
  **tree peak**: the largest sum of ``VmRSS`` over the whole tree seen at one sample (Ray runs only).

Memory mapped files (the staging columns read back at the end) count in VmHWM too, as page cache the
kernel can drop; ``anon end`` is the part that cannot be dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# The environment as launched: ``import elmo_cache`` (here, for the model's size) sets variables of its own
# (elmo_cache._primitives), which a child running another checkout (``--code``) must not inherit.
_LAUNCH_ENV = dict(os.environ)
_DEFAULT_RUNS = (
    "local:zarr:bundled:1M,local:zarr:tiny:1M,local:zarr:tiny:10M,local:hdf5:tiny:1M,local:hdf5:tiny:10M,"
    "ray:zarr:tiny:1M,ray:zarr:tiny:10M"
)


def _tokens(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _status(pid: int) -> dict[str, int]:
    """The ``kB`` fields of /proc/<pid>/status, in bytes (empty when the process is gone)."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                parts = value.split()
                if len(parts) == 2 and parts[1] == "kB":
                    out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (by parent pid, from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _model_dir(size: str) -> Path:
    from elmo_cache.model.random_model import write_random_model

    root = Path(os.environ.get("ELMO_CACHE_BENCH_DIR", Path.home() / ".cache" / "elmo-cache-bench"))
    directory = root / f"{size}-seed0"
    if not (directory / "model_weights.hdf5").is_file():
        write_random_model(directory, size, seed=0, name="model")
    return directory


def _corpus(work: Path, tokens: int) -> Path:
    path = work / f"corpus-{tokens}.txt"
    if not path.is_file():
        sys.path.insert(0, str(_HERE))
        from _corpus import make_corpus, write_corpus

        tmp = path.with_suffix(".tmp")
        write_corpus(make_corpus(tokens), tmp)
        os.replace(tmp, path)
    return path


def _model_params(model: str) -> str:
    import numpy as np

    from elmo_cache.model.hub import BUNDLED
    from elmo_cache.model.options import ModelOptions
    from elmo_cache.model.sources import resolve
    from elmo_cache.model.weights import weight_shapes

    files = resolve(BUNDLED if model == "bundled" else str(_model_dir(model)))
    options = ModelOptions.from_file(files.options_file)
    params = sum(int(np.prod(shape)) for shape in weight_shapes(options).values())
    return f"{params / 1e6:.2f}M weights, vectors 3 x {2 * options.projection_dim}"


# (module, attribute path, phase): functions whose calls mark a phase of the build in the child. A name the
# library (``--code``) lacks is skipped. The innermost phase running is the one a sample is counted in.
_PHASES = (
    ("elmo_cache.builder.local", "load_encoder", "load model"),
    ("elmo_cache.builder.local", "_run", "encode"),
    ("elmo_cache.store.staging", "Writer.index", "index"),
    ("elmo_cache.store.zarr.writer", "ZarrWriter.finalize", "finish"),
    ("elmo_cache.store.hdf5.writer", "Hdf5Writer.finalize", "finish"),
    ("elmo_cache.store.zarr.write", "finish_group", "finish group"),
    ("elmo_cache.builder.ray.engine", "first_pass", "first pass"),
    ("elmo_cache.builder.ray.engine", "run_parts", "parts (ray)"),
    ("elmo_cache.builder.ray.engine", "RayRun.finish", "finish"),
)


class _PhaseSampler:
    """Samples this process's RssAnon / RssFile every 50 ms and keeps, per phase, the largest of each and
    the values when the phase ended: which phase holds memory, and whether it is anonymous or mapped files."""

    def __init__(self) -> None:
        import threading

        self.stack: list[str] = ["setup"]
        self.peaks: dict[str, dict[str, int]] = {}
        self.ends: dict[str, dict[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def sample(self) -> dict[str, int]:
        status = _status(os.getpid())
        values = {key: status.get(key, 0) for key in ("RssAnon", "RssFile", "VmRSS")}
        peak = self.peaks.setdefault(self.stack[-1], dict.fromkeys(values, 0))
        for key, value in values.items():
            peak[key] = max(peak[key], value)
        return values

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def wrap(self, module_name: str, path: str, phase: str) -> None:
        import functools
        import importlib

        try:
            owner: Any = importlib.import_module(module_name)
        except ImportError:
            return
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        original = getattr(owner, name, None)
        if original is None:
            return

        @functools.wraps(original)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(phase)
            try:
                return original(*args, **kwargs)
            finally:
                self.ends[phase] = self.sample()
                self.stack.pop()

        setattr(owner, name, wrapped)

    def start(self) -> None:
        for module_name, path, phase in _PHASES:
            self.wrap(module_name, path, phase)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"peaks": self.peaks, "ends": self.ends}


def child(spec: dict) -> None:
    """The measured process: one build, then its own figures as a JSON line on stdout."""
    import elmo_cache
    from elmo_cache.builder.options import BuildOptions

    sampler = _PhaseSampler()
    sampler.start()

    model = spec["model"]
    kwargs = {} if model == "bundled" else {"model": spec["model_dir"]}
    options = BuildOptions(output=spec["output"], overwrite=True, progress=False, **kwargs)
    begin = time.monotonic()
    extra = {"workers": spec["workers"]} if spec["engine"] == "ray" else {}
    summary = elmo_cache.build(spec["corpus"], options, engine=spec["engine"], **extra)
    seconds = time.monotonic() - begin
    status = _status(os.getpid())
    result = {
        "library": str(Path(elmo_cache.__file__).parent),
        "sentences": summary.n_sentences,
        "tokens": summary.n_tokens,
        "seconds": seconds,
        "anon_end": status.get("RssAnon", 0),
        "hwm": status.get("VmHWM", 0),
        "phases": sampler.stop(),
    }
    print("RESULT " + json.dumps(result), flush=True)
    if spec["engine"] == "ray":
        import ray

        ray.shutdown()


def measure(run: str, args: argparse.Namespace) -> dict:
    engine, fmt, model, size = run.split(":")
    tokens = _tokens(size)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    spec = {
        "engine": engine,
        "model": model,
        "model_dir": None if model == "bundled" else str(_model_dir(model)),
        "corpus": str(_corpus(work, tokens)),
        "output": str(work / f"out-{engine}.{'zarr' if fmt == 'zarr' else 'h5'}"),
        "workers": args.workers,
    }
    env = dict(_LAUNCH_ENV)
    if args.code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.code, env.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE, text=True, env=env
    )
    worker_peak = tree_peak = anon_peak = worker_anon = worker_file = 0
    hwm: dict[int, int] = {}
    names: dict[int, str] = {}  # Ray process -> its name (ray::MapWorker(...), ray::IDLE...)
    while proc.poll() is None:
        total = 0
        for pid in _tree(proc.pid):
            status = _status(pid)
            total += status.get("VmRSS", 0)
            if pid == proc.pid:
                anon_peak = max(anon_peak, status.get("RssAnon", 0))
            elif "ray::" in _cmdline(pid):
                hwm[pid] = max(hwm.get(pid, 0), status.get("VmHWM", 0))
                names[pid] = _cmdline(pid).split(" ", 1)[0]
                worker_anon = max(worker_anon, status.get("RssAnon", 0))
                worker_file = max(worker_file, status.get("RssFile", 0))
        tree_peak = max(tree_peak, total)
        time.sleep(0.2)
    worker_peak = max(hwm.values(), default=0)
    out, _ = proc.communicate()
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{run}: the child failed (exit {proc.returncode})")
    result = json.loads(lines[-1][len("RESULT ") :])
    return {
        "run": run,
        "engine": engine,
        "format": fmt,
        "model": model,
        **result,
        "anon_peak": anon_peak,
        "worker_anon_peak": worker_anon,
        "worker_file_peak": worker_file,
        "workers": sorted(([names[pid], peak] for pid, peak in hwm.items()), key=lambda x: -x[1])[:6],
        "worker_peak": worker_peak,
        "tree_peak": tree_peak,
    }


def _phase_lines(r: dict) -> str:
    """Per phase of the build process: the largest RssAnon / RssFile seen, and both when it ended (MB)."""
    mb = 2**20
    lines = [f"    {'phase':14} {'anon peak':>9} {'file peak':>9} {'anon end':>9} {'file end':>9}  (MB)"]
    for phase, peak in r["phases"]["peaks"].items():
        end = r["phases"]["ends"].get(phase, {})
        lines.append(
            f"    {phase:14} {peak['RssAnon'] / mb:9.0f} {peak['RssFile'] / mb:9.0f} "
            f"{end.get('RssAnon', 0) / mb:9.0f} {end.get('RssFile', 0) / mb:9.0f}"
        )
    if r["engine"] == "ray":
        lines.append(
            f"    ray workers: RssAnon peak {r['worker_anon_peak'] / mb:.0f} MB, RssFile peak "
            f"{r['worker_file_peak'] / mb:.0f} MB"
        )
        for name, peak in r.get("workers", []):
            lines.append(f"      {name[:48]:48} VmHWM {peak / mb:6.0f} MB")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default=_DEFAULT_RUNS, help="comma list of engine:format:model:tokens")
    parser.add_argument("--work", default="/tmp/elmo-bench-memory", help="corpora and outputs (reused)")
    parser.add_argument("--code", help="a checkout whose elmo_cache the children import (PYTHONPATH)")
    parser.add_argument("--workers", type=int, default=2, help="Ray workers")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--phases", action="store_true", help="also print each phase's RssAnon / RssFile")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return

    sys.path.insert(0, str(_HERE))
    from _machine import describe_machine

    print("\n".join(describe_machine("cpu").lines()))
    print(
        f"date {time.strftime('%Y-%m-%d %H:%M')}, load average {os.getloadavg()[0]:.1f}, "
        f"code {args.code or 'installed'}"
    )
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    for model in sorted({r.split(":")[2] for r in runs}):
        print(f"model {model}: {_model_params(model)}")
    gb = 2**30
    header = f"{'engine':6} {'format':6} {'model':8} {'tokens':>10} {'sentences':>9} {'driver peak':>11} "
    header += f"{'anon end':>9} {'worker peak':>11} {'tree peak':>9} {'seconds':>8}"
    print(header, flush=True)
    rows = []
    for run in runs:
        r = measure(run, args)
        rows.append(r)
        workers = f"{r['worker_peak'] / gb:9.2f} GB" if r["engine"] == "ray" else f"{'-':>11}"
        tree = f"{r['tree_peak'] / gb:7.2f} GB" if r["engine"] == "ray" else f"{'-':>9}"
        print(
            f"{r['engine']:6} {r['format']:6} {r['model']:8} {r['tokens']:>10,} {r['sentences']:>9,} "
            f"{r['hwm'] / gb:8.2f} GB {r['anon_end'] / gb:6.2f} GB {workers} {tree} {r['seconds']:8.1f}",
            flush=True,
        )
        if args.phases:
            print(_phase_lines(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
