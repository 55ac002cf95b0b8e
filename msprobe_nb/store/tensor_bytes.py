"""How a tensor handed to the dump writer becomes the bytes it stores: its width, raw bytes, dtype and shape.

Plain contiguous CPU tensors and the recorder's numpy host copies are viewed as they are; anything else is
converted (docs/hdf5_schema.md, "Tensors"). torch is imported only when a torch tensor is handed over.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["tensor_bytes"]

#: the dtypes numpy and torch share by name: numpy arrays of these (native byte order) are stored as the torch
#: dtype of the same name, and plain CPU tensors of these are viewed through numpy as they are
SHARED_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
_NUMPY_TENSOR_DTYPES = {np.dtype(n): f"torch.{n}" for n in SHARED_DTYPES}
#: (plain tensor types, {torch dtype: its name}, the strided layout) for :func:`_plain_tensor_bytes`; filled on
#: first use (the store imports torch only when it is handed tensors)
_PLAIN: tuple[tuple[type, ...], dict[Any, str], Any] | None = None


def _numpy_tensor_bytes(name: str, a: np.ndarray) -> tuple[int, np.ndarray, str, tuple[int, ...]]:
    """A numpy array handed as a tensor (the recorder's host copies are): stored as the torch dtype of the same
    name, read back as a torch tensor."""
    dtype = _NUMPY_TENSOR_DTYPES.get(a.dtype)
    if dtype is None:
        raise TypeError(f"tensor {name!r}: numpy dtype {a.dtype} has no torch dtype to store it as "
                        f"(expected one of {', '.join(sorted(str(d) for d in _NUMPY_TENSOR_DTYPES))})")
    shape = a.shape  # before ascontiguousarray, which makes a 0-d array 1-d
    flat = np.ascontiguousarray(a).reshape(-1)
    width = a.itemsize
    return width, flat.view(f"uint{8 * width}"), dtype, shape


def _plain_tensor_bytes(t: Any) -> tuple[int, np.ndarray, str, tuple[int, ...]] | None:
    """The common case of :func:`tensor_bytes` in a few attribute reads: a plain, contiguous CPU tensor
    of a dtype numpy holds, neither conjugated nor negated, is viewed as it is (the same bytes as the general
    path). None for anything else, which the general path converts or refuses."""
    global _PLAIN
    if _PLAIN is None:
        import torch

        _PLAIN = ((torch.Tensor, torch.nn.Parameter), {getattr(torch, n): f"torch.{n}" for n in SHARED_DTYPES},
                  torch.strided)
    types, names, strided = _PLAIN
    if type(t) not in types:
        return None
    dtype = names.get(t.dtype)
    if dtype is None or t.layout is not strided or not t.is_cpu or not t.is_contiguous() or t.is_neg():
        return None
    arr = t.numpy(force=True) if t.requires_grad else t.numpy()  # force: no detach() (a view all the same)
    width = arr.itemsize
    return width, arr.reshape(-1).view(f"uint{8 * width}"), dtype, tuple(t.shape)


def tensor_bytes(name: str, t: Any) -> tuple[int, np.ndarray, str, tuple[int, ...]]:
    """(width, the bytes viewed as unsigned integers of that width, the torch dtype's name, the shape) of the
    tensor ``name`` handed to the writer: a torch tensor (moved to the CPU, conjugate and negative views
    resolved, made contiguous) or a numpy array of a dtype torch shares. TypeError for what cannot be stored."""
    if type(t) is np.ndarray:
        return _numpy_tensor_bytes(name, t)
    plain = _plain_tensor_bytes(t)
    if plain is not None:
        return plain
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise TypeError(f"tensor {name!r}: layout {t.layout} is not supported (convert to dense first)")
    if t.is_quantized:
        raise TypeError(f"tensor {name!r}: quantized tensors are not supported (dequantize first)")
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    width = min(t.element_size(), 8)
    raw = t.reshape(-1).view(torch.uint8).numpy()
    return width, raw.view(f"uint{8 * width}"), str(t.dtype), tuple(t.shape)
