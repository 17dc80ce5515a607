"""``elmo_cache.train``: pretrain an ELMo biLM the way bilm-tf does, resumably, on one or many processes.

The recipe (bilm-tf ``train_elmo.py`` / ``training.py``): both directions' losses
averaged; sampled softmax; dropout on every LSTM input and before the softmax;
Adagrad (lr 0.2, initial accumulator 1.0); gradients clipped to global norm 10;
truncated back-propagation over ``unroll`` steps with the LSTM state carried from
batch to batch.

Resuming: a checkpoint (model, optimizer, LSTM state, data position, every RNG) is
written every few minutes by rename, so a run killed at any moment (kill -9
included) continues from the last one when the same command runs again, and takes
the same steps an uninterrupted run would have taken. SIGTERM (what schedulers send
before they kill) and SIGINT (Ctrl-C) during the steps do not lose the minutes since:
the step in flight finishes, a checkpoint is written and the run returns, stopped
(``TrainResult.stopped_by``); a second signal acts at once, as it would have.

Data parallel (``nproc``, or started by torchrun): see :mod:`elmo_cache.train.distributed`
for what a step of N processes is; rank 0 writes the checkpoint and the model files.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from elmo_cache.errors import InvalidParameterError
from elmo_cache.model.options import ModelOptions
from elmo_cache.progress import progress_bar
from elmo_cache.threads import THREADS_ENV, apply_threads, usable_cpus
from elmo_cache.train.bilm import TrainableBiLM
from elmo_cache.train.checkpoint import CHECKPOINT_FILE, cpu_name, write_checkpoint
from elmo_cache.train.config import TrainOptions, TrainResult
from elmo_cache.train.data import TokenizedCorpus
from elmo_cache.train.distributed import Group, join, leave, rank_seed
from elmo_cache.train.files import VOCAB_FILE, write_model_dir
from elmo_cache.train.prepare import share
from elmo_cache.train.softmax import LogUniformSampler
from elmo_cache.train.step import StepLoss
from elmo_cache.train.vocab import Vocabulary

__all__ = ["train_rank"]

log = logging.getLogger(__name__)


def train_rank(corpus: str | os.PathLike[str], output: str | os.PathLike[str], options: TrainOptions) -> TrainResult:
    """Train as this process's rank: the only one, or one that torchrun started (it joins its group)."""
    group = join(options.device)
    try:
        return _run(corpus, Path(output), options, group)
    finally:
        leave(group)


