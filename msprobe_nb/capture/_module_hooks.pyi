"""Types of the optional C extension ``_module_hooks`` (capture/_module_hooks.c); its layout is checked at import
by capture/c_contract.py."""
from typing import Any

ABI: int
CONTEXT_FIELDS: tuple[str, ...]

class Hooks:
    """The global module hooks' work for one recorder; ``ctx`` holds ``CONTEXT_FIELDS``, in order."""

    def __init__(self, ctx: tuple[Any, ...]) -> None: ...
    def pre(self, module: Any, args: Any) -> None:
        """``ModuleHooks._pre`` past its compile check."""
    def post(self, module: Any, args: Any, *rest: Any) -> None:
        """``ModuleHooks._post`` past its compile check."""
