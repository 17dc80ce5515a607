"""ELMoForManyLangs (HIT-SCIR) model directories, mapped onto this package's biLM.

A model directory holds ``config.json`` (whose ``config_path`` names the model config, often as
an absolute path from its author's machine), that model config, ``char.dic`` and ``word.dic``
(``token<TAB>id`` per line) and two torch state dicts, ``token_embedder.pkl`` and ``encoder.pkl``.

The published models (``cnn`` token embedder + ``elmo`` encoder) compute what
:class:`~elmo_cache.model.bilm.BiLM` computes, with four differences that are all mapped here:

* characters are rows of ``char.dic`` (code points, not UTF-8 bytes); a token is
  ``[<eow>, chars..., <bow>]`` then ``<pad>`` (the package swaps the two names, consistently),
  cut to ``max_characters_per_token - 2`` code points; unknown characters are ``<oov>``; the
  sentence is wrapped in ``<bos>`` ... ``<eos>`` (:class:`EfmlTokenIds`);
* a word embedding (``word.dic``, unknown words ``<oov>``) is concatenated before the char-CNN
  features and projected with them: its columns of the projection become ``word_proj``;
* a highway layer is one ``Linear(n, 2n)``, transform first, gate second, with
  ``out = g * x + (1 - g) * relu(h)``: our gate is ``1 - g``, so its weights are negated;
* the LSTM (allennlp's ``LstmCellWithProjection``) has gates i, f, g, o, its bias on the state
  side and the forget bias stored: the columns are reordered to i, f, o, g and nothing is added.

Every tensor of both state dicts is named here, its shape checked against the config and the
dictionaries; a missing, extra or misshapen tensor is an error naming the file and the tensor.
Weight files are read with ``torch.load(weights_only=True)`` (no code runs), which reads both the
zip format and the legacy format of ``torch.save`` that the published 2018 files use.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PureWindowsPath
from typing import Any

import numpy as np
import torch

from elmo_cache.errors import ModelNotFoundError, OptionsError, WeightFileError
from elmo_cache.model.options import LIMITS, ModelOptions, bounded_filters, bounded_int, finite_clip
from elmo_cache.model.weights import ElmoWeights, LstmWeights

__all__ = [
    "FORMAT",
    "CONFIG_FILE",
    "MODEL_FILES",
    "EfmlModel",
    "EfmlTokenIds",
    "is_model_dir",
    "read_config",
    "read_dic",
    "load_model",
    "fingerprint",
]

FORMAT = "elmoformanylangs"
"""The format's name in :class:`~elmo_cache.model.files.ModelFiles` and in cache identities."""

CONFIG_FILE = "config.json"
MODEL_FILES = ("char.dic", "word.dic", "token_embedder.pkl", "encoder.pkl")
"""The files beside ``config.json``, in the order their hashes make the weights SHA-256."""

SUPPORTED = {"token_embedder": ("cnn",), "encoder": ("elmo",)}
_ACTIVATIONS = ("relu", "tanh")
# The package's own default config (its configs/ folder; both files hold the same), used by the
# published English model whose config.json names it without shipping it.
_PACKAGE_CONFIG: dict[str, Any] = {
    "encoder": {"name": "elmo", "projection_dim": 512, "cell_clip": 3, "proj_clip": 3, "dim": 4096, "n_layers": 2},
    "token_embedder": {
        "name": "cnn",
        "activation": "relu",
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "word_dim": 100,
        "char_dim": 50,
        "max_characters_per_token": 50,
    },
}
_PACKAGE_CONFIGS = {f"cnn_{n}_100_512_4096_sample.json": _PACKAGE_CONFIG for n in (0, 50)}
# Entries the package looks up in the dictionaries (its names; <bow>/<eow> are used swapped).
_REQUIRED_CHARS = ("<bow>", "<eow>", "<oov>", "<pad>", "<bos>", "<eos>")
_REQUIRED_WORDS = ("<oov>", "<pad>")


def is_model_dir(path: Path) -> bool:
    """Whether ``path`` is a directory in this layout (``config.json`` beside any of its files)."""
    return (path / CONFIG_FILE).is_file() and any((path / name).exists() for name in MODEL_FILES)


