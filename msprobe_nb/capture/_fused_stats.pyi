"""Types of the optional C extension ``_fused_stats`` (capture/_fused_stats.c)."""
from typing import Any

ABI: int

def stats_at(address: int, n: int) -> tuple[float, float, float, float]:
    """(max, min, sum, norm) of the ``n`` float32 values at ``address`` (a tensor's ``data_ptr()``)."""

def strided_stats_at(address: int, shape: Any, strides: Any) -> tuple[float, float, float, float] | None:
    """(max, min, sum, norm) of a strided float32 view at ``address`` (a tensor's ``data_ptr()``, ``shape`` and
    ``stride()``); None for a layout the kernel does not read."""

def counted_stats_at(address: int, shape: Any, strides: Any) -> tuple[float, ...] | None:
    """(max, min, sum, norm, NaN count, +inf count, -inf count) of a float32 view holding NaN or inf, by
    torch's rules; None for a layout the kernel does not read."""

def int_stats_at(address: int, n: int, code: int) -> tuple[float, float, float, float]:
    """(max, min, sum, sum of squares) of ``n`` integers of kind ``code`` at ``address``; for bool (code 5) the
    first value is the count of true elements."""

def norms_into(addresses: Any, counts: Any, out: Any) -> None:
    """Writes into ``out`` (float32) the norm of each run of ``counts[k]`` float32 values at ``addresses[k]``."""

def pack_stats(values: list[Any], flat: Any, out: Any) -> bool:
    """Writes ``values`` (7-tuples of floats) into ``out`` (7 float64 each); False as soon as one is not such a
    tuple (``out`` then holds nothing of use)."""
