"""Types of the optional C extension ``_api_handler`` (capture/_api_handler.c); its layout is checked at import
by capture/c_contract.py."""
from typing import Any

ABI: int
CONTEXT_FIELDS: tuple[str, ...]

class Handler:
    """The L1 mode's handler of one recorder; ``ctx`` holds ``CONTEXT_FIELDS``, in order."""

    def __init__(self, ctx: tuple[Any, ...]) -> None: ...
    def handle(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Any:
        """The call's result, recorded as ``ApiMode.__torch_function__`` records it."""
    def __call__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        """The mode's ``__torch_function__`` itself, as torch calls it: steps aside while compiling, else ``handle``."""
    @property
    def __self__(self) -> Any:
        """The mode this handler records for (torch checks it before each call)."""

def string_lookups(cls: type) -> bool:
    """Give ``cls`` (a class defined in Python) a ``tp_getattr`` that finds ``__torch_function__`` through one interned
    name and answers it with the mode's ``Handler`` where ``getattr`` would give ``cls``'s own ``__torch_function__``
    bound to the mode; False where ``cls`` has a ``tp_getattr`` of its own already."""
