"""elmo-cache: precompute contextual ELMo embeddings once, read them straight from disk, serve them fast.

Public API (imported lazily, so ``import elmo_cache`` stays cheap)::

    from elmo_cache import Encoder, open, build, CacheDataset, collate, BucketBatchSampler, ScalarMix
"""

from __future__ import annotations

import os as _os
import sys as _sys
from typing import TYPE_CHECKING

from elmo_cache._primitives import bound_primitive_caches
from elmo_cache.lazy import lazy_exports
from elmo_cache.version import __version__

# The build lock (fcntl.flock) and the zarr reader's open-file budget (resource.getrlimit) are POSIX's, and
# setup.cfg declares POSIX: elsewhere one clear error at import, not a ModuleNotFoundError from deep in a read.
if _os.name != "posix":
    raise ImportError(
        f"elmo-cache runs on POSIX systems (Linux, macOS), not on {_sys.platform!r}: its build lock needs fcntl "
        "and its zarr reader resource; on Windows use WSL or the Docker image"
    )

# Before anything imports torch, which reads these once: see elmo_cache._primitives.
bound_primitive_caches()

# name -> module that defines it
_EXPORTS = {
    "Encoder": "elmo_cache.encoder.encoder",
    "ModelOptions": "elmo_cache.model.options",
    "MixSpec": "elmo_cache.rows.selection",
    "Selection": "elmo_cache.rows.selection",
    "BuildOptions": "elmo_cache.builder",
    "build": "elmo_cache.builder",
    "open": "elmo_cache.reader.cache",
    "Cache": "elmo_cache.reader.cache",
    "CacheDataset": "elmo_cache.reader.dataset",
    "collate": "elmo_cache.reader.dataset",
    "BucketBatchSampler": "elmo_cache.reader.dataset",
    "ScalarMix": "elmo_cache.reader.scalar_mix",
    "tokenize": "elmo_cache.text.tokenize",
    "sentence_hash": "elmo_cache.text.tokenize",
    "ElmoCacheError": "elmo_cache.errors",
    "ModelNotFoundError": "elmo_cache.errors",
    "ModelDownloadError": "elmo_cache.errors",
    "OptionsError": "elmo_cache.errors",
    "WeightFileError": "elmo_cache.errors",
    "InvalidParameterError": "elmo_cache.errors",
    "CorpusError": "elmo_cache.errors",
    "CacheNotFoundError": "elmo_cache.errors",
    "CacheFormatError": "elmo_cache.errors",
    "CacheCorruptError": "elmo_cache.errors",
    "CacheReplacedError": "elmo_cache.errors",
    "IncompleteCacheError": "elmo_cache.errors",
    "CacheExistsError": "elmo_cache.errors",
    "CorpusChangedError": "elmo_cache.errors",
    "QueueFullError": "elmo_cache.errors",
    "NotReadyError": "elmo_cache.errors",
    "LimitExceededError": "elmo_cache.errors",
    "NotInCacheError": "elmo_cache.errors",
    "AuthenticationError": "elmo_cache.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # pragma: no cover
    # Re-exports for type checkers and IDEs (``X as X`` marks them public).
    from elmo_cache.builder import BuildOptions as BuildOptions
    from elmo_cache.builder import build as build
    from elmo_cache.encoder.encoder import Encoder as Encoder
    from elmo_cache.errors import *  # noqa: F403
    from elmo_cache.model.options import ModelOptions as ModelOptions
    from elmo_cache.reader.cache import Cache as Cache
    from elmo_cache.reader.cache import open as open  # noqa: A004 - the public name shadows the builtin on purpose
    from elmo_cache.reader.dataset import BucketBatchSampler as BucketBatchSampler
    from elmo_cache.reader.dataset import CacheDataset as CacheDataset
    from elmo_cache.reader.dataset import collate as collate
    from elmo_cache.reader.scalar_mix import ScalarMix as ScalarMix
    from elmo_cache.rows.selection import MixSpec as MixSpec
    from elmo_cache.rows.selection import Selection as Selection
    from elmo_cache.text.tokenize import sentence_hash as sentence_hash
    from elmo_cache.text.tokenize import tokenize as tokenize


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
