"""The engine seam: how a planned build is carried out, and the one registry of engines.

:func:`elmo_cache.builder.api.build` runs every build through the same steps: plan (the options
validated, the model described without loading it, the cache's identity), prepare the output
(:func:`elmo_cache.builder.output.prepare_output`), run, finish, summary. An :class:`Engine` does what
differs between one process and many: what it cannot build, what it holds for the build, whose
interrupted build a staging folder is, and how windows are encoded and the cache written and
published (:class:`EngineRun`). Both engines encode windows through
:mod:`elmo_cache.builder.encoding` and write the per-sentence columns the plan's layout declares
(``Layout.sentence_columns``; none of ``vectors``' rows for ``--pool-only``), so they write the same bytes.

Adding an engine: one class implementing :class:`Engine` (with a ``from_arguments`` constructor),
one entry in :data:`_REGISTRY`, its tests. Engines are imported when asked for, so the registry
costs nothing (and ``import elmo_cache`` never imports Ray).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from elmo_cache.errors import InvalidParameterError

if TYPE_CHECKING:
    from elmo_cache.builder.options import BuildOptions
    from elmo_cache.builder.plan import Plan
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.model.files import ModelFiles
    from elmo_cache.model.identity import ModelDescription
    from elmo_cache.store import OutputState
    from elmo_cache.text.corpus import Corpus

__all__ = ["ENGINES", "BuildJob", "Engine", "EngineRun", "Finished", "engine_class", "make_engine", "other_engines"]

# name -> "module:class", imported on first use. The first is the default engine.
_REGISTRY: dict[str, str] = {
    "local": "elmo_cache.builder.local:LocalEngine",
    "ray": "elmo_cache.builder.ray.engine:RayEngine",
}

ENGINES = tuple(_REGISTRY)
"""Valid ``engine`` values of :func:`elmo_cache.build`: one process, or workers on a Ray cluster."""


@dataclass(frozen=True)
class BuildJob:
    """One build, planned once by the skeleton: what every engine step works from."""

    # The corpus.
    source: Corpus
    # The options as given.
    options: BuildOptions
    # The validated plan, its model-dependent defaults (chunk_rows, shard_rows) filled.
    plan: Plan
    # The model's identity and width, read without loading it (or the given encoder's).
    model: ModelDescription
    # The model's files (None when an encoder was given): what the encoders are loaded from.
    model_files: ModelFiles | None
    # What the cache will hold (plan.identity): compared with what is at the output.
    identity: dict[str, Any]
    # time.monotonic() when the build began (before the lock): the ray engine's run counts from here.
    began: float


@dataclass(frozen=True)
class Finished:
    """What an engine reports once the cache is published: the figures of its summary."""

    # The published cache.
    path: Path
    # The whole cache: sentences, tokens, rows and distinct sentences.
    n_sentences: int
    n_tokens: int
    n_rows: int
    n_unique: int
    # Wall seconds of this run, and the tokens it encoded (tokens/s is their ratio).
    seconds: float
    tokens_run: int
    # The engine's own fields of BuildSummary (the local resumed_from; the ray workers and parts).
    extra: Mapping[str, Any]


class EngineRun(Protocol):
    """One engine's build from a prepared output to the published cache."""

    def run(self) -> None:
        """Encode every window not yet on disk and write its rows (resumable: kept when interrupted)."""
        ...

    def finish(self) -> Finished:
        """Write what remains (index, small arrays, checksums, metadata) and publish the cache."""
        ...


class Engine(Protocol):
    """How a planned build is carried out (one instance per build; see the module docstring)."""

    # The name users pass as --engine and summaries report.
    name: str

    def check(self, source: Corpus, plan: Plan) -> None:
        """Refuse, before any work, what this engine cannot build (:class:`InvalidParameterError` naming it)."""
        ...

    def session(self, job: BuildJob) -> AbstractContextManager[None]:
        """What the engine holds for the whole build, entered with the output's lock held and before the
        output is touched (the local encoder, loaded; the Ray cluster, connected)."""
        ...

    def interrupted(self, output: Path, found: OutputState) -> bool:
        """Whether the staging folder of ``output`` (nothing being at ``output``, see ``found``) holds an
        interrupted build of this engine; cheap, reads no more than a marker."""
        ...

    def start(self, job: BuildJob, found: OutputState) -> EngineRun:
        """Create the build's staging, or resume this engine's interrupted one (``found`` is RESUMABLE),
        checking that it is the same build; raise :class:`CacheExistsError` when it is not."""
        ...


def engine_class(name: str) -> Any:
    """The class of the engine called ``name`` (imported now); the error lists the valid ones."""
    try:
        module, cls = _REGISTRY[name].split(":")
    except KeyError:
        raise InvalidParameterError(f"engine: {name!r} is not valid; choose from {list(ENGINES)}") from None
    return getattr(importlib.import_module(module), cls)


def make_engine(name: str, *, encoder: Encoder | None, address: str | None, workers: int | None) -> Engine:
    """The engine ``name`` for one build, given :func:`elmo_cache.build`'s engine arguments (each engine
    refuses those it does not take)."""
    engine: Engine = engine_class(name).from_arguments(encoder=encoder, address=address, workers=workers)
    return engine


def other_engines(engine: Engine) -> list[Engine]:
    """One idle instance of every other engine: to recognise their interrupted builds at an output."""
    return [engine_class(name)() for name in ENGINES if name != engine.name]
