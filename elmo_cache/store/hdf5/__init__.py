"""The HDF5 container of docs/FORMAT.md: one ``cache.h5`` whose datasets are contiguous, so every
array is read at its offset of the file, by position (``read``), written only once the build is finished
(``writer``); ``container`` is what the rest of the package may know of it.
"""

from elmo_cache.store.hdf5.container import Hdf5Container
from elmo_cache.store.hdf5.read import is_store, open_arrays, open_with_library, read_metadata, read_owned_metadata
from elmo_cache.store.hdf5.writer import Hdf5Writer, little_endian

__all__ = [
    "Hdf5Container",
    "Hdf5Writer",
    "is_store",
    "read_metadata",
    "read_owned_metadata",
    "open_arrays",
    "open_with_library",
    "little_endian",
]
