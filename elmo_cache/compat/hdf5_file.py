"""``embed_file``'s work: a file of sentences to the HDF5 layout allennlp 0.9's ``elmo`` command writes.

The layout: one float32 dataset per input line, named by its line number counted from 0 (``"0"``,
``"1"``...), or by the sentence itself with sentence keys; its shape ``(3, n_tokens, dim)`` for
"all", ``(n_tokens, dim)`` for "top" (the last layer) and "average" (the mean of the three layers).
Unless sentences are forgotten or are the keys, a dataset ``sentence_to_index`` of shape ``(1,)``
holds one variable-length string: the JSON object ``{sentence: "line number"}``, the sentence being
its line stripped of surrounding whitespace (a repeated sentence maps to its last line).

As 0.9 does, empty lines are refused (they would be datasets without tokens that its readers do
not expect), and so are repeated sentences with sentence keys; unlike 0.9, which fails halfway
through writing, this happens before any vector is computed, naming every offending line, and a
``/`` or a lone ``.`` in a sentence key (HDF5 would read them as a path) is refused the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from elmo_cache.errors import CorpusError, InvalidParameterError
from elmo_cache.text.corpus import Corpus
from elmo_cache.text.tokenize import tokenize

__all__ = [
    "OUTPUT_FORMATS",
    "DEFAULT_BATCH_SIZE",
    "EmbedFileSummary",
    "write_embeddings",
    "read_lines",
    "check_paths",
    "check_output_path",
]

OUTPUT_FORMATS = ("all", "top", "average")
"""What ``embed_file`` writes per sentence: every layer, the top one, or their mean."""

DEFAULT_BATCH_SIZE = 64
"""Sentences per batch, as in allennlp 0.9."""

SENTENCE_TO_INDEX = "sentence_to_index"

# How many offending line numbers an error lists before it counts the rest.
_LIST_LINES = 10

Embed = Callable[[list[list[str]]], Iterator[np.ndarray]]


@dataclass(frozen=True)
class EmbedFileSummary:
    """What ``embed_file`` wrote."""

    # The HDF5 file written.
    path: Path
    # Sentences (input lines) embedded: one dataset each.
    n_sentences: int
    # "all", "top" or "average".
    output_format: str
    # True when datasets are named by their sentence, False when by their line number.
    sentence_keys: bool
    # True when the file holds the sentence_to_index dataset.
    sentence_to_index: bool

    def __str__(self) -> str:
        keys = "keyed by sentence" if self.sentence_keys else "keyed by line number"
        index = f", with {SENTENCE_TO_INDEX}" if self.sentence_to_index else ""
        return f"wrote {self.path}: {self.n_sentences:,} sentences ({self.output_format}, {keys}{index})"


def read_lines(source: IO[str] | IO[bytes] | str | os.PathLike[str]) -> tuple[str, list[str]]:
    """The input's name and its lines, stripped of surrounding whitespace (and of a leading BOM).

    A path is read as a corpus (``-``: stdin; gzip; invalid UTF-8 an error naming the line); an open
    file is read from where it stands and left open."""
    if isinstance(source, str | os.PathLike):
        corpus = Corpus(source)
        return corpus.name, [text.lstrip("\ufeff").strip() for _, text in corpus.lines()]
    name = str(getattr(source, "name", "<input>"))
    lines = []
    # An open file yields str or bytes lines, depending on its mode.
    stream: Iterable[str | bytes] = source
    for number, line in enumerate(stream):
        try:
            text: str = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as exc:
            raise CorpusError(f"{name}, line {number + 1}: invalid UTF-8 at byte {exc.start}") from None
        lines.append(text.lstrip("\ufeff").strip())
    return name, lines


def _line_list(numbers: list[int]) -> str:
    shown = ", ".join(str(n + 1) for n in numbers[:_LIST_LINES])
    more = len(numbers) - _LIST_LINES
    return shown + (f" and {more} more" if more > 0 else "")


def _check_lines(name: str, sentences: list[str], use_sentence_keys: bool) -> None:
    empty = [i for i, sentence in enumerate(sentences) if not sentence]
    if empty:
        raise CorpusError(
            f"{name}: empty line{'s' if len(empty) > 1 else ''} {_line_list(empty)} (counting from 1); "
            "allennlp's elmo command refuses them too: remove them (elmo-cache build keeps them as "
            "sentences without tokens)"
        )
    if not use_sentence_keys:
        return
    unusable = [i for i, sentence in enumerate(sentences) if "/" in sentence or sentence == "."]
    if unusable:
        raise CorpusError(
            f"{name}: line {_line_list(unusable)} cannot be an HDF5 key (a '/' in it, or a lone '.'); "
            "drop use_sentence_keys (--use-sentence-keys) to key datasets by line number"
        )
    first: dict[str, int] = {}
    for i, sentence in enumerate(sentences):
        if sentence in first:
            raise CorpusError(
                f"{name}: line {i + 1} repeats line {first[sentence] + 1}, and sentence keys must be "
                "distinct; drop use_sentence_keys (--use-sentence-keys) to encode repeated sentences"
            )
        first[sentence] = i


def _shape(vectors: np.ndarray, output_format: str) -> np.ndarray:
    if output_format == "all":
        return vectors
    if output_format == "top":
        return vectors[-1]
    return vectors.mean(axis=0, dtype=np.float32)


def check_output_path(output_file_path: str | os.PathLike[str]) -> Path:
    """``output_file_path`` as a Path, refused (naming it) when its folder is missing or it is a folder."""
    output = Path(output_file_path)
    if not output.parent.is_dir():
        raise InvalidParameterError(f"output_file_path: folder {output.parent} does not exist")
    if output.is_dir():
        raise InvalidParameterError(f"output_file_path: {output} is a directory; name an HDF5 file")
    return output


def check_paths(input_file: str | os.PathLike[str], output_file_path: str | os.PathLike[str]) -> None:
    """What :func:`write_embeddings` would refuse about its two paths, checked before a model loads."""
    Corpus(input_file)  # raises CorpusError when the file is missing or a folder ("-" is stdin)
    check_output_path(output_file_path)


def write_embeddings(
    input_file: IO[Any] | str | os.PathLike[str],
    output_file_path: str | os.PathLike[str],
    embed: Embed,
    *,
    output_format: str = "all",
    forget_sentences: bool = False,
    use_sentence_keys: bool = False,
    progress: bool = False,
) -> EmbedFileSummary:
    """Read ``input_file``, embed its lines with ``embed`` (token lists in, ``(3, n, dim)`` arrays out,
    in order) and write ``output_file_path`` in allennlp 0.9's layout (see the module docstring).
    The output is written beside its final name and renamed when complete; an existing file is
    replaced, as 0.9 replaced it. ``progress``: a bar of the sentences embedded on stderr
    (:mod:`elmo_cache.progress`)."""
    import h5py

    from elmo_cache.progress import progress_bar

    if output_format not in OUTPUT_FORMATS:
        raise InvalidParameterError(f"output_format: {output_format!r} is not one of {list(OUTPUT_FORMATS)}")
    output = check_output_path(output_file_path)
    name, sentences = read_lines(input_file)
    _check_lines(name, sentences, use_sentence_keys)
    keep_index = not forget_sentences and not use_sentence_keys
    tmp = output.with_name(output.name + ".tmp")
    try:
        bar = progress_bar(total=len(sentences), desc="embedding", unit=" sent", disable=not progress)
        with h5py.File(tmp, "w") as f, bar:
            vectors = embed([tokenize(sentence) for sentence in sentences])
            for number, (sentence, embedded) in enumerate(zip(sentences, vectors, strict=True)):
                key = sentence if use_sentence_keys else str(number)
                f.create_dataset(key, data=np.asarray(_shape(embedded, output_format), dtype=np.float32))
                bar.update(1)
            if keep_index:
                mapping = {sentence: str(number) for number, sentence in enumerate(sentences)}
                index = f.create_dataset(SENTENCE_TO_INDEX, (1,), dtype=h5py.special_dtype(vlen=str))
                index[0] = json.dumps(mapping)
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return EmbedFileSummary(output, len(sentences), output_format, use_sentence_keys, keep_index)
