"""The optional C extensions' contracts with the Python side, declared once and checked once, at import.

Each extension exports the layout it was built with: an ``ABI`` number, and for the row builder and the API
handler their context's field names (``CONTEXT_FIELDS``, the C enum's order), for the row builder also a row's
and a seen entry's arity and the kind codes. The
Python side builds the context by those names and takes an extension only when its layout is the one this
Python expects; on any mismatch (a stale build next to newer Python files) it warns once and falls back to
the Python path, which gives the same rows and statistics (tests/test_row_builder.py holds them equal).
"""
from __future__ import annotations

import importlib
import warnings
from types import ModuleType
from typing import Any

#: ABI of _fused_stats and _row_builder (MSPROBE_NB_STATS_ABI in _stats_pass.h)
STATS_ABI = 3
#: ABI of _stack_keys (STACK_KEYS_ABI in _stack_keys.c)
STACK_KEYS_ABI = 1
#: ABI of _recorder_lock (RECORDER_LOCK_ABI in _recorder_lock.c)
RECORDER_LOCK_ABI = 1
#: ABI of _api_handler (API_HANDLER_ABI in _api_handler.c)
API_HANDLER_ABI = 2
#: what the C handler's context holds, by name (ApiMode builds it from these)
HANDLER_FIELDS = ("mode", "recorder", "lock_acquire", "lock_release", "collectives", "note_error", "resolve",
                  "operators", "operator_methods", "slow", "drawing", "same_elements", "call_type", "graph_task_id",
                  "stack_id", "selected", "is_custom_forward", "forward_frame", "grad_enabled", "sequence_nr", "tensor",
                  "positions", "grad_inputs", "checkpoint_node", "replay_in_backward", "custom_node", "consumed",
                  "add_rows", "io_input", "io_output", "share_summary", "mark_written", "attach_api_backward",
                  "compiler_globals")
#: ABI of _api_backward (API_BACKWARD_ABI in _api_backward.c)
API_BACKWARD_ABI = 2
#: what the C API backward's context holds, by name (GradientHooks builds it from these)
BACKWARD_FIELDS = ("recorder", "lock_acquire", "lock_release", "note_error", "add_rows", "io_input", "io_output",
                   "call_type", "share_summary", "tensor", "accumulate_grad", "leaves", "no_torch_function",
                   "same_elements", "max_nodes", "backward_name", "backward_names", "backward_of")
#: ABI of _module_hooks (MODULE_HOOKS_ABI in _module_hooks.c)
MODULE_HOOKS_ABI = 2
#: what the C module hooks' context holds, by name (ModuleHooks builds it from these)
MODULE_HOOKS_FIELDS = ("recorder", "lock_acquire", "lock_release", "note_error", "add_rows", "io_input", "io_output",
                       "io_parameters", "call_type", "no_torch_function", "graph_task_id", "walked_id", "selected",
                       "module_paths", "watch_parameters", "python_pre", "python_post", "records_modules",
                       "grad_enabled", "leaves", "tensor", "backward_names", "backward_of", "grad_watch", "hook_tensor",
                       "param_hooks", "io_parameters_grad", "positions")
#: what the row builder's context holds, by name (Recorder builds it from these)
CONTEXT_FIELDS = ("recorder", "summarizer", "summarize", "kernel", "dtype_codes", "dtype_code", "device_code",
                  "describe", "row_of", "nan", "device_cpu", "tensor_types", "tensor", "float32", "strided", "leaves",
                  "walk", "positions", "size_type", "scalar_text", "host_copy", "float16", "bfloat16", "half_max",
                  "int_dtypes")
#: a row's ``kind`` codes, on both sides
KIND_CODES = {"tensor": 0, "none": 1, "value": 2}
#: the fields of a seen entry (``Recorder._seen[id(tensor)]``), which both sides build and read
SEEN_FIELDS = ("ref", "version", "summary", "tensor_id", "producer")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"msprobe_nb.capture.{name}")
    except ImportError:  # not built (no compiler): the Python path, silently, as documented
        return None


def _refuse(name: str, problems: list[str]) -> None:
    warnings.warn(f"msprobe_nb: the C extension {name} does not match this version's Python side "
                  f"({'; '.join(problems)}); recording uses the Python path (same results, slower). "
                  "Reinstall the package to rebuild it.", RuntimeWarning, stacklevel=3)


