"""A drop-in for allennlp 0.9's ``ElmoEmbedder`` (``from allennlp.commands.elmo import ElmoEmbedder``).

>>> from elmo_cache.compat import ElmoEmbedder        # was: from allennlp.commands.elmo import ElmoEmbedder
>>> embedder = ElmoEmbedder()                         # the bundled model; or ElmoEmbedder(options_file, weight_file)
>>> embedder.embed_sentence(["The", "cat", "sat", "."]).shape
(3, 4, 256)

Stateless by default (every sentence from the zero LSTM state: the fix for 0.9's "cold start");
``ElmoEmbedder(..., stateful=True)`` carries state across batches as 0.9 did.

The names are imported on first use: ``elmo-cache elmo --help`` reads the defaults of
:mod:`~elmo_cache.compat.hdf5_file` without importing torch (which the embedder needs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elmo_cache.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from elmo_cache.compat.embedder import ElmoEmbedder as ElmoEmbedder
    from elmo_cache.compat.hdf5_file import DEFAULT_BATCH_SIZE as DEFAULT_BATCH_SIZE
    from elmo_cache.compat.hdf5_file import OUTPUT_FORMATS as OUTPUT_FORMATS
    from elmo_cache.compat.hdf5_file import EmbedFileSummary as EmbedFileSummary

# name -> module that defines it
_EXPORTS = {
    "ElmoEmbedder": "elmo_cache.compat.embedder",
    "EmbedFileSummary": "elmo_cache.compat.hdf5_file",
    "DEFAULT_BATCH_SIZE": "elmo_cache.compat.hdf5_file",
    "OUTPUT_FORMATS": "elmo_cache.compat.hdf5_file",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
