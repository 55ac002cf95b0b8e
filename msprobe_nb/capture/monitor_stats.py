"""The monitor's device-side arithmetic: aggregates of many tensors at once, sign bitmaps, one host transfer.

Everything here runs under ``torch.no_grad()`` on the tensors' own device and only reads them. Aggregates of a
list of tensors are one fused ``torch._foreach_*`` call where torch has one (norm, max) and one small kernel per
tensor otherwise (min, mean, NaN and inf counts). :func:`gather` brings every result of a step to the host in
a single copy per device (the results are flattened to bytes and concatenated first).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from msprobe_nb.capture.host_arrays import numpy_copy
from msprobe_nb.capture.stats import PLAIN_TENSORS, norms_kernel
from msprobe_nb.store.monitor_schema import COUNT_STATS, FLOAT_STATS, STATS

__all__ = ["COUNT_STATS", "FLOAT_STATS", "STATS", "SignHistory", "SignPacker", "cpu_norm_runs", "cpu_norms",
           "cpu_norms_host", "gather", "histograms", "nonfinite_counts", "tensor_stats"]
#: the magic multiplier that gathers the lowest bit of each of 8 bytes into one byte (little bit order)
_PACK = 0x0102040810204080
#: tensors up to this many values that share a size and dtype get their norms from one stacked reduction (a
#: model's many biases and norm weights: one kernel instead of one per tensor)
SMALL_NUMEL = 4096
_plans: dict[tuple, tuple[list[int], list[list[int]], torch.Tensor | None, bool]] = {}


def _norm_plan(ts: Sequence[torch.Tensor], layout: Any = None,
               ) -> tuple[list[int], list[list[int]], torch.Tensor | None, bool]:
    """(positions of the tensors normed one by one, groups of positions stacked together, the permutation that
    puts the concatenated results back in order or None, whether every tensor is float32); cached per layout
    (``layout``: a caller's key that stands for the tensors' shapes, dtypes and device)."""
    plan = _plans.get(layout) if layout is not None else None
    if plan is not None:
        return plan
    key = tuple((t.shape, t.dtype) for t in ts)
    plan = _plans.get(key)
    if plan is None:
        groups: dict[tuple, list[int]] = {}
        for i, (shape, dtype) in enumerate(key):
            if shape.numel() <= SMALL_NUMEL:
                groups.setdefault((shape, dtype), []).append(i)
        stacked = [g for g in groups.values() if len(g) > 1]
        taken = {i for g in stacked for i in g}
        single = [i for i in range(len(ts)) if i not in taken]
        order = single + [i for g in stacked for i in g]
        perm = None
        if order != list(range(len(ts))):
            inv = [0] * len(order)
            for pos, i in enumerate(order):
                inv[i] = pos
            perm = torch.as_tensor(inv, device=ts[0].device)
        if len(_plans) > 512:  # a step's layouts repeat every step; a bound keeps a caller from growing it
            _plans.clear()
        plan = _plans[key] = (single, stacked, perm, all(d == torch.float32 for _, d in key))
    if layout is not None:
        _plans[layout] = plan
    return plan


_F32 = torch.float32


def cpu_norm_runs(ts: Sequence[torch.Tensor]) -> tuple[list[int], list[int]] | None:
    """(addresses, counts) of the tensors' values for :func:`cpu_norms`, or None unless every tensor is a
    non-empty contiguous float32 CPU tensor (a plain one or a Parameter: a subclass takes torch's path) and the
    C kernel is built. One loop over the tensors, since each tensor attribute read costs as much as the
    kernel's work on a small parameter. A negative view (``is_neg``) is allowed: its memory holds the values'
    negations, which have the same norm."""
    if norms_kernel() is None:
        return None
    addresses: list[int] = []
    counts: list[int] = []
    add, count = addresses.append, counts.append
    for t in ts:
        if t.__class__ not in PLAIN_TENSORS or t.dtype is not _F32 or not t.is_cpu or not t.is_contiguous():
            return None
        add(t.data_ptr())
        count(t.numel())
    return (addresses, counts) if all(counts) else None


def cpu_norms_host(runs: tuple[list[int], list[int]]) -> np.ndarray:
    """float32 L2 norms (NaN and inf propagate as torch's do) of the runs :func:`cpu_norm_runs` gave, from the
    kit's C kernel in one call, as a fresh numpy array (torch's CPU ``_foreach_norm`` dispatches once per
    tensor, which a model's hundreds of parameters make most of its cost). The caller holds the tensors
    meanwhile."""
    out = np.empty(len(runs[0]), np.float32)
    norms_kernel()(*runs, out)
    return out


def cpu_norms(runs: tuple[list[int], list[int]]) -> torch.Tensor:
    """:func:`cpu_norms_host` as a CPU tensor."""
    return torch.from_numpy(cpu_norms_host(runs))


def _norms(ts: Sequence[torch.Tensor], layout: Any = None) -> torch.Tensor:
    """float32 L2 norm of each tensor (one device): the C kernel for float32 CPU tensors where it is built;
    else a fused ``_foreach_norm`` over the large ones and one stacked reduction per group of small ones of one
    shape and dtype."""
    runs = cpu_norm_runs(ts) if ts[0].is_cpu else None
    if runs is not None:
        return cpu_norms(runs)
    single, stacked, perm, fp32 = _norm_plan(ts, layout)
    parts = []
    if single:
        one = [ts[i] for i in single]
        norms = torch._foreach_norm(one, 2) if fp32 else torch._foreach_norm(one, 2, dtype=torch.float32)
        parts.append(torch.stack(norms))
    for g in stacked:
        rows = torch.stack([ts[i] for i in g]).reshape(len(g), -1)
        parts.append(torch.linalg.vector_norm(rows, dim=1, dtype=torch.float32))
    out = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out if perm is None else out[perm]


def _column(stat: str, ts: Sequence[torch.Tensor], layout: Any = None) -> torch.Tensor:
    if stat == "norm":
        return _norms(ts, layout)
    if stat == "max":
        return torch.stack([m.float() for m in torch._foreach_max(list(ts))])
    if stat == "min":
        return torch.stack([t.amin().float() for t in ts])
    if stat == "mean":
        return torch.stack([t.mean(dtype=torch.float32) for t in ts])
    if stat == "nan":
        return torch.stack([t.isnan().sum() for t in ts])
    if stat == "inf":
        return torch.stack([t.isinf().sum() for t in ts])
    raise ValueError(f"unknown monitor statistic {stat!r}; known: {', '.join(STATS)}")


def tensor_stats(ts: Sequence[torch.Tensor], stats: Sequence[str], layout: Any = None,
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(float32 ``(len(ts), nf)``, int64 ``(len(ts), nc)``) of the float and count ``stats`` of each tensor.

    The tensors must share one device; empty tensors must be left out by the caller (their min has no value).
    ``layout``: a hashable key the caller guarantees to change whenever the tensors' shapes, dtypes or device
    do (it saves building one from every tensor).
    Either part is None when no statistic of its kind is asked for.
    """
    with torch.no_grad():
        fl = [s for s in stats if s in FLOAT_STATS]
        co = [s for s in stats if s in COUNT_STATS]
        f = torch.stack([_column(s, ts, layout) for s in fl], dim=1) if fl else None
        c = torch.stack([_column(s, ts) for s in co], dim=1) if co else None
        return f, c


def nonfinite_counts(ts: Sequence[torch.Tensor], norms: np.ndarray) -> np.ndarray:
    """int64 ``(len(ts), 2)``: the NaN and inf counts of each tensor, given its host norm: (0, 0) where the
    norm is finite (a NaN or an inf makes the L2 norm NaN or inf), counted exactly only where it is not. So
    the counts cost nothing on a healthy step; on a step with a non-finite tensor they cost one pass over
    that tensor and a host read."""
    out = np.zeros((len(ts), 2), np.int64)
    norms = np.asarray(norms, np.float64)
    if np.isfinite(norms.sum()):  # no norm is NaN or inf (a sum that overflows takes the exact look below)
        return out
    bad = np.flatnonzero(~np.isfinite(norms))
    if len(bad):
        with torch.no_grad():
            for i in bad.tolist():
                t = ts[i]
                if t.is_floating_point() or t.is_complex():
                    out[i] = (int(t.isnan().sum()), int(t.isinf().sum()))
    return out


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
    """Sign bitmaps of a list of tensors on one device (bit 1: the value is > 0), packed 8 to a byte in little
    bit order, each tensor's bits starting on a fresh byte so two runs' bitmaps compare byte by byte. Small
    tensors of one shape (and a whole number of bytes) are compared in one stacked kernel."""

    def __init__(self) -> None:
        self._plans: dict[tuple, tuple[list, list[int], np.ndarray, np.ndarray]] = {}

    def _plan(self, ts: Sequence[torch.Tensor]) -> tuple[list, list[int], np.ndarray, np.ndarray]:
        """(pieces: int position or list of positions stacked, the tensors in bitmap order, numel and padded
        byte count of each in that order)."""
        key = tuple((t.shape, t.dtype) for t in ts)
        plan = self._plans.get(key)
        if plan is None:
            groups: dict[tuple, list[int]] = {}
            for i, (shape, dtype) in enumerate(key):
                if shape.numel() <= SMALL_NUMEL and shape.numel() % 8 == 0:
                    groups.setdefault((shape, dtype), []).append(i)
            stacked = [g for g in groups.values() if len(g) > 1]
            taken = {i for g in stacked for i in g}
            pieces: list = [i for i in range(len(ts)) if i not in taken] + stacked
            order = [i for p in pieces for i in (p if isinstance(p, list) else [p])]
            numel = np.array([key[i][0].numel() for i in order], np.int64)
            if len(self._plans) > 16:
                self._plans.clear()
            plan = self._plans[key] = (pieces, order, numel, -(-numel // 8))
        return plan

    def pack(self, ts: Sequence[torch.Tensor]) -> tuple[torch.Tensor, list[int], np.ndarray, np.ndarray]:
        """(packed uint8 bytes, the tensors' positions in bitmap order, their numel and byte counts in it)."""
        with torch.no_grad():
            pieces, order, numel, nbytes = self._plan(ts)
            bits = []
            for p in pieces:
                if isinstance(p, list):
                    bits.append((torch.stack([ts[i] for i in p]) > 0).reshape(-1))
                    continue
                b = (ts[p] > 0).reshape(-1)
                pad = -b.numel() % 8
                bits.append(b if not pad else torch.cat([b, b.new_zeros(pad)]))
            flat = torch.cat(bits) if len(bits) > 1 else bits[0]
            packed = ((flat.view(torch.uint8).view(torch.int64) * _PACK) >> 56).to(torch.uint8)
            return packed, order, numel, nbytes


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], np.uint8)


class SignHistory:
    """Each bitmap's sign agreement with the previous step's bitmap of the same name (host side, from the
    packed bytes the step brought over anyway): the fraction of values whose signs did not change. A step may
    bring several blocks (one per device); each is compared with the previous step's block of the same names."""

    def __init__(self) -> None:
        self._blocks: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray]] = {}  # names -> (nbytes, blob)
        self._by_name: dict[str, np.ndarray] = {}  # the previous step's bytes of each name, for changed layouts
        self._step: object = None

    def agreement(self, names: list[str], numel: np.ndarray, nbytes: np.ndarray, blob: np.ndarray,
                  step: object = None) -> np.ndarray:
        """Agreement per name of one block of ``step``, NaN on a first step or for a name whose bitmap size
        changed; remembers the block for the next step."""
        if step != self._step:  # a new step: the last one's blocks become the reference
            self._step, self._prev_blocks, self._prev_names = step, self._blocks, self._by_name
            self._blocks, self._by_name = {}, {}
        key = tuple(names)
        starts = np.cumsum(nbytes) - nbytes
        self._blocks[key] = (nbytes, blob)
        for n, a, b in zip(names, starts, nbytes, strict=True):
            self._by_name[n] = blob[a:a + b]
        out = np.full(len(names), np.nan)
        prev = getattr(self, "_prev_blocks", {}).get(key)
        if prev is not None and np.array_equal(prev[0], nbytes):
            differ = _POPCOUNT[np.bitwise_xor(blob, prev[1])]
            return 1.0 - np.add.reduceat(differ.astype(np.int64), starts) / numel if len(names) else out
        old_names = getattr(self, "_prev_names", {})
        for i, (n, a, b) in enumerate(zip(names, starts, nbytes, strict=True)):
            old = old_names.get(n)
            if old is not None and len(old) == b:
                out[i] = 1.0 - int(_POPCOUNT[np.bitwise_xor(blob[a:a + b], old)].sum(dtype=np.int64)) / numel[i]
        return out


