"""The one table every layer agrees on: one row per recorded leaf (a tensor, a value or a None).

Capture fills these columns, the HDF5 store writes and reads them, the msprobe reader produces them
from dump.json, and the analysis layer compares them. Names follow msprobe so a row's ``name`` is the
row name of msprobe's compare CSV (``Functional.linear.0.forward.input.0``).

The HDF5 layout that stores this table is documented in ``docs/hdf5_schema.md``; bump
``SCHEMA_VERSION`` whenever a column is added, removed or changes meaning.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pandas is imported where tables are built, not by the recording path
    import pandas as pd

SCHEMA_VERSION = 1

#: ``value_type`` of a tensor row that holds a DTensor's local shard; its ``value`` is the JSON of the
#: DTensor's placements, mesh and global shape (docs/distributed.md)
DTENSOR_VALUE_TYPE = "DTensor"

#: column -> (pandas dtype, meaning). Order is the DataFrame's column order.
COLUMNS: dict[str, tuple[str, str]] = {
    "step": ("int32", "training step the row belongs to"),
    "rank": ("int32", "distributed rank (0 without torch.distributed)"),
    "call_index": ("int64", "execution order of the call within (step, rank); rows of one call share it"),
    "call": ("string", "msprobe call name: Functional.linear.0.forward, Module.net1.Linear.forward.0, "
                       "Module.net1.Linear.parameters_grad.0"),
    "name": ("string", "msprobe row name: <call>.<io>.<arg>, e.g. Functional.linear.0.forward.input.0"),
    "family": ("string", "API family: Torch, Tensor, Functional, NPU, Distributed, VF, Aten, Module, Function, ..."),
    "op": ("string", "API name (linear, __getitem__) or module class name (Linear)"),
    "module_path": ("string", "for Module calls: dotted path of the module in the model (net1.ln1)"),
    "counter": ("int32", "per-name call counter, restarting every step"),
    "direction": ("string", "forward | recompute (rerun by activation checkpointing) | backward | parameters_grad"),
    "io": ("string", "input | output | parameters | parameters_grad"),
    "arg": ("string", "position inside io: '0', '0.1' (nested), 'weight' (kwarg, dict key, field name)"),
    "is_kwarg": ("bool", "the leaf came from keyword arguments (dump.json input_kwargs)"),
    "kind": ("string", "tensor | value | none"),
    "dtype": ("string", "torch dtype as msprobe writes it (torch.float32); empty for values"),
    "shape": ("object", "tuple of ints for tensors, None otherwise"),
    "numel": ("Int64", "number of elements"),
    "device": ("string", "device of the tensor (cpu, cuda:0, npu:0); empty when unknown"),
    "requires_grad": ("boolean", "tensor.requires_grad"),
    "max": ("float64", "maximum (bool: 1.0 if any true); NaN when not computed or when the tensor has NaN"),
    "min": ("float64", "minimum (bool: 1.0 if all true)"),
    "mean": ("float64", "mean (NaN for bool, like msprobe)"),
    "norm": ("float64", "L2 norm (complex: of abs)"),
    "nan_count": ("Int64", "number of NaN elements; <NA> when the source did not record it"),
    "posinf_count": ("Int64", "number of +inf elements"),
    "neginf_count": ("Int64", "number of -inf elements"),
    "hash": ("string", "content hash in md5/crc32/xor summary modes; empty otherwise"),
    "value_type": ("string", "type of a non-tensor value (int, float, torch.dtype, slice, ...); "
                                "DTENSOR_VALUE_TYPE on the row of a DTensor's local shard"),
    "value": ("string", "JSON text of a non-tensor value"),
    "data_name": ("string", "key of the whole tensor in tensor mode (Dump.tensor(key)); empty otherwise"),
    "stack_id": ("int32", "index into Dump.stacks (-1: none)"),
    "parent": ("string", "enclosing module call (construct.json parent); empty at top level"),
    "tensor_id": ("Int64", "provenance: id of this tensor's identity within the step"),
    "producer": ("string", "provenance: call whose output this input tensor is; empty if unknown"),
    "rng": ("string", "random draw: generator it drew from (cpu, cuda:0, python, numpy, custom:<id>)"),
    "rng_state": ("string", "random draw: digest of the generator state before the draw"),
}

COLUMN_NAMES = list(COLUMNS)


class Coded:
    """A column handed to the writer as ``values[codes]``.

    Why: the fields of a call (its name, family, op, parent, stack...) repeat on every row of the call;
    converting and interning them once per call instead of once per row is most of a step's write.
    """

    __slots__ = ("codes", "values")

    def __init__(self, codes: Any, values: Any):
        self.codes = codes    # 1-D integer numpy array, one per row: an index into ``values``
        self.values = values  # list or 1-D array, one per distinct call

    def __len__(self) -> int:
        return len(self.codes)


NUMERIC_STATS = ["max", "min", "mean", "norm"]


def empty_calls() -> pd.DataFrame:
    """An empty calls table with the schema's dtypes."""
    import pandas as pd
    return coerce_calls(pd.DataFrame({c: [] for c in COLUMN_NAMES}))


def coerce_calls(df: pd.DataFrame) -> pd.DataFrame:
    """Give ``df`` every schema column, in order, with the schema's dtypes (missing columns get defaults)."""
    import pandas as pd
    n = len(df)
    out = {}
    for col, (dtype, _) in COLUMNS.items():
        if col in df.columns:
            s = df[col]
        elif dtype in ("int32", "int64"):
            s = pd.Series([-1 if col == "stack_id" else 0] * n, index=df.index)
        elif dtype == "float64":
            s = pd.Series([float("nan")] * n, index=df.index)
        elif dtype == "bool":
            s = pd.Series([False] * n, index=df.index)
        elif dtype == "object":
            s = pd.Series([None] * n, index=df.index, dtype=object)
        elif dtype == "string":
            s = pd.Series([""] * n, index=df.index)
        else:  # nullable Int64 / boolean
            s = pd.Series([pd.NA] * n, index=df.index)
        out[col] = s if dtype == "object" else s.astype(pandas_dtype(dtype))
    return pd.DataFrame(out, index=df.index, copy=False)


def pandas_dtype(dtype: str) -> Any:
    """The pandas dtype of a schema dtype name. Text is pandas' string dtype stored as Python objects, whether
    or not pyarrow is installed (pandas' default storage is pyarrow's where it is, and pyarrow refuses the lone
    surrogates that undecodable bytes of a hostile or damaged dump become)."""
    if dtype == "string":
        import pandas as pd
        return pd.StringDtype("python")
    return dtype


@dataclass
class DumpParts:
    """What a reader hands to :class:`msprobe_nb.Dump`: the table plus the side tables of one dump.

    ``tensor_loader(data_name)`` returns the whole tensor (a torch.Tensor) in tensor mode, loaded lazily (a
    loader may take ``(data_name, step=, rank=)`` instead: ``Dump.load_tensor`` looks which).
    """

    calls: pd.DataFrame
    stacks: dict[int, list[str]] = field(default_factory=dict)
    construct: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    tensor_loader: Callable[..., Any] | None = None
    source: str = ""
