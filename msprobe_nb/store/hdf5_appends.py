"""Low-level HDF5 appends of the writer: column groups with their two-slot tails, and packed buffers.

Committed bytes are never rewritten: whole chunks go to the main datasets once, the partial chunk to a tail
slot the last commit does not point to (docs/hdf5_schema.md, "Crash safety").
"""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import h5py
import numpy as np
from h5py import h5s, h5t

from msprobe_nb.store.checksums import crc32
from msprobe_nb.store.hdf5_chunk_writes import ChunkWrites
from msprobe_nb.store.hdf5_direct_chunks import chunk_encoder


class ColumnGroup:
    """Columns that grow together, stored so that committed bytes are never rewritten.

    Whole chunks go to the compressed main dataset of each column (``/calls/max``), each written exactly
    once. The last, partial chunk lives in one uncompressed two-slot tail per group (``/tail/calls``, bytes
    of shape (2, chunk, record size)): each row there is one packed little-endian record of all the group's
    columns, laid out as the tail's ``columns`` attribute says. New rows are written after the committed
    ones in the current slot, and when a chunk fills up the leftover rows go to the other slot. A kill
    therefore never damages what the last commit points to, and a step costs one tail write per group
    (a record row is contiguous in the chunk: one write of one piece, where a tail per dtype took five).
    """

    def __init__(self, f: h5py.File, name: str, chunk: int, columns: dict[str, str], filt: dict[str, Any]) -> None:
        self.name, self.chunk = name, chunk
        self.main: dict[str, DatasetWriter] = {}
        for path, dtype in columns.items():
            ds = f.create_dataset(  # fletcher32: HDF5 checks every (compressed) chunk
                path, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(chunk,), **filt,
                fletcher32=True, track_times=False)
            self.main[path] = DatasetWriter(ds, chunk_encoder(ds))
        self.record = np.dtype([(path, np.dtype(dtype).newbyteorder("<")) for path, dtype in columns.items()])
        self.names = tuple(columns)  # the record's field names, in order
        size = self.record.itemsize
        tail = f.create_dataset(f"tail/{name}", shape=(2, chunk, size), dtype="uint8", chunks=(1, chunk, size),
                                track_times=False)
        tail.attrs["columns"] = json.dumps([[p, self.record[p].str] for p in columns])
        self.tail = DatasetWriter(tail, in_place=True)
        # committed length, tail slot, and crc32 of the committed rows of that slot (their record bytes)
        self.length, self.slot, self.crc = 0, 0, 0
        # the rows of each tail slot, as records: appended in place, so a step never copies the older rows
        self.bufs = (np.empty(chunk, self.record), np.empty(chunk, self.record))

    def state(self) -> tuple[int, int, int]:
        return self.length, self.slot, self.crc

    def stage(self, data: dict[str, np.ndarray]) -> tuple[int, int, int]:
        """Write ``data`` beyond the committed rows; returns the state to commit.

        Only rows past the committed ones are touched, in the file and in ``bufs``, so a step that fails
        after staging leaves the committed state as it was. The tail's crc32 goes on from the committed
        rows' (only the new bytes are summed).
        """
        n = len(next(iter(data.values())))
        c, t = self.chunk, self.length % self.chunk
        if t + n < c:
            rec = self.bufs[self.slot][t:t + n]
            for p in self.names:
                rec[p] = data[p]
            if not n:
                return self.length, self.slot, self.crc
            raw = rec.view(np.uint8).reshape(n, self.record.itemsize)
            _write_tail(self.tail, self.slot, t, raw)
            return self.length + n, self.slot, crc32(raw, self.crc)
        # Whole chunks go to the main datasets one column at a time (a large step never holds a second copy
        # of all its columns); only the leftover rows are packed, into the other slot.
        full = (t + n) // c * c
        prev, rest = self.bufs[self.slot][:t], self.bufs[1 - self.slot][:t + n - full]
        base = self.length - t
        for p, ds in self.main.items():
            col = np.concatenate([prev[p], np.asarray(data[p], ds.dtype)])
            append_main(ds, base, col[:full], c)
            rest[p] = col[full:]
        raw = rest.view(np.uint8).reshape(len(rest), self.record.itemsize)
        if len(rest):
            _write_tail(self.tail, 1 - self.slot, 0, raw)
        return self.length + n, 1 - self.slot, crc32(raw)

    def commit(self, state: tuple[int, int, int]) -> None:
        self.length, self.slot, self.crc = state