def _threads(options: TrainOptions, group: Group) -> None:
    # Processes on one node share its cores: by default each takes its share, not all of them
    # (two processes of two threads each on two cores run several times slower than of one).
    if options.threads is None and group.local_world_size > 1 and not os.environ.get(THREADS_ENV):
        apply_threads(max(1, usable_cpus() // group.local_world_size))
    else:
        apply_threads(options.threads)


@dataclass
class _Position:
    """Where the run stands: what a checkpoint records besides the weights and generators."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    tokens: int = 0
    # Seconds trained by earlier runs of this output (resumed ones).
    seconds_before: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class _Window:
    """The sampled loss since the last log line."""

    loss: float = 0.0
    count: float = 0.0

    def add(self, value: float) -> None:
        self.loss += value
        self.count += 1

    def close(self, position: _Position) -> float:
        mean = self.loss / self.count
        position.history.append({"step": position.step, "tokens": position.tokens, "loss": mean})
        self.loss, self.count = 0.0, 0.0
        return mean


class _Signals:
    """SIGTERM and SIGINT while the steps run: the first is noted (the loop checkpoints and stops after the
    step in flight) and puts the previous handlers back, so that a second one acts as it would have (SIGINT:
    KeyboardInterrupt; SIGTERM: the process ends, the last checkpoint kept). Python sets handlers only in the
    main thread: elsewhere (a library caller's thread) the signals keep their handlers."""

    WATCHED = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for signum in self.WATCHED:
                self._previous[signum] = signal.signal(signum, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)
        self._restore()
        log.warning("%s received: checkpointing after this step, then stopping", self.received.name)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def __exit__(self, *exc: object) -> None:
        self._restore()


class _Run:
    """One rank's training run: the model and its optimizer, the data, the position, and the steps
    (:meth:`train`) between checkpoints (:meth:`save`)."""

    def __init__(self, corpus: str | os.PathLike[str], output: Path, options: TrainOptions, group: Group):
        self.output, self.options, self.group = output, options, group
        self.device = group.device
        if group.is_main:
            output.mkdir(parents=True, exist_ok=True)
        _threads(options, group)
        prepared = share(corpus, output, options, group)
        self.fingerprint = prepared.fingerprint
        self.vocab = Vocabulary(prepared.vocab_words)
        if group.is_main:
            self.vocab.save(output / VOCAB_FILE)
        self.data = TokenizedCorpus.from_file(corpus, self.vocab, prepared.model_options.max_characters_per_token)
        self.global_batch = options.batch_size * group.world_size
        self.per_epoch = self._batches_per_epoch(corpus)
        self.total_steps = self.per_epoch * options.epochs
        if options.max_steps is not None:
            self.total_steps = min(self.total_steps, options.max_steps)
        self._make_model(prepared.model_options)
        self.position = _Position()
        if group.distributed:
            torch.manual_seed(rank_seed(options.seed, group.rank))  # each rank its own dropout masks
        if prepared.start is not None and group.is_main:  # the others receive rank 0's weights from DDP
            prepared.start.load_into(self.model)
            log.info("starting from the weights of %s with a fresh optimizer", prepared.start.name)
        if prepared.checkpoint is not None:
            self._restore(prepared.checkpoint)
        self.resumed_from = self.position.step
        self.loss_of = StepLoss(self.model, self.sampler)
        if group.distributed:
            from torch.nn.parallel import DistributedDataParallel

            # Its constructor broadcasts rank 0's weights (the start model, or a checkpoint's).
            self.loss_of = DistributedDataParallel(  # type: ignore[assignment]
                self.loss_of, device_ids=[self.device] if self.device.type == "cuda" else None
            )
        self.started = time.monotonic()
        self.signals = _Signals()

    def _batches_per_epoch(self, corpus: str | os.PathLike[str]) -> int:
        options, group, data = self.options, self.group, self.data
        per_epoch = data.batches_per_epoch(self.global_batch, options.unroll, options.reset_share)
        if per_epoch < 1:
            rows = "" if options.reset_share is None else " (rows of whole sentences, --reset-share)"
            processes = f" x {group.world_size} processes" if group.distributed else ""
            raise InvalidParameterError(
                f"{corpus}: {data.n_tokens} tokens is too little text for batch_size {options.batch_size}{processes} x "
                f"unroll {options.unroll}{rows}; lower them (--batch-size, --unroll{', --nproc' if processes else ''})"
            )
        return per_epoch

    def _make_model(self, model_options: ModelOptions) -> None:
        options, device = self.options, self.device
        torch.manual_seed(options.seed)
        self.model = TrainableBiLM(model_options, len(self.vocab), dropout=options.dropout).to(device)
        self.optimizer = torch.optim.Adagrad(
            self.model.parameters(), lr=options.learning_rate, initial_accumulator_value=options.initial_accumulator
        )
        # Alike on every rank: each step's negatives are the same draw everywhere, as in one process.
        self.sampler = LogUniformSampler(len(self.vocab), options.num_sampled, seed=options.seed)
        self.char_table = torch.from_numpy(self.data.char_ids).to(device=device, dtype=torch.int32)
        self.my_rows = self.group.rows(options.batch_size)
        self.state = self.model.zero_state(options.batch_size, device)

    def _restore(self, checkpoint: dict[str, Any]) -> None:
        group, device = self.group, self.device
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.state = [
            (h[:, self.my_rows].to(device), c[:, self.my_rows].to(device)) for h, c in checkpoint["lstm_state"]
        ]
        self.position = _Position(
            checkpoint["step"],
            checkpoint["epoch"],
            checkpoint["batch_in_epoch"],
            checkpoint["tokens"],
            checkpoint["seconds"],
            checkpoint["history"],
        )
        torch.set_rng_state(checkpoint["torch_rngs"][group.rank] if group.distributed else checkpoint["torch_rng"])
        cuda_rngs = checkpoint.get("cuda_rngs") or [checkpoint.get("cuda_rng")]
        if device.type == "cuda" and cuda_rngs[group.rank if group.distributed else 0] is not None:
            torch.cuda.set_rng_state(cuda_rngs[group.rank if group.distributed else 0], device)
        self.sampler.rng.bit_generator.state = checkpoint["sampler_rng"]
        if group.is_main:
            at = self.position
            log.info("resuming %s at step %d (epoch %d, batch %d)", self.output, at.step, at.epoch, at.batch_in_epoch)

    def save(self) -> None:
        """Write the checkpoint and the model files. Collective: every rank hands in its rows of the LSTM
        state and its generators; rank 0 writes."""
        group, device, at = self.group, self.device, self.position
        full_state = [(group.gather_rows(h), group.gather_rows(c)) for h, c in self.state]
        ranks = group.all_gather((torch.get_rng_state(), os.getpid()))
        rngs = [rng for rng, _ in ranks]
        cuda_rngs = group.all_gather(torch.cuda.get_rng_state(device)) if device.type == "cuda" else [None]
        if not group.is_main:
            return
        write_model_dir(self.output, self.model, self.vocab)
        payload = {
            "fingerprint": self.fingerprint,
            "vocab_sha256": self.vocab.sha256,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lstm_state": [(h.cpu(), c.cpu()) for h, c in full_state],
            "step": at.step,
            "epoch": at.epoch,
            "batch_in_epoch": at.batch_in_epoch,
            "tokens": at.tokens,
            "seconds": at.seconds_before + (time.monotonic() - self.started),
            "history": at.history,
            "torch_rng": rngs[0],
            "cuda_rng": cuda_rngs[0],
            "sampler_rng": self.sampler.rng.bit_generator.state,
            "machine": {
                "device": str(device),
                "threads": torch.get_num_threads(),
                "cpu": cpu_name(),
                "processes": group.world_size,
                "pids": [pid for _, pid in ranks],  # of the ranks, in rank order: which processes wrote it
            },
        }
        if group.distributed:
            payload["torch_rngs"], payload["cuda_rngs"] = rngs, cuda_rngs
        write_checkpoint(self.output / CHECKPOINT_FILE, payload)

    def _step(self, batch: Any) -> torch.Tensor:
        """One optimiser step on ``batch``; returns this rank's loss."""
        device, options = self.device, self.options
        assert batch.counts is not None
        inputs = torch.from_numpy(batch.inputs).to(device=device, dtype=torch.int64)
        targets = torch.from_numpy(batch.targets).to(device)
        weights = torch.from_numpy(batch.weights).to(device)
        counts = torch.from_numpy(batch.counts).to(device=device, dtype=torch.float32)
        resets = None if batch.resets is None else torch.from_numpy(batch.resets).to(device)
        loss, final = self.loss_of(inputs, self.char_table, self.state, resets, targets, weights, counts)
        self.optimizer.zero_grad(set_to_none=True)
        # bilm-tf differentiates loss * unroll_steps: a per-token mean loss with the gradient
        # scale of a per-sequence sum, which is what lr 0.2 and clip 10 are tuned for. Times
        # the processes, because DDP averages the ranks' gradients and the global loss is their sum.
        (loss * (options.unroll * self.group.world_size)).backward()
        torch.nn.utils.clip_grad_norm_(self.params, options.clip_norm)
        self.optimizer.step()
        self.state = [(h.detach(), c.detach()) for h, c in final]
        at = self.position
        at.step += 1
        at.batch_in_epoch += 1
        at.tokens += int(batch.counts[0])
        return loss

    def _vote(self, loss: torch.Tensor, last_save: float) -> tuple[float, bool, bool]:
        """The step's global loss, and whether to save and whether to stop: rank 0's clock decides, so
        that every rank does it at the same step."""
        now, options = time.monotonic(), self.options
        decide = self.group.is_main
        due = decide and now - last_save >= options.checkpoint_seconds
        stop = decide and options.time_limit is not None and now - self.started >= options.time_limit
        # Any rank's signal stops every rank at this step (torchrun forwards SIGTERM to each).
        stop = stop or self.signals.received is not None
        report = torch.tensor([loss.item(), float(due), float(stop)], dtype=torch.float64, device=self.device)
        value, due_votes, stop_votes = self.group.all_reduce_sum(report).tolist()
        return value, due_votes > 0, stop_votes > 0

    def train(self) -> TrainResult:
        """Steps until ``total_steps``, the last epoch, the time limit or SIGTERM/SIGINT, saving every
        ``checkpoint_seconds`` and at the end."""
        options, at = self.options, self.position
        self.started = time.monotonic()
        last_save = self.started
        tokens_at_start = at.tokens
        show = options.progress and self.group.is_main
        bar = progress_bar(total=self.total_steps, initial=at.step, disable=not show, unit="step", desc="training")
        self.params = [p for p in self.model.parameters()]
        window = _Window()
        self.model.train()
        with self.signals:
            return self._train(bar, window, last_save, tokens_at_start)

    def _train(self, bar: Any, window: _Window, last_save: float, tokens_at_start: int) -> TrainResult:
        options, at = self.options, self.position
        stopped_early = False
        try:
            while at.step < self.total_steps and at.epoch < options.epochs:
                for batch in self.data.epoch_batches(
                    options.seed,
                    at.epoch,
                    self.global_batch,
                    options.unroll,
                    start=at.batch_in_epoch,
                    reset_share=options.reset_share,
                    part=self.my_rows,
                ):
                    if at.step >= self.total_steps:
                        break
                    loss = self._step(batch)
                    value, due, stop = self._vote(loss, last_save)
                    window.add(value)
                    rate = (at.tokens - tokens_at_start) / max(time.monotonic() - self.started, 1e-9)
                    bar.set_postfix(
                        epoch=at.epoch,
                        loss=f"{value:.3f}",
                        ppl=f"{math.exp(min(value, 50)):.1f}",
                        tok_s=f"{rate:,.0f}",
                    )
                    bar.update(1)
                    if due:
                        mean = window.close(at)
                        if self.group.is_main:
                            log.info(
                                "step %d/%d epoch %d: %d tokens, sampled loss %.4f, %.0f tokens/s",
                                *(at.step, self.total_steps, at.epoch, at.tokens, mean, rate),
                            )
                        self.save()
                        last_save = time.monotonic()
                    if stop:
                        stopped_early = True
                        break
                if stopped_early or at.step >= self.total_steps:
                    if at.batch_in_epoch >= self.per_epoch:
                        at.epoch, at.batch_in_epoch = at.epoch + 1, 0
                    break
                at.epoch, at.batch_in_epoch = at.epoch + 1, 0
        finally:
            bar.close()
        if window.count:
            window.close(at)
        self.save()
        seconds = time.monotonic() - self.started
        return TrainResult(
            output=self.output,
            steps=at.step,
            epoch=at.epoch,
            tokens=at.tokens,
            seconds=at.seconds_before + seconds,
            tokens_per_second=(at.tokens - tokens_at_start) / max(seconds, 1e-9),
            loss=at.history[-1]["loss"] if at.history else None,
            resumed_from_step=self.resumed_from,
            finished=at.step >= self.total_steps,
            history=at.history,
            stopped_by=None if self.signals.received is None else self.signals.received.name,
        )


def _run(corpus: str | os.PathLike[str], output: Path, options: TrainOptions, group: Group) -> TrainResult:
    return _Run(corpus, output, options, group).train()
