"""Row codecs: how a cache stores its rows (float32, float16, int8, pq, opq, or one registered from outside).

The interface comes first (:class:`RowCodec`), then the registry that maps a ``--quantize`` value or a cache's
metadata to a codec, then the float codecs. int8 (:mod:`elmo_cache.rows.quantize`) and product quantisation
(:mod:`elmo_cache.rows.pq`) are in their own modules, which import this one and register themselves; this
module never imports them by name, so that a codec from anywhere (a plugin, a test) is registered the same way.

A codec is parsed once: from the build's options by the plan (:func:`codec_for_option`), or from a cache's
metadata by the reader and verify (:func:`codec_of_metadata`); everything downstream is handed the object. A
codec starts unbound (the model's width unknown) and is bound by :meth:`RowCodec.bind` once it is known.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

import numpy as np

from elmo_cache.errors import CacheFormatError, InvalidParameterError

if TYPE_CHECKING:
    import torch

    from elmo_cache.rows.selection import Selection

__all__ = [
    "FLOAT_CODECS",
    "CodecEntry",
    "FloatCodec",
    "RowCodec",
    "UndecodedSentence",
    "codec_choices",
    "codec_for_option",
    "codec_of_metadata",
    "invalid_option",
    "nonfinite_rows",
    "register_builtin",
    "stored_rows_on_device",
    "unregister_codec",
    "codec_for_reading",
    "pad_floats",
    "quantization_problem",
    "register_codec",
    "registered_schemes",
    "slots_of",
    "stored_row_shape",
]


@runtime_checkable
class RowCodec(Protocol):
    """How the rows of a cache are stored, and everything that depends on it.

    ``dim`` and ``slots`` are None until :meth:`bind` (a plan made before the model is loaded); every method
    below :meth:`bind` needs a bound codec.
    """

    @property
    def name(self) -> str:
        """What --quantize calls it ("none" for the float codecs, "int8", "pq:8", ...)."""
        ...

    @property
    def dtype(self) -> str:
        """Storage dtype of ``vectors``."""
        ...

    @property
    def quantized(self) -> bool:
        """Whether stored rows are codes to decode (``Cache.quantized`` gives them), not floats."""
        ...

    @property
    def read_dtype(self) -> np.dtype:
        """The dtype ``cache[i]`` returns: the stored one for floats, float32 for a decoded cache."""
        ...

    @property
    def training_vectors(self) -> int | None:
        """Token rows of the corpus the codec is trained on before any row is written (None: no training)."""
        ...

    @property
    def exact_pool(self) -> bool:
        """Whether a pool of stored (decoded) rows equals the pool the build stored, bit for bit."""
        ...

    def rounding_step(self, scale: float) -> float | None:
        """How far a stored value of a vector whose largest magnitude is ``scale`` may be from the float it
        stores, beyond float32 round-off (None: no bound, e.g. a nearest centroid; verify then does not
        recompute pooled vectors from the rows)."""
        ...

    def require(self) -> None:
        """Raise :class:`InvalidParameterError` when a build with this codec cannot run here (a missing extra)."""
        ...

    def with_training_vectors(self, vectors: int) -> RowCodec:
        """This codec trained on ``vectors`` token rows (only for a codec with :attr:`training_vectors`)."""
        ...

    def bind(self, dim: int, slots: int) -> RowCodec:
        """This codec for rows of ``slots`` vectors (stored layers, 1 for a mix) of ``dim`` values."""
        ...

    # -- layout and metadata ---------------------------------------------------------------------

    def stored_shape(self, row_shape: Sequence[int]) -> tuple[int, ...]:
        """The stored row of a float row of ``row_shape``."""
        ...

    def to_metadata(self) -> dict[str, Any] | None:
        """The metadata's ``quantization`` object (None: the key is absent, as in a float cache)."""
        ...

    # -- writing ---------------------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> np.ndarray:
        """float32 rows ``(..., dim)`` (or ``(..., slots, dim)``) on any device as stored rows (host numpy).

        A codec may also define ``encode_rows(x) -> torch.Tensor``: the same bytes as a tensor on ``x``'s
        device, whose copy a build queues behind the device's work instead of waiting for it (the built-in
        codecs do; :func:`stored_rows_on_device` uses it where it exists, else this)."""
        ...

    def nonfinite(self, x: torch.Tensor, stored: np.ndarray) -> np.ndarray | None:
        """Which rows of ``stored`` (``encode(x)``, one per token) a reader would get back with a value that is not
        finite: a boolean per row, or None when none (the build refuses them). "Once stored" differs per codec:
        float16 overflows past 65504, int8 keeps a non-finite scale, pq's codes are always finite but mean
        nothing for a non-finite ``x``. Cheap when everything is finite: one check over the batch."""
        ...

    def train(self, sample: np.ndarray) -> RowCodec:
        """This codec trained on ``sample`` ``(n, slots, dim)`` float32 rows."""
        ...

    def parameters(self) -> np.ndarray:
        """The trained values, 1-D little-endian float32 (staged while building, stored as :meth:`final_arrays`)."""
        ...

    @property
    def parameter_shape(self) -> tuple[int, ...]:
        """The shape recorded beside the staged parameters."""
        ...

    def with_parameters(self, values: Any, where: str) -> RowCodec:
        """This codec with trained values ``values`` (as :meth:`parameters` gives them), checked; ``where`` names
        them in errors."""
        ...

    def final_arrays(self) -> dict[str, np.ndarray]:
        """The arrays a finished cache holds for this codec beyond ``vectors`` (pq: its codebooks)."""
        ...

    # -- reading ---------------------------------------------------------------------------------

    def for_reading(self, where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]) -> RowCodec:
        """This codec with what decoding needs from the cache: its :meth:`final_arrays` read from ``optional``
        (array and block sums by name) and checked."""
        ...

    def with_arrays(self, arrays: Mapping[str, Any], where: Any) -> RowCodec:
        """This codec with its arrays taken from ``arrays`` as they are (verify, which checks them itself)."""
        ...

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """Stored rows as float32 ``(..., dim)``."""
        ...

    def decoder(self, read: Callable[[int, int], np.ndarray]) -> Callable[[int, int], np.ndarray]:
        """A reader ``read(start, stop)`` of stored rows as one of the rows ``cache[i]`` is made of."""
        ...

    def raw(self, rows: np.ndarray) -> Any:
        """Stored rows of one sentence, undecoded (``Cache.quantized(i)``, ``CacheDataset`` items)."""
        ...

    def pad(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        """A zero-padded float32 batch of :meth:`raw` sentences (``collate``)."""
        ...

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """float rows as a cache of this codec returns them: encoded, then decoded."""
        ...

    def live_as_cached(
        self, acts: np.ndarray, selection: Selection, stored: Selection, dtype: Any = None
    ) -> np.ndarray:
        """A live encoding ``(3, n_tokens, dim)`` float32 in the form ``selection`` asks, rounded as this cache
        (storing ``stored``) rounds its rows, so that a server's live answers equal its cache hits."""
        ...

    # -- verify ----------------------------------------------------------------------------------

    def sample_problem(
        self, stored: np.ndarray, expected: np.ndarray, atol: float, rtol: float
    ) -> tuple[str | None, float]:
        """Whether stored rows hold ``expected`` (a fresh encoding, token-major) within the encoder's tolerance
        ``atol + rtol * |value|`` and this codec's own error: a problem (None: none) and the largest error."""
        ...


class UntrainedCodec:
    """What a codec with nothing to train and nothing stored beside its rows inherits (the float codecs,
    int8): no training sample, no parameters, no extra arrays, nothing to read at open."""

    @property
    def training_vectors(self) -> int | None:
        return None

    def require(self) -> None:
        return None

    def train(self, sample: np.ndarray) -> Self:
        return self

    def parameters(self) -> np.ndarray:
        return np.empty(0, "<f4")

    @property
    def parameter_shape(self) -> tuple[int, ...]:
        return (0,)

    def with_parameters(self, values: Any, where: str) -> Self:
        return self

    def final_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def for_reading(self, where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]) -> Self:
        return self

    def with_arrays(self, arrays: Mapping[str, Any], where: Any) -> Self:
        return self


