"""Types of the optional C extension ``_row_builder`` (capture/_row_builder.c); its layout is checked at import
by capture/c_contract.py."""
from typing import Any

ABI: int
ROW_ARITY: int
SEEN_ARITY: int
CONTEXT_FIELDS: tuple[str, ...]
KIND_CODES: dict[str, int]

def build_rows(rows: list[tuple[Any, ...]], value: Any, prefix: str, k: int, base: str, io: int, is_kwarg: bool,
               set_producer: bool, call: str, seen: dict[int, list[Any]], ctx: tuple[Any, ...]) -> int:
    """Appends one row per leaf of ``value`` to ``rows`` as ``Recorder.add_rows`` does; returns how many."""

def attr_columns(objs: list[Any], names: tuple[str, ...]) -> list[list[Any]]:
    """``[[getattr(o, name) for o in objs] for name in names]``, slot members read at their offsets."""

def split_rows(rows: list[tuple[Any, ...]], numeric: tuple[int, ...], out: Any) -> list[list[Any] | None]:
    """The rows as columns: the fields at ``numeric`` written as float64 into ``out`` (one row of it per field),
    every other field as a list (None in the numeric fields' places)."""
