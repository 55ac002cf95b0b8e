"""Writes into allocated chunks at their file addresses (store/hdf5_chunk_writes.py).

The tails and the commit index take this path after a chunk's first write: the file must hold exactly the bytes
``H5Dwrite`` would have put there, readers in this process and others must see them at once, and anything the
path does not cover (a new chunk, a block across chunks or columns, a filtered dataset, another driver) must go
to HDF5 as before.
"""
from __future__ import annotations

import os

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import msprobe_nb as mp
from msprobe_nb.store import hdf5_chunk_writes
from msprobe_nb.store.hdf5_appends import DatasetWriter
from msprobe_nb.store.hdf5_chunk_writes import ChunkWrites


@pytest.fixture
def pwrites(monkeypatch):
    """The calls of os.pwrite the chunk writes make, as (bytes, offset)."""
    seen: list[tuple[int, int]] = []
    real = os.pwrite

    def counted(fd, data, offset):
        seen.append((len(data), offset))
        return real(fd, data, offset)

    monkeypatch.setattr(hdf5_chunk_writes.os, "pwrite", counted)
    return seen


def _pair(tmp_path, shape, chunks, dtype="uint8", **kw):
    """The same dataset in two files: one written through DatasetWriter in place, one by h5py."""
    files = [h5py.File(tmp_path / n, "w", rdcc_nbytes=0) for n in ("in_place.h5", "h5py.h5")]
    sets = [f.create_dataset("d", shape=shape, dtype=dtype, chunks=chunks, **kw) for f in files]
    return files, sets


def test_blocks_written_in_place_are_the_bytes_hdf5_writes(tmp_path, pwrites):
    files, (mine, ref) = _pair(tmp_path, (2, 64, 12), (1, 64, 12))
    w = DatasetWriter(mine, in_place=True)
    assert w.chunks is not None
    rng = np.random.default_rng(0)
    start = 0
    for n in (5, 17, 1, 30, 11):  # rows appended to slot 0, and the same rows to slot 1
        for slot in (0, 1):
            block = rng.integers(0, 256, (1, n, 12), dtype=np.uint8)
            w.write_at((slot, start, 0), block)
            ref[slot, start:start + n] = block[0]
        start += n
    # each slot's first block went through HDF5 (which allocated its chunk), the other four in place
    assert len(pwrites) == 8 and sorted({n for n, _ in pwrites}) == sorted({17 * 12, 12, 30 * 12, 11 * 12})
    for f in files:
        f.flush()
    np.testing.assert_array_equal(mine[...], ref[...])
    other = h5py.File(tmp_path / "in_place.h5", "r")  # a second open of the file sees the rows too
    np.testing.assert_array_equal(other["d"][...], ref[...])
    other.close()
    for f in files:
        f.close()
    with h5py.File(tmp_path / "in_place.h5", "r") as a, h5py.File(tmp_path / "h5py.h5", "r") as b:
        np.testing.assert_array_equal(a["d"][...], b["d"][...])


def test_index_rows_go_in_place_in_chunks_that_grow_with_the_extent(tmp_path, pwrites):
    files, (mine, ref) = _pair(tmp_path, (0, 5), (4, 5), dtype="int64", maxshape=(None, 5))
    w = DatasetWriter(mine, in_place=True)
    for i in range(11):
        if i >= w.length:
            w.set_extent((w.length + 4, 5))
            ref.resize((ref.shape[0] + 4, 5))
        row = np.arange(5, dtype=np.int64).reshape(1, 5) + 100 * i - 2**40
        w.write_at((i, 0), row)
        ref[i] = row[0]
    assert len(pwrites) == 8  # three chunks, each allocated by its first row
    assert all(n == 40 for n, _ in pwrites)
    np.testing.assert_array_equal(mine[...], ref[...])
    for f in files:
        f.close()


