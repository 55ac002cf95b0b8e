"""msprobe-compatible names for what the modes see: ``Functional.linear``, ``Tensor.__add__``, ``Torch.randint``.

A torch function mode reports ``x + y`` as ``Tensor.add``; msprobe (which wraps ``Tensor.__add__``) names it
``Tensor.__add__``. To line our dumps up with msprobe's we look at the calling bytecode instruction: a
``BINARY_OP +`` that resolved to ``Tensor.add`` was an operator. One frame lookup, no patching.
"""
from __future__ import annotations

import dis
import sys
from functools import lru_cache

import torch
from torch.overrides import resolve_name

from msprobe_nb.capture.collectives import FUNCTIONAL_NAMESPACES

# BINARY_OP argument -> dunder name (CPython 3.11+ numbering, see dis._nb_ops).
_NB_DUNDERS = [
    "__add__", "__and__", "__floordiv__", "__lshift__", "__matmul__", "__mul__", "__mod__", "__or__",
    "__pow__", "__rshift__", "__sub__", "__truediv__", "__xor__",
    "__iadd__", "__iand__", "__ifloordiv__", "__ilshift__", "__imatmul__", "__imul__", "__imod__", "__ior__",
    "__ipow__", "__irshift__", "__isub__", "__itruediv__", "__ixor__",
]
_CMP_DUNDERS = {"<": "__lt__", "<=": "__le__", "==": "__eq__", "!=": "__ne__", ">": "__gt__", ">=": "__ge__"}
_BINARY_OP = dis.opmap.get("BINARY_OP", -1)
_COMPARE_OP = dis.opmap["COMPARE_OP"]
_UNARY = {dis.opmap.get("UNARY_NEGATIVE", -1): "__neg__", dis.opmap.get("UNARY_INVERT", -1): "__invert__"}
# COMPARE_OP packs the comparison index in the upper bits from 3.12 on.
_CMP_SHIFT = 0 if sys.version_info < (3, 12) else (4 if sys.version_info < (3, 13) else 5)

# Tensor methods that an operator resolves to, by the operator's dunder name (in-place forms included).
OPERATOR_METHODS = {
    "__add__": "add", "__iadd__": "add_", "__sub__": "sub", "__isub__": "sub_", "__mul__": "mul",
    "__imul__": "mul_", "__truediv__": "div", "__itruediv__": "div_", "__matmul__": "matmul",
    "__and__": "bitwise_and", "__iand__": "bitwise_and_", "__or__": "bitwise_or", "__ior__": "bitwise_or_",
    "__xor__": "bitwise_xor", "__ixor__": "bitwise_xor_", "__lshift__": "__lshift__",
    "__rshift__": "__rshift__", "__ilshift__": "__ilshift__", "__irshift__": "__irshift__",
    "__floordiv__": "__floordiv__", "__ifloordiv__": "__ifloordiv__", "__mod__": "remainder",
    "__imod__": "remainder_", "__pow__": "__pow__", "__ipow__": "pow_",
    "__lt__": "lt", "__le__": "le", "__gt__": "gt", "__ge__": "ge", "__eq__": "__eq__", "__ne__": "__ne__",
    "__neg__": "neg", "__invert__": "bitwise_not",
}


def _operator_table() -> dict[int, str]:
    """The operator dunder an instruction calls, keyed by ``opcode << 8 | oparg`` (its argument byte): the one
    table of :func:`tensor_operator` and of the C handler (capture/_api_handler.c)."""
    table: dict[int, str] = {}
    if _BINARY_OP >= 0:
        for arg, dunder in enumerate(_NB_DUNDERS):
            table[_BINARY_OP << 8 | arg] = dunder
    for arg in range(256):
        idx = arg >> _CMP_SHIFT
        compared = _CMP_DUNDERS.get(dis.cmp_op[idx]) if idx < len(dis.cmp_op) else None
        if compared is not None:
            table[_COMPARE_OP << 8 | arg] = compared
    for opcode, unary in _UNARY.items():
        if opcode >= 0:
            table.update((opcode << 8 | arg, unary) for arg in range(256))
    return table


OPERATOR_AT = _operator_table()

# Functions the function mode sees that are metadata or conversions, not computations: never recorded.
IGNORED_TENSOR_METHODS = frozenset({
    "size", "dim", "ndimension", "stride", "numel", "nelement", "is_contiguous", "data_ptr",
    "storage_offset", "element_size", "is_floating_point", "is_complex", "is_signed", "get_device",
    "untyped_storage", "_typed_storage", "storage", "__len__", "__iter__", "__repr__", "__format__",
    "__hash__", "__reduce_ex__", "__deepcopy__", "__array__", "__array_wrap__", "__contains__", "__dir__",
    "_is_view", "has_names", "__bool__", "__nonzero__", "item", "tolist", "__index__", "__int__",
    "__float__", "__complex__", "backward", "register_hook", "register_post_accumulate_grad_hook",
    "retain_grad", "requires_grad_", "__setstate__", "__reversed__", "_fix_weakref", "is_pinned",
    "is_shared", "_has_symbolic_sizes_strides", "dim_order", "__torch_function__", "__getstate__",
    "_version", "is_inference", "is_set_to", "__class__", "__sizeof__", "cpu_rng_state",
})