# ------------------------------------------------------------------------------- config
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OptionsError(f"{path}: not a readable JSON file ({exc})") from None


def read_config(directory: Path) -> tuple[dict[str, Any], str]:
    """The model config that ``config.json``'s ``config_path`` names, and where it was found.

    Looked for as the package does: the path itself (relative to the directory), else its file
    name beside ``config.json`` (written on another machine, Windows paths included), else the
    package's own default config of that name."""
    top_path = directory / CONFIG_FILE
    top = _read_json(top_path)
    if not isinstance(top, dict) or not isinstance(top.get("config_path"), str):
        raise OptionsError(f"{top_path}: field 'config_path' (the model config's file name) is missing or not a string")
    named = top["config_path"]
    basename = PureWindowsPath(named).name  # splits on both / and \
    for candidate in (directory / named, directory / basename):
        if basename and candidate.is_file():
            raw = _read_json(candidate)
            if not isinstance(raw, dict):
                raise OptionsError(f"{candidate}: expected a JSON object")
            return raw, str(candidate)
    if basename in _PACKAGE_CONFIGS:
        return _PACKAGE_CONFIGS[basename], f"the package's default {basename} (named by {top_path})"
    raise ModelNotFoundError(
        f"{top_path}: config_path {named!r} names a model config that is neither at that path nor "
        f"as {basename!r} in {directory}; copy the model config beside config.json"
    )


