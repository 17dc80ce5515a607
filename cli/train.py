"""``elmo-cache train``: pretrain a biLM into a model directory (thin wrapper over elmo_cache.train)."""

from __future__ import annotations

import os
import signal
import sys

import click

from elmo_cache.train.presets import TRAIN_PRESETS

__all__ = ["train_command"]

_EPILOG = """\b
Writes MODEL_DIR/options.json + weights.hdf5 (the bilm-tf layout: `elmo-cache build
--model MODEL_DIR` and allennlp's Elmo read them), vocab.txt + softmax.hdf5 (for
`elmo-cache perplexity` or further training) and checkpoint.pt. SIGTERM or Ctrl-C
while training: the step in flight finishes, a checkpoint is written and the
command exits 143 (SIGTERM) or 130 (Ctrl-C); a second signal stops at once. After
any interruption (kill -9 included), run the same command again: it resumes from
the last checkpoint and takes the steps an uninterrupted run takes. Raise --epochs
to continue a finished run. A first try: --preset tiny --max-steps 100 (minutes).

\b
Data parallel: --nproc N trains with N processes (torch.distributed: gloo on the
CPU, NCCL with one GPU each on CUDA). The global batch is --batch-size x N rows;
each process reads its own --batch-size rows of it; gradients are those of the
global batch's loss and the learning rate is unchanged: N processes take the steps
one process with --batch-size x N would. Resume with the same N. Many nodes: run
this command under torchrun (without --nproc) on every node, e.g.
  torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d \\
    --rdzv-endpoint HOST:29400 --rdzv-id RUN --no-python elmo-cache train ...
(docs/TRAINING.md).
"""


@click.command("train", epilog=_EPILOG)
@click.argument("corpus", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "output", required=True, type=click.Path(file_okay=False), help="Model directory.")
@click.option(
    "--preset",
    default="base",
    show_default=True,
    type=click.Choice(list(TRAIN_PRESETS)),
    help="Model size (base: ~3M parameters, 256-d vectors; tiny: a first try in minutes).",
)
@click.option(
    "--options",
    "options_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="An options.json (bilm-tf schema) instead of a preset.",
)
@click.option(
    "--vocab",
    "vocab_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Use this vocab.txt (first lines <S>, </S>, <UNK>) instead of building one.",
)
@click.option(
    "--init-from",
    default=None,
    type=str,
    help="Start from a model with a fresh optimizer: a directory `train` wrote (weights, softmax and "
    "vocabulary go on), or any bilm-tf model: a published name, 'bundled', an NLPL directory or .zip, or a "
    "directory with options and weights only (a fresh softmax over this corpus's vocabulary: domain adaptation).",
)
@click.option("--min-count", type=int, default=3, show_default=True, help="Rarer words are <UNK> as targets.")
@click.option("--max-vocab", type=int, default=None, help="At most this many softmax words.")
@click.option("--epochs", type=int, default=10, show_default=True, help="Passes over the corpus.")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps in total.")
@click.option("--time-limit", type=float, default=None, help="Stop after this many minutes (checkpointed).")
@click.option(
    "--batch-size",
    type=int,
    default=128,
    show_default=True,
    help="Parallel rows of the text stream, per process (global batch: this x --nproc).",
)
@click.option("--unroll", type=int, default=20, show_default=True, help="Steps of back-propagation through time.")
@click.option("--num-sampled", type=int, default=8192, show_default=True, help="Negative samples of the softmax.")
@click.option("--dropout", type=float, default=0.1, show_default=True)
@click.option("--learning-rate", type=float, default=0.2, show_default=True, help="Adagrad learning rate.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--reset-share",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Train for the encoder's use: rows begin at sentence starts and this share of sentences "
    "starts from the zero state (default: bilm-tf's carried state throughout).",
)
@click.option("--checkpoint-minutes", type=float, default=5.0, show_default=True)
@click.option("--device", default=None, help="cpu, cuda or cuda:N. Default: CUDA when available.")
@click.option(
    "--threads",
    type=int,
    default=None,
    help="CPU threads for torch. Default: $ELMO_CACHE_THREADS, else the CPUs this process may use.",
)
@click.option(
    "--nproc",
    type=int,
    default=1,
    show_default=True,
    help="Train data-parallel with this many local processes (torchrun's launcher; gloo on the CPU, "
    "one GPU each with NCCL). Threads per process default to the CPUs / N.",
)
@click.option(
    "--max-restarts",
    type=int,
    default=0,
    show_default=True,
    help="With --nproc: restart the group this often after a process dies (resuming from the last "
    "checkpoint) instead of stopping.",
)
@click.option("--overwrite", is_flag=True, help="Start over even if MODEL_DIR holds a run with other settings.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def train_command(
    corpus: str,
    output: str,
    preset: str,
    options_file: str | None,
    vocab_file: str | None,
    init_from: str | None,
    min_count: int,
    max_vocab: int | None,
    epochs: int,
    max_steps: int | None,
    time_limit: float | None,
    batch_size: int,
    unroll: int,
    num_sampled: int,
    dropout: float,
    learning_rate: float,
    seed: int,
    reset_share: float | None,
    checkpoint_minutes: float,
    device: str | None,
    threads: int | None,
    nproc: int,
    max_restarts: int,
    overwrite: bool,
    no_progress: bool,
) -> None:
    """Pretrain an ELMo biLM on CORPUS (one sentence per line, whitespace tokens) the way bilm-tf does."""
    from elmo_cache.encoder.names import check_device_name
    from elmo_cache.threads import choose_threads
    from elmo_cache.train.config import TrainOptions

    options = TrainOptions(
        preset=preset,
        options_file=options_file,
        vocab_file=vocab_file,
        init_from=init_from,
        min_count=min_count,
        max_vocab=max_vocab,
        epochs=epochs,
        max_steps=max_steps,
        time_limit=None if time_limit is None else time_limit * 60.0,
        batch_size=batch_size,
        unroll=unroll,
        num_sampled=num_sampled,
        dropout=dropout,
        learning_rate=learning_rate,
        seed=seed,
        reset_share=reset_share,
        checkpoint_seconds=checkpoint_minutes * 60.0,
        device=device,
        threads=threads,
        nproc=nproc,
        max_restarts=max_restarts,
        overwrite=overwrite,
        progress=not no_progress,
    )
    # Checked before torch is imported (train imports it): a typo costs no import, no model.
    options.validate()
    check_device_name(device)
    choose_threads(threads)
    from elmo_cache.train.api import train

    result = train(corpus, output, options)
    from elmo_cache.train.distributed import launched_by_torchrun

    if launched_by_torchrun() and os.environ.get("RANK") != "0":
        return  # under torchrun every rank returns the same result: rank 0 reports it
    if result.finished:
        state = "finished"
    elif result.stopped_by:
        state = f"stopped by {result.stopped_by}, checkpoint written (run the same command to continue)"
    else:
        state = "stopped (run the same command to continue)"
    resumed = f", resumed at step {result.resumed_from_step}" if result.resumed_from_step else ""
    loss = "n/a" if result.loss is None else f"{result.loss:.4f}"
    click.echo(
        f"{state}: {result.output} after {result.steps} steps{resumed}, {result.tokens:,} tokens, "
        f"{result.tokens_per_second:,.0f} tokens/s, last sampled loss {loss}"
    )
    if result.stopped_by:
        # 128 + the signal, as a process the signal had ended: the run did not finish, a scheduler may requeue it.
        sys.exit(128 + signal.Signals[result.stopped_by].value)
