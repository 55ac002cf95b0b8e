"""Types of the optional C extension ``_api_backward`` (capture/_api_backward.c); its layout is checked at import
by capture/c_contract.py."""
from typing import Any

ABI: int
CONTEXT_FIELDS: tuple[str, ...]

class Attacher:
    """The API backward of one recorder; ``ctx`` holds ``CONTEXT_FIELDS``, in order."""

    def __init__(self, ctx: tuple[Any, ...]) -> None: ...
    def attach(self, c: Any, out: Any, inputs: list[Any] | None, seq0: int, bname: str, parent: str) -> None:
        """Hook the nodes call ``c`` made, as ``GradientHooks.attach_api_backward`` does."""