def _field(section: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise OptionsError(f"{where}: field {key!r} is missing")
    return section[key]


def _clip(value: Any, source: str, key: str) -> float | None:
    # The package clips only when the value is truthy (0 and null: no clipping).
    return finite_clip(value, source=source, key=key) if value else None


def parse_config(raw: Mapping[str, Any], source: str) -> tuple[ModelOptions, dict[str, Any]]:
    """The biLM options of a model config and its normalised form (recorded in cache identities).

    ``n_characters`` is left at 0 here: it is the size of ``char.dic``."""
    sections = {}
    for part, supported in SUPPORTED.items():
        section = raw.get(part)
        if not isinstance(section, dict):
            raise OptionsError(f"{source}: section {part!r} is missing")
        name = str(_field(section, "name", f"{source} {part}"))
        # The package compares the token embedder's name case-insensitively, the encoder's exactly.
        if (name.lower() if part == "token_embedder" else name) not in supported:
            raise OptionsError(
                f"{source}: field {part}.name is {name!r}, which elmo-cache does not load; supported: "
                "token_embedder 'cnn' with encoder 'elmo' (the published ELMoForManyLangs models)"
            )
        sections[part] = section
    cnn, enc = sections["token_embedder"], sections["encoder"]
    where_cnn, where_enc = f"{source} token_embedder", f"{source} encoder"

    # Every integer is bounded by the same LIMITS as a bilm-tf options.json, before anything it
    # sizes is allocated; errors name the config file and the key as the config spells it.
    def number(section: Mapping[str, Any], part: str, key: str, low: int, limit: str) -> int:
        value = _field(section, key, f"{source} {part}")
        return bounded_int(value, source=source, key=f"{part}.{key}", low=low, high=LIMITS[limit])

    activation = str(_field(cnn, "activation", where_cnn))
    if activation not in _ACTIVATIONS:
        raise OptionsError(f"{source}: token_embedder.activation {activation!r} is not one of {list(_ACTIVATIONS)}")
    char_dim = _field(cnn, "char_dim", where_cnn)
    if isinstance(char_dim, (int, float)) and not isinstance(char_dim, bool) and char_dim < 1:
        raise OptionsError(
            f"{source}: token_embedder.char_dim is {char_dim}; elmo-cache loads only models with "
            "characters (char_dim > 0), as the published ones"
        )
    max_chars = number(cnn, "token_embedder", "max_characters_per_token", 3, "max_characters_per_token")
    te: dict[str, Any] = {
        "name": "cnn",
        "activation": activation,
        "filters": [
            list(f)
            for f in bounded_filters(_field(cnn, "filters", where_cnn), source, "token_embedder.filters", max_chars)
        ],
        "n_highway": number(cnn, "token_embedder", "n_highway", 0, "n_highway"),
        "word_dim": number(cnn, "token_embedder", "word_dim", 0, "word_dim"),
        "char_dim": number(cnn, "token_embedder", "char_dim", 1, "char_embedding_dim"),
        "max_characters_per_token": max_chars,
    }
    en: dict[str, Any] = {
        "name": "elmo",
        "projection_dim": number(enc, "encoder", "projection_dim", 1, "projection_dim"),
        "dim": number(enc, "encoder", "dim", 1, "lstm_dim"),
        "n_layers": number(enc, "encoder", "n_layers", 1, "n_layers"),
        "cell_clip": _clip(_field(enc, "cell_clip", where_enc), source, "encoder.cell_clip"),
        "proj_clip": _clip(_field(enc, "proj_clip", where_enc), source, "encoder.proj_clip"),
    }
    normal: dict[str, Any] = {"format": FORMAT, "token_embedder": te, "encoder": en}
    options = ModelOptions(
        char_embedding_dim=te["char_dim"],
        filters=tuple((w, n) for w, n in te["filters"]),
        n_highway=te["n_highway"],
        n_characters=0,
        max_characters_per_token=te["max_characters_per_token"],
        activation=te["activation"],
        n_layers=en["n_layers"],
        lstm_dim=en["dim"],
        projection_dim=en["projection_dim"],
        cell_clip=en["cell_clip"],
        proj_clip=en["proj_clip"],
        use_skip_connections=True,
    )
    return options, normal


# ------------------------------------------------------------------------ dictionaries
def read_dic(path: Path, required: Sequence[str]) -> dict[str, int]:
    """A ``char.dic``/``word.dic`` as the package reads it: lines split as ``str.splitlines`` does,
    stripped, ``token<TAB>id``; a line with one field is a whitespace character, stored as U+3000."""
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing (an ELMoForManyLangs model needs {list(MODEL_FILES)})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WeightFileError(f"{path}: not UTF-8 ({exc})") from None
    table: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.strip().split("\t")
        if len(fields) == 1:
            fields.insert(0, "\u3000")
        if len(fields) != 2 or not fields[1].lstrip("-").isdigit():
            raise WeightFileError(f"{path}: line {number} is not 'token<TAB>id': {line!r}")
        table[fields[0]] = int(fields[1])
    missing = [name for name in required if name not in table]
    if missing:
        raise WeightFileError(f"{path}: has no entry for {missing}")
    return table


class EfmlTokenIds:
    """Tokens to ``char.dic``/``word.dic`` rows, as the package computes them."""

    boundaries = ("<bos>", "<eos>")

    def __init__(self, chars: Mapping[str, int], words: Mapping[str, int] | None, max_chars: int):
        self.chars = chars
        self.words = words
        self.max_chars = max_chars
        # The package's names are swapped: a word starts with <eow> and ends with <bow>.
        self._start, self._end = chars["<eow>"], chars["<bow>"]
        self._oov, self._pad = chars["<oov>"], chars["<pad>"]

    def _cut(self, word: str) -> str:
        return word[: self.max_chars - 2] if len(word) + 2 > self.max_chars else word

    def char_ids(self, words: Sequence[str]) -> np.ndarray:
        ids = np.full((len(words), self.max_chars), self._pad, dtype=np.int64)
        ids[:, 0] = self._start
        for row, word in zip(ids, words):
            word = self._cut(word)
            if word in self.boundaries:
                row[1], row[2] = self.chars[word], self._end
                continue
            row[1 : 1 + len(word)] = [self.chars.get(c, self._oov) for c in word]
            row[1 + len(word)] = self._end
        return ids

    def word_ids(self, words: Sequence[str]) -> np.ndarray | None:
        if self.words is None:
            return None
        oov = self.words["<oov>"]
        return np.fromiter((self.words.get(self._cut(w), oov) for w in words), dtype=np.int64, count=len(words))


# ------------------------------------------------------------------------------ weights
def _read_state_dict(path: Path, digests: dict[str, str]) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing (an ELMoForManyLangs model needs {list(MODEL_FILES)})")
    data = path.read_bytes()
    digests[path.name] = hashlib.sha256(data).hexdigest()
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, AttributeError) as exc:
        raise WeightFileError(
            f"{path}: not a torch state dict that loads without running code ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); "
            "a whole pickled module must be re-saved as its state_dict()"
        ) from None
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WeightFileError(f"{path}: expected a state dict (tensor names to tensors), got {type(state).__name__}")
    return dict(state)


