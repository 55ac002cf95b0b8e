"""Types of the optional C extension ``msprobe_nb.store._column_ids`` (store/_column_ids.c)."""
from typing import Any

ABI: int

def ids(values: list[Any], table: dict[Any, int], last_values: list[Any] | None, last_ids: Any,
        out: Any) -> list[int]: ...
