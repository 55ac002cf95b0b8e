"""What torch's activation checkpointing means for a random draw that the randomness policy would change.

A checkpointed region runs its forward twice: once in the forward pass and again in the backward, where
torch restores the device generators first (``preserve_rng_state``) so that every draw repeats and the
gradients belong to the masks the forward used. ``dropout_off`` and ``host_random`` change draws in the
function mode; the recompute repeats that change only where it runs under the mode too:

* a **reentrant** checkpoint (``use_reentrant=True``) at L1 and mix: the kit pushes its mode for the
  recompute (``ApiMode.replay_in_backward``). Dropout with ``p=0`` repeats as it is; host draws repeat once
  the kit's host generator is put back where it stood when the region's forward drew first
  (:class:`HostStates`), as torch does for the device generators.
* a **non-reentrant** checkpoint (``use_reentrant=False``, FSDP's and Hugging Face's wrappers that use it),
  and a reentrant one at L0 and L2 (no mode is pushed there): the recompute runs outside any function mode.
  A changed draw would not repeat: dropout with ``p=0`` in the forward and ``p>0`` in the recompute, or a host
  mask against a device mask, which makes torch raise ``CheckpointError`` or, worse, gives gradients of
  another mask than the forward's. The policy therefore leaves such a draw as the user wrote it (its ``rng``
  says so) and warns once.
"""
from __future__ import annotations

import sys
import weakref
from types import FrameType

import torch
import torch.utils.checkpoint as _checkpoint

#: the forward of torch's reentrant checkpoint: a draw made below it belongs to that region
_REENTRANT_FORWARD = _checkpoint.CheckpointFunction.forward.__code__
#: ``qualname`` prefix of the saved-tensor pack hook a non-reentrant checkpoint pushes for its region
_NON_REENTRANT_PACK = "_checkpoint_hook."
_TOP_HOOKS = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)


def in_non_reentrant_region() -> bool:
    """Whether tensors saved now will be recomputed by a non-reentrant ``torch.utils.checkpoint``."""
    if _TOP_HOOKS is None:  # pragma: no cover - every torch this kit supports has it
        return False
    try:
        hooks = _TOP_HOOKS(True)
    except (RuntimeError, TypeError):  # pragma: no cover
        return False
    return hooks is not None and getattr(hooks[0], "__qualname__", "").startswith(_NON_REENTRANT_PACK)


def reentrant_region_nodes() -> list:
    """The backward nodes (``CheckpointFunctionBackward``, each region's ``ctx``) of the reentrant checkpoints
    whose forward is running now, innermost first: a region nested in another belongs to both."""
    nodes = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code is _REENTRANT_FORWARD:
            ctx = frame.f_locals.get("ctx")
            if ctx is not None:
                nodes.append(ctx)
        frame = frame.f_back
    return nodes


class HostStates:
    """The kit's host generator state at the first host draw of each reentrant checkpoint region, put back
    while the region is recomputed and restored after it (``torch.random.fork_rng`` does the same for the
    device generators). Keyed weakly by the region's backward node: a step's graph takes its entries along."""

    def __init__(self) -> None:
        self._first: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._outside: list[torch.Tensor] = []

    def note(self, nodes: list, gen: torch.Generator) -> None:
        """Before a host draw inside the regions of ``nodes``: keep the generator's state for each region whose
        first host draw this is (an outer region's first draw may be made inside an inner one)."""
        state = None
        for node in nodes:
            if node not in self._first:
                if state is None:
                    state = gen.get_state()
                self._first[node] = state

    def enter(self, node, gen: torch.Generator) -> bool:
        """The recompute of ``node``'s region begins: draw from where its forward drew. False if it drew nothing
        on the host (then nothing is changed and :meth:`leave` is not needed)."""
        state = self._first.get(node)
        if state is None:
            return False
        self._outside.append(gen.get_state())
        gen.set_state(state)
        return True

    def leave(self, gen: torch.Generator) -> None:
        """The recompute ended: the generator goes on from where the forward pass left it."""
        gen.set_state(self._outside.pop())
