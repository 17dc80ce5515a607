"""The settings of a training run and what it reports (``elmo-cache train``'s options)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError

__all__ = ["TrainOptions", "TrainResult", "PERPLEXITY_MODES"]

PERPLEXITY_MODES = ("stream", "sentence", "warm")
"""How ``perplexity`` runs the LSTM over a text (elmo_cache.train.evaluate); here, where no torch is needed."""


@dataclass(frozen=True)
class TrainOptions:
    """How to train; the fields marked *fixed* must not change when a run resumes."""

    # Model size: a preset name (tiny, base, small, medium, original) ... (fixed)
    preset: str = "base"
    # ... or an options.json in the bilm-tf schema, which wins over the preset (fixed).
    options_file: str | None = None
    # A vocab.txt to use as is (first lines <S>, </S>, <UNK>); default: built from the corpus (fixed).
    vocab_file: str | None = None
    # A model to start from, with a fresh optimizer (fixed): a directory this trainer wrote (options,
    # vocabulary, weights and softmax all carry on: how to go on from a model whose checkpoint is
    # gone), or any bilm-tf model named as `build --model` names one (a published name, "bundled", a
    # directory with options and weights only): its weights carry on under a fresh softmax over this
    # corpus's vocabulary (domain adaptation; see elmo_cache.train.init).
    init_from: str | None = None
    # Words seen fewer times than this are <UNK> as softmax targets (fixed).
    min_count: int = 3
    # At most this many softmax rows, the most frequent words (fixed).
    max_vocab: int | None = None
    # Rows of the stream read in parallel by each process; the global batch is batch_size x processes (fixed).
    batch_size: int = 128
    # Steps of truncated back-propagation; the LSTM state carries on across batches (fixed).
    unroll: int = 20
    # Distinct negative samples per batch for the sampled softmax (fixed).
    num_sampled: int = 8192
    # Dropout on every LSTM input and before the softmax (fixed).
    dropout: float = 0.1
    # Adagrad learning rate and initial accumulator (fixed).
    learning_rate: float = 0.2
    initial_accumulator: float = 1.0
    # Global gradient-norm clip (fixed).
    clip_norm: float = 10.0
    # Seeds the weights, the shuffles, dropout and the sampler (fixed).
    seed: int = 0
    # None: bilm-tf's stream, LSTM state carried through every sentence. A share in [0, 1]: rows
    # begin at sentence starts and that share of sentences starts from the zero state, the state
    # the encoder starts every sentence from, so the model learns to begin without context (fixed).
    reset_share: float | None = None
    # Passes over the corpus; may be raised to continue a finished run.
    epochs: int = 10
    # Stop after this many optimizer steps in total (None: no limit).
    max_steps: int | None = None
    # Stop (with a checkpoint) after this many seconds of this invocation (None: no limit).
    time_limit: float | None = None
    # Seconds between checkpoints; the model files are rewritten at each one.
    checkpoint_seconds: float = 300.0
    # "cpu", "cuda" or "cuda:N"; None: CUDA when available.
    device: str | None = None
    # CPU threads for torch (None: $ELMO_CACHE_THREADS, else the CPUs this process may use).
    threads: int | None = None
    # Show a progress bar.
    progress: bool = True
    # Discard a checkpoint made with other fixed settings instead of refusing to resume.
    overwrite: bool = False
    # Local processes training data-parallel (torch.distributed; torchrun's elastic launcher starts
    # them): each reads its own batch_size rows of a global batch of batch_size x nproc rows and the
    # step is that global batch's, learning rate unchanged. A checkpoint resumes with as many
    # processes only. 1: this process trains alone (or joins the group torchrun started it in).
    nproc: int = 1
    # With nproc > 1: how often the launcher restarts the whole group after a process fails (each
    # restart resumes from the last checkpoint); 0: fail, and the same command resumes.
    max_restarts: int = 0

    _FIXED = (
        "preset",
        "options_file",
        "vocab_file",
        "min_count",
        "max_vocab",
        "batch_size",
        "unroll",
        "num_sampled",
        "dropout",
        "learning_rate",
        "initial_accumulator",
        "clip_norm",
        "seed",
    )

    def validate(self) -> None:
        positive = ("batch_size", "unroll", "num_sampled", "epochs", "min_count", "nproc")
        for name in positive:
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidParameterError(f"dropout: must be in [0, 1), got {self.dropout}")
        for name in ("learning_rate", "clip_norm", "checkpoint_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidParameterError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.init_from is not None and self.options_file is not None:
            raise InvalidParameterError("init_from brings its own options (the model's shape): drop options_file")
        if self.max_restarts < 0:
            raise InvalidParameterError(f"max_restarts: must be >= 0, got {self.max_restarts}")
        if self.reset_share is not None and not 0.0 <= self.reset_share <= 1.0:
            raise InvalidParameterError(f"reset_share: must be in [0, 1], got {self.reset_share}")
        if self.initial_accumulator <= 0:
            raise InvalidParameterError(f"initial_accumulator: must be positive, got {self.initial_accumulator}")

    def fixed(self) -> dict[str, Any]:
        fixed = {name: getattr(self, name) for name in self._FIXED}
        if self.reset_share is not None:  # only when set, so that older checkpoints still resume
            fixed["reset_share"] = self.reset_share
        return fixed


@dataclass
class TrainResult:
    """What a call to :func:`train` did."""

    output: Path
    steps: int
    epoch: int
    tokens: int
    seconds: float
    tokens_per_second: float
    loss: float | None
    resumed_from_step: int
    finished: bool
    history: list[dict[str, float]] = field(default_factory=list)
    # The signal (SIGTERM or SIGINT) that stopped the run after a checkpoint, or None.
    stopped_by: str | None = None
