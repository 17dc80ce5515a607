"""Every build's steps, whichever engine runs it (:func:`build_cache`).

1. **Plan** (once): the options checked against each other and the corpus
   (:func:`~elmo_cache.builder.plan.make_plan`), what the engine cannot build refused, the model
   described from its files without loading it (:meth:`Encoder.describe
   <elmo_cache.Encoder.describe>`), the model-dependent defaults filled and the cache's identity.
2. **Prepare the output**, with its lock held and the engine's session open: a complete cache there
   ends the build; an interrupted one of this engine is resumed; anything else is an error unless
   ``overwrite`` (:func:`~elmo_cache.builder.output.prepare_output`).
3. **Run** and 4. **finish**: the engine's (:class:`~elmo_cache.builder.engine.EngineRun`).
5. **Summary**: :class:`~elmo_cache.builder.options.BuildSummary` from what the engine reports.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from elmo_cache.builder.codebooks import larger_than_int8
from elmo_cache.builder.engine import BuildJob, Engine, other_engines
from elmo_cache.builder.options import BuildOptions, BuildSummary, disk_bytes
from elmo_cache.builder.output import adopt_chunking, prepare_output
from elmo_cache.builder.plan import Plan, identity, make_plan
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.identity import ModelDescription
from elmo_cache.store import OutputKind
from elmo_cache.store.lock import output_lock
from elmo_cache.text.corpus import Corpus

if TYPE_CHECKING:
    from elmo_cache.encoder.encoder import Encoder
    from elmo_cache.model.files import ModelFiles

__all__ = ["build_cache", "model_description"]

# Warnings about the build as asked (stderr through logging's last resort when the application configures none).
_log = logging.getLogger("elmo_cache.builder")


def build_cache(source: Corpus, options: BuildOptions, engine: Engine, encoder: Encoder | None = None) -> BuildSummary:
    """The build of ``source`` by ``engine``, through the steps above (``encoder``: the one to use
    instead of ``options.model``)."""
    began = time.monotonic()
    plan = make_plan(source, options)
    engine.check(source, plan)
    if options.update and not getattr(engine, "updates", False):
        raise InvalidParameterError(f"update: {getattr(engine, 'no_update', 'this engine cannot update a cache')}")
    with output_lock(plan.output):  # held for the whole build, by the driver for the ray workers too
        model, files = model_description(options, encoder)
        plan = plan.with_model(model.output_dim, source)

        def identity_of(plan: Plan) -> dict[str, Any]:
            return identity(plan, model.identity, dedupe=bool(options.dedupe))

        if not options.overwrite:  # what is there goes: nothing to adopt
            plan = adopt_chunking(plan, identity_of, update=options.update)
        ident = identity_of(plan)
        job = BuildJob(source, options, plan, model, files, ident, began)
        with engine.session(job):
            engines = [engine, *other_engines(engine)]
            found = prepare_output(plan, ident, options.overwrite, engines, source, update=options.update)
            if found.kind is OutputKind.COMPLETE:
                assert found.meta is not None
                meta = found.meta
                return BuildSummary.already_there(plan.output, plan.format, meta, engine.name)
            if found.kind is OutputKind.FRESH and (larger := larger_than_int8(plan, source)) is not None:
                # Before the codebooks are trained (the long phase), once: a resumed build was told at its start.
                _log.warning(larger.warning())
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
    from elmo_cache.model import sources

    # Resolved before the encoder module (and torch) is imported: a mistyped model fails at once.
    files = sources.resolve(options.model, options.options_file, options.weight_file)
    from elmo_cache.encoder.encoder import Encoder

    # Precision and initial state as the encoders will run: both are part of the identity.
    description = Encoder.describe(files, precision=options.precision, initial_state=options.initial_state)
    return description, files
