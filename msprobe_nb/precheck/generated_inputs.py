"""Inputs for a statistics dump: tensors generated to match a row's dtype, shape, range and mean.

This is msprobe's random mode, and it is approximate: the values are not the recorded ones, so a kernel
that is wrong only on the run's real data (a cancellation, an overflow at one spot) may pass. Floats are
drawn uniformly in [min, max] and bent by a power law so that their expected mean is the recorded mean
(the norm is not matched); min and max themselves are placed at the first two elements. Integers are
drawn in [min, max], bools with the recorded all/any. A row without statistics (NaN in the tensor) gets
standard normal values, and says so.
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import torch

__all__ = ["generate"]


def _num(x: Any) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return math.nan
    return v


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dt


def generate(row: Any, notes: list[str]) -> torch.Tensor:
    """A CPU tensor like the one ``row`` (a calls-table row) describes; ``notes`` gets what was not matched.
    Seeded by the row's name, so a check is repeatable."""
    dtype = _dtype(str(row.dtype))
    shape = tuple(int(s) for s in (row.shape or ()))
    gen = torch.Generator().manual_seed(zlib.crc32(str(row.name).encode()))
    lo, hi, mean = _num(row.min), _num(row.max), _num(row.mean)
    n = math.prod(shape)
    if dtype == torch.bool:
        if not math.isnan(lo) and lo >= 1:
            return torch.ones(shape, dtype=dtype)
        if not math.isnan(hi) and hi <= 0:
            return torch.zeros(shape, dtype=dtype)
        return torch.rand(shape, generator=gen) < 0.5
    if not dtype.is_floating_point and not dtype.is_complex:
        if math.isnan(lo) or math.isnan(hi):
            notes.append(f"{row.name}: no range recorded; integers drawn in [0, 10)")
            lo, hi = 0.0, 9.0
        return torch.randint(int(lo), int(hi) + 1, shape, generator=gen, dtype=torch.int64).to(dtype)
    if not all(map(math.isfinite, (lo, hi))):
        notes.append(f"{row.name}: no finite range recorded (NaN or inf in the tensor); standard normal values")
        return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    t = torch.rand(shape, generator=gen, dtype=torch.float64)
    if hi > lo and math.isfinite(mean):
        tau = min(max((mean - lo) / (hi - lo), 0.01), 0.99)
        t = t.pow(1.0 / tau - 1.0)  # E[u ** a] = 1 / (a + 1) for u uniform in [0, 1]
    out = lo + (hi - lo) * t
    flat = out.view(-1)
    if n >= 2:
        flat[0], flat[1] = lo, hi
    elif n == 1 and math.isfinite(mean):
        flat[0] = mean
    return out.to(dtype)
