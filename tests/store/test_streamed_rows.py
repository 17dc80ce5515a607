"""Rows and plan slices that must not be held whole: a vectors file streamed to disk as its rows come,
a distributed part's rows likewise, a worker's windows read from the plan's files (not its maps), and a
whole-file map copied a block at a time with its pages dropped (issue 17, item 5)."""

from __future__ import annotations

import io
import itertools
import mmap
from pathlib import Path

import numpy as np
import pytest

from elmo_cache.store import Layout
from elmo_cache.store import zarr as zarr_store
from elmo_cache.store.format import BUILD_DIR
from elmo_cache.store.parallel import FRAGMENTS_DIR, copy_rows, file_range, fragment_path
from elmo_cache.store.registry import get_container
from elmo_cache.store.staging import array_blocks
from elmo_cache.store.zarr import write as zarr_write
from elmo_cache.store.zarr.vectors_file import VectorsFileStream

ROW = (2, 4)


def layout(compression: str | None = None) -> Layout:
    return Layout("zarr", ROW, "float32", chunk_rows=3, compression=compression, shard_rows=9)


def rows_of(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *ROW)).astype(np.float32)


def spools(staging: Path) -> list[Path]:
    return sorted((staging / BUILD_DIR).glob("vectors-*.tmp"))


@pytest.mark.parametrize("compression", [None, "blosc-lz4"])
@pytest.mark.parametrize("n_rows, k", [(25, 0), (25, 2)])  # a full file, and the last (partial) one
def test_stream_writes_the_file_write_vectors_file_writes(tmp_path, compression, n_rows, k):
    lay = layout(compression)
    lo, hi = file_range(k, zarr_store.vectors_file_rows(lay), n_rows)
    rows = rows_of(hi - lo, seed=k)
    want = zarr_store.write_vectors_file(tmp_path / "a", lay, n_rows, k, rows)
    with VectorsFileStream(tmp_path / "b", lay, n_rows, k) as stream:
        for piece in np.array_split(rows, [1, 2, 6]):  # pieces across chunk boundaries, one empty
            stream.write(piece)
            # On disk as soon as written: the stream holds no more than its file buffer of rows.
            (spool,) = spools(tmp_path / "b")
            assert spool.stat().st_size >= stream.rows * lay.row_bytes - io.DEFAULT_BUFFER_SIZE
        got = stream.finish()
    assert got == want
    assert spools(tmp_path / "b") == []
    for name in (zarr_store.vectors_file_path(Path(), lay, k), zarr_write.sums_path(Path(), k)):
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()


def test_stream_refuses_too_many_rows_and_an_unfinished_file_leaves_nothing(tmp_path):
    lay = layout()
    stream = VectorsFileStream(tmp_path, lay, 25, 0)
    with pytest.raises(ValueError, match="holds 9 rows"):
        stream.write(rows_of(10))
    stream.write(rows_of(4))
    with pytest.raises(ValueError, match="4 rows written of 9"):
        stream.finish()
    stream.close()
    assert spools(tmp_path) == []
    assert not zarr_store.vectors_file_path(tmp_path, lay, 0).exists()


@pytest.mark.parametrize("first, end", [(0, 25), (4, 22), (9, 18), (2, 7)])
def test_row_sink_streams_a_part(tmp_path, first, end):
    """Whole files owned by the part are published as write_vectors_file writes them; shared ones are
    fragments; at no point does the sink hold more rows in memory than the window it is given."""
    lay, n_rows = layout(), 25
    all_rows = rows_of(n_rows, seed=3)
    staging = tmp_path / "part"
    (staging / BUILD_DIR / FRAGMENTS_DIR).mkdir(parents=True)  # made by the driver (ParallelWriter.create)
    writer = get_container("zarr").parallel_writer()
    assert writer is not None
    with writer.part(staging, lay, n_rows, first, end) as sink:
        pos = first
        for size in (1, 5, 2, 7, 3, 11, 4, 100):
            take = min(size, end - pos)
            sink.add(all_rows[pos : pos + take])
            pos += take
            assert not any(isinstance(v, np.ndarray) and v.ndim == 3 for v in vars(sink).values())
        written = sink.finish()
    file_rows = writer.file_rows(lay)
    assert file_rows == zarr_store.vectors_file_rows(lay)
    for k, got in written.files.items():
        lo, hi = file_range(k, file_rows, n_rows)
        want = zarr_store.write_vectors_file(tmp_path / "ref", lay, n_rows, k, all_rows[lo:hi])
        assert got == want
        name = zarr_store.vectors_file_path(Path(), lay, k)
        assert (staging / name).read_bytes() == (tmp_path / "ref" / name).read_bytes()
    for k, lo, hi in written.fragments:
        assert k not in written.files
        data = np.fromfile(fragment_path(staging, k, lo), dtype=np.float32).reshape(-1, *ROW)
        np.testing.assert_array_equal(data, all_rows[lo:hi])
    covered = sorted(
        [file_range(k, file_rows, n_rows) for k in written.files] + [(lo, hi) for _, lo, hi in written.fragments]
    )
    assert covered[0][0] == first and covered[-1][1] == end
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    assert spools(staging) == [] and not list((staging / BUILD_DIR).rglob("*.tmp"))