class DatasetWriter:
    """Writes blocks into one dataset through h5py's low-level API, reusing what every write needs: the
    numpy and HDF5 types, the file dataspace (renewed when :meth:`set_extent` grows it) and a memory
    dataspace per block shape. A step writes several datasets right after the step's own work, and building
    these objects again for each write cost more than the write itself. With ``in_place``, a block that falls in a
    chunk already in the file is written there directly (hdf5_chunk_writes), where the dataset qualifies.
    ``hdf5_calls`` counts the calls into HDF5 that may change the file's metadata (extents, chunk allocations, its
    chunk index): a write in place changes none, so a step whose count did not move needs no flush."""

    __slots__ = ("ds", "dtype", "length", "encode", "chunks", "hdf5_calls", "_id", "_mtype", "_fspace", "_mspaces")

    def __init__(self, ds: h5py.Dataset, encode: Callable[[np.ndarray], bytes] | None = None, *,
                 in_place: bool = False) -> None:
        self.ds, self.dtype = ds, ds.dtype
        self.encode = encode  # whole chunks encoded here and written past HDF5's filters (hdf5_direct_chunks)
        self.chunks = ChunkWrites.for_dataset(ds) if in_place else None
        self.hdf5_calls = 0
        self._id = ds.id  # the low-level dataset: h5py's property makes a Python call on every read
        self.length = ds.shape[0]  # the extent of the first dimension (it changes through set_extent only)
        self._mtype = h5t.py_create(self.dtype)
        self._fspace = self._id.get_space()
        self._mspaces: dict[tuple, Any] = {}

    def set_extent(self, shape: tuple[int, ...]) -> None:
        self.hdf5_calls += 1  # counted before the call: a call that raised may have changed something too
        self._id.set_extent(shape)
        self._fspace = self._id.get_space()
        self.length = shape[0]

    def write_at(self, start: tuple[int, ...], block: np.ndarray) -> None:
        """``ds[start : start + block.shape] = block`` (within the extent)."""
        block = np.ascontiguousarray(block, dtype=self.dtype)
        chunks = self.chunks
        if chunks is not None and start[0] + block.shape[0] <= self.length and chunks.write(start, block):
            return
        mspace = self._mspaces.get(block.shape)
        if mspace is None:
            if len(self._mspaces) > 32:
                self._mspaces.clear()
            mspace = self._mspaces[block.shape] = h5s.create_simple(block.shape)
        self._fspace.select_hyperslab(start, block.shape)
        self.hdf5_calls += 1
        self._id.write(mspace, self._fspace, block, self._mtype)
        if chunks is not None:
            chunks.allocated(self._id, start, block.shape)

    def write_chunks(self, start: int, block: np.ndarray, chunk: int) -> None:
        """``ds[start : start + len(block)] = block`` for whole chunks from a chunk boundary, each encoded by
        ``encode`` and stored as it is (within the extent)."""
        encode = self.encode
        assert encode is not None, "write_chunks() needs an encoder"
        block = np.ascontiguousarray(block, dtype=self.dtype)
        self.hdf5_calls += 1
        for i in range(0, len(block), chunk):
            self._id.write_direct_chunk((start + i,), encode(block[i:i + chunk]), 0)


#: whole chunks a main dataset's extent is grown by at once: a change of extent rewrites the dataset's object
#: header at the next flush, and a step that fills the calls chunk paid that for each of its 34 columns
EXTENT_CHUNKS = 8


def append_main(ds: DatasetWriter, base: int, arr: np.ndarray, chunk: int) -> None:
    """``ds[base:base + n] = arr`` (whole chunks, each written once), the extent grown first where it is short.

    The extent only grows, :data:`EXTENT_CHUNKS` chunks at a time: it runs ahead of the rows by fewer than that many
    chunks, never written and so taking no space, and a step that failed may have grown it too; readers take
    the rows from the commit index's lengths, never from the extent (docs/hdf5_schema.md)."""
    end = base + len(arr)
    if end > ds.length:
        ds.set_extent((max(end, base + EXTENT_CHUNKS * chunk),))
    if ds.encode is not None:
        ds.write_chunks(base, arr, chunk)
    else:
        ds.write_at((base,), arr)


def _write_tail(ds: DatasetWriter, slot: int, start: int, raw: np.ndarray) -> None:
    """``ds[slot, start:start + n] = raw``, the records' bytes ``(n, record size)`` (one contiguous piece of the
    slot's chunk)."""
    ds.write_at((slot, start, 0), raw.reshape(1, *raw.shape))


def write_packed(ds: h5py.Dataset, start: int, arrays: list[np.ndarray], chunk: int) -> None:
    """Write ``arrays`` back to back from ``start`` (a chunk boundary), one whole chunk per write.

    Small arrays are gathered until they fill a chunk; large ones are written from views. No chunk is
    written twice and at most one chunk is copied at a time.
    """
    pieces: list[np.ndarray] = []
    pos, filled = start, 0
    for a in arrays:
        if filled and filled + len(a) >= chunk:
            need = chunk - filled
            ds[pos:pos + chunk] = np.concatenate([*pieces, a[:need]])
            pos, pieces, filled, a = pos + chunk, [], 0, a[need:]
        if not filled:
            cut = len(a) // chunk * chunk
            if cut:
                ds[pos:pos + cut] = a[:cut]
                pos, a = pos + cut, a[cut:]
        if len(a):
            pieces.append(a)
            filled += len(a)
    if filled:
        ds[pos:pos + filled] = np.concatenate(pieces)

