"""Transformer encoders (BERT, RoBERTa, XLM-R, DeBERTa, ...) as a model source: ``--model hf:NAME``.

``NAME`` is a local directory saved by ``save_pretrained`` (``config.json``, the weights as
``*.safetensors`` or ``pytorch_model*.bin``, and a fast tokenizer's ``tokenizer.json``) or a hub name
(downloaded once into the Hugging Face cache). Two settings that change the vectors may follow,
comma-separated: ``subword=first|mean|last`` (which of a token's subwords give its vector; default
first) and ``stride=N`` (subwords between the starts of two windows of a sentence too long for the
model; default half a window): ``hf:bert-base-cased,subword=mean,stride=128``.

The layers are the embedding output and every block's (``L + 1``), each ``hidden_size`` wide, so the
build's ``--layers``, ``--mix``, codecs and pools apply to them as to ELMo's three. What the identity
records (:func:`describe`) is read here without importing transformers for a local directory's
files; the tokenizer's window geometry needs transformers (:func:`tokenizer_geometry`), imported
only when a Transformer model is named.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elmo_cache.errors import InvalidParameterError, ModelDownloadError, ModelNotFoundError
from elmo_cache.model import hub
from elmo_cache.model.files import ModelFiles
from elmo_cache.model.identity import ModelDescription, model_identity

__all__ = [
    "PREFIX",
    "FORMAT",
    "SUBWORD_CHOICES",
    "TransformerSpec",
    "TransformerSource",
    "parse_spec",
    "is_spec",
    "layer_count",
    "describe",
    "settings_of",
]

PREFIX = "hf:"
FORMAT = "transformers"
SUBWORD_CHOICES = ("first", "mean", "last")

# Model types whose position ids start after the padding index (fairseq's convention): they have
# ``max_position_embeddings - pad_token_id - 1`` positions for a sequence, not ``max_position_embeddings``.
_PADDING_OFFSET_POSITIONS = frozenset(
    {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text", "ibert", "mpnet"}
)
# config.json entries that say which library version or path wrote the file, not what the model computes.
_VOLATILE_CONFIG = ("transformers_version", "_name_or_path", "_commit_hash")
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spm.model",
)
_SETTING = re.compile(r",(subword|stride)=([^,]*)$")


@dataclass(frozen=True)
class TransformerSpec:
    """``hf:NAME[,subword=...][,stride=N]`` parsed."""

    # The local directory or hub name after ``hf:``.
    name: str
    # Which subword of a token gives its vector: one of SUBWORD_CHOICES.
    subword: str = "first"
    # Subwords between window starts for long sentences; None: half a window.
    stride: int | None = None


def is_spec(model: object) -> bool:
    """Whether ``model`` names a Transformer (``hf:...``)."""
    return isinstance(model, str) and model.lower().startswith(PREFIX)


def parse_spec(text: str) -> TransformerSpec:
    """Parse ``hf:NAME[,subword=first|mean|last][,stride=N]``; raises naming the bad part."""
    if not is_spec(text):
        raise InvalidParameterError(f"model: {text!r} is not a Transformer model; write {PREFIX}NAME")
    rest = text[len(PREFIX) :]
    settings: dict[str, str] = {}
    while (match := _SETTING.search(rest)) is not None:
        key, value = match.groups()
        if key in settings:
            raise InvalidParameterError(f"model: {key} is given twice in {text!r}")
        settings[key] = value
        rest = rest[: match.start()]
    if not rest:
        raise InvalidParameterError(
            f"model: {text!r} names no model; write {PREFIX}DIRECTORY or {PREFIX}HUB_NAME "
            f"(e.g. {PREFIX}bert-base-cased)"
        )
    subword = settings.get("subword", "first")
    if subword not in SUBWORD_CHOICES:
        raise InvalidParameterError(f"model: subword={subword!r} is not valid; choose from {list(SUBWORD_CHOICES)}")
    stride: int | None = None
    if "stride" in settings:
        try:
            stride = int(settings["stride"])
        except ValueError:
            raise InvalidParameterError(f"model: stride={settings['stride']!r} is not a whole number") from None
        if stride < 1:
            raise InvalidParameterError(f"model: stride={stride} must be at least 1 (subwords between window starts)")
    return TransformerSpec(rest, subword, stride)


def settings_of(files: ModelFiles) -> TransformerSpec:
    """The subword choice and stride a resolved Transformer model was asked with."""
    settings = dict(files.variant)
    stride = settings.get("stride")
    return TransformerSpec(files.name, str(settings.get("subword", "first")), None if stride is None else int(stride))


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"{directory}: no config.json; a Transformer model directory is what save_pretrained writes"
        ) from None
    except (OSError, ValueError) as error:
        raise ModelNotFoundError(f"{path}: not a readable JSON file ({error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ModelNotFoundError(f"{path}: has no 'model_type'; it is not a transformers model config")
    return config


def _weight_files(directory: Path) -> list[Path]:
    found = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not found:
        names = sorted(p.name for p in directory.iterdir())
        raise ModelNotFoundError(
            f"{directory}: no weights (*.safetensors or pytorch_model*.bin) beside config.json; found {names}"
        )
    return found


def _files_sha256(paths: list[Path]) -> str:
    """One SHA-256 for a set of files: of a single file its own, of several the hash of their names and hashes."""
    if len(paths) == 1:
        return hub.file_sha256(paths[0])
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{path.name}\0{hub.file_sha256(path)}\n".encode())
    return digest.hexdigest()


def check_architecture(config: Mapping[str, Any], where: str) -> None:
    """Refuse a decoder-only or an encoder-decoder model: their hidden states are not an encoder's features."""
    model_type = str(config.get("model_type"))
    if config.get("is_encoder_decoder"):
        raise InvalidParameterError(
            f"{where}: {model_type!r} is an encoder-decoder (seq2seq) model; elmo-cache stores the hidden states of "
            "encoders (BERT, RoBERTa, XLM-R, DeBERTa, ...): name an encoder-only model"
        )
    if config.get("is_decoder"):
        raise InvalidParameterError(
            f"{where}: the config says is_decoder (causal attention); name an encoder-only model (BERT, RoBERTa, ...)"
        )
    architectures = [str(a) for a in config.get("architectures") or ()]
    decoders = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")
    if architectures and all(any(a.endswith(d) for d in decoders) for a in architectures):
        raise InvalidParameterError(
            f"{where}: {model_type!r} is a decoder-only or generative model ({', '.join(architectures)}); "
            "elmo-cache stores the hidden states of encoders (BERT, RoBERTa, XLM-R, DeBERTa, ...)"
        )


