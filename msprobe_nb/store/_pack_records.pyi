"""Types of the optional C extension ``_pack_records`` (store/_pack_records.c)."""
from typing import Any

def pack(out: Any, itemsize: int, start: int, fields: tuple[tuple[int, Any], ...]) -> None:
    """Record ``r`` of ``out`` (a C-contiguous buffer of whole records of ``itemsize`` bytes) takes
    ``column[start + r]`` at its offset, for each ``(offset, column)`` of ``fields``."""
