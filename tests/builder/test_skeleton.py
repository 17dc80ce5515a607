"""builder/skeleton.py: every build's steps in order, whichever engine runs them: plan once, the model
described, the output prepared with its lock held and the engine's session open, run, finish, summary."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from elmo_cache.builder.engine import BuildJob, EngineRun, Finished
from elmo_cache.builder.local import LocalEngine
from elmo_cache.builder.options import BuildOptions
from elmo_cache.builder.plan import Plan
from elmo_cache.builder.skeleton import build_cache
from elmo_cache.errors import InvalidParameterError, OutputLockedError
from elmo_cache.store import OutputState
from elmo_cache.store.lock import output_lock
from elmo_cache.text.corpus import Corpus
from tests._build_fixtures import corpus_lines, write_corpus


class RecordingEngine(LocalEngine):
    """The local engine, with each step the skeleton calls written down (and checks made inside them)."""

    def __init__(self, encoder):
        super().__init__(encoder)
        self.calls: list[str] = []
        self.job: BuildJob | None = None
        self.refuse: str | None = None

    def check(self, source: Corpus, plan: Plan) -> None:
        self.calls.append("check")
        if self.refuse:
            raise InvalidParameterError(self.refuse)

    @contextmanager
    def session(self, job: BuildJob) -> Iterator[None]:
        self.calls.append("session")
        self.job = job
        with super().session(job):
            yield
        self.calls.append("session closed")

    def start(self, job: BuildJob, found: OutputState) -> EngineRun:
        self.calls.append(f"start {found.kind.value}")
        return RecordingRun(super().start(job, found), self.calls, job.plan.output)


class RecordingRun:
    def __init__(self, run: EngineRun, calls: list[str], output: Path):
        self.inner, self.calls, self.output = run, calls, output

    def run(self) -> None:
        # The output's lock is held for the whole build: another build cannot take it now.
        with pytest.raises(OutputLockedError, match="being built"), output_lock(self.output):
            pass
        self.calls.append("run")
        self.inner.run()

    def finish(self) -> Finished:
        self.calls.append("finish")
        return self.inner.finish()


@pytest.fixture
def corpus(tmp_path) -> Corpus:
    return Corpus(write_corpus(tmp_path / "c.txt", corpus_lines(12, seed=3)))


def test_the_steps_run_in_order_and_the_job_carries_the_plan_with_the_models_width(corpus, tmp_path, tiny_encoder):
    engine = RecordingEngine(tiny_encoder)
    summary = build_cache(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), engine, tiny_encoder)
    assert engine.calls == ["check", "session", "start fresh", "run", "finish", "session closed"]
    job = engine.job
    assert job is not None and job.model.output_dim == tiny_encoder.output_dim
    assert job.plan.chunk_rows is not None and job.plan.shard_rows is not None  # filled once the width was known
    assert job.identity["model"] == dict(tiny_encoder.identity)
    assert summary.path == tmp_path / "c.zarr" and summary.engine == "local" and not summary.already_complete
    assert summary.n_sentences == 12 and summary.bytes > 0


def test_a_complete_cache_of_the_same_build_ends_it_before_the_engine_starts(corpus, tmp_path, tiny_encoder):
    options = BuildOptions(output=tmp_path / "c.h5", progress=False)
    first = build_cache(corpus, options, RecordingEngine(tiny_encoder), tiny_encoder)
    engine = RecordingEngine(tiny_encoder)
    again = build_cache(corpus, options, engine, tiny_encoder)
    assert engine.calls == ["check", "session", "session closed"]
    assert again.already_complete and again.n_sentences == first.n_sentences == 12


def test_what_the_engine_refuses_is_refused_before_the_model_or_the_output_is_touched(corpus, tmp_path, tiny_encoder):
    engine = RecordingEngine(tiny_encoder)
    engine.refuse = "format: this engine writes no such thing"
    with pytest.raises(InvalidParameterError, match="this engine writes no such thing"):
        build_cache(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), engine, tiny_encoder)
    assert engine.calls == ["check"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def test_an_encoder_that_carries_state_across_batches_is_refused(corpus, tmp_path, tiny_model):
    from elmo_cache import Encoder

    carrying = Encoder.load(tiny_model, device="cpu", initial_state="carry")
    with pytest.raises(InvalidParameterError, match="initial_state 'carry'"):
        build_cache(corpus, BuildOptions(output=tmp_path / "c.zarr", progress=False), LocalEngine(carrying), carrying)
