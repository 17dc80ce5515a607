"""``elmo-cache elmo``: allennlp 0.9's ``allennlp elmo`` command (one HDF5 dataset per sentence)."""

from __future__ import annotations

import click

from elmo_cache.compat.hdf5_file import DEFAULT_BATCH_SIZE

__all__ = ["elmo_command"]


@click.command("elmo")
@click.argument("input_file", type=click.Path(dir_okay=False, allow_dash=True))
@click.argument("output_file", type=click.Path(dir_okay=False))
@click.option("--all", "all_layers", is_flag=True, help="Write all three layers: (3, n_tokens, dim) per sentence.")
@click.option("--top", is_flag=True, help="Write the top layer: (n_tokens, dim) per sentence.")
@click.option("--average", is_flag=True, help="Write the mean of the three layers: (n_tokens, dim) per sentence.")
@click.option(
    "--model",
    default=None,
    help="Model name, directory or NLPL .zip, as for build. Default: the bundled model (256-d, no download; "
    "said on stderr). allennlp elmo's default was the Original (1024-d): --model original.",
)
@click.option("--options-file", default=None, help="options.json of the model (with --weight-file).")
@click.option("--weight-file", default=None, help="Weights HDF5 of the model (with --options-file).")
@click.option("--batch-size", type=click.IntRange(min=1), default=DEFAULT_BATCH_SIZE, show_default=True)
@click.option(
    "--cuda-device", type=click.IntRange(min=-1), default=-1, show_default=True, help="CUDA device; -1: the CPU."
)
@click.option(
    "--forget-sentences",
    is_flag=True,
    help="Leave out sentence_to_index (the JSON object mapping each sentence to its dataset's name).",
)
@click.option(
    "--use-sentence-keys",
    is_flag=True,
    help="Name each dataset by its sentence instead of its line number (sentences must be distinct).",
)
@click.option(
    "--stateful",
    is_flag=True,
    help="Carry the LSTM state from batch to batch as allennlp did (vectors then depend on the batches); "
    "default: every sentence from the zero state.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def elmo_command(
    input_file: str,
    output_file: str,
    all_layers: bool,
    top: bool,
    average: bool,
    model: str | None,
    options_file: str | None,
    weight_file: str | None,
    batch_size: int,
    cuda_device: int,
    forget_sentences: bool,
    use_sentence_keys: bool,
    stateful: bool,
    no_progress: bool,
) -> None:
    """Embed INPUT_FILE (one whitespace-tokenised sentence per line, no empty lines) into OUTPUT_FILE,
    an HDF5 file in the layout of allennlp's ``elmo`` command: a dataset per line, named by its line
    number from 0, and sentence_to_index."""
    from elmo_cache.compat.hdf5_file import check_paths
    from elmo_cache.threads import apply_threads

    chosen = [name for name, flag in (("all", all_layers), ("top", top), ("average", average)) if flag]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --all, --top, --average")
    check_paths(input_file, output_file)  # before torch and the model load
    from elmo_cache.compat import ElmoEmbedder

    apply_threads()
    embedder = ElmoEmbedder(options_file, weight_file, cuda_device, stateful=stateful, model=model)
    summary = embedder.embed_file(
        input_file, output_file, chosen[0], batch_size, forget_sentences, use_sentence_keys, progress=not no_progress
    )
    click.echo(str(summary))
