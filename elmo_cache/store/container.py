"""The container seam: what a store format must provide (the registry of formats is :mod:`elmo_cache.store.registry`).

A container is one way of laying docs/FORMAT.md's arrays on disk (a zarr v3 directory, an HDF5
file). Everything that differs between formats lives behind :class:`Container`: its suffixes
and detection, its option checks, its readers, its writer, its :class:`ParallelWriter` (how several
workers write one output at once, or None), and its own structure and checksum checks for ``verify``. The
build, the reader, ``verify`` and the server ask the registry; none of them branches on a
format's name.

A build asks :meth:`Container.inspect` what is at its output (:class:`OutputState`): a finished cache,
something else, an interrupted build its writer resumes, or nothing.

Adding a format: a subpackage with a class implementing :class:`Container`, one line in
:mod:`elmo_cache.store.registry` (or its ``register_container`` from outside), and one subclass of
the store contract tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

    from elmo_cache.store.staging import Layout, Progress, SentenceColumns, Writer

__all__ = [
    "Container",
    "OutputKind",
    "OutputState",
    "ParallelWriter",
    "PartFiles",
    "PartSink",
    "inspect_store",
]


class OutputKind(Enum):
    """What a build finds at its output (:class:`OutputState`)."""

    # A finished cache: nothing to build.
    COMPLETE = "complete"
    # Something that is not a finished cache (a foreign file or folder, an unfinished cache): only
    # --overwrite replaces it.
    OCCUPIED = "occupied"
    # Nothing at the output, and its staging holds a build the container's writer resumes.
    RESUMABLE = "resumable"
    # Nothing at the output, nor a build to resume (a staging folder may still hold another kind of build).
    FRESH = "fresh"


@dataclass(frozen=True)
class OutputState:
    """The answer of :meth:`Container.inspect`: what is at a build's output, read once."""

    # Which of the four cases it is.
    kind: OutputKind
    # The container answering: the one whose store is at the output (COMPLETE, OCCUPIED), else the one asked.
    container: str
    # The elmo-cache metadata at the output (COMPLETE; OCCUPIED by an unfinished cache), else None.
    meta: dict[str, Any] | None = None
    # The committed progress of the interrupted build in the staging folder (RESUMABLE only).
    progress: Progress | None = None
    # The metadata of the complete cache at the output that this build updates (``build --update`` given another
    # version of its corpus: FRESH or RESUMABLE, the staging beside the cache); None for any other build.
    updating: dict[str, Any] | None = None
    # With ``updating``: the lines the new corpus shares with that cache from its first (its first change).
    unchanged_lines: int = 0


def inspect_store(
    container: Container, output: Path, read_metadata: Callable[[Path], dict[str, Any] | None]
) -> OutputState:
    """:meth:`Container.inspect` for a container whose store at ``output`` it already owns (``read_metadata``
    reads it without checking that again), or when nothing is at ``output``."""
    from elmo_cache.store.staging import load_progress

    if output.exists() or output.is_symlink():
        meta = read_metadata(output)
        complete = meta is not None and meta.get("complete") is True
        return OutputState(OutputKind.COMPLETE if complete else OutputKind.OCCUPIED, container.name, meta=meta)
    progress = load_progress(output)
    kind = OutputKind.FRESH if progress is None else OutputKind.RESUMABLE
    return OutputState(kind, container.name, progress=progress)