class QuantizedCodec:
    """What the quantised codecs share: codes stored, float32 read back, and their ``quantize`` and
    ``dequantize`` as the codec's ``encode`` and ``decode``. A subclass defines those two."""

    @property
    def quantized(self) -> bool:
        return True

    @property
    def read_dtype(self) -> np.dtype:
        return np.dtype(np.float32)

    @property
    def exact_pool(self) -> bool:
        # A pool recomputed from decoded rows is not the pool of the floats the build had.
        return False

    def quantize_rows(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def quantize(self, x: torch.Tensor) -> np.ndarray:
        """:meth:`quantize_rows` on the host."""
        return self.quantize_rows(x).cpu().numpy()

    def dequantize(self, rows: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def encode(self, x: torch.Tensor) -> np.ndarray:
        """:meth:`quantize`."""
        return self.quantize(x)

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`quantize_rows`."""
        return self.quantize_rows(x)

    def decode(self, rows: np.ndarray) -> np.ndarray:
        """:meth:`dequantize`."""
        return self.dequantize(rows)

    def decoder(self, read: Callable[[int, int], np.ndarray]) -> Callable[[int, int], np.ndarray]:
        """A row reader ``read(start, stop)`` of stored rows turned into one of decoded float32 rows."""
        dequantize = self.dequantize
        return lambda start, stop: dequantize(read(start, stop))


class UndecodedSentence:
    """One sentence of a quantised cache, undecoded: numpy sees its decoded float32 values
    (``np.asarray(item)`` is ``cache[i]``); a subclass says how it decodes, what shape that gives, and may
    batch its decoding in :meth:`collate`."""

    codes: np.ndarray

    @property
    def ndim(self) -> int:
        return self.codes.ndim

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the decoded floats."""
        raise NotImplementedError

    @property
    def dtype(self) -> np.dtype:
        """The dtype of the decoded floats."""
        return np.dtype(np.float32)

    def dequantize(self) -> np.ndarray:
        raise NotImplementedError

    def collate(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        """A zero-padded float32 batch of ``items`` (this one among them, as ``collate`` found it first): each
        decoded, then padded; a subclass decodes the batch at once."""
        return pad_floats([item.dequantize() for item in items], max_tokens)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype, copy=False)


def stored_rows_on_device(codec: RowCodec, x: torch.Tensor) -> torch.Tensor:
    """``codec``'s stored rows of ``x`` as a tensor: on ``x``'s device through the codec's ``encode_rows`` where it
    has one (see :meth:`RowCodec.encode`), else its host rows from ``encode``."""
    import torch

    encode_rows = getattr(codec, "encode_rows", None)
    if encode_rows is not None:
        rows: torch.Tensor = encode_rows(x)
        return rows
    return torch.from_numpy(codec.encode(x))


def nonfinite_rows(values: np.ndarray) -> np.ndarray | None:
    """Which rows (first axis) of ``values`` hold a value that is not finite, or None when none: one check over
    the whole array first, since a build calls this on every batch and almost never finds one."""
    if np.isfinite(values).all():
        return None
    return ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)


def pad_floats(arrays: Sequence[Any], max_tokens: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A zero-padded batch of float sentences ``(n_layers, n_tokens, dim)`` or ``(n_tokens, dim)``, in
    ``dtype`` (default float32): each sentence cast once, straight into the batch."""
    import torch

    dtype = torch.float32 if dtype is None else dtype
    if dtype not in (torch.float16, torch.float32, torch.float64):
        # No numpy view of bfloat16 to cast into: pad in float32, then one cast.
        return pad_floats(arrays, max_tokens).to(dtype)

    first = arrays[0]
    layered = first.ndim == 3
    token_axis = 1 if layered else 0
    shape = (
        (len(arrays), first.shape[0], max_tokens, first.shape[-1])
        if layered
        else (len(arrays), max_tokens, first.shape[-1])
    )
    vectors = torch.zeros(shape, dtype=dtype)
    out = vectors.numpy()  # one cast-and-copy per sentence, straight from the rows read
    per_token = first.shape[:token_axis] + first.shape[token_axis + 1 :]
    for b, array in enumerate(arrays):
        if array.shape[:token_axis] + array.shape[token_axis + 1 :] != per_token:
            raise InvalidParameterError(f"collate: item {b} has shape {array.shape}, unlike item 0 {first.shape}")
        n = array.shape[token_axis]
        if layered:
            out[b, :, :n] = array
        else:
            out[b, :n] = array
    return vectors


# -- the registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CodecEntry:
    """A registered codec family: how its ``--quantize`` values and its metadata become codecs."""

    # Metadata ``quantization.scheme`` values it reads, and the ``--quantize`` prefixes (before any ":") it takes.
    schemes: tuple[str, ...]
    # The codec of a --quantize value whose scheme is one of ``schemes``; raises InvalidParameterError for a bad one.
    parse: Callable[[str], RowCodec]
    # The bound codec a cache's metadata records (its ``quantization`` object's scheme is one of ``schemes``);
    # raises CacheFormatError for a description it cannot read.
    from_metadata: Callable[[Mapping[str, Any], int, int], RowCodec]
    # How its --quantize values are written, for error messages ("int8", "pq:M").
    choices: tuple[str, ...]
    # What its metadata looks like, for the error on invalid metadata.
    expected: str
    # Whether ``quantization`` (the metadata object) with vectors of ``dtype`` is one this codec reads.
    valid_metadata: Callable[[Mapping[str, Any], Any], bool]
    # More words on the choices (pq's M), or "".
    help: str = ""


_REGISTRY: dict[str, CodecEntry] = {}
_ENTRIES: list[CodecEntry] = []
# The codecs shipped with elmo-cache, registered when their module is imported; imported by name on first lookup
# so that this module (which they import) imports none of them.
_BUILTIN_MODULES = ("elmo_cache.rows.quantize", "elmo_cache.rows.pq")
_builtins_loaded = False


def register_codec(entry: CodecEntry, *, replace_existing: bool = False) -> None:
    """Register a codec family: ``--quantize`` values and cache metadata with one of ``entry.schemes`` become its
    codecs. A scheme registered already is an error unless ``replace_existing``."""
    _load_builtins()
    taken = [s for s in entry.schemes if s in _REGISTRY or s in FLOAT_CODECS or s == "none"]
    if taken and not replace_existing:
        raise InvalidParameterError(f"register_codec: scheme(s) {taken} are registered already")
    _add(entry)


def unregister_codec(scheme: str) -> None:
    """Forget the codec family registered for ``scheme`` (tests register codecs of their own)."""
    entry = _REGISTRY.get(scheme)
    if entry is None:
        raise InvalidParameterError(
            f"unregister_codec: scheme {scheme!r} is not registered; registered: {registered_schemes()}"
        )
    for name in entry.schemes:
        _REGISTRY.pop(name, None)
    _ENTRIES.remove(entry)


def _add(entry: CodecEntry) -> None:
    for old in {id(_REGISTRY[s]): _REGISTRY[s] for s in entry.schemes if s in _REGISTRY}.values():
        for name in old.schemes:
            _REGISTRY.pop(name, None)
        _ENTRIES.remove(old)
    for scheme in entry.schemes:
        _REGISTRY[scheme] = entry
    _ENTRIES.append(entry)


def register_builtin(entry: CodecEntry) -> None:
    """:func:`register_codec` for the codec modules shipped with elmo-cache, as they are imported."""
    _add(entry)


def _entries() -> list[CodecEntry]:
    """The registered families: the shipped ones first, in :data:`_BUILTIN_MODULES` order (whichever module was
    imported first), then the others in the order they were registered."""
    _load_builtins()

    def rank(entry: CodecEntry) -> int:
        module = getattr(entry.parse, "__module__", None)
        return _BUILTIN_MODULES.index(module) if module in _BUILTIN_MODULES else len(_BUILTIN_MODULES)

    return sorted(_ENTRIES, key=rank)  # stable: registration order within a rank


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        for module in _BUILTIN_MODULES:
            importlib.import_module(module)


def registered_schemes() -> list[str]:
    """The metadata schemes of every registered codec (the float codecs have none)."""
    return [scheme for entry in _entries() for scheme in entry.schemes]


def codec_choices() -> list[str]:
    """The valid ``--quantize`` values, as written in help and errors."""
    return ["none", *(choice for entry in _entries() for choice in entry.choices)]


def codec_for_option(value: str | None, *, fp16: bool = False) -> RowCodec:
    """The codec of ``--quantize value`` (None or "none": floats, float16 with ``fp16``), unbound; anything
    else is an error naming ``quantize`` and listing the choices."""
    if value is None or value == "none":
        return FLOAT16 if fp16 else FLOAT32
    _load_builtins()
    entry = _REGISTRY.get(str(value).split(":")[0])
    if entry is None:
        raise invalid_option(value)
    codec = entry.parse(value)
    if fp16:
        raise InvalidParameterError(
            f"fp16, quantize: --quantize {value} stores codes (and, for int8, float32 scales), so --fp16 (float16 "
            "storage) does not apply; drop one of them"
        )
    return codec


def invalid_option(value: Any) -> InvalidParameterError:
    """The error for a ``--quantize`` value no registered codec takes (or that its codec refuses): the choices."""
    helps = "; ".join(e.help for e in _entries() if e.help)
    return InvalidParameterError(
        f"quantize: {value!r} is not valid; choose from {codec_choices()}" + (f" ({helps})" if helps else "")
    )


def slots_of(meta: Mapping[str, Any]) -> int:
    """Vectors per stored row that a cache's metadata implies: its layers, or 1 for a mix."""
    return len(meta.get("layers") or []) if meta.get("kind") == "layers" else 1


def codec_of_metadata(meta: Mapping[str, Any]) -> RowCodec:
    """The bound codec a cache's metadata records (no ``quantization``: its float dtype); its extra arrays are
    not read (shapes and dtypes only: :func:`codec_for_reading` for decoding)."""
    raw = meta.get("quantization")
    dim = int(meta.get("dim") or 0)
    slots = slots_of(meta)
    if raw is None:
        return FloatCodec(str(meta.get("dtype"))).bind(dim, slots)
    _load_builtins()
    entry = _REGISTRY.get(str(raw.get("scheme"))) if isinstance(raw, Mapping) else None
    if entry is None:
        raise CacheFormatError(
            f"metadata quantization {raw!r} is not one this elmo-cache reads "
            f"(one of {registered_schemes()}); upgrade elmo-cache"
        )
    return entry.from_metadata(raw, dim, slots)


def codec_for_reading(where: Any, meta: Mapping[str, Any], optional: Mapping[str, tuple[Any, Any]]) -> RowCodec:
    """:func:`codec_of_metadata` for a reader: what decoding needs (a pq cache's codebooks) read from ``optional``
    (the cache's optional arrays and their block sums, by name) and checked now."""
    return codec_of_metadata(meta).for_reading(where, meta, optional)


def stored_row_shape(meta: Mapping[str, Any]) -> tuple[int, ...]:
    """The shape of one row of ``vectors`` that a cache's metadata implies (quantised rows included)."""
    dim = int(meta.get("dim") or 0)
    row: tuple[int, ...] = (dim,) if meta.get("kind") == "mix" else (len(meta.get("layers") or []), dim)
    return codec_of_metadata(meta).stored_shape(row)


def quantization_problem(raw: Mapping[str, Any]) -> str | None:
    """What is wrong with the ``quantization`` and ``dtype`` of metadata ``raw`` (None: nothing; a float cache's
    dtype is checked by :func:`elmo_cache.store.format.parse_metadata` itself)."""
    quantization = raw.get("quantization")
    if quantization is None:
        return None
    _load_builtins()
    scheme = quantization.get("scheme") if isinstance(quantization, dict) else None
    entry = _REGISTRY.get(scheme) if isinstance(scheme, str) else None
    if entry is not None and entry.valid_metadata(quantization, raw.get("dtype")):
        return None
    expected = ", or ".join(e.expected for e in _entries())
    return (
        f"quantization {quantization!r} with dtype {raw.get('dtype')!r} (expected {expected}; a newer "
        "elmo-cache may read it)"
    )


# -- the float codecs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FloatCodec(UntrainedCodec):
    """Rows stored as floats (float32, or float16 with ``--fp16``): no metadata ``quantization``, read as stored."""

    # "float32" or "float16".
    float_dtype: str = "float32"
    dim: int | None = None
    slots: int | None = None
    name: str = "none"

    @property
    def dtype(self) -> str:
        return self.float_dtype

    @property
    def quantized(self) -> bool:
        return False

    @property
    def read_dtype(self) -> np.dtype:
        return np.dtype(self.float_dtype)

    @property
    def exact_pool(self) -> bool:
        return self.float_dtype == "float32"

    def rounding_step(self, scale: float) -> float | None:
        # float16: a unit in the last place (2**-10 relative); float32 stores the floats themselves.
        return scale * 2.0**-10 if self.float_dtype == "float16" else 0.0

    def with_training_vectors(self, vectors: int) -> FloatCodec:
        raise InvalidParameterError("codebook_sample: float rows are not trained")

    def bind(self, dim: int, slots: int) -> FloatCodec:
        return replace(self, dim=int(dim), slots=int(slots))

    def stored_shape(self, row_shape: Sequence[int]) -> tuple[int, ...]:
        return tuple(row_shape)

    def to_metadata(self) -> dict[str, Any] | None:
        return None

    def encode(self, x: torch.Tensor) -> np.ndarray:
        return self.encode_rows(x).cpu().numpy()

    def encode_rows(self, x: torch.Tensor) -> torch.Tensor:
        import torch

        # Cast on the device, so only the stored bytes cross to the host.
        dtype = torch.float16 if self.float_dtype == "float16" else torch.float32
        return x.to(dtype, memory_format=torch.contiguous_format)

    def nonfinite(self, x: torch.Tensor, stored: np.ndarray) -> np.ndarray | None:
        # After the cast: float16 turns magnitudes past 65504 into inf.
        return nonfinite_rows(stored)

    def decode(self, rows: np.ndarray) -> np.ndarray:
        return np.asarray(rows, dtype=np.float32)

    def decoder(self, read: Callable[[int, int], np.ndarray]) -> Callable[[int, int], np.ndarray]:
        return read  # cache[i] is in the stored dtype: nothing to decode

    def raw(self, rows: np.ndarray) -> np.ndarray:
        return rows

    def pad(self, items: Sequence[Any], max_tokens: int) -> torch.Tensor:
        return pad_floats(items, max_tokens)

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=self.float_dtype).astype(np.float32)

    def live_as_cached(
        self, acts: np.ndarray, selection: Selection, stored: Selection, dtype: Any = None
    ) -> np.ndarray:
        # A float cache stores what a live answer in its dtype is: the cast is all the rounding there is.
        return selection.apply_array(acts, dtype)

    def sample_problem(
        self, stored: np.ndarray, expected: np.ndarray, atol: float, rtol: float
    ) -> tuple[str | None, float]:
        error = np.abs(stored.astype(np.float32) - expected)
        worst = float(error.max())
        if (error > atol + rtol * np.abs(expected)).any():
            return (
                f"stored vectors differ from a fresh encoding by up to {worst:.3g} (tolerance {atol:g} + {rtol:g} "
                "x |value|)"
            ), worst
        return None, worst


FLOAT32 = FloatCodec("float32")
FLOAT16 = FloatCodec("float16")
FLOAT_CODECS = {"float32": FLOAT32, "float16": FLOAT16}
"""The float codecs by storage dtype."""
