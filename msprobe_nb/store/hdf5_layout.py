"""The kit's HDF5 dump layout, described once: names, versions, groups, index fields, flags and digests.

The writer builds files from these and the reader checks files against them; neither defines its own.
``docs/hdf5_schema.md`` explains each one. This module imports neither h5py nor pandas (``store.dump`` reads
``RANK_FILE_RE`` from it to find rank files without loading h5py).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from msprobe_nb.store.checksums import crc32
from msprobe_nb.store.schema import COLUMNS

FORMAT_NAME = "msprobe_nb.dump"
#: Version of the HDF5 arrangement (groups, encodings, index). The calls-table columns carry their
#: own version, ``schema.SCHEMA_VERSION``; a reader needs both to match.
LAYOUT_VERSION = 5
TOOL_NAME = "msprobe_nb"

RANK_FILE_RE = re.compile(r"^rank(\d+)\.h5$")

#: Stored in a nullable Int64 column where the value is <NA>.
INT_NA = np.iinfo(np.int64).min
#: Last column of every committed ``/index/steps`` row ("mspb"); a row of fill zeros is not a commit.
COMMIT_MAGIC = 0x6D737062
TENSOR_WIDTHS = (1, 2, 4, 8)

#: Columns the writer derives itself: ``step`` from the index, ``rank`` from the file.
DERIVED_COLUMNS = ("step", "rank")
STORED_COLUMNS = [c for c in COLUMNS if c not in DERIVED_COLUMNS]

#: schema dtype -> (on-disk numpy dtype, encoding name written as the dataset's ``encoding`` attr).
ENCODINGS: dict[str, tuple[str, str]] = {
    "string": ("int32", "string_id"),
    "int32": ("int32", "int32"),
    "int64": ("int64", "int64"),
    "float64": ("float64", "float64"),
    "bool": ("uint8", "bool"),
    "Int64": ("int64", "nullable_int64"),
    "boolean": ("int8", "nullable_bool"),
    "object": ("int32", "shape_id"),
}

#: Append-only tables. Each group's columns grow together: group -> (rows per chunk, {dataset: dtype}).
GROUPS: dict[str, tuple[int, dict[str, str]]] = {
    "calls": (1 << 12, {f"calls/{c}": ENCODINGS[COLUMNS[c][0]][0] for c in STORED_COLUMNS}),
    "strings": (1 << 12, {"strings/ends": "int64"}),
    "string_bytes": (1 << 16, {"strings/bytes": "uint8"}),
    "shapes": (1 << 10, {"shapes/ends": "int64"}),
    "shape_dims": (1 << 10, {"shapes/dims": "int64"}),
    "stacks": (1 << 10, {"stacks/id": "int32", "stacks/ends": "int64"}),
    "stack_frames": (1 << 12, {"stacks/frames": "int32"}),
    "construct": (1 << 12, {"construct/step": "int32", "construct/call": "int32", "construct/parent": "int32"}),
    "tensors": (1 << 10, {"tensors/name": "int32", "tensors/step": "int32", "tensors/buffer": "uint8",
                          "tensors/offset": "int64", "tensors/count": "int64", "tensors/dtype": "int32",
                          "tensors/shape": "int32"}),
}
#: Columns of the ``/index/steps`` rows of layouts 1-3: the step; per group its committed length and tail
#: slot; the committed length of each tensor buffer; the commit marker.
INDEX_FIELDS_V3 = (["step"] + [x for g in GROUPS for x in (g, f"{g}_slot")]
                   + [f"u{w}" for w in TENSOR_WIDTHS] + ["commit"])
#: Layout 4 added ``flags`` (what happened to the step, ``FLAG_*``) before the marker.
INDEX_FIELDS_V4 = INDEX_FIELDS_V3[:-1] + ["flags", "commit"]
#: Layout 5 adds, per group, the crc32 of its committed tail rows (``<group>_crc``), and ``crc``: the crc32 of
#: the row's fields before it (little-endian int64), so readers detect damaged bytes instead of using them.
INDEX_FIELDS = INDEX_FIELDS_V4[:-1] + [f"{g}_crc" for g in GROUPS] + ["crc", "commit"]
#: field name -> its column in an ``/index/steps`` row (today's fields)
INDEX_POS = {name: i for i, name in enumerate(INDEX_FIELDS)}
#: ``flags`` bit: the row is no data, it marks that rows of its step were lost because writing them failed
#: (the row repeats the previous commit's lengths); bits 8-23 hold the failure's errno (0: not an OSError).
FLAG_DROPPED = 1
#: ``flags`` bit: the step's recording was cut short by an exception in the user's code (``stop()`` called
#: while it was being handled, or ``record()`` left by one): its rows are what was recorded until then.
FLAG_PARTIAL = 2
TENSOR_CHUNK_BYTES = 1 << 20  # bytes per chunk of a tensor buffer; each step starts a fresh chunk
#: Rows per chunk of ``/index/steps``; its extent grows a whole chunk at a time (fill rows are not commits).
INDEX_BLOCK = 256
#: Longest column whose conversion is remembered for the next step (``DumpWriter._recall``).
MEMO_ROWS = 4096



def tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(TOOL_NAME)
    except PackageNotFoundError:  # running from a checkout
        import msprobe_nb

        return str(getattr(msprobe_nb, "__version__", "0+unknown"))



def plain_attr(v: Any, errors: str = "surrogateescape") -> Any:
    """An attribute value as plain JSON: text, numbers, lists. The digest decodes losslessly (a damaged byte
    must change it); the reader decodes with ``errors="replace"`` to show text."""
    if isinstance(v, bytes):
        return v.decode("utf-8", errors)
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def attrs_digest(f: Any) -> int:
    """crc32 of the attributes readers rely on: every root attribute but ``attrs_crc`` itself, the record layout
    of each tail and the index's fields. Text attributes live in HDF5's global heap, which carries no checksum
    of its own; ``attrs_crc`` (root, layout 5) lets a reader tell a damaged one from what was written."""
    items = [["/", k, plain_attr(f.attrs[k])] for k in sorted(f.attrs) if k != "attrs_crc"]
    items += [[f"tail/{g}", "columns", plain_attr(f[f"tail/{g}"].attrs["columns"])] for g in GROUPS]
    items.append(["index/steps", "fields", plain_attr(f["index/steps"].attrs["fields"])])
    return crc32(json.dumps(items, sort_keys=True, ensure_ascii=True, default=str).encode())


def commit_row(step: int, states: list[tuple[int, int, int]], ends: Mapping[int, int], flags: int) -> list[int]:
    """A row of ``/index/steps`` (``INDEX_FIELDS``): the groups' states, tensor buffer ends, flags, tail crcs,
    then the crc32 of all that and the commit marker."""
    row = [step]
    for length, slot, _ in states:
        row += (length, slot)
    row += [ends[w] for w in TENSOR_WIDTHS]
    row.append(flags)
    row += [crc for _, _, crc in states]
    row.append(crc32(np.asarray(row, "<i8").tobytes()))
    row.append(COMMIT_MAGIC)
    return row

