"""Small writes into chunks the file already holds, made at the chunk's address with ``os.pwrite``.

Each recorded step writes its new rows into each table's tail (docs/hdf5_schema.md, "Crash safety") and then
its commit row into ``/index/steps``: a few hundred bytes to a few hundred KB, into an unfiltered chunk an
earlier write allocated. Through ``H5Dwrite`` each of these writes pays HDF5's selection, its chunk lookup and
its I/O path, about a hundred microseconds at a step's end, where the bytes themselves take a tenth of that.
An unfiltered chunk never moves once it is allocated (only a filtered chunk whose size changes is stored
again), so its address is looked up once (``H5Dget_chunk_info_by_coord``) and later writes into it go
straight to the file there. The file holds the same bytes, written at the same point of the step and in the
same order against the flush and the commit; a write that fails raises ``OSError`` as HDF5's would.

Only datasets that qualify take this path: chunked, no filters, a little-endian numeric type, in a file
opened with the ``sec2`` driver (the one whose handle is a file descriptor), where ``os.pwrite`` exists (not on
Windows). A chunk that is not allocated yet, or a block that is not one contiguous piece of one chunk, is left
to ``H5Dwrite``, which allocates it.
"""
from __future__ import annotations

import errno
import os
import sys

import h5py
import numpy as np
from h5py import h5t

__all__ = ["ChunkWrites"]


class ChunkWrites:
    """Writes blocks of one dataset into its allocated chunks at their file addresses (see the module)."""

    __slots__ = ("_fd", "_chunk", "_strides", "_addresses")

    def __init__(self, fd: int, chunk: tuple[int, ...], itemsize: int) -> None:
        self._fd = fd
        self._chunk = chunk
        strides, size = [], itemsize
        for c in reversed(chunk):  # C order inside a chunk, as HDF5 stores it
            strides.append(size)
            size *= c
        self._strides = tuple(reversed(strides))
        self._addresses: dict[tuple[int, ...], int] = {}  # chunk coordinates -> byte offset in the file

    @classmethod
    def for_dataset(cls, ds: h5py.Dataset) -> ChunkWrites | None:
        """The writer of ``ds``'s chunks, or None where ``ds`` does not qualify (its writes stay HDF5's)."""
        if not hasattr(os, "pwrite") or ds.chunks is None or ds.dtype.kind not in "iuf" or sys.byteorder != "little":
            return None
        if ds.id.get_create_plist().get_nfilters() != 0:
            return None
        ftype = ds.id.get_type()
        if ds.dtype.itemsize > 1 and ftype.get_order() != h5t.ORDER_LE:
            return None
        f = ds.file
        if f.driver != "sec2":
            return None
        fd = f.id.get_vfd_handle()
        if not isinstance(fd, int) or fd < 0:
            return None
        return cls(fd, tuple(ds.chunks), ds.dtype.itemsize)

    def write(self, start: tuple[int, ...], block: np.ndarray) -> bool:
        """Write ``block`` (C-contiguous, the dataset's dtype) at ``start``; False, with nothing written, where
        it is not one contiguous piece of one allocated chunk (the caller then writes it through HDF5)."""
        place = self._place(start, block.shape)
        if place is None:
            return False
        coord, offset = place
        address = self._addresses.get(coord)
        if address is None:
            return False  # looked up after HDF5's own write allocated it (:meth:`allocated`)
        view = memoryview(block.data).cast("B")
        pos = address + offset
        while len(view):
            n = os.pwrite(self._fd, view, pos)
            if n <= 0:
                raise OSError(errno.EIO, "the write into an HDF5 chunk stopped short")
            view, pos = view[n:], pos + n
        return True

    def allocated(self, ds_id: h5py.h5d.DatasetID, start: tuple[int, ...], shape: tuple[int, ...]) -> None:
        """After HDF5 wrote a block at ``start``: remember the address of the chunk it lies in, once the chunk is
        in the file, so later writes into it take :meth:`write`."""
        place = self._place(start, shape)
        if place is None or place[0] in self._addresses:
            return
        info = ds_id.get_chunk_info_by_coord(place[0])
        if info.byte_offset is not None and info.size == self._strides[0] * self._chunk[0]:
            self._addresses[place[0]] = int(info.byte_offset)

    def _place(self, start: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
        """The chunk a block lies in and its byte offset there, or None where the block is not one contiguous
        piece of one chunk: dimensions of one before the first longer one, whole chunk rows after it."""
        chunk = self._chunk
        if len(start) != len(chunk) or len(shape) != len(chunk):
            return None
        coord, offset, inner = [], 0, False
        for s, n, c, stride in zip(start, shape, chunk, self._strides):
            k = s % c
            if n < 1 or k + n > c or (inner and (k != 0 or n != c)):
                return None
            if n > 1:
                inner = True
            coord.append(s - k)
            offset += k * stride
        return tuple(coord), offset
