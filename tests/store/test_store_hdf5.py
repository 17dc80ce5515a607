"""The store contract for the HDF5 container: its hooks, and every test of :class:`StoreContract`."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from elmo_cache.store.format import META_KEY
from tests.contracts.store import StoreContract
from tests.contracts.store_pooled import PooledStoreContract
from tests.contracts.store_quantized import QuantizedStoreContract


class TestHdf5Store(StoreContract, PooledStoreContract, QuantizedStoreContract):
    fmt = "hdf5"
    parallel = False

    def data_of(self, output: Path, name: str) -> tuple[Path, int]:
        with h5py.File(output, "r") as f:
            return output, f[name].id.get_offset()

    def where(self, name: str) -> str:
        return f"dataset {name!r}"

    def truncate_vectors(self, output: Path) -> tuple[str, str]:
        with h5py.File(output, "r") as f:
            end = f["tokens/bytes"].id.get_offset() + 3
        output.write_bytes(output.read_bytes()[:end])
        return str(output), str(output)

    def delete_array(self, output: Path, name: str) -> None:
        with h5py.File(output, "r+") as f:
            del f[name]

    def set_metadata(self, path: Path, raw: str | None = None, **changes) -> None:
        with h5py.File(path, "r+") as f:
            if raw is None:
                meta = json.loads(f.attrs[META_KEY])
                meta.update(changes)
                raw = json.dumps(meta)
            f.attrs[META_KEY] = raw

    def replace_array(self, path: Path, name: str, data: np.ndarray) -> None:
        with h5py.File(path, "r+") as f:
            del f[name]
            f.create_dataset(name, data=data)

    def write_format_1(self, path: Path) -> None:
        with h5py.File(path, "r+") as f:
            del f["tokens"]
            meta = json.loads(f.attrs[META_KEY])
            meta.pop("checksums")
            meta["format_version"] = 1
            f.attrs[META_KEY] = json.dumps(meta)
