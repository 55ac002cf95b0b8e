"""The monitor's aggregates of DTensor parameters (FSDP2's shards, tensor parallelism): the full tensor's.

A rank holds only its shard of a DTensor, and the norm of a shard says nothing of the parameter: under FSDP2
with N ranks each would record about 1/sqrt(N) of it, and two runs with different rank counts could not be
compared. The full tensor's L2 norm is the square root of the sum of the shards' squared norms: each rank
takes its shard's norm (one pass, as for a plain tensor), and one ``all_reduce`` per group of tensors that
share a mesh and placements sums the squares over the mesh dimensions the tensor is sharded on (a replicated
dimension holds the same values on every rank: not summed). That is one small collective (a float64 per
tensor) per kind and step instead of gathering any tensor: ``full_tensor()`` would move every parameter.
The NaN and inf counts are summed the same way, and only on a step where a full norm is not finite (every
rank sees the same full norms, so all of them take that branch together). min, max and mean, sign bitmaps
and histograms (all opt-in) are the local shard's.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from msprobe_nb.capture.dtensors import is_dtensor

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["full_nonfinite_counts", "full_norms", "is_dtensor", "local_shards"]



def local_shards(ts: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Each DTensor's own shard (no communication, no autograd node)."""
    return [t._local_tensor for t in cast("Sequence[DTensor]", ts)]  # the callers pass DTensors only


def _groups(ts: Sequence[torch.Tensor]) -> list[tuple[list[int], Any, list[Any]]]:
    """(positions, mesh, the mesh's process groups to sum over) per group of tensors of one mesh and placements."""
    found: dict[tuple, list[int]] = {}
    for i, t in enumerate(cast("Sequence[DTensor]", ts)):  # the callers pass DTensors only
        found.setdefault((t.device_mesh, tuple(t.placements)), []).append(i)
    out = []
    for (mesh, placements), idx in found.items():
        if any(p.is_partial() for p in placements):
            raise ValueError("Monitor: a DTensor parameter with a Partial placement has no full values to aggregate")
        dims = [d for d, p in enumerate(placements) if p.is_shard()]
        out.append((idx, mesh, [mesh.get_group(d) for d in dims]))
    return out


def _all_reduce(t: torch.Tensor, groups: list[Any]) -> torch.Tensor:
    for g in groups:
        torch.distributed.all_reduce(t, group=g)
    return t


def full_norms(ts: Sequence[torch.Tensor]) -> torch.Tensor:
    """float32 L2 norms of the full tensors of the DTensors ``ts`` (one device), on that device: local norms,
    squared in float64, summed over the sharded mesh dimensions by one all_reduce per mesh and placements."""
    with torch.no_grad():
        local = local_shards(ts)
        sq = torch.stack(torch._foreach_norm(local, 2, dtype=torch.float32)).double().square()
        for idx, _mesh, groups in _groups(ts):
            if groups:
                pos = torch.as_tensor(idx, device=sq.device)
                part = _all_reduce(sq.index_select(0, pos), groups) if len(idx) != len(ts) else _all_reduce(sq, groups)
                if len(idx) != len(ts):
                    sq.index_copy_(0, pos, part)
        return sq.sqrt().float()


def full_nonfinite_counts(ts: Sequence[torch.Tensor], norms: np.ndarray) -> np.ndarray:
    """int64 ``(len(ts), 2)``: NaN and inf counts of the full DTensors, (0, 0) where the full norm is finite;
    the local counts summed like the norms where it is not."""
    out = np.zeros((len(ts), 2), np.int64)
    norms = np.asarray(norms, np.float64)
    if np.isfinite(norms).all():
        return out
    with torch.no_grad():
        local = local_shards(ts)
        c = torch.stack([torch.stack([x.isnan().sum(), x.isinf().sum()]) for x in local])
        for idx, _mesh, groups in _groups(ts):
            pos = torch.as_tensor(idx, device=c.device)
            part = _all_reduce(c.index_select(0, pos), groups)
            c.index_copy_(0, pos, part)
        return c.cpu().numpy().astype(np.int64)