def _positions(config: Mapping[str, Any]) -> int:
    positions = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in _PADDING_OFFSET_POSITIONS:
        positions -= int(config.get("pad_token_id") or 0) + 1
    return positions


@dataclass(frozen=True)
class Geometry:
    """How a sentence's subwords are cut into windows the model can read."""

    # Subwords of one sentence a window holds, special tokens excluded.
    window: int
    # Subwords between the starts of consecutive windows.
    stride: int


def tokenizer_geometry(directory: Path, config: Mapping[str, Any], stride: int | None) -> Geometry:
    """The window and stride of ``directory``'s model (imports transformers to read its tokenizer)."""
    from elmo_cache.model.subwords import load_tokenizer, special_tokens

    tokenizer = load_tokenizer(directory)
    prefix, suffix = special_tokens(tokenizer)
    limit = _positions(config)
    max_length = getattr(tokenizer, "model_max_length", None)
    if isinstance(max_length, int) and 0 < max_length < limit:
        limit = max_length
    window = limit - len(prefix) - len(suffix)
    if window < 1:
        raise InvalidParameterError(
            f"{directory}: the model reads {limit} positions, no room beside its special tokens"
        )
    chosen = max(1, window // 2) if stride is None else stride
    if chosen > window:
        raise InvalidParameterError(
            f"model: stride={chosen} is longer than a window ({window} subwords): windows would leave gaps; "
            f"choose a stride from 1 to {window}"
        )
    return Geometry(window, chosen)


def _identity_options(directory: Path, spec: TransformerSpec) -> tuple[dict[str, Any], int]:
    config = _read_config(directory)
    check_architecture(config, str(directory))
    layers = int(config.get("num_hidden_layers") or 0) + 1
    dim = int(config.get("hidden_size") or 0)
    geometry = tokenizer_geometry(directory, config, spec.stride)
    tokenizer_files = [directory / name for name in _TOKENIZER_FILES if (directory / name).is_file()]
    options = {
        "format": FORMAT,
        "model_type": config["model_type"],
        "n_layers": layers,
        "dim": dim,
        "config": {key: value for key, value in sorted(config.items()) if key not in _VOLATILE_CONFIG},
        "tokenizer_sha256": _files_sha256(tokenizer_files) if tokenizer_files else None,
        "subword": spec.subword,
        "window": geometry.window,
        "stride": geometry.stride,
    }
    return options, dim


def fingerprint(files: ModelFiles) -> tuple[str, dict[str, Any]]:
    """The weights SHA-256 and options the identity of ``files`` records."""
    directory = _directory(files)
    options, _ = _identity_options(directory, settings_of(files))
    return _files_sha256(_weight_files(directory)), options


def describe(files: ModelFiles, precision: str, initial_state: str) -> ModelDescription:
    """The identity, width and layer count an encoder of ``files`` has, without loading the weights."""
    if initial_state != "zero":
        raise InvalidParameterError(
            f"initial_state: {initial_state!r} is an ELMo LSTM setting; a Transformer has no initial state (use 'zero')"
        )
    directory = _directory(files)
    options, dim = _identity_options(directory, settings_of(files))
    sha = _files_sha256(_weight_files(directory))
    identity = model_identity(files.name, options, sha, initial_state, precision, directory, None)
    return ModelDescription(identity, dim, options["n_layers"])


def _directory(files: ModelFiles) -> Path:
    if files.directory is None:
        raise ValueError("a Transformer model's ModelFiles need their directory")
    return files.directory


def _download(name: str) -> Path:
    """A hub model's files, downloaded once into the Hugging Face cache (config, tokenizer, weights)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelNotFoundError(
            f"{PREFIX}{name}: not a local directory, and naming a hub model needs huggingface_hub: "
            "pip install 'elmo-cache[transformers]'"
        ) from None
    patterns = ["config.json", "*.safetensors", *_TOKENIZER_FILES]
    try:
        folder = Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as error:  # the hub client raises many types: name them in one message
        raise ModelDownloadError(f"{PREFIX}{name}: could not download it from the Hugging Face hub: {error}") from None
    if not list(folder.glob("*.safetensors")):
        try:
            folder = Path(snapshot_download(name, allow_patterns=[*patterns, "pytorch_model*.bin"]))
        except Exception as error:
            raise ModelDownloadError(f"{PREFIX}{name}: could not download its weights: {error}") from None
    return folder


def _local_snapshot(name: str) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not downloaded, or no huggingface_hub: nothing local to propose
        return None


def _files(spec: TransformerSpec, directory: Path, name: str) -> ModelFiles:
    variant: tuple[tuple[str, Any], ...] = (("subword", spec.subword),)
    if spec.stride is not None:
        variant += (("stride", spec.stride),)
    return ModelFiles(
        name,
        directory / "config.json",
        _weight_files(directory)[0],
        TransformerSource.origin,
        directory=directory,
        format=FORMAT,
        variant=variant,
    )


def require_transformers() -> None:
    """Raise a plain error naming the extra to install where transformers is missing."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ModelNotFoundError(
            f'a {PREFIX}NAME model needs the transformers library: pip install "elmo-cache[transformers]"'
        ) from None


