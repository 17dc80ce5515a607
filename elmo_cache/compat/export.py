"""``export``: write a cache in the original allennlp ``elmo`` command's HDF5 layout.

That layout has one float32 dataset per line, named by the line number (``"0"``, ``"1"``...),
of shape ``(n_layers, n_tokens, dim)`` for a layered cache (``(3, n, 1024)`` for the Original
with all layers, as ``allennlp elmo --all`` writes) or ``(n_tokens, dim)`` for a mixed one (as
``--top``/``--average`` write), plus ``sentence_to_index``: a 1-element variable-length string
dataset holding the JSON object ``{sentence text: "line number"}`` (the text being the line
stripped of surrounding whitespace; a repeated sentence maps to its last line, as allennlp's
dict does). Empty lines, which allennlp refuses, become datasets with zero tokens.

The text comes from the corpus when the caller names one (``corpus=``): its lines exactly, as
allennlp keys them. Otherwise a format-2 cache
supplies its stored tokens, joined by one space (the same key wherever a line separates its tokens
by single spaces). A format-1 cache stores no text: without its corpus ``sentence_to_index`` is
left out (tools that only read the numbered datasets do not need it). One dataset per sentence is
slow to open at millions of sentences; this export is for tools that need that layout, not a way
to store large caches.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from elmo_cache.errors import CacheExistsError, CorpusError, InvalidParameterError
from elmo_cache.text.corpus import Corpus

__all__ = ["ExportSummary", "export", "export_format", "EXPORT_FORMATS"]


@dataclass(frozen=True)
class ExportSummary:
    """What :func:`export` wrote."""

    path: Path
    n_sentences: int
    # The corpus sentence_to_index came from, or None when it was left out or came from the cache.
    corpus: str | None
    # True when sentence_to_index was made from the tokens stored in the cache (no corpus needed).
    from_tokens: bool = False
    # "hdf5" (allennlp's layout) or "parquet" (elmo_cache.compat.parquet).
    format: str = "hdf5"

    def __str__(self) -> str:
        if self.format == "parquet":
            return f"wrote {self.path}: {self.n_sentences:,} sentences as Parquet (line, tokens, vectors)"
        if self.corpus:
            index = f"sentence_to_index from {self.corpus}"
        elif self.from_tokens:
            index = "sentence_to_index from the tokens stored in the cache"
        else:
            index = "no sentence_to_index (a format-1 cache stores no text: pass --corpus to add it)"
        return f"wrote {self.path}: {self.n_sentences:,} sentences in the allennlp layout, {index}"


def _sentences_as_text(source: Corpus) -> Iterator[tuple[int, str, int]]:
    """``(number, text, token count)`` of each sentence: the line itself for whitespace-split input (allennlp's
    key), the tokens joined by spaces for pre-tokenised input."""
    if source.input_format == "lines":
        for number, text in source.lines():
            text = text.lstrip("\ufeff")
            yield number, text.strip(), len(text.split())
    else:
        for number, tokens in source.sentences():
            yield number, " ".join(tokens), len(tokens)


def _sentence_to_index(source: Corpus, lengths: np.ndarray) -> dict[str, str]:
    mapping: dict[str, str] = {}
    count = 0
    for number, text, n_tokens in _sentences_as_text(source):
        count = number + 1
        if number >= len(lengths):
            continue
        if n_tokens != lengths[number]:
            unit = "sentence" if source.input_format == "conllu" else "line"
            raise CorpusError(
                f"{source.name}, {unit} {number + 1}: {n_tokens} tokens but the cache stores "
                f"{lengths[number]}; not the corpus this cache was built from"
            )
        mapping[text] = str(number)
    if count != len(lengths):
        raise CorpusError(
            f"{source.name} has {count} lines but the cache has {len(lengths)} sentences; "
            "not the corpus this cache was built from"
        )
    return mapping


def export(
    cache: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    corpus: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    format: str | None = None,
    progress: bool = False,
) -> ExportSummary:
    """Write the cache at ``cache`` to ``output``: an HDF5 file in allennlp's layout, or with
    ``format="parquet"`` (the default for a ``.parquet`` output) a Parquet file for pyarrow and Hugging
    Face ``datasets`` (:mod:`elmo_cache.compat.parquet`; ``corpus`` applies to HDF5's sentence_to_index only).

    Raises :class:`~elmo_cache.errors.CacheExistsError` if ``output`` exists (unless
    ``overwrite``) and :class:`~elmo_cache.errors.CorpusError` when ``corpus`` does not match
    the cache. The file appears only once complete (written beside it, then renamed). ``progress``: a
    bar on stderr (:mod:`elmo_cache.progress`), one line at a time when stderr is not a terminal.
    """
    from elmo_cache.progress import progress_bar
    from elmo_cache.reader.cache import open as open_cache

    output = Path(output)
    chosen = export_format(output, format)
    if chosen == "parquet":
        from elmo_cache.compat.parquet import require_pyarrow, write_parquet

        require_pyarrow()  # before anything is opened or written
        if corpus is not None:
            raise InvalidParameterError(
                "corpus: only the HDF5 export takes a corpus (for sentence_to_index); the Parquet file's tokens "
                "column holds the tokens the cache stores"
            )
    if output.exists() and not overwrite:
        raise CacheExistsError(f"{output} exists; pass --overwrite to replace it")
    with open_cache(cache) as opened:
        if opened.pool_only:  # checked before anything is written
            raise InvalidParameterError(
                f"cache: {opened.path} stores only pooled sentence vectors (--pool-only), no token vectors to "
                "export; export a cache built without --pool-only"
            )
        with progress_bar(total=len(opened), desc="exporting", unit=" sent", disable=not progress) as bar:
            if chosen == "parquet":
                return ExportSummary(output, write_parquet(opened, output, bar.update), None, format="parquet")
            return _export_hdf5(opened, output, corpus, bar.update)


EXPORT_FORMATS = ("hdf5", "parquet")
"""What :func:`export` writes: allennlp's HDF5 layout, or Parquet."""


def export_format(output: Path, format: str | None) -> str:
    """``format``, checked, or the one ``output``'s suffix names (``.parquet``/``.pq``: parquet; else hdf5)."""
    if format is None:
        return "parquet" if output.suffix.lower() in (".parquet", ".pq") else "hdf5"
    if format not in EXPORT_FORMATS:
        raise InvalidParameterError(f"format: {format!r} is not one of {list(EXPORT_FORMATS)}")
    return format


def _export_hdf5(
    opened: Any, output: Path, corpus: str | os.PathLike[str] | None, advance: Callable[[int], Any]
) -> ExportSummary:
    import h5py

    lengths = np.asarray(opened.lengths)
    # Like verify: only a corpus the caller names is read, never the path the metadata claims.
    corpus_path: Any = corpus
    mapping = None
    if corpus_path is not None:
        mapping = _sentence_to_index(Corpus.as_built(corpus_path, opened.metadata), lengths)
    elif opened.stores_tokens:
        mapping = {" ".join(opened.tokens(i)): str(i) for i in range(len(opened))}
    tmp = output.with_name(output.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as f:
            for i in range(len(opened)):
                f.create_dataset(str(i), data=np.asarray(opened[i], dtype=np.float32))
                advance(1)
            if mapping is not None:
                index = f.create_dataset("sentence_to_index", (1,), dtype=h5py.special_dtype(vlen=str))
                index[0] = json.dumps(mapping)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return ExportSummary(
        output,
        len(opened),
        None if corpus_path is None else str(corpus_path),
        from_tokens=corpus_path is None and mapping is not None,
    )
