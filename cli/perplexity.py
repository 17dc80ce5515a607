"""``elmo-cache perplexity``: full-softmax perplexity of a trained model directory on a text."""

from __future__ import annotations

import json

import click

from elmo_cache.train.config import PERPLEXITY_MODES as MODES

__all__ = ["perplexity_command"]


@click.command("perplexity")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("text", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--mode",
    default="stream",
    show_default=True,
    type=click.Choice(MODES),
    help="stream: LSTM state carried across sentences in file order (as bilm-tf trains); "
    "sentence: each sentence alone from the zero state (as the encoder runs by default); "
    "warm: each sentence alone from the encoder's warm state (--initial-state warm).",
)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--device", default=None, help="cpu, cuda or cuda:N. Default: CUDA when available.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def perplexity_command(
    model_dir: str,
    text: str,
    mode: str,
    batch_size: int,
    device: str | None,
    as_json: bool,
) -> None:
    """Perplexity of the biLM in MODEL_DIR on TEXT (one sentence per line): forward, backward and mean."""
    from elmo_cache.train import perplexity

    result = perplexity(model_dir, text, mode=mode, batch_size=batch_size, device=device)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(
        f"{text}: {result.sentences:,} sentences, {result.tokens:,} tokens, OOV {result.oov_rate:.2%}, "
        f"{result.predictions:,} predictions per direction ({mode} mode)"
    )
    click.echo(f"perplexity  forward {result.forward:.2f}  backward {result.backward:.2f}  mean {result.mean:.2f}")
