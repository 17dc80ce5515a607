"""A Transformer encoder behind the ELMo encoder's interface: token lists in, ``L + 1`` word-aligned layers out.

:meth:`Encoder.load <elmo_cache.Encoder.load>` returns one for ``hf:NAME`` (:mod:`elmo_cache.model.transformer`);
the build, verify, the server and the exports use it as they use the biLM, through ``encode_flat`` and
``embed_batch``. Layer 0 is the embedding output, layer ``j`` block ``j``'s output (transformers'
``hidden_states``). Each stored token gets one vector per layer, from its subwords (first, mean or last,
as the model was named) in the window of its sentence where it has most context
(:mod:`~elmo_cache.encoder.windows`). Sentences are padded only to the longest window of their
length-sorted sub-batch and masked, so a sentence's vectors do not depend on its batch beyond float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from elmo_cache.encoder.encoder import Encoder, validate_sentences
from elmo_cache.encoder.hardware import check_precision
from elmo_cache.encoder.names import batch_tokens_for
from elmo_cache.encoder.transfer import to_device
from elmo_cache.encoder.windows import plan_windows
from elmo_cache.errors import InvalidParameterError
from elmo_cache.model import transformer
from elmo_cache.model.files import ModelFiles
from elmo_cache.model.subwords import load_tokenizer, special_tokens, split_sentences

__all__ = ["TransformerEncoder"]


class TransformerEncoder(Encoder):
    """A Transformer encoder (transformers' ``AutoModel``) on one device, one vector per stored token and layer."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        identity: dict[str, Any],
        *,
        device: torch.device,
        precision: str,
        name: str | None,
        directory: Path | None,
    ):
        # Not the biLM's constructor: there is no LSTM state and no char-CNN word cache here.
        self.model = model
        self.tokenizer = tokenizer
        self._identity = identity
        options = identity["options"]
        self.device = device
        self.precision = precision
        self.initial_state = "zero"
        self.name = name
        self.directory = directory
        self.weight_file = None
        self.output_dim = int(options["dim"])
        self.n_layers = int(options["n_layers"])
        self.subword = str(options["subword"])
        self.window = int(options["window"])
        self.stride = int(options["stride"])
        self._prefix, self._suffix = special_tokens(tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @classmethod
    def from_files(
        cls, files: ModelFiles, *, device: torch.device, precision: str = "fp32", initial_state: str = "zero"
    ) -> TransformerEncoder:
        """The encoder of a resolved ``hf:`` model (what ``Encoder.load`` calls for one)."""
        from transformers import AutoConfig, AutoModel

        description = transformer.describe(files, precision, initial_state)
        assert files.directory is not None
        dtype = check_precision(precision, device)
        config = AutoConfig.from_pretrained(str(files.directory))
        model = AutoModel.from_pretrained(str(files.directory), config=config, dtype=dtype)
        if not hasattr(model, "get_input_embeddings") or getattr(model.config, "is_decoder", False):
            raise InvalidParameterError(f"{files.directory}: AutoModel gave no encoder ({type(model).__name__})")
        model.to(device).eval()
        tokenizer = load_tokenizer(files.directory)
        return cls(
            model,
            tokenizer,
            description.identity,
            device=device,
            precision=precision,
            name=files.name,
            directory=files.directory,
        )

    # ----------------------------------------------------------------- identity
    @property
    def weights_sha256(self) -> str | None:
        """SHA-256 of the weights files (computed when the model was described)."""
        return self._identity["weights_sha256"]

    @property
    def identity(self) -> dict[str, Any]:
        """What determines this encoder's vectors (stored in cache metadata as ``model``)."""
        return dict(self._identity)

    def __repr__(self) -> str:
        return (
            f"TransformerEncoder(name={self.name!r}, layers={self.n_layers}, dim={self.output_dim}, "
            f"device={str(self.device)!r}, precision={self.precision!r}, subword={self.subword!r})"
        )

    @property
    def default_batch_tokens(self) -> int:
        """Tokens per sub-batch when none is asked for: smaller than ELMo's on a CPU (names.FORMAT_BATCH_TOKENS)."""
        return batch_tokens_for(self.device.type, transformer.FORMAT)

    def clear_word_cache(self) -> None:
        """Nothing to clear: a Transformer has no per-word cache."""

    def reset_state(self) -> None:
        """Nothing to reset: a Transformer carries no state between batches."""

    @property
    def start_state(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise InvalidParameterError("a Transformer encoder has no LSTM start state")

    # ----------------------------------------------------------------- encoding
    @torch.inference_mode()
    def encode_flat(self, sentences: Sequence[Sequence[str]]) -> tuple[torch.Tensor, np.ndarray]:
        """One batch: ``(L + 1, total_tokens, dim)`` float32 on the device, sentences in input order, and
        each sentence's token offset (``len(sentences) + 1`` entries)."""
        validate_sentences(sentences)
        n_tokens = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(n_tokens, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return torch.zeros(self.n_layers, 0, self.output_dim, device=self.device), offsets

        # Every sentence's windows as model inputs, and for every token (input order) the rows of its subwords.
        inputs: list[list[int]] = []
        token_window = np.empty(total, dtype=np.int64)
        token_start = np.empty(total, dtype=np.int64)  # position of its first subword in its window's input
        token_count = np.empty(total, dtype=np.int64)
        position = 0
        for sentence, (ids, spans) in zip(sentences, split_sentences(self.tokenizer, sentences), strict=True):
            plan = plan_windows(spans, self.window, self.stride, tokens=sentence)
            first_window = len(inputs)
            for begin, end in plan.windows:
                inputs.append(self._prefix + ids[begin:end] + self._suffix)
            for k, (a, b) in enumerate(spans):
                w = plan.chosen[k]
                token_window[position] = first_window + w
                token_start[position] = len(self._prefix) + a - plan.windows[w][0]
                token_count[position] = b - a
                position += 1

        width = max(len(ids) for ids in inputs)
        input_ids = np.full((len(inputs), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(inputs), width), dtype=np.int64)
        for row, ids in enumerate(inputs):
            input_ids[row, : len(ids)] = ids
            mask[row, : len(ids)] = 1
        output = self.model(
            input_ids=to_device(input_ids, self.device),
            attention_mask=to_device(mask, self.device),
            output_hidden_states=True,
        )
        hidden = output.hidden_states
        if len(hidden) != self.n_layers:
            raise InvalidParameterError(
                f"{self.name}: the model gave {len(hidden)} hidden states, its config says {self.n_layers}"
            )
        # (L + 1, windows * width, dim): row r * width + p is position p of window r.
        flat = torch.stack(hidden).reshape(self.n_layers, len(inputs) * width, self.output_dim)
        base = token_window * width + token_start
        if self.subword == "first":
            out = flat.index_select(1, to_device(base, self.device)).float()
        elif self.subword == "last":
            out = flat.index_select(1, to_device(base + token_count - 1, self.device)).float()
        else:
            # The mean summed subword by subword, left to right, the same order in any batch.
            out = flat.index_select(1, to_device(base, self.device)).float()
            for k in range(1, int(token_count.max())):
                has = token_count > k
                rows = to_device(np.flatnonzero(has), self.device)
                out.index_add_(1, rows, flat.index_select(1, to_device(base[has] + k, self.device)).float())
            out /= to_device(token_count.astype(np.float32), self.device).view(1, -1, 1)
        return out.contiguous(), offsets
