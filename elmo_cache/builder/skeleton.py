"""``build``: every build's steps, whichever engine runs it.

1. **Plan** (once): the options checked against each other and the corpus
   (:func:`~elmo_cache.builder.plan.make_plan`), what the engine cannot build refused, the model
   described from its files without loading it (:meth:`Encoder.describe
   <elmo_cache.Encoder.describe>`), the model-dependent defaults filled and the cache's identity.
2. **Prepare the output**, with its lock held and the engine's session open: a complete cache there
   ends the build; an interrupted one of this engine is resumed; anything else is an error unless
   ``overwrite`` (:func:`~elmo_cache.builder.plan.prepare_output`).
3. **Run** and 4. **finish**: the engine's (:class:`~elmo_cache.builder.engine.EngineRun`).
5. **Summary**: :class:`~elmo_cache.builder.options.BuildSummary` from what the engine reports.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from elmo_cache.builder.engine import BuildJob, Engine, make_engine, other_engines
from elmo_cache.builder.options import BuildOptions, BuildSummary, disk_bytes
from elmo_cache.builder.plan import identity, make_plan, open_corpus, prepare_output
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.identity import ModelDescription
from elmo_cache.store import OutputKind
from elmo_cache.store.lock import output_lock
from elmo_cache.text.corpus import Corpus

if TYPE_CHECKING:
    from elmo_cache.encoder import Encoder
    from elmo_cache.model.sources import ModelFiles

__all__ = ["build", "run_build"]


def build(
    corpus: str | os.PathLike[str] | Corpus,
    options: BuildOptions | None = None,
    encoder: Encoder | None = None,
    *,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
) -> BuildSummary:
    """Encode every line of ``corpus`` and write the cache; returns a :class:`BuildSummary`.

    ``corpus``: a path (``-`` for stdin; gzip is detected) or a :class:`~elmo_cache.text.corpus.Corpus`.
    ``encoder``: an :class:`~elmo_cache.Encoder` to use instead of loading ``options.model``.
    Running the same build again after an interruption (even ``kill -9``) resumes it and
    ends with the cache an uninterrupted build writes; on a complete cache it does nothing.
    Raises :class:`~elmo_cache.errors.CacheExistsError` when the output holds a cache or an
    interrupted build made with other options (unless ``overwrite``),
    :class:`~elmo_cache.errors.CorpusError` for unreadable input (lines before the bad one are
    committed first), :class:`~elmo_cache.errors.InvalidParameterError` for bad options.

    ``engine`` (:data:`~elmo_cache.builder.engine.ENGINES`): ``"local"``, one process; ``"ray"`` builds
    the same cache on a Ray cluster (``pip install "elmo-cache[ray]"``; zarr only): ``address`` names the
    cluster (None: a local one), ``workers`` the encoder actors; see
    :func:`elmo_cache.builder.distributed.build_distributed` and docs/DISTRIBUTED.md.
    """
    options = options or BuildOptions()
    return run_build(corpus, options, make_engine(engine, encoder=encoder, address=address, workers=workers), encoder)


def run_build(
    corpus: str | os.PathLike[str] | Corpus, options: BuildOptions, engine: Engine, encoder: Encoder | None = None
) -> BuildSummary:
    """The build of ``corpus`` by ``engine`` (``encoder``: the one to use instead of ``options.model``)."""
    began = time.monotonic()
    source = open_corpus(corpus, options)
    if options.pool_only:  # the full build with --pool, then its token rows dropped
        from elmo_cache.builder.poolonly import build_pool_only

        return build_pool_only(source, options, engine, encoder)
    plan = make_plan(source, options)
    engine.check(source, plan)
    with output_lock(plan.output):  # held for the whole build, by the driver for the ray workers too
        model, files = model_description(options, encoder)
        plan = plan.with_model(model.output_dim)
        ident = identity(plan, model.identity, model.output_dim, dedupe=bool(options.dedupe))
        job = BuildJob(source, options, plan, model, files, ident, began)
        with engine.session(job):
            found = prepare_output(plan, ident, options.overwrite, [engine, *other_engines(engine)])
            if found.kind is OutputKind.COMPLETE:
                assert found.meta is not None
                meta = found.meta
                return BuildSummary.already_there(plan.output, plan.format, meta, engine.name)
            run = engine.start(job, found)
            run.run()
            done = run.finish()
            return BuildSummary(
                done.path,
                plan.format,
                done.n_sentences,
                done.n_tokens,
                done.n_rows,
                done.n_unique,
                disk_bytes(done.path),
                done.seconds,
                done.tokens_run / max(done.seconds, 1e-9),
                engine=engine.name,
                **done.extra,
            )


def model_description(options: BuildOptions, encoder: Encoder | None) -> tuple[ModelDescription, ModelFiles | None]:
    """The model's identity and width, from the given encoder or read from the files ``options`` name."""
    if encoder is not None:
        if getattr(encoder, "initial_state", "zero") == "carry":
            raise InvalidParameterError(
                "encoder: initial_state 'carry' makes vectors depend on batch order; use 'zero' or 'warm'"
            )
        return ModelDescription(encoder.identity, encoder.output_dim), None
    from elmo_cache.encoder import Encoder
    from elmo_cache.model import sources

    files = sources.resolve(options.model, options.options_file, options.weight_file)
    # Precision and initial state as the encoders will run: both are part of the identity.
    description = Encoder.describe(files, precision=options.precision, initial_state=options.initial_state)
    return description, files