def row_builder_problems(mod: Any, row_arity: int) -> list[str]:
    """What in the row builder ``mod``'s exported layout differs from this Python's (empty: it matches)."""
    problems = []
    if getattr(mod, "ABI", None) != STATS_ABI:
        problems.append(f"ABI {getattr(mod, 'ABI', None)}, expected {STATS_ABI}")
    if set(getattr(mod, "CONTEXT_FIELDS", ())) != set(CONTEXT_FIELDS):
        problems.append("context fields differ")
    if getattr(mod, "ROW_ARITY", None) != row_arity:
        problems.append(f"rows of {getattr(mod, 'ROW_ARITY', None)} fields, expected {row_arity}")
    if getattr(mod, "SEEN_ARITY", None) != len(SEEN_FIELDS):
        problems.append("seen entries differ")
    if dict(getattr(mod, "KIND_CODES", {})) != KIND_CODES:
        problems.append("kind codes differ")
    return problems


def _by_abi(name: str, abi: int) -> ModuleType | None:
    mod = _load(name)
    if mod is not None and getattr(mod, "ABI", None) != abi:
        _refuse(name, [f"ABI {getattr(mod, 'ABI', None)}, expected {abi}"])
        return None
    return mod


def fused_stats() -> ModuleType | None:
    """``_fused_stats`` where it is built with this ABI, else None."""
    return _by_abi("_fused_stats", STATS_ABI)


def row_builder(row_arity: int) -> ModuleType | None:
    """``_row_builder`` where it is built with this layout (rows of ``row_arity`` fields), else None."""
    mod = _load("_row_builder")
    if mod is not None and (problems := row_builder_problems(mod, row_arity)):
        _refuse("_row_builder", problems)
        return None
    return mod


def stack_keys() -> ModuleType | None:
    """``_stack_keys`` where it is built with this ABI, else None."""
    return _by_abi("_stack_keys", STACK_KEYS_ABI)


def recorder_lock() -> ModuleType | None:
    """``_recorder_lock`` where it is built with this ABI, else None (the recorder takes ``threading.RLock``)."""
    return _by_abi("_recorder_lock", RECORDER_LOCK_ABI)


def _with_context(name: str, abi: int, fields: tuple[str, ...]) -> ModuleType | None:
    mod = _by_abi(name, abi)
    if mod is not None and set(getattr(mod, "CONTEXT_FIELDS", ())) != set(fields):
        _refuse(name, ["context fields differ"])
        return None
    return mod


def api_handler() -> ModuleType | None:
    """``_api_handler`` where it is built with this ABI and context, else None (the Python handler)."""
    return _with_context("_api_handler", API_HANDLER_ABI, HANDLER_FIELDS)


def api_backward() -> ModuleType | None:
    """``_api_backward`` where it is built with this ABI and context, else None (api_backward's classes)."""
    return _with_context("_api_backward", API_BACKWARD_ABI, BACKWARD_FIELDS)


def module_hooks() -> ModuleType | None:
    """``_module_hooks`` where it is built with this ABI and context, else None (the Python hooks)."""
    return _with_context("_module_hooks", MODULE_HOOKS_ABI, MODULE_HOOKS_FIELDS)


def replaced(mod: ModuleType | None, ctx: tuple, name: str, value: Any) -> tuple:
    """``ctx`` (a row builder context made by :func:`context` for ``mod``) with its field ``name`` set to
    ``value``: benchmarks and tests switch one field (the host copies) without knowing the order."""
    order = getattr(mod, "CONTEXT_FIELDS", CONTEXT_FIELDS) if mod is not None else CONTEXT_FIELDS
    i = list(order).index(name)
    return ctx[:i] + (value,) + ctx[i + 1:]


def context(mod: ModuleType | None, values: dict[str, Any]) -> tuple:
    """The row builder's context: ``values`` (one per :data:`CONTEXT_FIELDS` name) in the order ``mod``
    was built with (this module's order without an extension)."""
    order = getattr(mod, "CONTEXT_FIELDS", CONTEXT_FIELDS) if mod is not None else CONTEXT_FIELDS
    return tuple(values[name] for name in order)
