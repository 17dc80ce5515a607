"""The zarr v3 container of docs/FORMAT.md: its reader and its writer.

Files. zarr keeps every chunk of an array in its own file unless chunks are grouped into
*shards* (the ``sharding_indexed`` codec): then a file holds a shard, its chunks one after the
other and an index of where each one is at its end. ``vectors`` is sharded (FORMAT.md says why:
a 100M-sentence cache would otherwise be millions of files); the 1-D arrays are not.

Reading. When an array's chunks are raw bytes (the ``bytes`` codec alone, no compressor, chunked
along rows only) a chunk file *is* the raw C-order bytes of ``chunk_rows`` rows (zarr pads edge
chunks), and so is the data part of a shard whose chunks lie back to back, as this module
writes them. Such an array is read here without zarr at all: each file is opened when first
touched and a sentence is one positioned read (``pread``) of it into a fresh array, from the page
cache every DataLoader worker shares, exactly as with HDF5 (:mod:`elmo_cache.store.positioned` says
why not a mapping: a file truncated under one kills the process). A sentence that straddles two
files is two reads into one array. A file that does not exist is an error, not the fill value zarr
would read (see ``maps._open_file``), and so is one that is not a regular file, or one that is not
the file first opened (replaced under the reader). A shard's index is checked (size, CRC-32C, layout)
when the shard is first opened; the rows themselves are checked against their block sums by the
reader (:mod:`elmo_cache.store.blocksums`).

Open files are bounded per array (an eighth of ``ulimit -n``; see ``maps._max_open_files``); reopening
a closed file costs an ``open`` and an ``fstat`` (a few microseconds). Opening touches only the
``zarr.json`` files and the first and last file of each array, so it is independent of the
cache size, and ``zarr`` itself is not even imported (the writer imports it).

Arrays that are compressed (or chunked across columns) fall back to zarr's own reads, one decoded
chunk at a time (of a shard, zarr reads only that chunk), with a few decoded chunks kept (bounded
by bytes) so that sequential reads decode each chunk once. Random reads of a compressed cache
decode a whole chunk per sentence: that is the price of compression, which saves little on floats.

Writing. See :class:`ZarrWriter`: rows stream into the file of the shard being filled, which
becomes a vectors file when full, so finishing a build never copies the vectors again (at several
KB per token that copy would cost as much as a slow encoder). Finishing (:func:`finish_group`)
writes the per-sentence arrays, the tokens and the index, then ``checksums.json`` (size and CRC-32
of every file but the root ``zarr.json``), sets ``complete: true`` and renames the folder to the
output, so the output path only ever holds a finished cache. :func:`create_group` and
:func:`write_vectors_file` let other writers (a distributed build) fill vectors files in any order.
"""

from __future__ import annotations

from elmo_cache.store.chunked import ChunkedArray
from elmo_cache.store.zarr.read import is_store, open_arrays, open_with_library, read_metadata
from elmo_cache.store.zarr.write import (
    COMPRESSIONS,
    SMALL_CHUNK,
    TEXT_CHUNK,
    create_group,
    file_checksum,
    finish_group,
    vectors_file_path,
    vectors_file_rows,
    write_vectors_file,
)
from elmo_cache.store.zarr.writer import ZarrWriter

__all__ = [
    "COMPRESSIONS",
    "SMALL_CHUNK",
    "TEXT_CHUNK",
    "ChunkedArray",
    "file_checksum",
    "ZarrWriter",
    "create_group",
    "finish_group",
    "vectors_file_path",
    "vectors_file_rows",
    "write_vectors_file",
    "is_store",
    "read_metadata",
    "open_arrays",
    "open_with_library",
]