def test_copy_rows_reads_in_blocks(tmp_path, monkeypatch):
    from elmo_cache.store import parallel

    lay = layout()
    rows = rows_of(20)
    rows.tofile(tmp_path / "raw.bin")
    monkeypatch.setattr(parallel, "_COPY_BYTES", 3 * lay.row_bytes)

    class Sink:
        def __init__(self) -> None:
            self.pieces: list[np.ndarray] = []

        def write(self, piece: np.ndarray) -> None:
            self.pieces.append(piece)

    sink = Sink()
    copy_rows(tmp_path / "raw.bin", 20, lay, sink)
    assert max(len(p) for p in sink.pieces) == 3
    np.testing.assert_array_equal(np.concatenate(sink.pieces), rows)
    with pytest.raises(OSError, match="shorter"):
        copy_rows(tmp_path / "raw.bin", 21, lay, Sink())


def test_first_pass_windows_are_read_from_the_files_not_the_maps(tmp_path):
    from elmo_cache.builder.firstpass import first_pass
    from elmo_cache.text.corpus import Corpus

    lines = [" ".join(f"w{i}x{j}" for j in range(i % 7)) for i in range(300)]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    plan = first_pass(Corpus(tmp_path / "c.txt"), tmp_path / "plan", 40, dedupe=False, info={})
    want = [plan.window(w) for w in range(len(plan.windows))]

    class Untouchable:
        def __getitem__(self, key):
            raise AssertionError("a window was read through the plan's map")

    for name in ("offsets", "lengths", "hashes", "new", "text_ends", "text"):
        setattr(plan, name, Untouchable())
    assert len(want) > 5
    for w, (window, offsets, new, first_row) in enumerate(want):
        got = plan.window(w)
        assert got[0].tokens == window.tokens and got[0].first_line == window.first_line
        for a, b in (
            (got[0].hashes, window.hashes),
            (got[0].lengths, window.lengths),
            (got[1], offsets),
            (got[2], new),
        ):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        assert got[3] == first_row
    assert [t for w in want for t in w[0].tokens] == [line.split() for line in lines]


def _mapped_rss_kb(address: int) -> int:
    """Rss of the mapping holding ``address`` in this process (/proc/self/smaps)."""
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="madvise needed")
def test_array_blocks_copies_a_map_and_drops_its_pages(tmp_path, monkeypatch):
    from elmo_cache.store import durable, staging

    monkeypatch.setattr(staging, "_COPY_BLOCK", 2**20)  # several pieces per block
    data = np.arange(4 * 2**20, dtype=np.int64)  # 32 MiB
    data.tofile(tmp_path / "a.bin")
    mapped = durable.RawColumn(tmp_path / "a.bin", "int64").read(len(data))
    step = 2**20  # 8 MiB blocks
    got = []
    for start, block in array_blocks(mapped, step):
        assert not isinstance(block, np.memmap) and block.base is None
        got.append((start, block))
        # The pages copied are dropped from the process (what stays is the kernel's fault-around, ~1 MiB).
        assert _mapped_rss_kb(mapped.ctypes.data) <= 4096
    assert [s for s, _ in got] == [0, step, 2 * step, 3 * step]
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), data)
    assert list(array_blocks(np.arange(5), 2))[-1][1].tolist() == [4]  # not a map: plain copies