@dataclass(frozen=True)
class PartFiles:
    """What one part of a parallel build wrote (:meth:`PartSink.finish`): the row-files it owned, whole, and
    the fragments of the files it shares with its neighbours, for :meth:`ParallelWriter.stitch`."""

    # Row-file number -> its (size, CRC-32), as the container's checksums record them.
    files: dict[int, tuple[int, int]]
    # (row-file number, first row, end row) of each fragment, rows counted in the whole cache.
    fragments: tuple[tuple[int, int, int], ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON a part's marker keeps, so that a resumed build stitches without redoing the part."""
        return {
            "files": {str(k): list(v) for k, v in self.files.items()},
            "fragments": [list(f) for f in self.fragments],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PartFiles:
        """The inverse of :meth:`to_json`."""
        return cls(
            {int(k): (int(v[0]), int(v[1])) for k, v in data["files"].items()},
            tuple((int(k), int(lo), int(hi)) for k, lo, hi in data["fragments"]),
        )


class PartSink(Protocol):
    """Where one worker's part puts its rows ``[first_row, end_row)``, given in order by :meth:`add`.

    Rows go to disk as they come (a part never holds a row-file in memory). Nothing a sink writes is
    visible at a final name until it is whole and durable, so a part redone after a crash, or a stale
    worker still running the same part, leaves the output consistent.
    """

    def add(self, rows: np.ndarray, first_row: int | None = None) -> None:
        """Append the part's next rows (of the layout's row shape), from ``first_row`` when given (a file's start
        after a file whose rows end short)."""
        ...

    def finish(self) -> PartFiles:
        """Make everything written durable and say what it is; raises when the part's rows did not all come."""
        ...

    def close(self) -> None:
        """Drop whatever an unfinished part left in its temporary files (harmless after :meth:`finish`)."""
        ...

    def __enter__(self) -> PartSink: ...

    def __exit__(self, *exc: object) -> None: ...


class ParallelWriter(Protocol):
    """How several workers write one output of a container at once (:meth:`Container.parallel_writer`).

    The rows of ``vectors`` are cut into *row-files* of :meth:`file_rows` rows each, which a worker can
    write independently. A build: the driver calls :meth:`create` once (again on resume); every part
    writes its rows through :meth:`part` (in any process that sees the staging folder) and records the
    :class:`PartFiles` it gets back; the driver gives every part's :class:`PartFiles` to :meth:`stitch`,
    then the staged values of the declared per-sentence columns to :meth:`finish`. A layout without token
    rows (``Layout.token_rows``) has a ``vectors`` of 0 rows: no part writes through :meth:`part`. The
    result is byte for byte the cache the container's single :class:`~elmo_cache.store.staging.Writer`
    writes. Instances are sent to the workers, so they must pickle.
    """

    def file_rows(self, layout: Layout) -> int:
        """Rows per row-file: row ``r`` lives in file ``r // file_rows``. Parts cut at these boundaries own
        whole files; the rest are shared."""
        ...

    def create(self, staging: Path, layout: Layout, n_rows: int, metadata: dict[str, Any]) -> None:
        """The output's skeleton in ``staging``: ``vectors`` of ``n_rows`` rows, no row written, root
        metadata ``metadata`` (unfinished). On a resumed build, checks that the skeleton there matches."""
        ...

    def part(
        self,
        staging: Path,
        layout: Layout,
        n_rows: int,
        first_row: int,
        end_row: int,
        ends: Mapping[int, int] | None = None,
    ) -> PartSink:
        """A sink for the rows ``[first_row, end_row)`` of one part; ``ends``: the row-files whose rows end short
        of the file, by the row they end at (each window's rows start a file: ``Layout.window_rows``)."""
        ...

    def stitch(
        self,
        staging: Path,
        layout: Layout,
        n_rows: int,
        parts: list[PartFiles],
        ends: Mapping[int, int] | None = None,
    ) -> dict[int, tuple[int, int]]:
        """Write the row-files shared by several parts from their fragments; returns every row-file's
        ``(size, CRC-32)`` by number. Raises :class:`CacheFormatError` when the parts do not cover every row."""
        ...

    def finish(
        self,
        staging: Path,
        output: Path,
        sentences: SentenceColumns,
        metadata: dict[str, Any],
        sums: dict[int, tuple[int, int]],
        extra: dict[str, np.ndarray] | None = None,
    ) -> Path:
        """Write the per-sentence arrays derived from the declared columns' values in ``sentences``
        (:meth:`~elmo_cache.store.staging.SentenceColumns.arrays`, as the single writer derives them; ``extra``:
        optional arrays such as a pq cache's codebooks), the checksums (``sums`` from :meth:`stitch`) and
        ``metadata`` (``complete: true``) last, then publish the staging at ``output``; returns it."""
        ...


@runtime_checkable
class Container(Protocol):
    """One on-disk layout of the cache format."""

    # The name users pass as --format and caches record as "container".
    name: str
    # What a store of this container is, in a message ("a zarr v3 directory").
    description: str
    # Output suffixes that ask for this container; the first is the default one.
    suffixes: tuple[str, ...]
    # Whether the cache is a directory (else one file): ``verify`` reads a damaged cache by this.
    is_directory: bool
    # Whether the vectors are chunked (chunk_rows, shard_rows and compression apply).
    chunked: bool

    def writer(self) -> type[Writer]:
        """The class that creates, resumes and finishes a cache of this container."""
        ...

    def parallel_writer(self) -> ParallelWriter | None:
        """How several workers write one output at once (the ray engine needs it); None when a cache of
        this container has a single writer."""
        ...

    def owns(self, path: Path) -> bool:
        """Whether ``path`` is a finished store of this container (cheap: no array is read)."""
        ...

    def explain(self, path: Path) -> str | None:
        """Why ``path``, which no container owns, looks like this container but is not a cache; else None."""
        ...

    def check_options(self, *, compression: str | None, chunk_rows: int | None, shard_rows: int | None) -> None:
        """Raise :class:`InvalidParameterError` naming the option this container cannot honour."""
        ...

    def open_arrays(self, path: Path, names: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
        """``(raw metadata attribute, arrays)``, read by position where possible (the reader's view)."""
        ...

    def open_with_library(self, path: Path) -> tuple[Any, dict[str, Any], Callable[[], None]]:
        """``(raw metadata, arrays, close)`` read by the container's own library (``verify``'s view)."""
        ...

    def read_metadata(self, path: Path) -> dict[str, Any] | None:
        """The elmo-cache metadata stored at ``path``, or None when it is not one of ours."""
        ...

    def inspect(self, output: Path) -> OutputState | None:
        """What a build of ``output`` finds there, its metadata or progress read once (:class:`OutputState`);
        None when something at ``output`` is not a store of this container (another may own it)."""
        ...

    def checksum_problems(self, path: Path, meta: dict[str, Any], arrays: dict[str, Any]) -> tuple[list[str], str]:
        """Every file or dataset whose CRC-32 differs from the recorded one, and the word for the unit checked."""
        ...

    def structure_problems(self, meta: dict[str, Any], arrays: dict[str, Any]) -> list[str]:
        """What breaks this container's own layout rules (chunking, contiguity) in opened arrays."""
        ...
