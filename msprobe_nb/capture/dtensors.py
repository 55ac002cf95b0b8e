"""DTensor arguments (FSDP2's sharded parameters, tensor parallelism) as the rank's own shard.

A DTensor is a wrapper: its ``data_ptr()`` is not its values, and its global values live on every rank of its
mesh. The kit records the local shard (``DTensor._local_tensor``: its statistics, shape and bytes), never the
gathered tensor, which would add communication to the user's step; the row says what the shard is part of
(placements, mesh and global shape) in its ``value`` column, with ``value_type`` ``"DTensor"``.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

import torch

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

from msprobe_nb.store.schema import DTENSOR_VALUE_TYPE as DTENSOR_TYPE  # noqa: F401 - the recorder's name for it

_PLAIN_DISPATCH = torch.Tensor.__torch_dispatch__
_DTensor: Any = None  # torch.distributed.tensor.DTensor, imported when a candidate is first seen



def _dtensor_class() -> Any:
    global _DTensor
    if _DTensor is None:
        try:
            from torch.distributed.tensor import DTensor

            _DTensor = DTensor
        except ImportError:  # a torch built without distributed
            _DTensor = ()
    return _DTensor


def is_wrapper(t: torch.Tensor) -> bool:
    """Whether ``t``'s class dispatches by itself (DTensor, fake and functional tensors): its memory at
    ``data_ptr()`` is not its values, even when it passes for an ``nn.Parameter`` (``_is_param``)."""
    return type(t).__torch_dispatch__ is not _PLAIN_DISPATCH


def is_dtensor(t: Any) -> bool:
    """``t`` is a DTensor (False where torch was built without distributed)."""
    cls = _dtensor_class()
    return bool(cls) and isinstance(t, cls)


def local_shard(t: torch.Tensor) -> torch.Tensor | None:
    """The rank's own shard of a DTensor (no communication, no autograd node), or None for other tensors."""
    if type(t) is torch.Tensor or not hasattr(t, "_local_tensor"):
        return None
    return t._local_tensor if is_dtensor(t) else None


def placement_text(t: torch.Tensor) -> str:
    """The row's ``value`` for a DTensor: its placements, mesh and global shape, as JSON."""
    d = cast("DTensor", t)  # the recorder calls it for DTensors only
    mesh = d.device_mesh
    return json.dumps({"placements": [repr(p) for p in d.placements], "mesh_shape": list(mesh.shape),
                       "mesh_dims": list(mesh.mesh_dim_names or ()), "global_shape": list(t.shape)})
