"""The official ELMo weight file (bilm-tf / allennlp layout): its datasets, reading it, writing it.

:func:`weight_shapes` lists every dataset the options call for; :func:`load_weights` reads a
file into torch tensors and :func:`write_weight_file` writes one (for trainers and tests), both
checking every dataset against that list.

Every dataset is named here explicitly and its shape checked against what the
options imply, so a weight file that does not belong to its ``options.json`` fails
with a message naming the dataset, not with a broadcasting error deep inside a
matmul. Tensors are read straight into their final buffers (``read_direct``), so
loading the Original model needs little more memory than its 357 MB of weights.

Conventions kept from the file (TensorFlow orientation, ``x @ W``):

* ``char_embed`` has no padding row: we prepend a zero row for the +1-shifted ids.
* LSTM ``W_0`` stacks ``[input; previous h]`` rows and gate columns in TensorFlow's
  order i, j, f, o (j is the candidate). We split it into input and recurrent parts
  and reorder the columns to i, f, o, j, so that one sigmoid covers three gates and
  one tanh the candidate. TensorFlow's forget-gate bias (+1.0, not stored) is folded
  into the bias here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import torch

from elmo_cache.errors import ModelNotFoundError, WeightFileError
from elmo_cache.model.options import ModelOptions

__all__ = [
    "ElmoWeights",
    "LstmWeights",
    "load_weights",
    "read_datasets",
    "write_weight_file",
    "weight_shapes",
    "FORGET_BIAS",
]

FORGET_BIAS = 1.0
"""TensorFlow's LSTMCell default, applied at run time in the original and not stored."""


@dataclass
class LstmWeights:
    """One biLSTM layer, both directions stacked on dim 0 (0 = forward, 1 = backward)."""

    # (2, P, 4D): input-to-gates, columns in i, f, o, j order.
    w_input: torch.Tensor
    # (2, P, 4D): previous-output-to-gates, same column order.
    w_hidden: torch.Tensor
    # (2, 4D): gate bias with the forget bias already added.
    bias: torch.Tensor
    # (2, D, P): cell projection (no bias).
    w_proj: torch.Tensor


@dataclass
class ElmoWeights:
    """All parameters of an ELMo biLM, as float32 CPU tensors in TF orientation."""

    # (262, C): row 0 is zeros (batch padding), rows 1.. are the file's char_embed.
    char_embed: torch.Tensor
    # One (weight (num, C, width), bias (num,)) per filter, ready for conv1d.
    convolutions: list[tuple[torch.Tensor, torch.Tensor]]
    # One (W_carry, b_carry, W_transform, b_transform) per highway layer.
    highways: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]
    # (n_filters, P) and (P,).
    proj_weight: torch.Tensor
    proj_bias: torch.Tensor
    # One entry per LSTM layer.
    lstm: list[LstmWeights]
    # Models with a word embedding beside the characters (ELMoForManyLangs): (n_words, W), and the
    # projection's word columns (W, P), added to the char-CNN's projection. None for bilm-tf models.
    word_embed: torch.Tensor | None = None
    word_proj: torch.Tensor | None = None


def lstm_prefix(direction: int, layer: int) -> str:
    """The weight file's group of one LSTM layer of one direction (0 forward, 1 backward)."""
    return f"RNN_{direction}/RNN/MultiRNNCell/Cell{layer}/LSTMCell"


def weight_shapes(options: ModelOptions) -> dict[str, tuple[int, ...]]:
    """Every dataset of the official weight file for ``options``, with its shape (``softmax/*`` is not part of it)."""
    c, p, d, nf = options.char_embedding_dim, options.projection_dim, options.lstm_dim, options.n_filters
    shapes: dict[str, tuple[int, ...]] = {"char_embed": (options.n_characters - 1, c)}
    for i, (width, num) in enumerate(options.filters):
        shapes[f"CNN/W_cnn_{i}"] = (1, width, c, num)
        shapes[f"CNN/b_cnn_{i}"] = (num,)
    for k in range(options.n_highway):
        for part in ("carry", "transform"):
            shapes[f"CNN_high_{k}/W_{part}"] = (nf, nf)
            shapes[f"CNN_high_{k}/b_{part}"] = (nf,)
    shapes["CNN_proj/W_proj"] = (nf, p)
    shapes["CNN_proj/b_proj"] = (p,)
    for direction in (0, 1):
        for layer in range(options.n_layers):
            prefix = lstm_prefix(direction, layer)
            shapes[f"{prefix}/W_0"] = (2 * p, 4 * d)
            shapes[f"{prefix}/B"] = (4 * d,)
            shapes[f"{prefix}/W_P_0"] = (d, p)
    return shapes


