"""Whole tensors of a kit HDF5 dump, read one at a time from their rank file's packed byte buffers."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_filters import missing_filter
from msprobe_nb.store.hdf5_open import READ_ERRORS, open_rank_file
from msprobe_nb.store.hdf5_tails import dataset
from msprobe_nb.store.tensor_arrays import array_of_bytes, decodable

__all__ = ["TensorLoader"]


class TensorLoader:
    """``loader(data_name) -> torch.Tensor``: reads one tensor from its rank file on each call.

    Names are ``"rank{r}/" + data_name``, or the bare ``data_name`` (the lowest rank that has it).
    Picklable (holds paths, not open files), so it can travel to worker processes.
    """

    def __init__(self, entries: dict[str, tuple[str, int, int, int, str, tuple[int, ...]]], source: str) -> None:
        self.entries = entries
        self.source = source
        self._files: dict[str, h5py.File] = {}  # opened once per rank file: opening costs ~1 ms a tensor

    def __getstate__(self) -> dict:
        return {"entries": self.entries, "source": self.source}  # open files do not travel

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._files = {}

    def close(self) -> None:
        """Close the rank files this loader opened (they are reopened on the next read)."""
        for f in self._files.values():
            f.close()
        self._files.clear()
        self.__dict__.pop("_blocks", None)

    BLOCK_BYTES = 1 << 24  # tensors are read through 16 MiB blocks: one HDF5 read serves many small tensors
    MAX_BLOCKS = 4

    def _elements(self, data_name: str, path: str, width: int, offset: int, count: int) -> np.ndarray:
        """The ``count`` elements of tensor ``data_name`` in its buffer, or DumpFormatError naming the file and
        why: a read that failed (the filter this process lacks, where that is the cause) or too few elements."""
        if not count:
            return np.zeros(0, np.uint8)
        try:
            arr = self._read(path, width, offset, count)
        except READ_ERRORS as e:
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} cannot be read ({self._lacking(path, width) or e})"
                                  ) from None
        if len(arr) != count:
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} runs past the end of tensors/u{width}")
        return arr

    def _lacking(self, path: str, width: int) -> str | None:
        """After a failed read: the filter of the buffer ``u<width>`` this process cannot decode, if that is why."""
        try:
            with self._buffer(path, width) as ds:
                return missing_filter(ds)
        except (*READ_ERRORS, DumpFormatError):
            return None

    @contextmanager
    def _buffer(self, path: str, width: int) -> Iterator[h5py.Dataset]:
        """The tensor buffer ``u<width>`` of a rank file. A finished file stays open for the next read (opening
        costs ~1 ms); a live one (its writer running, or killed) is closed again at once. Why: HDF5 shares one
        open file, and its metadata cache, between every handle of this process, so a handle kept open would
        pin the extents it saw, and the next read of the growing dump (``load`` again) would find them older
        than the commit index it reads."""
        f = self._files.get(path)
        if f is None or not f.id.valid:
            f = open_rank_file(Path(path))
            if f.swmr_mode:
                try:
                    yield dataset(f, f"tensors/u{width}")
                finally:
                    f.close()
                return
            self._files[path] = f
        yield dataset(f, f"tensors/u{width}")

    def _read(self, path: str, width: int, offset: int, count: int) -> np.ndarray:
        """Elements [offset, offset + count) of a tensor buffer, through a small cache of whole blocks."""
        per_block = self.BLOCK_BYTES // width
        first, last = offset // per_block, (offset + count - 1) // per_block
        if first != last:  # spans blocks (or is larger than one): read it directly
            with self._buffer(path, width) as ds:
                return ds[offset:offset + count]
        blocks = self.__dict__.setdefault("_blocks", {})
        key = (path, width, first)
        block = blocks.pop(key, None)
        if block is None or len(block) < offset - first * per_block + count:  # read while the file was shorter
            with self._buffer(path, width) as ds:
                block = ds[first * per_block:min((first + 1) * per_block, ds.shape[0])]
        blocks[key] = block  # most recently used last
        while len(blocks) > self.MAX_BLOCKS:
            blocks.pop(next(iter(blocks)))
        start = offset - first * per_block
        return block[start:start + count].copy()  # callers may modify the tensor: never share the block

    def __contains__(self, data_name: str) -> bool:
        return data_name in self.entries

    def names(self) -> list[str]:
        """Every ``rank{r}/name`` key."""
        return [k for k in self.entries if k.startswith("rank") and "/" in k]

    def array(self, data_name: str) -> np.ndarray:
        """The tensor as a numpy array, without torch: the analysis's form (bfloat16 and float8 as float32,
        store/tensor_arrays.py)."""
        try:
            path, width, offset, count, dtype_name, shape = self.entries[data_name]
        except KeyError:
            raise KeyError(f"no tensor named {data_name!r} in {self.source!r}") from None
        if not decodable(dtype_name):
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} has unknown dtype {dtype_name!r}")
        arr = self._elements(data_name, path, width, offset, count)
        try:
            return array_of_bytes(arr, dtype_name, tuple(shape))
        except ValueError as e:
            raise DumpFormatError(
                f"{path!r}: tensor {data_name!r} does not fit {dtype_name}{list(shape)} ({e})") from None

    def __call__(self, data_name: str) -> Any:
        import torch

        try:
            path, width, offset, count, dtype_name, shape = self.entries[data_name]
        except KeyError:
            raise KeyError(f"no tensor named {data_name!r} in {self.source!r}") from None
        dtype = getattr(torch, dtype_name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise DumpFormatError(f"{path!r}: tensor {data_name!r} has unknown dtype {dtype_name!r}")
        if count == 0:
            return torch.empty(shape, dtype=dtype)
        arr = self._elements(data_name, path, width, offset, count)
        try:
            return torch.from_numpy(arr.view(np.uint8)).view(dtype).reshape(shape)
        except RuntimeError as e:
            raise DumpFormatError(
                f"{path!r}: tensor {data_name!r} does not fit {dtype_name}{list(shape)} ({e})") from None


