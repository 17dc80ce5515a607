"""What a plain ``pip install elmo-cache`` (no ``server`` extra) must still do: import, build, read.

Each check runs in a fresh interpreter in which the server extra's modules cannot be imported
(``sys.modules[name] = None`` makes ``import name`` fail), as if they were not installed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests._build_fixtures import corpus_lines, write_corpus

SERVER_EXTRA = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic_settings", "prometheus_client", "orjson")

WITHOUT_SERVER = textwrap.dedent(
    f"""
    import sys
    for name in {SERVER_EXTRA!r}:
        sys.modules[name] = None
    """
)


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_SERVER + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_build_and_read_without_the_server_extra(tmp_path, tiny_model):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(6, seed=3))
    output = tmp_path / "corpus.zarr"
    done = python(
        """
        import sys
        from elmo_cache.cli.main import cli
        corpus, output, options, weights = sys.argv[1:]
        args = ["build", corpus, "-o", output, "--options-file", options, "--weight-file", weights]
        cli([*args, "--device", "cpu", "--no-progress"], standalone_mode=False)

        import elmo_cache
        with elmo_cache.open(output) as cache:
            assert len(cache) == 6 and cache[0].shape[1] == len(cache.tokens(0)), cache[0].shape
        loaded = sorted({name.split(".")[0] for name in sys.modules if sys.modules[name] is not None})
        print("server modules loaded:", [name for name in loaded if name in {SERVER_EXTRA}])
        print("transformers loaded:", [name for name in loaded if name in ("transformers", "tokenizers")])
        """.replace("{SERVER_EXTRA}", repr(set(SERVER_EXTRA))),
        str(corpus),
        str(output),
        str(tiny_model[0]),
        str(tiny_model[1]),
    )
    assert done.returncode == 0, done.stderr
    assert "server modules loaded: []" in done.stdout
    # An ELMo build does not import the transformers extra, installed or not.
    assert "transformers loaded: []" in done.stdout


def test_a_transformer_model_without_the_extra_says_what_to_install(tmp_path, tiny_model):
    corpus = write_corpus(tmp_path / "corpus.txt", corpus_lines(2, seed=3))
    model = tmp_path / "bert"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    done = python(
        """
        sys.modules["transformers"] = None
        from elmo_cache.cli.main import main
        sys.argv = ["elmo-cache", "build", sys.argv[1], "--model", "hf:" + sys.argv[2], "--no-progress"]
        main()
        """,
        str(corpus),
        str(model),
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert 'pip install "elmo-cache[transformers]"' in done.stderr
    assert "Traceback" not in done.stderr


def test_serve_without_the_server_extra_says_what_to_install(tmp_path):
    done = python(
        """
        from elmo_cache.cli.main import main
        sys.argv = ["elmo-cache", "serve", "--model", "bundled"]
        main()
        """
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert 'pip install "elmo-cache[server]"' in done.stderr
    assert "Traceback" not in done.stderr


def _extras() -> tuple[list[str], dict[str, list[str]]]:
    import configparser
    from pathlib import Path

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parents[1] / "setup.cfg", encoding="utf-8")

    def requirements(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]

    extras = {name: requirements(value) for name, value in config["options.extras_require"].items()}
    return requirements(config["options"]["install_requires"]), extras


def test_a_user_s_install_gets_no_test_pins_and_dev_carries_the_test_extra():
    core, extras = _extras()
    user = core + extras["server"]
    developer_only = {"pytest", "ruff", "mypy", "schemathesis", "elmoformanylangs", "overrides", "httpx"}
    assert not {r.split("=")[0].split("<")[0].split(">")[0] for r in user} & developer_only
    # dev names the test extra itself, so what the test extra gains carries over to `pip install -e ".[dev]"`.
    assert "elmo-cache[test,server]" in extras["dev"] and {"ruff>=0.6", "mypy>=1.10"} <= set(extras["dev"])
    assert any(r.startswith("elmoformanylangs==") for r in extras["test"])


def test_the_readme_s_first_install_line_is_a_user_s():
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    block = re.search(r"## Install\n\n```bash\n(.*?)```", readme, flags=re.S)
    assert block is not None
    first = block.group(1).splitlines()[0]
    assert first.startswith('pip install ".[server]"') and "-e" not in first.split("#")[0] and "test" not in first
