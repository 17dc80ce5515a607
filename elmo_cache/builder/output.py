"""What a build does about what is already at its output: nothing (the same cache is complete), resume
(its staging holds this engine's interrupted build of the same identity), start afresh, or refuse."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elmo_cache.builder.corpus_record import check_same_corpus
from elmo_cache.builder.plan import Plan, comparable_identity, differences
from elmo_cache.errors import CacheExistsError
from elmo_cache.store import OutputKind, OutputState, inspect_output, load_progress, remove_output
from elmo_cache.store.durable import finish_interrupted_publish
from elmo_cache.store.format import BUILD_DIR, metadata_digest, staging_path
from elmo_cache.text.corpus import Corpus

if TYPE_CHECKING:
    from elmo_cache.builder.engine import Engine

__all__ = ["prepare_output", "check_resumed", "adopt_chunking"]


def prepare_output(
    plan: Plan,
    identity: dict[str, Any],
    overwrite: bool,
    engines: Sequence[Engine],
    source: Corpus | None = None,
    *,
    update: bool = False,
) -> OutputState:
    """Decide what to do about what is already at the output, for a build by ``engines[0]`` of ``source``.

    Returns the output's state (:meth:`Container.inspect <elmo_cache.store.container.Container.inspect>`):
    COMPLETE (the same cache of the same corpus is there: nothing to do; another corpus is a
    :class:`~elmo_cache.errors.CorpusChangedError`), RESUMABLE (the staging holds an interrupted build of
    ``engines[0]``, which checks it is the same build when it starts) or FRESH (nothing is left there).
    Raises :class:`CacheExistsError` for anything else, unless ``overwrite`` (then everything goes).
    The other ``engines`` only say whose interrupted build the staging holds.

    ``update`` (``build --update``): a complete cache of the same options but another corpus is not an error
    but the cache to update: FRESH (or RESUMABLE, an interrupted update of it in the staging) with
    ``updating``, its metadata; the cache stays in place until the update publishes the new one.
    """
    output = plan.output
    staging = staging_path(output)
    finish_interrupted_publish(staging, output)  # a publish a kill cut between its renames left no cache there
    if overwrite:
        if output.exists() or output.is_symlink():
            remove_output(output)
        if staging.exists():
            remove_output(staging)
        return OutputState(OutputKind.FRESH, plan.format)
    found = inspect_output(output, plan.format)
    if found.kind in (OutputKind.COMPLETE, OutputKind.OCCUPIED):
        meta = found.meta
        if meta is None:
            raise CacheExistsError(
                f"{output} exists and is not an elmo-cache cache; choose another -o/--output "
                "or pass --overwrite to replace it"
            )
        there = {**meta, "container": found.container}
        # An update may re-chunk: chunking the command left to its defaults follows the new corpus (adopt_chunking).
        ignored = plan.defaulted if update else ()
        if _without(comparable_identity(there), ignored) != _without(comparable_identity(identity), ignored):
            how = "an update keeps the cache's options: pass them" if update else "pass --overwrite to rebuild it"
            raise CacheExistsError(f"{output} was built with other options ({differences(there, identity)}); {how}")
        if found.kind is OutputKind.OCCUPIED:
            raise CacheExistsError(
                f"{output} is an incomplete cache not written by this build; pass --overwrite to rebuild it"
            )
        changes = None if source is None else check_same_corpus(output, meta, source, update=update)
        if changes is not None:
            return _update_state(plan, identity, meta, changes.first)
        if (output / BUILD_DIR).is_dir():  # a publish killed before the build folder went (the cache is ours)
            shutil.rmtree(output / BUILD_DIR)
        if staging.exists():
            remove_output(staging)
        return found
    if not staging.exists():
        return found
    owner = next((engine for engine in engines if engine.interrupted(output, found)), None)
    if owner is None:  # an unfinished start (a first pass, a staging without a commit): nothing to keep
        remove_output(staging)
        return OutputState(OutputKind.FRESH, plan.format)
    if owner.name != engines[0].name:
        raise CacheExistsError(
            f"{staging} holds an interrupted build of the {owner.name} engine; rerun it with --engine {owner.name} "
            "to resume it, or pass --overwrite to discard it"
        )
    return dataclasses.replace(found, kind=OutputKind.RESUMABLE)


def _without(identity: dict[str, Any], keys: Any) -> dict[str, Any]:
    return {key: value for key, value in identity.items() if key not in keys}


def _update_state(plan: Plan, identity: dict[str, Any], meta: dict[str, Any], unchanged: int) -> OutputState:
    """The state of an update of the complete cache at the output (metadata ``meta``): the interrupted update
    in its staging resumed when it is one of the same options (its committed lines are checked against the
    corpus as any resume's are), else a fresh staging beside the cache."""
    staging = staging_path(plan.output)
    progress = load_progress(plan.output) if staging.exists() else None
    # An interrupted update takes rows and files from the cache at the output: only while it is the one the update
    # began from (not another cache put there since, nor an update begun without that record: started again).
    if (
        progress is not None
        and progress.updating == metadata_digest(meta)
        and comparable_identity(progress.identity) == comparable_identity(identity)
    ):
        return OutputState(
            OutputKind.RESUMABLE, plan.format, progress=progress, updating=meta, unchanged_lines=unchanged
        )
    if staging.exists():
        remove_output(staging)
    return OutputState(OutputKind.FRESH, plan.format, updating=meta, unchanged_lines=unchanged)


def check_resumed(staging: Path, there: dict[str, Any], identity: dict[str, Any]) -> None:
    """Raise :class:`CacheExistsError` unless the interrupted build in ``staging`` (identity ``there``) is this one."""
    if comparable_identity(there) != comparable_identity(identity):
        raise CacheExistsError(
            f"{staging} holds an interrupted build with other options ({differences(there, identity)}); "
            "rerun it with its own options to resume it, or pass --overwrite to discard it"
        )


def adopt_chunking(plan: Plan, identity_of: Callable[[Plan], dict[str, Any]], *, update: bool = False) -> Plan:
    """``plan`` with the chunking of the cache or interrupted (local) build at its output when that differs from
    this build's only in chunk_rows or shard_rows the command left to their defaults; else ``plan``.

    The defaults follow the corpus's size and this version's rules, and chunking changes no vector: a cache
    built under other defaults (an earlier version's, or before a corpus grew past one chunk) is still the
    cache this command asks for, and its interrupted build resumes in the chunking it began with.
    ``identity_of`` makes a plan's identity (the build's :func:`~elmo_cache.builder.plan.identity`).

    ``update``: the complete cache is the one being replaced, and its chunking was chosen for its own corpus; the
    new corpus gets its own defaults (a cache that began small must not keep small chunks as it grows: it is
    re-chunked, and rewritten, while the defaults follow its size), unless an interrupted update began in
    another chunking, which it resumes in."""
    if not plan.defaulted:
        return plan
    found = inspect_output(plan.output, plan.format)
    if update:
        progress = load_progress(plan.output) if staging_path(plan.output).exists() else None
        found = dataclasses.replace(found, kind=OutputKind.FRESH, progress=progress)
    if found.kind is OutputKind.COMPLETE and found.meta is not None:
        there: dict[str, Any] | None = {**found.meta, "container": found.container}
    else:
        there = None if found.progress is None else found.progress.identity
    if not there:
        return plan
    recorded = {name: there.get(name) for name in plan.defaulted}
    if any(isinstance(rows, bool) or not isinstance(rows, int) or rows < 1 for rows in recorded.values()):
        return plan  # not a chunked cache's record: the identity comparison names the difference
    chunking: dict[str, Any] = recorded
    if all(getattr(plan, name) == rows for name, rows in chunking.items()):
        return plan
    adopted = dataclasses.replace(plan, **chunking)
    if adopted.shard_rows is None or adopted.chunk_rows is None or adopted.shard_rows % adopted.chunk_rows:
        return plan
    return adopted if comparable_identity(there) == comparable_identity(identity_of(adopted)) else plan
