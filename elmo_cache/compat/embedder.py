"""``ElmoEmbedder``: allennlp 0.9's ``allennlp.commands.elmo.ElmoEmbedder`` on elmo-cache's encoder.

Same constructor, methods and return types as 0.9's, so code written for it (flair's
``ELMoEmbeddings``, the SeqVec protein embedder, bio_embeddings) changes one import. The difference
is the LSTM state: 0.9 carries it from one batch to the next, row by row, so a sentence's vectors
depend on what that row read before, and the first batches after loading, read from a zero state,
differ from later ones (the "cold start" of bio_embeddings #76). Here every sentence starts from the
zero state by default, so its vectors are the same whatever came before, whatever its batch.
``stateful=True`` carries state as 0.9 does, for reproducing numbers computed with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import PurePosixPath
from typing import IO

import numpy as np
import torch

from elmo_cache.compat.hdf5_file import DEFAULT_BATCH_SIZE, EmbedFileSummary, write_embeddings
from elmo_cache.encoder.encoder import Encoder
from elmo_cache.errors import InvalidParameterError, ModelNotFoundError
from elmo_cache.model.hub import PUBLISHED_MODELS
from elmo_cache.model.sources import ModelSpec

__all__ = ["ElmoEmbedder", "DEFAULT_BATCH_SIZE"]

PathOrUrl = str | os.PathLike[str]


class ElmoEmbedder:
    """allennlp 0.9's ``ElmoEmbedder``: token lists in, numpy arrays ``(3, n_tokens, dim)`` out.

    ``options_file``/``weight_file``: a model in the bilm-tf layout (paths; both or neither). Neither:
    the model bundled with elmo-cache (no download). The download URLs of AllenAI's published models
    (any host, matched by file name, as flair passes them) load that model by name, downloaded once
    into elmo-cache's model folder. ``cuda_device``: -1 for the CPU, N for ``cuda:N``.
    ``stateful``: False (default) starts every sentence from the zero LSTM state; True carries the
    state across batches row by row as allennlp 0.9 did (results then depend on batch order and
    size: for comparisons with numbers it computed). ``model``: any model ``Encoder.load`` takes by
    name or directory ("original", "small", a folder...), used when the two files are not given.
    """

    def __init__(
        self,
        options_file: PathOrUrl | None = None,
        weight_file: PathOrUrl | None = None,
        cuda_device: int = -1,
        *,
        stateful: bool = False,
        model: ModelSpec = None,
    ) -> None:
        if isinstance(cuda_device, bool) or not isinstance(cuda_device, int) or cuda_device < -1:
            raise InvalidParameterError(f"cuda_device: {cuda_device!r}; use -1 for the CPU or a CUDA device number")
        if cuda_device >= 0 and cuda_device >= torch.cuda.device_count():
            found = f"{torch.cuda.device_count()} CUDA devices" if torch.cuda.is_available() else "no CUDA here"
            raise InvalidParameterError(f"cuda_device: {cuda_device} does not exist ({found}); use -1 for the CPU")
        self.cuda_device = cuda_device
        self.stateful = stateful
        device = "cpu" if cuda_device < 0 else f"cuda:{cuda_device}"
        published = _published_name(options_file, weight_file)
        self.encoder = Encoder.load(
            published or model,
            options_file=None if published else options_file,
            weight_file=None if published else weight_file,
            device=device,
            initial_state="carry" if stateful else "zero",
        )

    def __repr__(self) -> str:
        return f"ElmoEmbedder({self.encoder!r}, cuda_device={self.cuda_device}, stateful={self.stateful})"

    @property
    def output_dim(self) -> int:
        """Width of every layer's vectors (1024 for the Original model)."""
        return self.encoder.output_dim

    def reset_state(self) -> None:
        """Stateful mode: forget the carried LSTM state, so the next batch starts from zeros."""
        self.encoder.reset_state()

    def batch_to_embeddings(self, batch: Sequence[Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch as torch tensors on the model's device: activations ``(batch, 3, n_tokens, dim)``
        float32, zero past each sentence's end, and the mask ``(batch, n_tokens)`` int64 (1 on tokens),
        ``n_tokens`` being the longest sentence's length."""
        _check_batch(batch)
        if all(len(sentence) == 0 for sentence in batch):
            # Nothing to run, and nothing read: in stateful mode the state stays as it was.
            empty = torch.zeros(len(batch), self.encoder.n_layers, 0, self.output_dim, device=self.encoder.device)
            return empty, torch.zeros(len(batch), 0, dtype=torch.int64, device=self.encoder.device)
        activations, lengths = self.encoder.encode_padded(batch)
        steps = torch.arange(activations.shape[2])
        mask = (steps.unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
        return activations, mask.to(self.encoder.device)

    def embed_sentence(self, sentence: Sequence[str]) -> np.ndarray:
        """Vectors of one tokenised sentence: float32 ``(3, n_tokens, dim)``; ``(3, 0, dim)`` for ``[]``."""
        return self.embed_batch([sentence])[0]

    def embed_batch(self, batch: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """Vectors of each sentence of one batch, in order: float32 ``(3, n_tokens, dim)`` each."""
        _check_batch(batch)
        if all(len(sentence) == 0 for sentence in batch):
            return [self._empty() for _ in batch]
        # Stateless, the encoder may split the batch as it likes (the vectors do not change); in
        # stateful mode it keeps the batch whole, since rows are what carry the state.
        return self.encoder.embed_batch(batch)

    def embed_sentences(
        self, sentences: Iterable[Sequence[str]], batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[np.ndarray]:
        """Vectors of each sentence, lazily, in order, computed ``batch_size`` sentences at a time."""
        _check_batch_size(batch_size)
        return self._embed_groups(iter(sentences), batch_size)

    def embed_file(
        self,
        input_file: IO[str] | IO[bytes] | PathOrUrl,
        output_file_path: PathOrUrl,
        output_format: str = "all",
        batch_size: int = DEFAULT_BATCH_SIZE,
        forget_sentences: bool = False,
        use_sentence_keys: bool = False,
        *,
        progress: bool = False,
    ) -> EmbedFileSummary:
        """Embed a file of whitespace-tokenised sentences, one per line, into an HDF5 file in the layout
        allennlp 0.9 writes (see :func:`elmo_cache.compat.hdf5_file.write_embeddings`).

        ``input_file``: an open file or a path (``-`` for stdin, gzip read transparently).
        ``output_format``: "all" (``(3, n_tokens, dim)`` per sentence), "top" (the last layer) or
        "average" (the mean of the three). ``forget_sentences``: leave out ``sentence_to_index``.
        ``use_sentence_keys``: name each dataset by its sentence instead of its line number. Empty
        lines, and with sentence keys repeated sentences or a ``/`` in one, are refused before
        anything is computed, naming their lines. The output appears only once complete.
        ``progress`` (keyword only; not in 0.9): a bar of the sentences embedded on stderr.
        """
        _check_batch_size(batch_size)
        return write_embeddings(
            input_file,
            output_file_path,
            lambda sentences: self.embed_sentences(sentences, batch_size),
            output_format=output_format,
            forget_sentences=forget_sentences,
            use_sentence_keys=use_sentence_keys,
            progress=progress,
        )

    def _embed_groups(self, sentences: Iterator[Sequence[str]], batch_size: int) -> Iterator[np.ndarray]:
        while group := [sentence for _, sentence in zip(range(batch_size), sentences)]:
            yield from self.embed_batch(group)

    def _empty(self) -> np.ndarray:
        return np.zeros((self.encoder.n_layers, 0, self.output_dim), dtype=np.float32)


def _check_batch(batch: Sequence[Sequence[str]]) -> None:
    if isinstance(batch, str):
        raise InvalidParameterError("batch: expected a list of token lists, got a string")
    for i, sentence in enumerate(batch):
        if isinstance(sentence, str):
            raise InvalidParameterError(
                f"sentence {i}: expected a list of tokens, got a string; split it first (sentence.split(), "
                "or list(sequence) for characters as SeqVec does)"
            )


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidParameterError(f"batch_size: must be a positive integer, got {batch_size!r}")


def _published_name(options_file: PathOrUrl | None, weight_file: PathOrUrl | None) -> str | None:
    """The published model whose download URLs these are, None for local files; other URLs are refused."""
    urls = [str(f) for f in (options_file, weight_file) if f is not None and "://" in str(f)]
    if not urls:
        return None
    names = {PurePosixPath(url.split("?")[0]).name for url in urls}
    for model in PUBLISHED_MODELS.values():
        known = {PurePosixPath(url).name for url, _ in model.files()}
        if len(urls) == 2 and names == known:
            return model.name
    raise ModelNotFoundError(
        f"{' and '.join(urls)}: elmo-cache downloads only AllenAI's published models by URL "
        f"({', '.join(PUBLISHED_MODELS)}, both files); download these files and pass their local paths"
    )
