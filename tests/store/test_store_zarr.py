"""The store contract for the zarr container: its hooks, and every test of :class:`StoreContract`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

import elmo_cache
from elmo_cache.store.format import META_KEY, TOKEN_ARRAYS
from tests.contracts.store import StoreContract
from tests.contracts.store_pooled import PooledStoreContract
from tests.contracts.store_quantized import QuantizedStoreContract


class TestZarrStore(StoreContract, PooledStoreContract, QuantizedStoreContract):
    fmt = "zarr"
    parallel = True

    def data_of(self, output: Path, name: str) -> tuple[Path, int]:
        chunk = output / name / "c" / "0"
        while chunk.is_dir():
            chunk = chunk / "0"
        return chunk, 0

    def where(self, name: str) -> str:
        return f"{name}/c/0"

    def truncate_vectors(self, output: Path) -> tuple[str, str]:
        with elmo_cache.open(output) as cache:
            last = cache._vectors.n_chunks - 1
        file = output / "vectors" / "c" / str(last) / "0" / "0"
        file.write_bytes(file.read_bytes()[:-8])
        return f"c/{last}/0/0: shard {last} of array 'vectors'", f"vectors/c/{last}/0/0 (array 'vectors')"

    def delete_array(self, output: Path, name: str) -> None:
        shutil.rmtree(output / name)

    def set_metadata(self, path: Path, raw: str | None = None, **changes) -> None:
        meta_file = path / "zarr.json"
        if raw is not None:
            meta_file.write_text(raw)
            return
        group = json.loads(meta_file.read_text())
        group["attributes"][META_KEY].update(changes)
        meta_file.write_text(json.dumps(group))

    def replace_array(self, path: Path, name: str, data: np.ndarray) -> None:
        import zarr

        shutil.rmtree(path / name)
        group = zarr.open_group(str(path), mode="r+")
        group.create_array(name, shape=data.shape, chunks=(max(1, len(data)),), dtype=data.dtype, compressors=None)[
            ...
        ] = data

    def write_format_1(self, path: Path) -> None:
        for name in TOKEN_ARRAYS:
            shutil.rmtree(path / name)
        (path / "tokens" / "zarr.json").unlink(missing_ok=True)
        (path / "tokens").rmdir()
        (path / "checksums.json").unlink()
        meta_file = path / "zarr.json"
        group = json.loads(meta_file.read_text())
        meta = group["attributes"][META_KEY]
        meta.pop("checksums")
        meta["format_version"] = 1
        meta_file.write_text(json.dumps(group))
