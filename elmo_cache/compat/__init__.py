"""A drop-in for allennlp 0.9's ``ElmoEmbedder`` (``from allennlp.commands.elmo import ElmoEmbedder``).

>>> from elmo_cache.compat import ElmoEmbedder        # was: from allennlp.commands.elmo import ElmoEmbedder
>>> embedder = ElmoEmbedder()                         # the bundled model; or ElmoEmbedder(options_file, weight_file)
>>> embedder.embed_sentence(["The", "cat", "sat", "."]).shape
(3, 4, 256)

Stateless by default (every sentence from the zero LSTM state: the fix for 0.9's "cold start");
``ElmoEmbedder(..., stateful=True)`` carries state across batches as 0.9 did.
"""

from elmo_cache.compat.embedder import ElmoEmbedder
from elmo_cache.compat.hdf5_file import DEFAULT_BATCH_SIZE, OUTPUT_FORMATS, EmbedFileSummary

__all__ = ["ElmoEmbedder", "EmbedFileSummary", "DEFAULT_BATCH_SIZE", "OUTPUT_FORMATS"]
