"""The monitor's device-side arithmetic: aggregates of many tensors at once, sign bitmaps, one host transfer.

Everything here runs under ``torch.no_grad()`` on the tensors' own device and only reads them. Aggregates of a
list of tensors are one fused ``torch._foreach_*`` call where torch has one (norm, max) and one small kernel per
tensor otherwise (min, mean, NaN and inf counts). :func:`gather` brings every result of a step to the host in
a single copy per device (the results are flattened to bytes and concatenated first).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["COUNT_STATS", "FLOAT_STATS", "STATS", "SignPacker", "gather", "histograms", "tensor_stats"]

#: aggregates computed in float32 (the norm in float32 whatever the tensor's dtype, so fp16 does not overflow)
FLOAT_STATS = ("norm", "min", "max", "mean")
#: aggregates counted exactly, in int64
COUNT_STATS = ("nan", "inf")
STATS = FLOAT_STATS + COUNT_STATS
#: the magic multiplier that gathers the lowest bit of each of 8 bytes into one byte (little bit order)
_PACK = 0x0102040810204080


def _column(stat: str, ts: Sequence[torch.Tensor]) -> torch.Tensor:
    if stat == "norm":
        return torch.stack(torch._foreach_norm(ts, 2, dtype=torch.float32))
    if stat == "max":
        return torch.stack([m.float() for m in torch._foreach_max(ts)])
    if stat == "min":
        return torch.stack([t.amin().float() for t in ts])
    if stat == "mean":
        return torch.stack([t.mean(dtype=torch.float32) for t in ts])
    if stat == "nan":
        return torch.stack([t.isnan().sum() for t in ts])
    if stat == "inf":
        return torch.stack([t.isinf().sum() for t in ts])
    raise ValueError(f"unknown monitor statistic {stat!r}; known: {', '.join(STATS)}")


def tensor_stats(ts: Sequence[torch.Tensor], stats: Sequence[str]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(float32 ``(len(ts), nf)``, int64 ``(len(ts), nc)``) of the float and count ``stats`` of each tensor.

    The tensors must share one device; empty tensors must be left out by the caller (their min has no value).
    Either part is None when no statistic of its kind is asked for.
    """
    with torch.no_grad():
        fl = [s for s in stats if s in FLOAT_STATS]
        co = [s for s in stats if s in COUNT_STATS]
        f = torch.stack([_column(s, ts) for s in fl], dim=1) if fl else None
        c = torch.stack([_column(s, ts) for s in co], dim=1) if co else None
        return f, c


def histograms(ts: Sequence[torch.Tensor], bounds: torch.Tensor) -> torch.Tensor:
    """int64 ``(len(ts), len(bounds) + 1)``: per tensor, how many values fall below ``bounds[0]``, in each
    ``[bounds[i], bounds[i+1])`` and at or above the last bound. NaN is counted in no bin."""
    with torch.no_grad():
        k = bounds.numel() + 1
        rows = []
        for t in ts:
            flat = t.detach().reshape(-1)
            flat = flat[~flat.isnan()] if flat.is_floating_point() else flat
            b = bounds.to(device=flat.device, dtype=flat.dtype if flat.is_floating_point() else torch.float32)
            rows.append(torch.bincount(torch.bucketize(flat, b, right=True), minlength=k))
        return torch.stack(rows)


class SignPacker:
    """Sign bitmaps of a list of tensors (bit 1: the value is > 0), packed 8 to a byte, each tensor's bits
    starting on a fresh byte (so two runs' bitmaps compare byte by byte), and the fraction of signs that
    agree with the previous call's bitmap of the same layout (NaN on the first call or after a change)."""

    def __init__(self) -> None:
        self._layout: tuple | None = None
        self._prev: torch.Tensor | None = None

    def pack(self, ts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(packed uint8 bytes, float32 agreement per tensor, byte offset of each tensor's bits; one more at
        the end) for tensors on one device."""
        with torch.no_grad():
            numel = [t.numel() for t in ts]
            padded = [-(-n // 8) * 8 for n in numel]
            layout = (ts[0].device, tuple(numel))
            pieces = []
            zero = ts[0].new_zeros(8, dtype=torch.bool)
            for t, n, p in zip(ts, numel, padded, strict=True):
                pieces.append(t.detach().reshape(-1) > 0)
                if p > n:
                    pieces.append(zero[: p - n])
            bits = torch.cat(pieces)
            packed = ((bits.view(torch.uint8).view(torch.int64) * _PACK) >> 56).to(torch.uint8)
            ends = np.cumsum([0] + padded)
            if self._layout == layout and self._prev is not None:
                ne = torch.cumsum(bits != self._prev, 0, dtype=torch.int64)
                idx = torch.as_tensor(ends[1:] - 1, device=bits.device)
                tot = ne[idx]
                per = torch.cat([tot[:1], tot[1:] - tot[:-1]])
                agree = 1.0 - per.float() / torch.as_tensor(numel, device=bits.device, dtype=torch.float32)
            else:
                agree = torch.full((len(ts),), float("nan"), device=bits.device)
            self._layout, self._prev = layout, bits
            return packed, agree, ends // 8


def gather(parts: Sequence[torch.Tensor]) -> list[np.ndarray]:
    """The host copies of ``parts`` (contiguous tensors of any dtype and device), in order, made with one
    device-to-host copy per device: each part is viewed as bytes and the bytes concatenated before the copy."""
    out: list[np.ndarray | None] = [None] * len(parts)
    by_device: dict[torch.device, list[int]] = {}
    for i, p in enumerate(parts):
        by_device.setdefault(p.device, []).append(i)
    with torch.no_grad():
        for idx in by_device.values():
            flats = [parts[i].contiguous().reshape(-1).view(torch.uint8) for i in idx]
            # a lone CPU part would come back as a view of the caller's tensor: copy it
            host = torch.cat(flats).cpu().numpy() if len(flats) > 1 else flats[0].cpu().numpy().copy()
            pos = 0
            for i, f in zip(idx, flats, strict=True):
                n = f.numel()
                dtype = np.dtype(str(parts[i].dtype).replace("torch.", ""))
                out[i] = host[pos:pos + n].view(dtype).reshape(parts[i].shape)
                pos += n
    return out  # type: ignore[return-value]
