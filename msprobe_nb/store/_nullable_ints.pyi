"""Types of the optional C extension ``msprobe_nb.store._nullable_ints`` (store/_nullable_ints.c)."""
from typing import Any

ABI: int

def from_floats(values: Any, na: int, out: Any) -> int: ...