# torch.ops namespaces that are bookkeeping (profiler ranges, ...), not computations
_SKIP_OP_NAMESPACES = frozenset({"profiler"})

_PREFIXES = (
    ("torch.nn.functional.", "Functional"),
    ("torch.Tensor.", "Tensor"),
    ("torch._C._VariableFunctions.", "Torch"),
    ("torch._C._nn.", "Functional"),
    ("torch._VF.", "VF"),
    ("torch.nn.init.", "Init"),
    ("torch.distributed.", "Distributed"),
    ("torch_npu.", "NPU"),
    ("torch.", "Torch"),
)


@lru_cache(maxsize=4096)
def _resolve(func) -> tuple[str, str] | None:
    """(family, op) for a function the mode reported, or None when it is not recorded."""
    if isinstance(func, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        qualified = (func._qualified_op_name if isinstance(func, torch._ops.OpOverloadPacket)
                     else func._schema.name)
        ns, _, op = qualified.partition("::")
        if ns in _SKIP_OP_NAMESPACES:
            return None
        if ns == "aten":
            return "Aten", op
        if ns in ("npu", "_C_ascend", "npu_graph"):
            return "NPU", op
        if ns in FUNCTIONAL_NAMESPACES:  # functional collectives: recorded by capture.collectives
            return "Distributed", f"{ns}.{op}"
        return ns, op  # custom op namespace, e.g. torch.library ops: "mylib.fused_gelu"
    name = resolve_name(func)
    if name is None:
        name = f"{getattr(func, '__module__', '') or ''}.{getattr(func, '__name__', repr(func))}"
    elif name.count(".") == 1 and name.startswith("torch."):
        name = _own_torch_name(func, name)
    if name.endswith((".__get__", ".__set__", ".__delete__")):
        return None
    for prefix, family in _PREFIXES:
        if name.startswith(prefix):
            op = name[len(prefix):]
            if family == "Tensor" and op in IGNORED_TENSOR_METHODS:
                return None
            if family == "Distributed":
                op = op.removeprefix("distributed_c10d.")  # msprobe: Distributed.all_reduce
            if family == "Torch" and op.startswith("_C."):
                return None  # grad-mode switches and other interpreter state, not computations
            if family == "Torch" and op in ("is_tensor", "is_storage", "is_grad_enabled", "get_default_dtype",
                                            "is_floating_point", "is_complex", "numel", "result_type",
                                            "can_cast", "promote_types", "is_nonzero"):
                return None
            return family, op
    head, _, op = name.rpartition(".")
    return head or "Python", op


def _own_torch_name(func, name: str) -> str:
    """torch's name of a ``torch.*`` function by its own ``__name__`` where ``resolve_name`` gave an alias's:
    equal builtins share one entry of torch's index (``torch.mm == torch.spmm``), so ``resolve_name(torch.mm)``
    is ``torch.spmm``, where msprobe (which wraps ``torch.mm`` by name) has ``Torch.mm``."""
    own = getattr(func, "__name__", None)
    if own and own != name[6:] and getattr(torch, own, None) == func:
        return f"torch.{own}"
    return name


def api_name(func, frame) -> tuple[str, str] | None:
    """(family, op) as msprobe names it, using ``frame`` (the caller) to tell ``x + y`` from ``x.add(y)``."""
    resolved = _resolve(func)
    if resolved is None or resolved[0] != "Tensor":
        return resolved
    return tensor_operator(resolved, frame)


#: (family, op) of a function, or None when it is not recorded (cached; no caller needed)
resolve_api = _resolve


def tensor_operator(resolved: tuple[str, str], frame) -> tuple[str, str]:
    """A Tensor method ``resolved`` as the operator dunder the caller's instruction used (``x + y``:
    ``Tensor.__add__``), or unchanged when it was called by name."""
    if frame is None:
        return resolved
    code = frame.f_code.co_code
    lasti = frame.f_lasti
    if lasti < 0 or lasti + 1 >= len(code):
        return resolved
    dunder = OPERATOR_AT.get(code[lasti] << 8 | code[lasti + 1])
    if dunder is not None and OPERATOR_METHODS.get(dunder) == resolved[1]:
        return "Tensor", dunder
    return resolved


def module_call_name(path: str, cls: str, direction: str, index: int) -> str:
    """``Module.net1.ln1.Linear.forward.0`` (msprobe puts the counter last for modules)."""
    return f"Module.{path}.{cls}.{direction}.{index}"