class _StateDict:
    """Takes tensors out of one state dict by name, checking each shape; :meth:`done` rejects leftovers."""

    def __init__(self, path: Path, state: dict[str, torch.Tensor], source: str):
        self.path, self.state, self.source = path, dict(state), source

    def take(self, name: str, shape: tuple[int, ...], why: str = "") -> torch.Tensor:
        if name not in self.state:
            raise WeightFileError(
                f"{self.path}: tensor {name!r} is missing (expected shape {shape} from {self.source})"
            )
        tensor = self.state.pop(name)
        if tuple(tensor.shape) != shape:
            raise WeightFileError(
                f"{self.path}: tensor {name!r} has shape {tuple(tensor.shape)} but {why or self.source} implies "
                f"{shape}; the files of this model directory do not belong together"
            )
        if not tensor.is_floating_point():
            raise WeightFileError(f"{self.path}: tensor {name!r} has dtype {tensor.dtype}, expected floating point")
        tensor = tensor.detach().to(torch.float32).contiguous()
        if not torch.isfinite(tensor).all():
            raise WeightFileError(f"{self.path}: tensor {name!r} contains NaN or infinite values")
        return tensor

    def done(self) -> None:
        if self.state:
            raise WeightFileError(
                f"{self.path}: tensor {sorted(self.state)[0]!r} is not part of the model {self.source} describes "
                f"({len(self.state)} unexpected in all)"
            )


def _check_ids(table: Mapping[str, int], rows: int, path: Path) -> None:
    worst = max(table.values())
    if min(table.values()) < 0 or worst >= rows:
        raise WeightFileError(f"{path}: ids must be 0..{rows - 1} (its embedding's rows); found {worst}")


def _token_embedder(
    reader: _StateDict, options: ModelOptions, word_dim: int, n_words: int, n_chars: int
) -> ElmoWeights:
    c, p, nf = options.char_embedding_dim, options.projection_dim, options.n_filters
    word_why = f"word.dic ({n_words} entries) with word_dim of {reader.source}"
    word_embed = reader.take("word_emb_layer.embedding.weight", (n_words, word_dim), word_why) if word_dim else None
    char_why = f"char.dic ({n_chars} entries) with char_dim of {reader.source}"
    char_embed = reader.take("char_emb_layer.embedding.weight", (n_chars, c), char_why)
    convolutions = [
        (reader.take(f"convolutions.{i}.weight", (num, c, width)), reader.take(f"convolutions.{i}.bias", (num,)))
        for i, (width, num) in enumerate(options.filters)
    ]
    highways = []
    for k in range(options.n_highway):
        weight = reader.take(f"highways._layers.{k}.weight", (2 * nf, nf))
        bias = reader.take(f"highways._layers.{k}.bias", (2 * nf,))
        # Theirs: g = sigmoid(gate half), out = g * x + (1 - g) * relu(transform half).
        # Ours: out = s * relu(transform) + (1 - s) * x with s = sigmoid(x W_carry + b_carry) = 1 - g.
        highways.append((-weight[nf:].T.contiguous(), -bias[nf:], weight[:nf].T.contiguous(), bias[:nf].clone()))
    projection = reader.take("projection.weight", (p, word_dim + nf))
    proj_bias = reader.take("projection.bias", (p,))
    reader.done()
    return ElmoWeights(
        char_embed=char_embed,
        convolutions=convolutions,
        highways=highways,
        proj_weight=projection[:, word_dim:].T.contiguous(),
        proj_bias=proj_bias,
        lstm=[],
        word_embed=word_embed,
        word_proj=projection[:, :word_dim].T.contiguous() if word_dim else None,
    )


