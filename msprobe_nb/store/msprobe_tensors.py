"""Whole tensors of an msprobe dump (``dump_tensor_data/*.pt`` / ``*.npy``), loaded without unpickling.

``torch.load(weights_only=True)`` and ``numpy.load(allow_pickle=False)``, numeric dtypes only, and only from
inside the dump folder unless the caller allows outside paths.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from msprobe_nb.store.errors import DumpFormatError, show
from msprobe_nb.store.msprobe_tree import is_plain_file_name


def _check_npy(path: Path) -> None:
    """Refuse an .npy file from its header alone, before numpy reads (or allocates) anything: non-numeric
    or structured dtypes, and headers claiming more bytes than the file holds."""
    fmt = np.lib.format
    with open(path, "rb") as fh:
        version = fmt.read_magic(fh)
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, _, dtype = read_header(fh)
        offset = fh.tell()
    if dtype.names is not None or dtype.subdtype is not None or dtype.kind not in "biufc" \
            or dtype.itemsize > (16 if dtype.kind == "c" else 8):
        raise DumpFormatError(f"{path}: holds a numpy array of dtype {dtype.str!r} ({dtype}); only plain "
                              "bool, integer, float and complex tensors are accepted")
    need = math.prod(shape) * dtype.itemsize
    have = path.stat().st_size - offset
    if need > have:
        raise DumpFormatError(f"{path}: its header claims shape {show(shape)} ({need} bytes) but the file holds "
                              f"{have} bytes of data (truncated or corrupt)")


def load_tensor_file(path: str | Path) -> Any:
    """Load one saved tensor without unpickling anything: .pt through ``torch.load(weights_only=True)``
    (explicit, so no environment variable turns it off), .npy through ``numpy.load(allow_pickle=False)``
    after its header says plain numbers (bool, integers, floats, complex)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: tensor file not found")
    try:
        if path.suffix == ".npy":
            _check_npy(path)
            arr = np.load(path, allow_pickle=False)
            import torch

            return torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))
        import torch

        obj = torch.load(path, map_location="cpu", weights_only=True)
    except DumpFormatError:
        raise
    except Exception as e:  # any failure of the safe loaders means a bad or unsafe file
        first = (str(e).strip().splitlines() or [""])[0]
        raise DumpFormatError(f"{path}: cannot load the tensor safely ({type(e).__name__}: {first}); "
                              "only plain tensors are accepted, arbitrary pickled objects are refused") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpFormatError(f"{path}: holds a {type(obj).__name__}, expected a single tensor")
    return obj


class MsprobeTensorLoader:
    """``loader(data_name, step=None, rank=None)``: the whole tensor saved under ``dump_tensor_data``.

    ``folders`` maps (step, rank) to the folders to look in: the rank's dump_tensor_data first, then the
    dump_data_dir its dump.json names. A file is read only if it resolves inside ``root`` (the dump folder):
    a symlink or a dump_data_dir leading elsewhere is refused unless ``allow_outside`` (a dump you trust).
    """

    def __init__(self, folders: dict[tuple[int, int], list[Path]], root: str | Path | None = None,
                 allow_outside: bool = False):
        self.folders = folders
        self.root = None if root is None else Path(root).resolve()
        self.allow_outside = allow_outside

    def __call__(self, data_name: str, step: int | None = None, rank: int | None = None) -> Any:
        if not isinstance(data_name, str) or not is_plain_file_name(data_name):
            raise DumpFormatError(f"data_name {data_name!r} is not a plain file name")
        keys = [k for k in self.folders if (step is None or k[0] == step) and (rank is None or k[1] == rank)]
        if not keys:
            raise KeyError(f"no step {step} / rank {rank} in this dump")
        found = {k: hit for k in keys
                 if (hit := next(((i, d / data_name) for i, d in enumerate(self.folders[k])
                                  if (d / data_name).is_file()), None))}
        if len(found) > 1:
            raise ValueError(f"{data_name!r} exists in several steps/ranks; pass step= and rank=")
        if not found:
            tried = ", ".join(str(d) for k in keys for d in self.folders[k])
            raise FileNotFoundError(f"{data_name}: tensor file not found in {tried} "
                                    "(only part of dump_tensor_data may have been copied)")
        which, file = next(iter(found.values()))
        if self.root is not None and not self.allow_outside:
            real = file.resolve()
            if not real.is_relative_to(self.root):
                how = "its folder is the dump_data_dir that dump.json names" if which else "a symlink leads there"
                raise DumpFormatError(f"{file}: resolves to {real}, outside the dump folder {self.root} ({how}); "
                                      "not read. For a dump you trust, load(..., allow_outside=True) or "
                                      "msprobe-nb export --allow-outside reads it")
        return load_tensor_file(file)