def write_weight_file(path: str | os.PathLike[str], options: ModelOptions, datasets: Mapping[str, np.ndarray]) -> Path:
    """Write ``datasets`` as an official ELMo weight file for ``options`` (float32, TF orientation).

    Every name of :func:`weight_shapes` must be there with its shape and finite values, and no
    other: anything else is a :class:`WeightFileError` naming the dataset, raised before the file
    is touched. The file is written beside ``path`` and renamed, so a reader never sees half of it.
    """
    path = Path(path)
    shapes = weight_shapes(options)
    missing = [name for name in shapes if name not in datasets]
    if missing:
        raise WeightFileError(
            f"{path}: dataset {missing[0]!r} is missing (expected shape {shapes[missing[0]]}); "
            f"{len(missing)} missing in all"
        )
    extra = sorted(name for name in datasets if name not in shapes)
    if extra:
        raise WeightFileError(
            f"{path}: dataset {extra[0]!r} is not part of the weight file these options describe; "
            f"expected only {sorted(shapes)}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        array = np.asarray(datasets[name])
        if tuple(array.shape) != shape:
            raise WeightFileError(
                f"{path}: dataset {name!r} has shape {tuple(array.shape)} but the options imply {shape}"
            )
        if not np.issubdtype(array.dtype, np.floating):
            raise WeightFileError(f"{path}: dataset {name!r} has dtype {array.dtype}, expected floating point")
        if not np.isfinite(array).all():
            raise WeightFileError(f"{path}: dataset {name!r} contains NaN or infinite values")
        arrays[name] = np.ascontiguousarray(array, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with h5py.File(tmp, "w") as f:
            for name, array in arrays.items():
                f.create_dataset(name, data=array)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _Reader:
    """Reads datasets from an open weight file, checking each name and shape."""

    def __init__(self, handle: h5py.File, path: Path, options_source: str):
        self.handle = handle
        self.path = path
        self.options_source = options_source

    def dataset(self, name: str, shape: tuple[int, ...]) -> h5py.Dataset:
        try:
            ds = self.handle[name]
        except KeyError:
            raise WeightFileError(
                f"{self.path}: dataset {name!r} is missing (expected shape {shape} from {self.options_source}); "
                "is this an ELMo weight file in the bilm-tf layout?"
            ) from None
        if not isinstance(ds, h5py.Dataset):
            raise WeightFileError(f"{self.path}: {name!r} is a group, expected a dataset of shape {shape}")
        if tuple(ds.shape) != shape:
            raise WeightFileError(
                f"{self.path}: dataset {name!r} has shape {tuple(ds.shape)} but {self.options_source} implies {shape}; "
                "the options file and the weight file do not belong together"
            )
        if not np.issubdtype(ds.dtype, np.floating):
            raise WeightFileError(f"{self.path}: dataset {name!r} has dtype {ds.dtype}, expected floating point")
        return ds

    def read(self, name: str, shape: tuple[int, ...], out: torch.Tensor | None = None) -> torch.Tensor:
        ds = self.dataset(name, shape)
        target = torch.empty(shape, dtype=torch.float32) if out is None else out
        array = target.numpy()
        if ds.dtype == np.float32:
            ds.read_direct(array)
        else:
            array[...] = ds[()]
        if not np.isfinite(array).all():
            raise WeightFileError(f"{self.path}: dataset {name!r} contains NaN or infinite values")
        return target


def _gate_order(d: int) -> torch.Tensor:
    """Column permutation from TF's i, j, f, o to our i, f, o, j."""
    i, j, f, o = (torch.arange(k * d, (k + 1) * d) for k in range(4))
    return torch.cat([i, f, o, j])


def _load_lstm_layer(reader: _Reader, options: ModelOptions, layer: int) -> LstmWeights:
    p, d = options.projection_dim, options.lstm_dim
    order = _gate_order(d)
    w_input = torch.empty(2, p, 4 * d)
    w_hidden = torch.empty(2, p, 4 * d)
    bias = torch.empty(2, 4 * d)
    w_proj = torch.empty(2, d, p)
    for direction in (0, 1):
        prefix = lstm_prefix(direction, layer)
        # Read W_0 in halves straight into the two buffers, then reorder columns in place
        # through one temporary row block at a time to keep peak memory low.
        ds = reader.dataset(f"{prefix}/W_0", (2 * p, 4 * d))
        for target, rows in ((w_input[direction], np.s_[:p]), (w_hidden[direction], np.s_[p:])):
            block = ds[rows]
            if not np.isfinite(block).all():
                raise WeightFileError(f"{reader.path}: dataset {prefix + '/W_0'!r} contains NaN or infinite values")
            target.copy_(torch.from_numpy(np.ascontiguousarray(block, dtype=np.float32))[:, order])
            del block
        raw_bias = reader.read(f"{prefix}/B", (4 * d,))
        bias[direction] = raw_bias[order]
        reader.read(f"{prefix}/W_P_0", (d, p), out=w_proj[direction])
    bias[:, d : 2 * d] += FORGET_BIAS  # the f block after reordering
    return LstmWeights(w_input=w_input, w_hidden=w_hidden, bias=bias, w_proj=w_proj)


def _open_weight_file(path: Path) -> h5py.File:
    if not path.is_file():
        raise ModelNotFoundError(f"weight file not found: {path}")
    if not h5py.is_hdf5(path):
        raise WeightFileError(f"{path}: not an HDF5 file (expected an ELMo weights .hdf5)")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise WeightFileError(f"{path}: cannot open as HDF5 ({exc})") from None


def read_datasets(
    path: str | os.PathLike[str], shapes: Mapping[str, tuple[int, ...]], *, source: str = "the options"
) -> dict[str, np.ndarray]:
    """The named datasets of an HDF5 file as they are stored (float32), each one's name, shape and
    finiteness checked as :func:`load_weights` checks them; for readers that need the file's own layout."""
    path = Path(path)
    with _open_weight_file(path) as handle:
        reader = _Reader(handle, path, source)
        return {name: reader.read(name, shape).numpy() for name, shape in shapes.items()}


def load_weights(
    path: str | os.PathLike[str], options: ModelOptions, *, options_source: str = "the options"
) -> ElmoWeights:
    """Read every dataset the options call for from an ELMo weight HDF5 file."""
    path = Path(path)
    with _open_weight_file(path) as handle:
        reader = _Reader(handle, path, options_source)
        c = options.char_embedding_dim
        char_embed = torch.zeros(options.n_characters, c)
        reader.read("char_embed", (options.n_characters - 1, c), out=char_embed[1:])

        convolutions = []
        for i, (width, num) in enumerate(options.filters):
            w = reader.read(f"CNN/W_cnn_{i}", (1, width, c, num))
            # TF (1, width, C, num) -> torch conv1d (num, C, width)
            convolutions.append((w[0].permute(2, 1, 0).contiguous(), reader.read(f"CNN/b_cnn_{i}", (num,))))
        extra = f"CNN/W_cnn_{len(options.filters)}"
        if extra in handle:
            raise WeightFileError(
                f"{path}: has {extra!r} but {options_source} lists {len(options.filters)} filters; "
                "the options file and the weight file do not belong together"
            )

        nf = options.n_filters
        highways = []
        for k in range(options.n_highway):
            prefix = f"CNN_high_{k}"
            highways.append(
                (
                    reader.read(f"{prefix}/W_carry", (nf, nf)),
                    reader.read(f"{prefix}/b_carry", (nf,)),
                    reader.read(f"{prefix}/W_transform", (nf, nf)),
                    reader.read(f"{prefix}/b_transform", (nf,)),
                )
            )
        if f"CNN_high_{options.n_highway}" in handle:
            raise WeightFileError(
                f"{path}: has CNN_high_{options.n_highway} but {options_source} says n_highway={options.n_highway}"
            )
        proj_weight = reader.read("CNN_proj/W_proj", (nf, options.projection_dim))
        proj_bias = reader.read("CNN_proj/b_proj", (options.projection_dim,))

        lstm = [_load_lstm_layer(reader, options, layer) for layer in range(options.n_layers)]
        if f"RNN_0/RNN/MultiRNNCell/Cell{options.n_layers}" in handle:
            raise WeightFileError(
                f"{path}: has more LSTM layers than {options_source} says (n_layers={options.n_layers})"
            )
    return ElmoWeights(
        char_embed=char_embed,
        convolutions=convolutions,
        highways=highways,
        proj_weight=proj_weight,
        proj_bias=proj_bias,
        lstm=lstm,
    )
