"""Numpy arrays over CPU tensors' memory that leave the tensors' storages as torch made them.

Why: ``Tensor.numpy()`` (and ``numpy.asarray(tensor)``) marks the tensor's storage "not resizable", for good.
A training stack that frees a storage by resizing it (FSDP2 frees each unsharded parameter after its forward
with ``untyped_storage().resize_(0)``) then fails with "Trying to resize storage that is not resizable".
DLPack gives numpy the same memory without touching the storage, so the kit reads user tensors only through it.
"""
from __future__ import annotations

import numpy as np
import torch


def numpy_view(t: torch.Tensor) -> np.ndarray:
    """A numpy view of the CPU tensor ``t`` (which does not require grad), valid while ``t`` lives unchanged.

    Raises like ``Tensor.numpy()`` where numpy cannot hold it (bfloat16, a negative or conjugate view). DLPack
    would export a negative view's memory without its sign, so that is refused here."""
    if t.is_neg() or t.is_conj():
        raise TypeError("a negative or conjugate view has no numpy view of its values")
    try:
        return np.from_dlpack(t)
    except BufferError as e:  # numpy's word for a dtype or layout it cannot take
        raise TypeError(str(e)) from e


def numpy_copy(t: torch.Tensor) -> np.ndarray:
    """A numpy copy of the CPU tensor ``t``, in ``t``'s shape and row-major order."""
    return numpy_view(t).copy()
