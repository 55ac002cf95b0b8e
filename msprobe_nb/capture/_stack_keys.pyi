"""Types of the optional C extension ``_stack_keys`` (capture/_stack_keys.c)."""
from types import FrameType

ABI: int

def stack_key(frame: FrameType, depth: int) -> bytes:
    """Native uint64 (f_lasti, id(f_code)) pairs of ``frame`` and up to ``depth - 1`` of its callers."""
