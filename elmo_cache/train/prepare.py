"""Before the first step: what model, which vocabulary, and where to resume from.

Rank 0 decides (it alone needs the output directory and the starting model; on many nodes
the others may not see them) and every rank receives the decision; every rank checks that
its own corpus is the one rank 0 read, since each reads its rows from its own copy.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_cache.errors import CorpusError, ElmoCacheError, InvalidParameterError
from elmo_cache.model.hub import file_sha256
from elmo_cache.model.options import ModelOptions
from elmo_cache.train.checkpoint import CHECKPOINT_FILE, load_checkpoint
from elmo_cache.train.config import TrainOptions
from elmo_cache.train.data import count_tokens
from elmo_cache.train.distributed import Group
from elmo_cache.train.files import VOCAB_FILE
from elmo_cache.train.init import StartingModel, resolve_start
from elmo_cache.train.presets import train_preset
from elmo_cache.train.vocab import Vocabulary

__all__ = ["Prepared", "plan", "prepare", "share"]


@dataclass(frozen=True)
class Prepared:
    """Rank 0's decisions, which every rank trains by."""

    # The model's shape.
    model_options: ModelOptions
    # What the checkpoint must match (fixed settings, model, corpus sha256, start, processes).
    fingerprint: dict[str, Any]
    # The softmax's words, in id order.
    vocab_words: list[str]
    # The checkpoint to resume from, or None for a fresh start.
    checkpoint: dict[str, Any] | None
    # The model to start from (when fresh and --init-from); only rank 0 loads it.
    start: StartingModel | None


def plan(
    corpus: str | os.PathLike[str], options: TrainOptions, world_size: int
) -> tuple[ModelOptions, dict[str, Any], StartingModel | None]:
    """``(model options, fingerprint, starting model)`` of a run; the cheap checks (corpus file,
    start model, options) that a launcher runs once before it starts any process."""
    if not Path(corpus).is_file():
        raise CorpusError(f"training corpus not found (a file is needed: training reads it every epoch): {corpus}")
    start = None if options.init_from is None else resolve_start(options.init_from, vocab_file=options.vocab_file)
    if start is not None:
        model_options = start.options
    elif options.options_file is not None:
        model_options = ModelOptions.from_file(options.options_file)
    else:
        model_options = train_preset(options.preset)
    fingerprint = {**options.fixed(), "model": model_options.to_dict(), "corpus_sha256": file_sha256(corpus)}
    if start is not None:  # only when set, so that older checkpoints still resume
        fingerprint.update(start.fingerprint())
    if world_size > 1:  # likewise: single-process checkpoints predate the key
        fingerprint["world_size"] = world_size
    return model_options, fingerprint, start


def prepare(corpus: str | os.PathLike[str], output: Path, options: TrainOptions, world_size: int) -> Prepared:
    """Rank 0's part: plan, check the checkpoint, choose the vocabulary."""
    model_options, fingerprint, start = plan(corpus, options, world_size)
    checkpoint = load_checkpoint(output / CHECKPOINT_FILE, fingerprint, options.overwrite)
    if checkpoint is not None:
        vocab = Vocabulary.load(output / VOCAB_FILE)
        if vocab.sha256 != checkpoint["vocab_sha256"]:
            raise InvalidParameterError(
                f"{output / VOCAB_FILE} changed since the checkpoint; use --overwrite to restart"
            )
    elif start is not None and start.has_softmax:
        vocab = start.vocabulary()  # type: ignore[assignment]
    elif options.vocab_file is not None:
        vocab = Vocabulary.load(options.vocab_file)
    else:
        vocab = Vocabulary.from_counts(count_tokens(corpus), min_count=options.min_count, max_size=options.max_vocab)
    return Prepared(model_options, fingerprint, list(vocab.words), checkpoint, None if checkpoint else start)


def share(corpus: str | os.PathLike[str], output: Path, options: TrainOptions, group: Group) -> Prepared:
    """Rank 0 prepares; every rank gets its decisions, or raises the error it met (all together,
    so that no rank waits in a collective for one that has given up)."""
    outcome: Prepared | ElmoCacheError | None = None
    if group.is_main:
        try:
            outcome = prepare(corpus, output, options, group.world_size)
        except ElmoCacheError as exc:
            outcome = exc
    outcome = group.broadcast(outcome)
    if isinstance(outcome, ElmoCacheError):
        raise outcome
    assert isinstance(outcome, Prepared)
    if group.distributed:
        expected = outcome.fingerprint["corpus_sha256"]
        mine = file_sha256(corpus) if Path(corpus).is_file() else None
        differ = [rank for rank, sha in enumerate(group.all_gather(mine)) if sha != expected]
        if differ:
            raise CorpusError(
                f"{corpus}: the corpus of rank(s) {differ} differs from rank 0's (or is missing): every process "
                "reads its rows from its own copy, so every node needs the same file"
            )
    return outcome