@pytest.mark.parametrize("start, shape", [
    ((0, 60, 0), (1, 8, 12)),   # across two chunks of a slot
    ((0, 0, 2), (1, 4, 10)),    # part of each row: not one contiguous piece
    ((0, 0, 0), (2, 4, 12)),    # both slots: two chunks
])
def test_a_block_that_is_not_one_piece_of_one_chunk_goes_to_hdf5(tmp_path, pwrites, start, shape):
    files, (mine, ref) = _pair(tmp_path, (2, 128, 12), (1, 64, 12))
    w = DatasetWriter(mine, in_place=True)
    one = np.ones((1, 1, 12), np.uint8)
    for _ in range(2):  # every chunk allocated by HDF5, then written in place: all four addresses are known
        for at in ((0, 0, 0), (0, 64, 0), (1, 0, 0), (1, 64, 0)):
            w.write_at(at, one)
            ref[at[0], at[1]] = 1
    assert len(pwrites) == 4
    pwrites.clear()
    block = np.full(shape, 7, np.uint8)
    w.write_at(start, block)
    ref[tuple(slice(s, s + n) for s, n in zip(start, shape))] = block
    assert pwrites == []
    np.testing.assert_array_equal(mine[...], ref[...])
    for f in files:
        f.close()


def test_place_finds_the_chunk_and_the_offset():
    cw = ChunkWrites(-1, (1, 64, 12), 1)
    assert cw._place((1, 10, 0), (1, 5, 12)) == ((1, 0, 0), 120)
    assert cw._place((0, 0, 0), (1, 64, 12)) == ((0, 0, 0), 0)
    assert cw._place((0, 63, 0), (1, 2, 12)) is None
    assert cw._place((0, 3, 4), (1, 1, 8)) == ((0, 0, 0), 40)  # one row's end is still one piece
    assert cw._place((0, 3, 4), (1, 2, 8)) is None
    idx = ChunkWrites(-1, (4, 5), 8)
    assert idx._place((9, 0), (1, 5)) == ((8, 0), 40)
    assert idx._place((9, 0), (1, 5, 1)) is None


def test_datasets_the_path_does_not_cover(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        assert ChunkWrites.for_dataset(f.create_dataset("z", (8,), "uint8", chunks=(4,), compression="gzip")) is None
        assert ChunkWrites.for_dataset(f.create_dataset("c", (8,), "uint8")) is None  # contiguous
        assert ChunkWrites.for_dataset(f.create_dataset("b", (8,), ">i4", chunks=(4,))) is None  # big-endian
        assert ChunkWrites.for_dataset(f.create_dataset("s", (8,), h5py.string_dtype(), chunks=(4,))) is None
        assert ChunkWrites.for_dataset(f.create_dataset("ok", (8,), "<i4", chunks=(4,))) is not None
    with h5py.File(tmp_path / "m.h5", "w", driver="core", backing_store=False) as f:  # no file descriptor
        assert ChunkWrites.for_dataset(f.create_dataset("d", (8,), "uint8", chunks=(4,))) is None


def test_no_pwrite_no_path(tmp_path, monkeypatch):
    monkeypatch.delattr(hdf5_chunk_writes.os, "pwrite")  # Windows
    with h5py.File(tmp_path / "a.h5", "w") as f:
        assert ChunkWrites.for_dataset(f.create_dataset("ok", (8,), "<i4", chunks=(4,))) is None


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _record_and_read(path, steps: int) -> list:
    """Record ``steps`` statistics steps, loading the live dump in this process after each; the loads'
    calls tables and the one after close()."""
    model = _model()
    dbg = mp.Debugger(dump_path=path, level="mix", task="statistics")
    seen = []
    for s in range(steps):
        dbg.start(model)
        model(torch.full((4, 8), float(s + 1))).sum().backward()
        model.zero_grad()
        dbg.stop()
        dbg.step()
        seen.append(dbg.load().calls)
    dbg.close()
    seen.append(dbg.load().calls)
    return seen


def test_a_live_dump_read_in_this_process_sees_each_step_as_hdf5_writes_it(tmp_path, monkeypatch, pwrites):
    """Steps written in place and loaded after each step in the same process (where HDF5 shares the open
    file with the reader) read exactly as a recording whose writes all go through HDF5."""
    mine = _record_and_read(tmp_path / "in_place", 40)
    assert len(pwrites) > 40  # the tails and the commit rows went in place
    monkeypatch.setattr(ChunkWrites, "for_dataset", classmethod(lambda cls, ds: None))
    pwrites.clear()
    ref = _record_and_read(tmp_path / "hdf5", 40)
    assert pwrites == []
    assert len(mine) == len(ref)
    for s, (a, b) in enumerate(zip(mine, ref)):
        assert a["step"].max() == min(s, 39)
        cols = ["step", "name", "io", "max", "min", "mean", "norm", "shape"]
        assert a[cols].equals(b[cols]), s
