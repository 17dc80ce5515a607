"""Thread counts: the CPUs this process may use by default (affinity, cgroup quota), overridden
by --threads or ELMO_CACHE_THREADS, for build and train."""

from __future__ import annotations

import os

import pytest
import torch
from click.testing import CliRunner

from elmo_cache.cli.main import cli
from elmo_cache.errors import InvalidParameterError
from elmo_cache.threads import THREADS_ENV, choose_threads, usable_cpus
from tests._build_fixtures import corpus_lines, write_corpus


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_cgroup_quota_caps_the_affinity(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    (tmp_path / "cpu.max").write_text("100000 100000\n")  # one CPU's worth
    assert usable_cpus(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: two threads may run
    assert usable_cpus(tmp_path) == min(2, affinity)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(tmp_path) == affinity
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")  # unlimited
    assert usable_cpus(v1) == affinity
    assert usable_cpus(tmp_path / "absent") == affinity


def test_the_flag_beats_the_environment_which_beats_the_default(monkeypatch):
    monkeypatch.delenv(THREADS_ENV)
    assert choose_threads() == usable_cpus()
    monkeypatch.setenv(THREADS_ENV, "3")
    assert choose_threads() == 3 and choose_threads(5) == 5
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(InvalidParameterError, match="ELMO_CACHE_THREADS: expected a positive integer"):
        choose_threads()
    with pytest.raises(InvalidParameterError, match="threads: must be at least 1"):
        choose_threads(0)


def test_build_and_train_take_threads(tmp_path, tiny_model, restore_threads):
    corpus = write_corpus(tmp_path / "c.txt", corpus_lines(8, seed=2))
    model = ["--options-file", str(tiny_model[0]), "--weight-file", str(tiny_model[1]), "--device", "cpu"]
    runner = CliRunner()
    result = runner.invoke(cli, ["build", str(corpus), "--no-progress", "--threads", "2", *model])
    assert result.exit_code == 0, result.output
    assert torch.get_num_threads() == 2
    bad = runner.invoke(cli, ["build", str(corpus), "--no-progress", "--threads", "0", "--overwrite", *model])
    assert bad.exit_code == 1 and "threads: must be at least 1" in bad.output and "Traceback" not in bad.output
    trained = runner.invoke(
        cli,
        ["train", str(corpus), "-o", str(tmp_path / "m"), "--preset", "tiny", "--min-count", "1"]
        + ["--batch-size", "2", "--unroll", "3", "--num-sampled", "4", "--max-steps", "1", "--no-progress"],
    )
    assert trained.exit_code == 0, trained.output
    assert torch.get_num_threads() == 1  # ELMO_CACHE_THREADS (1 in this suite) when no flag is given


def test_serve_sizes_the_encoder_pool(tiny_model, restore_threads):
    from elmo_cache.server import Settings, load_resources

    settings = Settings(options_file=tiny_model[0], weight_file=tiny_model[1], device="cpu", threads=2)
    encoder, _ = load_resources(settings)
    assert encoder is not None and torch.get_num_threads() == 2
    load_resources(Settings(options_file=tiny_model[0], weight_file=tiny_model[1], device="cpu"))
    assert torch.get_num_threads() == 1  # ELMO_CACHE_THREADS, as `serve` reads it too
