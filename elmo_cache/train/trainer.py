"""``elmo_cache.train``: pretrain an ELMo biLM the way bilm-tf does, resumably.

The recipe (bilm-tf ``train_elmo.py`` / ``training.py``): both directions' losses
averaged; sampled softmax; dropout on every LSTM input and before the softmax;
Adagrad (lr 0.2, initial accumulator 1.0); gradients clipped to global norm 10;
truncated back-propagation over ``unroll`` steps with the LSTM state carried from
batch to batch.

Resuming: a checkpoint (model, optimizer, LSTM state, data position, every RNG) is
written every few minutes by rename, so a run killed at any moment (kill -9
included) continues from the last one when the same command runs again, and takes
the same steps an uninterrupted run would have taken.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from elmo_cache.errors import CacheExistsError, CorpusError, InvalidParameterError
from elmo_cache.model.hub import file_sha256
from elmo_cache.model.options import ModelOptions
from elmo_cache.threads import apply_threads
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.data import TokenizedCorpus, count_tokens
from elmo_cache.train.files import OPTIONS_FILE, VOCAB_FILE, WEIGHTS_FILE, load_trained_model, write_model_dir
from elmo_cache.train.presets import train_preset
from elmo_cache.train.softmax import LogUniformSampler, sampled_softmax_loss
from elmo_cache.train.vocab import Vocabulary

__all__ = ["TrainOptions", "TrainResult", "train", "CHECKPOINT_FILE"]

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass(frozen=True)
class TrainOptions:
    """How to train; the fields marked *fixed* must not change when a run resumes."""

    # Model size: a preset name (tiny, base, small, medium, original) ... (fixed)
    preset: str = "base"
    # ... or an options.json in the bilm-tf schema, which wins over the preset (fixed).
    options_file: str | None = None
    # A vocab.txt to use as is (first lines <S>, </S>, <UNK>); default: built from the corpus (fixed).
    vocab_file: str | None = None
    # A trained model directory to start from: its options, vocabulary, weights and softmax, with a
    # fresh optimizer (how to go on from a model whose checkpoint is gone) (fixed).
    init_from: str | None = None
    # Words seen fewer times than this are <UNK> as softmax targets (fixed).
    min_count: int = 3
    # At most this many softmax rows, the most frequent words (fixed).
    max_vocab: int | None = None
    # Rows of the stream read in parallel (fixed).
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
        positive = ("batch_size", "unroll", "num_sampled", "epochs", "min_count")
        for name in positive:
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise InvalidParameterError(f"dropout: must be in [0, 1), got {self.dropout}")
        for name in ("learning_rate", "clip_norm", "checkpoint_seconds"):
            if getattr(self, name) <= 0:
                raise InvalidParameterError(f"{name}: must be positive, got {getattr(self, name)}")
        if self.init_from is not None and (self.options_file is not None or self.vocab_file is not None):
            raise InvalidParameterError(
                "init_from brings its own options and vocabulary: drop options_file / vocab_file"
            )
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


def _model_options(options: TrainOptions) -> ModelOptions:
    if options.init_from is not None:
        return ModelOptions.from_file(Path(options.init_from) / OPTIONS_FILE)
    if options.options_file is not None:
        return ModelOptions.from_file(options.options_file)
    return train_preset(options.preset)


def _resolve_device(device: str | None) -> torch.device:
    from elmo_cache.hardware import resolve_device as resolve

    return resolve(device)


def train(
    corpus: str | os.PathLike[str], output: str | os.PathLike[str], options: TrainOptions | None = None
) -> TrainResult:
    """Train a biLM on ``corpus`` (one sentence per line, whitespace tokens) into ``output``.

    ``output`` receives options.json, weights.hdf5, vocab.txt, softmax.hdf5 and checkpoint.pt.
    Running again with the same corpus and fixed options resumes from the checkpoint.
    """
    options = options or TrainOptions()
    options.validate()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    device = _resolve_device(options.device)
    apply_threads(options.threads)
    if not Path(corpus).is_file():
        raise CorpusError(f"training corpus not found (a file is needed: training reads it every epoch): {corpus}")
    model_options = _model_options(options)
    corpus_sha = file_sha256(corpus)
    fingerprint = {**options.fixed(), "model": model_options.to_dict(), "corpus_sha256": corpus_sha}
    if options.init_from is not None:  # only when set, so that older checkpoints still resume
        fingerprint["init_from"] = options.init_from
        fingerprint["init_weights_sha256"] = file_sha256(Path(options.init_from) / WEIGHTS_FILE)

    checkpoint_path = output / CHECKPOINT_FILE
    checkpoint = _load_checkpoint(checkpoint_path, fingerprint, options.overwrite)
    if checkpoint is not None:
        vocab = Vocabulary.load(output / VOCAB_FILE)
        if vocab.sha256 != checkpoint["vocab_sha256"]:
            raise InvalidParameterError(
                f"{output / VOCAB_FILE} changed since the checkpoint; use --overwrite to restart"
            )
    elif options.init_from is not None:
        vocab = Vocabulary.load(Path(options.init_from) / VOCAB_FILE)
    elif options.vocab_file is not None:
        vocab = Vocabulary.load(options.vocab_file)
    else:
        vocab = Vocabulary.from_counts(count_tokens(corpus), min_count=options.min_count, max_size=options.max_vocab)
    vocab.save(output / VOCAB_FILE)

    data = TokenizedCorpus.from_file(corpus, vocab, model_options.max_characters_per_token)
    per_epoch = data.batches_per_epoch(options.batch_size, options.unroll, options.reset_share)
    if per_epoch < 1:
        rows = "" if options.reset_share is None else " (rows of whole sentences, --reset-share)"
        raise InvalidParameterError(
            f"{corpus}: {data.n_tokens} tokens is too little text for batch_size {options.batch_size} x unroll "
            f"{options.unroll}{rows}; lower them (--batch-size, --unroll)"
        )
    total_steps = per_epoch * options.epochs
    if options.max_steps is not None:
        total_steps = min(total_steps, options.max_steps)

    torch.manual_seed(options.seed)
    model = TrainableBiLM(model_options, len(vocab), dropout=options.dropout).to(device)
    optimizer = torch.optim.Adagrad(
        model.parameters(), lr=options.learning_rate, initial_accumulator_value=options.initial_accumulator
    )
    sampler = LogUniformSampler(len(vocab), options.num_sampled, seed=options.seed)
    char_table = torch.from_numpy(data.char_ids).to(device=device, dtype=torch.int32)
    state = model.zero_state(options.batch_size, device)
    step = epoch = batch_in_epoch = tokens = 0
    elapsed_before = 0.0
    history: list[dict[str, float]] = []
    if checkpoint is None and options.init_from is not None:
        start, _ = load_trained_model(options.init_from)
        model.load_state_dict(start.state_dict())
        log.info("starting from the weights of %s with a fresh optimizer", options.init_from)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        state = [(h.to(device), c.to(device)) for h, c in checkpoint["lstm_state"]]
        step, epoch, batch_in_epoch = checkpoint["step"], checkpoint["epoch"], checkpoint["batch_in_epoch"]
        tokens, elapsed_before, history = checkpoint["tokens"], checkpoint["seconds"], checkpoint["history"]
        torch.set_rng_state(checkpoint["torch_rng"])
        if device.type == "cuda" and checkpoint.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(checkpoint["cuda_rng"], device)
        sampler.rng.bit_generator.state = checkpoint["sampler_rng"]
        log.info("resuming %s at step %d (epoch %d, batch %d)", output, step, epoch, batch_in_epoch)
    resumed_from = step

    def save() -> None:
        write_model_dir(output, model, vocab)
        payload = {
            "fingerprint": fingerprint,
            "vocab_sha256": vocab.sha256,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lstm_state": [(h.cpu(), c.cpu()) for h, c in state],
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "tokens": tokens,
            "seconds": elapsed_before + (time.monotonic() - started),
            "history": history,
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "sampler_rng": sampler.rng.bit_generator.state,
            "machine": {"device": str(device), "threads": torch.get_num_threads(), "cpu": _cpu_name()},
        }
        tmp = checkpoint_path.with_name(checkpoint_path.name + ".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, checkpoint_path)

    from tqdm.auto import tqdm

    started = time.monotonic()
    last_save = started
    tokens_at_start = tokens
    bar = tqdm(total=total_steps, initial=step, disable=not options.progress, unit="step", dynamic_ncols=True)
    params = [p for p in model.parameters()]
    window_loss, window_count = 0.0, 0.0
    stopped_early = False
    model.train()
    try:
        while step < total_steps and epoch < options.epochs:
            for batch in data.epoch_batches(
                options.seed,
                epoch,
                options.batch_size,
                options.unroll,
                start=batch_in_epoch,
                reset_share=options.reset_share,
            ):
                if step >= total_steps:
                    break
                inputs = torch.from_numpy(batch.inputs).to(device=device, dtype=torch.int64)
                targets = torch.from_numpy(batch.targets).to(device)
                weights = torch.from_numpy(batch.weights).to(device)
                resets = None if batch.resets is None else torch.from_numpy(batch.resets).to(device)
                _, outputs, final = model(inputs, char_table, state, resets)
                hidden = model.top_hidden(outputs)
                per_row = sampled_softmax_loss(
                    hidden.reshape(-1, hidden.shape[-1]),
                    targets.reshape(-1),
                    weights.reshape(-1),
                    model.softmax_weight,
                    model.softmax_bias,
                    sampler,
                ).view(2, -1)
                counts = weights.view(2, -1).sum(1).clamp_min(1.0)
                loss = (per_row.sum(1) / counts).mean()
                optimizer.zero_grad(set_to_none=True)
                # bilm-tf differentiates loss * unroll_steps: a per-token mean loss with the gradient
                # scale of a per-sequence sum, which is what lr 0.2 and clip 10 are tuned for.
                (loss * options.unroll).backward()
                torch.nn.utils.clip_grad_norm_(params, options.clip_norm)
                optimizer.step()
                state = [(h.detach(), c.detach()) for h, c in final]
                step += 1
                batch_in_epoch += 1
                tokens += int(batch.weights[0].sum())
                value = loss.item()
                window_loss += value
                window_count += 1
                now = time.monotonic()
                rate = (tokens - tokens_at_start) / max(now - started, 1e-9)
                bar.set_postfix(
                    epoch=epoch, loss=f"{value:.3f}", ppl=f"{math.exp(min(value, 50)):.1f}", tok_s=f"{rate:,.0f}"
                )
                bar.update(1)
                if now - last_save >= options.checkpoint_seconds:
                    history.append({"step": step, "tokens": tokens, "loss": window_loss / window_count})
                    log.info(
                        "step %d/%d epoch %d: %d tokens, sampled loss %.4f, %.0f tokens/s",
                        step,
                        total_steps,
                        epoch,
                        tokens,
                        window_loss / window_count,
                        rate,
                    )
                    window_loss, window_count = 0.0, 0.0
                    save()
                    last_save = time.monotonic()
                if options.time_limit is not None and now - started >= options.time_limit:
                    stopped_early = True
                    break
            if stopped_early or step >= total_steps:
                if batch_in_epoch >= per_epoch:
                    epoch, batch_in_epoch = epoch + 1, 0
                break
            epoch, batch_in_epoch = epoch + 1, 0
    finally:
        bar.close()
    if window_count:
        history.append({"step": step, "tokens": tokens, "loss": window_loss / window_count})
    save()
    seconds = time.monotonic() - started
    return TrainResult(
        output=output,
        steps=step,
        epoch=epoch,
        tokens=tokens,
        seconds=elapsed_before + seconds,
        tokens_per_second=(tokens - tokens_at_start) / max(seconds, 1e-9),
        loss=history[-1]["loss"] if history else None,
        resumed_from_step=resumed_from,
        finished=step >= total_steps,
        history=history,
    )


def _load_checkpoint(path: Path, fingerprint: dict[str, Any], overwrite: bool) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    # weights_only: unpickling may run code, and a checkpoint can come from anyone; it holds only
    # tensors, numbers, strings, lists and dicts, which the restricted loader reads.
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if checkpoint.get("fingerprint") == fingerprint:
        return checkpoint
    if overwrite:
        log.warning("%s: made with other settings; starting over (--overwrite)", path)
        return None
    old = checkpoint.get("fingerprint", {})
    changed = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
    raise CacheExistsError(
        f"{path.parent} holds a training run with other settings ({', '.join(changed)} differ); "
        "run with the same corpus and settings to resume, or pass --overwrite to start over"
    )


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