def _encoder(reader: _StateDict, options: ModelOptions) -> list[LstmWeights]:
    p, d = options.projection_dim, options.lstm_dim
    # Their gate blocks i, f, g, o -> ours i, f, o, g.
    order = torch.cat([torch.arange(k * d, (k + 1) * d) for k in (0, 1, 3, 2)])
    layers = []
    for layer in range(options.n_layers):
        parts: dict[str, list[torch.Tensor]] = {"w_input": [], "w_hidden": [], "bias": [], "w_proj": []}
        for direction in ("forward", "backward"):
            prefix = f"{direction}_layer_{layer}"
            parts["w_input"].append(reader.take(f"{prefix}.input_linearity.weight", (4 * d, p)).T[:, order])
            parts["w_hidden"].append(reader.take(f"{prefix}.state_linearity.weight", (4 * d, p)).T[:, order])
            parts["bias"].append(reader.take(f"{prefix}.state_linearity.bias", (4 * d,))[order])
            parts["w_proj"].append(reader.take(f"{prefix}.state_projection.weight", (p, d)).T)
        layers.append(LstmWeights(**{key: torch.stack(values).contiguous() for key, values in parts.items()}))
    reader.done()
    return layers


@dataclass
class EfmlModel:
    """An ELMoForManyLangs model read and mapped: what :class:`~elmo_cache.Encoder` runs."""

    options: ModelOptions
    weights: ElmoWeights
    tokens: EfmlTokenIds
    # The normalised model config (a cache identity's "options").
    options_dict: dict[str, Any]
    # SHA-256 over the SHA-256s of the files read (dictionaries and state dicts).
    weights_sha256: str


def _combine(digests: Mapping[str, str]) -> str:
    return hashlib.sha256("".join(f"{name} {digests[name]}\n" for name in sorted(digests)).encode()).hexdigest()


def load_model(directory: str | Path) -> EfmlModel:
    """Read, check and map every file of an ELMoForManyLangs model directory."""
    directory = Path(directory)
    raw, source = read_config(directory)
    options, normal = parse_config(raw, source)
    word_dim = normal["token_embedder"]["word_dim"]
    digests: dict[str, str] = {}
    chars = read_dic(directory / "char.dic", _REQUIRED_CHARS)
    digests["char.dic"] = hashlib.sha256((directory / "char.dic").read_bytes()).hexdigest()
    words = None
    if word_dim:
        words = read_dic(directory / "word.dic", _REQUIRED_WORDS)
        digests["word.dic"] = hashlib.sha256((directory / "word.dic").read_bytes()).hexdigest()
    embedder_path, encoder_path = directory / "token_embedder.pkl", directory / "encoder.pkl"
    embedder = _StateDict(embedder_path, _read_state_dict(embedder_path, digests), source)
    weights = _token_embedder(embedder, options, word_dim, len(words or ()), len(chars))
    weights.lstm = _encoder(_StateDict(encoder_path, _read_state_dict(encoder_path, digests), source), options)
    _check_ids(chars, len(chars), directory / "char.dic")
    if words is not None:
        _check_ids(words, len(words), directory / "word.dic")
    options = replace(options, n_characters=len(chars))
    tokens = EfmlTokenIds(chars, words, options.max_characters_per_token)
    return EfmlModel(options, weights, tokens, normal, _combine(digests))


def fingerprint(directory: str | Path) -> tuple[str, dict[str, Any]]:
    """The weights SHA-256 and options an encoder of this directory records, without loading it."""
    directory = Path(directory)
    raw, source = read_config(directory)
    _, normal = parse_config(raw, source)
    names = [n for n in MODEL_FILES if n != "word.dic" or normal["token_embedder"]["word_dim"]]
    missing = [n for n in names if not (directory / n).is_file()]
    if missing:
        raise ModelNotFoundError(f"{directory}: {missing} missing")
    return _combine({n: hashlib.sha256((directory / n).read_bytes()).hexdigest() for n in names}), normal
