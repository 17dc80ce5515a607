"""The error hierarchy of elmo-cache.

Every error a user can cause derives from :class:`ElmoCacheError` *and* from the
builtin it specialises, so callers may catch either ``ElmoCacheError`` or the
familiar ``FileNotFoundError`` / ``ValueError``. The CLI and the server catch
``ElmoCacheError`` in one place and print its message plainly; the server's errors
module alone turns each class into an HTTP status.
"""

from __future__ import annotations

__all__ = [
    "ElmoCacheError",
    "ModelNotFoundError",
    "ModelDownloadError",
    "OptionsError",
    "WeightFileError",
    "InvalidParameterError",
    "CorpusError",
    "CacheNotFoundError",
    "CacheFormatError",
    "IncompleteCacheError",
    "CacheExistsError",
    "ServiceError",
    "QueueFullError",
    "NotReadyError",
    "LimitExceededError",
    "NotInCacheError",
    "AuthenticationError",
    "LiveTimeoutError",
    "OutputLockedError",
    "CacheTimeoutError",
    "CacheCorruptError",
    "CacheReplacedError",
    "TrainingFailedError",
]


class ElmoCacheError(Exception):
    """Base class of every error elmo-cache raises on purpose."""


class ModelNotFoundError(ElmoCacheError, FileNotFoundError):
    """A model name, directory, options file or weight file does not exist."""


class ModelDownloadError(ElmoCacheError, ConnectionError):
    """A named model is not cached locally and could not be downloaded."""


class OptionsError(ElmoCacheError, ValueError):
    """An ``options.json`` is unreadable or describes an unsupported model."""


class WeightFileError(ElmoCacheError, ValueError):
    """A weight file is not HDF5, lacks a dataset, or has a misshapen one."""


class InvalidParameterError(ElmoCacheError, ValueError):
    """A caller passed a parameter outside its valid choices."""


class CorpusError(ElmoCacheError, ValueError):
    """The input corpus cannot be read as requested (the message names the line)."""


class CacheNotFoundError(ElmoCacheError, FileNotFoundError):
    """A cache path does not exist."""


class CacheFormatError(ElmoCacheError, ValueError):
    """A cache exists but is not a valid elmo-cache store (corrupt or foreign)."""


class IncompleteCacheError(CacheFormatError):
    """A cache whose build has not finished (resume it by running the build again)."""


class CacheExistsError(ElmoCacheError, FileExistsError):
    """The output exists and was built with other options (use ``--overwrite``)."""


class CorpusChangedError(CacheExistsError):
    """The output holds a cache (or an interrupted build) of another version of the corpus: the message says
    how many lines changed, were added or removed and the first that differs (use ``--overwrite``)."""


class ServiceError(ElmoCacheError):
    """A request the embedding service refuses; ``code`` is a stable machine-readable reason."""

    code = "service_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class QueueFullError(ServiceError, RuntimeError):
    """Too many live encodings are already waiting; retry later."""

    code = "queue_full"


class NotReadyError(ServiceError, RuntimeError):
    """The service is still loading or already shutting down (``code`` says which)."""

    code = "not_ready"


class LimitExceededError(ServiceError, ValueError):
    """A request is larger than a configured limit (tokens per sentence, sentences per request)."""

    code = "limit_exceeded"


class NotInCacheError(ServiceError, LookupError):
    """Sentences are not in the cache and no model is loaded to encode them."""

    code = "not_in_cache"


class AuthenticationError(ServiceError, PermissionError):
    """A request without the API key the service requires."""

    code = "unauthorized"


class LiveTimeoutError(ServiceError, TimeoutError):
    """A live encoding waited (queued and encoding) longer than the service allows; retry later."""

    code = "live_timeout"


class OutputLockedError(ElmoCacheError, BlockingIOError):
    """Another live build holds the output's lock (the message names its pid and host)."""


class CacheTimeoutError(ServiceError, TimeoutError):
    """Reading a request's answer from the cache (or writing it out) took longer than the service allows."""

    code = "cache_timeout"


class CacheCorruptError(CacheFormatError):
    """Stored bytes of a cache fail their check (a block checksum, a missing, truncated or non-regular
    file): the cache was damaged after its build (a partial copy or sync, a bit flip). The message names
    the file or dataset and the rows; ``elmo-cache verify`` reports every damage, rebuilding repairs it."""


class CacheReplacedError(CacheCorruptError):
    """The cache at a path was replaced after a reader opened it (``build --update`` or a rebuild published a new
    one there): files the reader opens now would be the new cache's, which its block sums do not vouch for. The
    files it already opened keep giving the old cache's bytes; open the cache again for the new one."""


class TrainingFailedError(ElmoCacheError, RuntimeError):
    """A process of a data-parallel training run died (an error, a signal such as kill -9): the launcher
    stopped the others. The message names the rank and how it ended; the same command resumes the run
    from its last checkpoint."""
