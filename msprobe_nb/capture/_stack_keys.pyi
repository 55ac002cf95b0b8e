"""Types of the optional C extension ``_stack_keys`` (capture/_stack_keys.c)."""
from types import FrameType
from typing import Any

ABI: int

def stack_key(frame: FrameType, depth: int) -> bytes:
    """Native uint64 (f_lasti, id(f_code)) pairs of ``frame`` and up to ``depth - 1`` of its callers."""

class Ids:
    """A ``StackTable``'s ``stack_id`` and ``walked_id`` in C, over the table's own state."""

    def __init__(self, table: Any, depth: int) -> None: ...
    def stack_id(self, frame: FrameType | None) -> int: ...
    def walked_id(self, frame: FrameType | None) -> int: ...
