"""A recorded call, and the naming rules that follow from what a call is.

One :class:`Call` per forward API, module forward, backward or parameter-gradient firing; the recorder
stores its fields once per call, not once per row.
"""
from __future__ import annotations

from dataclasses import dataclass

#: APIs whose output holds exactly the elements of their first input, in another shape or layout: the
#: output reuses the input's statistics instead of reducing the same values again, and in backward the
#: gradient of that input reuses the statistics of the gradient of the output (the same elements, too).
SAME_ELEMENTS = frozenset({
    ("Tensor", n) for n in ("view", "reshape", "transpose", "permute", "t", "flatten", "squeeze", "unsqueeze",
                            "contiguous", "clone", "detach", "view_as", "reshape_as", "unflatten", "movedim",
                            "swapaxes", "swapdims", "mT")} | {
    ("Torch", n) for n in ("reshape", "transpose", "permute", "t", "flatten", "squeeze", "unsqueeze", "clone",
                           "detach", "movedim", "swapaxes", "swapdims")})


@dataclass(slots=True)
class Call:
    """One recorded call (forward API, module forward, backward, parameter gradients)."""

    call: str
    family: str
    op: str
    counter: int
    direction: str
    module_path: str = ""
    parent: str = ""
    stack_id: int = -1
    index: int = -1
    rng: str = ""
    rng_state: str = ""
    dump: bool = True
    slot: int = -1  # position in Recorder.calls once it has rows


def _backward_name(call: str) -> str:
    if call.startswith("Module.") and ".forward." in call:
        head, _, tail = call.rpartition(".forward.")
        return f"{head}.backward.{tail}"
    return call[: -len("forward")] + "backward" if call.endswith(".forward") else call
