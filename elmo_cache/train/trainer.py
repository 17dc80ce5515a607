"""``elmo_cache.train``: pretrain an ELMo biLM the way bilm-tf does, resumably, on one or many processes.

The recipe (bilm-tf ``train_elmo.py`` / ``training.py``): both directions' losses
averaged; sampled softmax; dropout on every LSTM input and before the softmax;
Adagrad (lr 0.2, initial accumulator 1.0); gradients clipped to global norm 10;
truncated back-propagation over ``unroll`` steps with the LSTM state carried from
batch to batch.

Resuming: a checkpoint (model, optimizer, LSTM state, data position, every RNG) is
written every few minutes by rename, so a run killed at any moment (kill -9
included) continues from the last one when the same command runs again, and takes
the same steps an uninterrupted run would have taken.

Data parallel (``nproc``, or started by torchrun): see :mod:`elmo_cache.train.distributed`
for what a step of N processes is; rank 0 writes the checkpoint and the model files.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path

import torch

from elmo_cache.errors import InvalidParameterError
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


def _run(corpus: str | os.PathLike[str], output: Path, options: TrainOptions, group: Group) -> TrainResult:
    device = group.device
    if group.is_main:
        output.mkdir(parents=True, exist_ok=True)
    _threads(options, group)
    prepared = share(corpus, output, options, group)
    checkpoint, model_options, fingerprint = prepared.checkpoint, prepared.model_options, prepared.fingerprint
    vocab = Vocabulary(prepared.vocab_words)
    if group.is_main:
        vocab.save(output / VOCAB_FILE)

    data = TokenizedCorpus.from_file(corpus, vocab, model_options.max_characters_per_token)
    global_batch = options.batch_size * group.world_size
    per_epoch = data.batches_per_epoch(global_batch, options.unroll, options.reset_share)
    if per_epoch < 1:
        rows = "" if options.reset_share is None else " (rows of whole sentences, --reset-share)"
        processes = f" x {group.world_size} processes" if group.distributed else ""
        raise InvalidParameterError(
            f"{corpus}: {data.n_tokens} tokens is too little text for batch_size {options.batch_size}{processes} x "
            f"unroll {options.unroll}{rows}; lower them (--batch-size, --unroll{', --nproc' if processes else ''})"
        )
    total_steps = per_epoch * options.epochs
    if options.max_steps is not None:
        total_steps = min(total_steps, options.max_steps)

    torch.manual_seed(options.seed)
    model = TrainableBiLM(model_options, len(vocab), dropout=options.dropout).to(device)
    optimizer = torch.optim.Adagrad(
        model.parameters(), lr=options.learning_rate, initial_accumulator_value=options.initial_accumulator
    )
    # Alike on every rank: each step's negatives are the same draw everywhere, as in one process.
    sampler = LogUniformSampler(len(vocab), options.num_sampled, seed=options.seed)
    char_table = torch.from_numpy(data.char_ids).to(device=device, dtype=torch.int32)
    my_rows = group.rows(options.batch_size)
    state = model.zero_state(options.batch_size, device)
    step = epoch = batch_in_epoch = tokens = 0
    elapsed_before = 0.0
    history: list[dict[str, float]] = []
    if group.distributed:
        torch.manual_seed(rank_seed(options.seed, group.rank))  # each rank its own dropout masks
    if prepared.start is not None and group.is_main:  # the others receive rank 0's weights from DDP
        prepared.start.load_into(model)
        log.info("starting from the weights of %s with a fresh optimizer", prepared.start.name)
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        state = [(h[:, my_rows].to(device), c[:, my_rows].to(device)) for h, c in checkpoint["lstm_state"]]
        step, epoch, batch_in_epoch = checkpoint["step"], checkpoint["epoch"], checkpoint["batch_in_epoch"]
        tokens, elapsed_before, history = checkpoint["tokens"], checkpoint["seconds"], checkpoint["history"]
        torch.set_rng_state(checkpoint["torch_rngs"][group.rank] if group.distributed else checkpoint["torch_rng"])
        cuda_rngs = checkpoint.get("cuda_rngs") or [checkpoint.get("cuda_rng")]
        if device.type == "cuda" and cuda_rngs[group.rank if group.distributed else 0] is not None:
            torch.cuda.set_rng_state(cuda_rngs[group.rank if group.distributed else 0], device)
        sampler.rng.bit_generator.state = checkpoint["sampler_rng"]
        if group.is_main:
            log.info("resuming %s at step %d (epoch %d, batch %d)", output, step, epoch, batch_in_epoch)
    resumed_from = step
    loss_of = StepLoss(model, sampler)
    if group.distributed:
        from torch.nn.parallel import DistributedDataParallel

        # Its constructor broadcasts rank 0's weights (the start model, or a checkpoint's).
        loss_of = DistributedDataParallel(loss_of, device_ids=[device] if device.type == "cuda" else None)  # type: ignore[assignment]

    def save() -> None:
        # Collective: every rank hands in its rows of the LSTM state and its generators.
        full_state = [(group.gather_rows(h), group.gather_rows(c)) for h, c in state]
        ranks = group.all_gather((torch.get_rng_state(), os.getpid()))
        rngs = [rng for rng, _ in ranks]
        cuda_rngs = group.all_gather(torch.cuda.get_rng_state(device)) if device.type == "cuda" else [None]
        if not group.is_main:
            return
        write_model_dir(output, model, vocab)
        payload = {
            "fingerprint": fingerprint,
            "vocab_sha256": vocab.sha256,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "lstm_state": [(h.cpu(), c.cpu()) for h, c in full_state],
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "tokens": tokens,
            "seconds": elapsed_before + (time.monotonic() - started),
            "history": history,
            "torch_rng": rngs[0],
            "cuda_rng": cuda_rngs[0],
            "sampler_rng": sampler.rng.bit_generator.state,
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
        write_checkpoint(output / CHECKPOINT_FILE, payload)

    from tqdm.auto import tqdm

    started = time.monotonic()
    last_save = started
    tokens_at_start = tokens
    show = options.progress and group.is_main
    bar = tqdm(total=total_steps, initial=step, disable=not show, unit="step", dynamic_ncols=True)
    params = [p for p in model.parameters()]
    window_loss, window_count = 0.0, 0.0
    stopped_early = False
    model.train()
    try:
        while step < total_steps and epoch < options.epochs:
            for batch in data.epoch_batches(
                options.seed,
                epoch,
                global_batch,
                options.unroll,
                start=batch_in_epoch,
                reset_share=options.reset_share,
                part=my_rows,
            ):
                if step >= total_steps:
                    break
                assert batch.counts is not None
                inputs = torch.from_numpy(batch.inputs).to(device=device, dtype=torch.int64)
                targets = torch.from_numpy(batch.targets).to(device)
                weights = torch.from_numpy(batch.weights).to(device)
                counts = torch.from_numpy(batch.counts).to(device=device, dtype=torch.float32)
                resets = None if batch.resets is None else torch.from_numpy(batch.resets).to(device)
                loss, final = loss_of(inputs, char_table, state, resets, targets, weights, counts)
                optimizer.zero_grad(set_to_none=True)
                # bilm-tf differentiates loss * unroll_steps: a per-token mean loss with the gradient
                # scale of a per-sequence sum, which is what lr 0.2 and clip 10 are tuned for. Times
                # the processes, because DDP averages the ranks' gradients and the global loss is their sum.
                (loss * (options.unroll * group.world_size)).backward()
                torch.nn.utils.clip_grad_norm_(params, options.clip_norm)
                optimizer.step()
                state = [(h.detach(), c.detach()) for h, c in final]
                step += 1
                batch_in_epoch += 1
                tokens += int(batch.counts[0])
                now = time.monotonic()
                # Rank 0's clock decides when to save or stop, so that every rank does it at the same step.
                decide = group.is_main
                due = decide and now - last_save >= options.checkpoint_seconds
                stop = decide and options.time_limit is not None and now - started >= options.time_limit
                report = torch.tensor([loss.item(), float(due), float(stop)], dtype=torch.float64, device=device)
                value, due_votes, stop_votes = group.all_reduce_sum(report).tolist()
                due, stop = due_votes > 0, stop_votes > 0
                window_loss += value
                window_count += 1
                rate = (tokens - tokens_at_start) / max(now - started, 1e-9)
                bar.set_postfix(
                    epoch=epoch, loss=f"{value:.3f}", ppl=f"{math.exp(min(value, 50)):.1f}", tok_s=f"{rate:,.0f}"
                )
                bar.update(1)
                if due:
                    history.append({"step": step, "tokens": tokens, "loss": window_loss / window_count})
                    if group.is_main:
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
                if stop:
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
