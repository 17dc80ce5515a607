"""``elmo-cache`` starts light: --help, --version and option errors import neither torch nor a model.

The promise is checked by what a fresh interpreter has imported, not by a clock (the figure, with
its command, is in the README).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Each: argv, the exit code, a piece of what it prints. Run one after another in one fresh
# interpreter, which reports after each whether torch (or a model file) has been imported yet.
CASES = [
    (["--help"], 0, "Precompute ELMo embeddings"),
    (["--version"], 0, "elmo-cache, version"),
    (["build", "--help"], 0, "Encode every line of CORPUS"),
    (["train", "--help"], 0, "Pretrain an ELMo biLM"),
    (["serve", "--help"], 0, "Serve CACHE"),
    (["perplexity", "--help"], 0, "Perplexity of the biLM"),
    (["elmo", "--help"], 0, "Embed INPUT_FILE"),
    (["buld", "corpus.txt"], 2, "No such command 'buld'"),
    (["build", "corpus.txt", "--layers", "3"], 1, "layer 3 does not exist; choose from [0, 1, 2]"),
    (["build", "corpus.txt", "--layers", "1", "--mix", "1,1,1"], 1, "exclusive"),
    (["build", "corpus.txt", "--chunk-rows", "0"], 1, "chunk_rows: must be a positive number of rows"),
    (["build", "corpus.txt", "--precision", "fp8"], 1, "choose from ['fp32', 'bf16', 'fp16']"),
    (["build", "corpus.txt", "--device", "tpu"], 1, "device: 'tpu' is not a device"),
    (["build", "corpus.txt", "--threads", "0"], 1, "threads: must be at least 1"),
    (["build", "corpus.txt", "--compression", "lz77"], 1, "choose from ['none', 'zstd'"),
    (["build", "missing.txt"], 1, "corpus not found: missing.txt"),
    (["build", "corpus.txt", "-o", "x.parquet"], 1, "ends in '.parquet', another file format's suffix"),
    (["build", "corpus.txt", "--layers", "1,1"], 1, "--layers: layer 1 is listed twice in '1,1'"),
    (["elmo", "corpus.txt", "out.h5"], 2, "give exactly one of --all, --top, --average"),
    (["elmo", "missing.txt", "out.h5", "--top"], 1, "corpus not found: missing.txt"),
    (["elmo", "corpus.txt", "no/such/out.h5", "--top"], 1, "folder no/such does not exist"),
    (["train", "corpus.txt", "-o", "m", "--epochs", "0"], 1, "epochs: must be >= 1, got 0"),
    (["train", "corpus.txt", "-o", "m", "--device", "gpu"], 1, "device: 'gpu' is not a device"),
    (["serve", "--port", "-5"], 1, "port (ELMO_CACHE_PORT)"),
    (["serve"], 1, "nothing to serve"),
    (["serve", "--cors-origin", "https://a.example", "--openai-mix", "1,x"], 1, "openai_mix (ELMO_CACHE_OPENAI_MIX)"),
    (["serve", "--openai-pool", "avg"], 2, "'avg' is not one of 'mean', 'max', 'first-last'"),
    (["verify", "missing.zarr"], 1, "cache not found: missing.zarr"),
]

_DRIVER = """
import contextlib, io, json, sys
from elmo_cache.cli.main import main
for argv in json.loads(sys.argv[1]):
    sys.argv = ["elmo-cache", *argv]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code
    heavy = sorted(m for m in ("torch", "elmo_cache.model.bilm", "elmo_cache.encoder.encoder") if m in sys.modules)
    print(json.dumps({"argv": argv, "code": code, "output": out.getvalue(), "heavy": heavy}))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    (folder / "corpus.txt").write_text("the cat sat\na dog\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps([argv for argv, _, _ in CASES])],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["argv"] for line in lines] == [argv for argv, _, _ in CASES]
    return lines, folder


@pytest.mark.parametrize(("index", "case"), list(enumerate(CASES)), ids=[" ".join(c[0]) for c in CASES])
def test_help_version_and_option_errors_import_no_torch(results, index, case):
    lines, folder = results
    _, code, text = case
    line = lines[index]
    assert line["code"] == code, line["output"]
    assert text in line["output"]
    assert line["heavy"] == [], f"imported {line['heavy']} for {line['argv']}"
    if code:
        assert "Traceback" not in line["output"]
    assert not (folder / "corpus.zarr").exists() and not (folder / "m").exists()  # nothing written
    assert not (folder / "x.parquet").exists()


def test_verify_says_its_default_model_is_the_cache_s():
    from click.testing import CliRunner

    from elmo_cache.cli.main import cli

    text = " ".join(CliRunner().invoke(cli, ["verify", "--help"]).output.split())
    assert "Default: the model that built CACHE" in text and "Default: bundled" not in text
    build = " ".join(CliRunner().invoke(cli, ["build", "--help"]).output.split())
    assert "Default: bundled (256-d" in build


def test_a_build_imports_torch_once_options_pass(tmp_path, tiny_model):
    """The other side of the promise: the deferred imports do happen when the work needs them."""
    (tmp_path / "corpus.txt").write_text("the cat sat\n", encoding="utf-8")
    argv = ["build", "corpus.txt", "--no-progress", "--options-file", str(tiny_model[0])]
    argv += ["--weight-file", str(tiny_model[1]), "--device", "cpu"]
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps([argv])], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    line = json.loads(done.stdout)
    assert line["code"] == 0, line["output"]
    assert "torch" in line["heavy"] and (tmp_path / "corpus.zarr").is_dir()