def resolve_spec(spec: TransformerSpec) -> ModelFiles:
    """The files of ``spec``: its directory, or the hub model downloaded."""
    require_transformers()
    path = Path(spec.name).expanduser()
    if path.is_dir():
        directory, name = path.resolve(), f"{PREFIX}{path.name}"
    elif path.is_absolute() or spec.name.startswith((".", "~")) or spec.name.count("/") > 1:
        raise ModelNotFoundError(f"{PREFIX}{spec.name}: no such directory")
    else:
        directory, name = _download(spec.name), f"{PREFIX}{spec.name}"
    check_architecture(_read_config(directory), f"{PREFIX}{spec.name}")
    return _files(spec, directory, name)


class TransformerSource:
    """``hf:NAME``: a Transformer encoder, from a local directory or the Hugging Face hub."""

    origin = "transformers"

    def claims(self, request: Any) -> bool:
        return is_spec(request.model)

    def resolve(self, request: Any) -> ModelFiles:
        return resolve_spec(parse_spec(request.model))

    def candidate(self, recorded: Mapping[str, Any]) -> tuple[ModelFiles | None, str]:
        options = recorded.get("options")
        if not isinstance(options, dict) or options.get("format") != FORMAT:
            return None, ""
        spec = TransformerSpec(str(recorded.get("name")), str(options.get("subword")), int(options.get("stride") or 1))
        directory = recorded.get("directory")
        folders = [Path(directory)] if isinstance(directory, str) else []
        name = str(recorded.get("name") or "")
        if name.startswith(PREFIX) and (snapshot := _local_snapshot(name[len(PREFIX) :])) is not None:
            folders.append(snapshot)
        for folder in folders:
            if (folder / "config.json").is_file():
                try:
                    return _files(spec, folder, name), f"{folder} now holds another Transformer model"
                except ModelNotFoundError:
                    continue
        return None, f"its Transformer model is neither in {directory} nor in the Hugging Face cache"

    def describe(self) -> str:
        return f"'{PREFIX}DIRECTORY' or '{PREFIX}HUB_NAME' (a Transformer encoder; ',subword=first|mean|last,stride=N')"


def layer_count(model: object) -> int:
    """How many layers the named model gives: ``L + 1`` for a Transformer of ``L`` blocks, else ELMo's 3.

    Reads the Transformer's config.json (resolving ``hf:NAME``, which downloads a hub model once), so that
    ``--layers`` and ``--mix`` are checked against the model before anything is built.
    """
    if not is_spec(model):
        return 3
    files = resolve_spec(parse_spec(str(model)))
    assert files.directory is not None
    return int(_read_config(files.directory).get("num_hidden_layers") or 0) + 1
