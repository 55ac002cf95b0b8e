"""The store's optional C extensions (setup.py): a function of one, where it is built with the layout this Python
expects, else None, and the caller's Python or numpy way serves."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def optional_function(module: str, abi: int, name: str) -> Callable[..., Any] | None:
    """``msprobe_nb.store.<module>.<name>`` where that extension is built with ``ABI == abi``; None where it is not
    built (no C compiler at install) or was built for another layout."""
    try:
        mod = importlib.import_module(f"msprobe_nb.store.{module}")
    except ImportError:
        return None
    return getattr(mod, name) if getattr(mod, "ABI", None) == abi else None
