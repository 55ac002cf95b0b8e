"""Columns as the writer receives them, made plain: length checks, missing values, whole integers, JSON.

A column may be a list, a tuple, a numpy array or a pandas Series; the writer does not import pandas, so
pandas' NA is recognised by its type's name.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from msprobe_nb.store.c_functions import optional_function

#: the layout of _nullable_ints this Python expects (NULLABLE_INTS_ABI in _nullable_ints.c)
NULLABLE_INTS_ABI = 1
_from_floats = optional_function("_nullable_ints", NULLABLE_INTS_ABI, "from_floats")  # None: numpy's passes


def json_default(obj: Any) -> Any:
    """JSON for what ``json.dumps`` cannot write itself: numpy scalars, sets and tuples, else the text."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def as_1d(values: Any, col: str, n: int | None) -> Any:
    """Length check; returns ``values`` unchanged (lists stay lists)."""
    try:
        m = len(values)
    except TypeError:
        raise ValueError(f"column {col!r}: expected a list or 1-D array, got {type(values).__name__}") from None
    if isinstance(values, np.ndarray) and values.ndim != 1:
        raise ValueError(f"column {col!r}: expected a 1-D array, got shape {values.shape}")
    if n is not None and m != n:
        raise ValueError(f"column {col!r} has {m} values, other columns have {n}")
    return values


def as_list(values: Any) -> list:
    """Plain Python values of a column (list, tuple, numpy array, pandas Series/Index/array)."""
    if isinstance(values, list):
        return values
    tolist = getattr(values, "tolist", None)
    return tolist() if tolist is not None else list(values)


def is_missing(v: Any) -> bool:
    """None, NaN or pandas' NA (recognised by type name: the writer does not import pandas)."""
    return v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"


def nullable(values: Any, n: int, na: int, dtype: Any, cast: Any) -> np.ndarray:
    """A nullable column as numpy: missing values become ``na``."""
    if isinstance(values, np.ndarray) and values.dtype.kind == "f":
        if _from_floats is not None and values.ndim == 1:  # one pass in C, the same ints and the same error
            floats = np.ascontiguousarray(values, dtype=np.float64)
            out = np.empty(len(floats), np.int64)
            bad = _from_floats(floats, na, out)
            if bad >= 0:
                raise ValueError(f"{float(floats[bad])!r} is not an integer")
            return out.astype(dtype, copy=False)
        missing = np.isnan(values)
        filled = np.where(missing, 0.0, values)
        with np.errstate(invalid="ignore"):  # inf or beyond int64: caught as not equal below
            ints = filled.astype(np.int64)
        bad = ints != filled
        if bad.any():  # never truncated: 1.5 or inf is an error, as exact_int makes it for a list
            raise ValueError(f"{float(filled[bad][0])!r} is not an integer")
        ints[missing] = na
        return ints.astype(dtype, copy=False)
    return np.fromiter((na if is_missing(v) else cast(v) for v in as_list(values)), dtype, count=n)


def exact_int(v: Any) -> int:
    """An integer value; a float must be whole (1.0 is 1, 1.5 is an error)."""
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{v!r} is not an integer")
    return int(v)
