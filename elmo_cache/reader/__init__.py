"""Reading a cache: :func:`open` and :class:`Cache` (``cache``), the cheap integrity checks made at
open (``checks``), pooled vectors stored or computed (``pooled``), a torch ``Dataset`` and
``collate`` (``dataset``) and a learnable mix over cached layers (``scalar_mix``).

Only ``cache`` is imported here: the dataset and the mix import torch, which a reader need not.
"""

from elmo_cache.reader.cache import Cache, open  # noqa: A004 - the public name shadows the builtin on purpose

__all__ = ["open", "Cache"]
