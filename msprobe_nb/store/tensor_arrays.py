"""Stored tensor bytes as numpy arrays for the analysis, without torch (docs/compare.md, "Tensors").

The rule: dtypes numpy has keep their dtype; bfloat16 and float8 (e4m3fn, e5m2) become float32, which holds
each of their values exactly; bool and complex stay bool and complex (the metrics widen them).
"""
from __future__ import annotations

import numpy as np

__all__ = ["array_of_bytes", "decodable"]

_NUMPY = {f"torch.{n}": np.dtype(n) for n in ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16",
                                               "uint32", "uint64", "float16", "float32", "float64",
                                               "complex64", "complex128")}


def _fp8_table(exp_bits: int, man_bits: int, finite_only: bool) -> np.ndarray:
    """The float32 value of each of the 256 bit patterns of an 8-bit float."""
    bits = np.arange(256, dtype=np.int64)
    sign = np.where(bits >> 7, -1.0, 1.0)
    e = (bits >> man_bits) & ((1 << exp_bits) - 1)
    m = bits & ((1 << man_bits) - 1)
    bias = (1 << (exp_bits - 1)) - 1
    frac = m / float(1 << man_bits)
    val = np.where(e == 0, frac * 2.0 ** (1 - bias), (1 + frac) * 2.0 ** (e - bias))
    top = e == (1 << exp_bits) - 1
    if finite_only:  # e4m3fn: no inf, all-ones is NaN
        val = np.where(top & (m == (1 << man_bits) - 1), np.nan, val)
    else:  # e5m2: IEEE-like
        val = np.where(top, np.where(m == 0, np.inf, np.nan), val)
    return (sign * val).astype(np.float32)


_FP8 = {"torch.float8_e4m3fn": (4, 3, True), "torch.float8_e5m2": (5, 2, False)}
_TABLES: dict[str, np.ndarray] = {}


def decodable(dtype_name: str) -> bool:
    """Whether :func:`array_of_bytes` turns this stored dtype into an array."""
    return dtype_name in _NUMPY or dtype_name in _FP8 or dtype_name == "torch.bfloat16"


def array_of_bytes(raw: np.ndarray, dtype_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The stored elements ``raw`` (unsigned integers of any width, the tensor's bytes in native order) as a
    numpy array of ``shape`` under the rule above. ValueError for a dtype it does not decode."""
    b = np.ascontiguousarray(raw).view(np.uint8)
    if dtype_name in _NUMPY:
        return b.view(_NUMPY[dtype_name]).reshape(shape)
    if dtype_name == "torch.bfloat16":  # the top half of a float32
        return (b.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if dtype_name in _FP8:
        table = _TABLES.get(dtype_name)
        if table is None:
            table = _TABLES[dtype_name] = _fp8_table(*_FP8[dtype_name])
        return table[b].reshape(shape)
    raise ValueError(f"no numpy form for stored dtype {dtype_name!r}")