def gather(parts: Sequence[torch.Tensor | np.ndarray]) -> list[np.ndarray]:
    """The host copies of ``parts`` (contiguous tensors of any dtype numpy has, on any device), in order, made
    with one device-to-host copy per accelerator: each part is viewed as bytes and the bytes concatenated
    before the copy. CPU parts are copied one by one (no transfer to batch). A numpy array part is the caller's
    own fresh host result and is passed through as it is."""
    out: list[np.ndarray | None] = [None] * len(parts)
    by_device: dict[torch.device, list[int]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for i, p in enumerate(parts):
        if isinstance(p, np.ndarray):
            out[i] = p
        else:
            tensors[i] = p
            by_device.setdefault(p.device, []).append(i)
    with torch.no_grad():
        for device, idx in by_device.items():
            if device.type == "cpu":  # already on the host: a copy each (a part may be a view of the caller's)
                for i in idx:
                    out[i] = numpy_copy(tensors[i])
                continue
            flats = [tensors[i].contiguous().reshape(-1).view(torch.uint8) for i in idx]
            # a lone CPU part would come back as a view of the caller's tensor: copy it
            host = torch.cat(flats).cpu().numpy() if len(flats) > 1 else flats[0].cpu().numpy().copy()
            pos = 0
            for i, f in zip(idx, flats, strict=True):
                n = f.numel()
                dtype = np.dtype(str(tensors[i].dtype).replace("torch.", ""))
                out[i] = host[pos:pos + n].view(dtype).reshape(tensors[i].shape)
                pos += n
    return out  # type: ignore[return-value]
