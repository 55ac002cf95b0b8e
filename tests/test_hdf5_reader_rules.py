"""The HDF5 reader's integrity checks on ids (store/hdf5_reader.py, issue 36): a rank file whose checksums hold
but whose ids name strings, shapes or tensor bytes that are not there (a hostile or buggy writer) is refused
with a DumpFormatError naming the file and the table; ids that mean "none" (-1) are read as missing. The files
are written by the real writer, with its payload edited just before the commit (so every checksum is right)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter

_STEP: dict[str, Any] = {"columns": {"name": ["a", "b"], "shape": [(2,), None], "data_name": ["t", ""]},
                         "stacks": {1: ["x.py:1", "y.py:2"]},
                         "construct": {"a": "b", "b": None},
                         "tensors": {"t": np.arange(2, dtype=np.float32)}}


def _written(tmp_path: Path, edit: Callable[[dict, DumpWriter], None] | None = None,
             stage: Callable[[dict], None] | None = None) -> Path:
    """One step written by the real writer; ``edit(payload, writer)`` changes its prepared payload, ``stage``
    the tensor index columns, just before they are committed."""
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        if edit is not None:
            real_write = w._write

            def write(step: int, p: dict, flags: int = 0) -> None:
                edit(p, w)
                real_write(step, p, flags)
            w._write = write  # type: ignore[method-assign]
        if stage is not None:
            group = w._groups["tensors"]
            real_stage = group.stage

            def staged(data: dict) -> Any:
                stage(data)
                return real_stage(data)
            group.stage = staged  # type: ignore[method-assign]
        w.write_step(0, dict(_STEP["columns"]), stacks=_STEP["stacks"], construct=_STEP["construct"],
                     tensors=_STEP["tensors"])
    return d


def _refused(d: Path, pattern: str) -> None:
    with pytest.raises(DumpFormatError, match=pattern) as e:
        read_hdf5(d).calls  # noqa: B018  (the columns are read lazily by some readers)
    assert str(d / "rank0.h5") in str(e.value)


def test_a_faithful_write_reads_back_every_id(tmp_path):
    parts = read_hdf5(_written(tmp_path))
    assert parts.calls["name"].tolist() == ["a", "b"] and parts.calls["shape"].tolist() == [(2,), None]
    assert parts.stacks == {1: ["x.py:1", "y.py:2"]}
    assert parts.construct == {"a": "b", "b": None}
    assert parts.tensor_loader("t").tolist() == [0.0, 1.0]


def _set_col(col: str, value: int) -> Callable[[dict, DumpWriter], None]:
    def edit(p: dict, w: DumpWriter) -> None:
        p["cols"][col] = p["cols"][col].copy()
        p["cols"][col][-1] = value
    return edit


@pytest.mark.parametrize("value", [10 ** 6, -1, -5])
def test_a_string_column_naming_no_string_is_refused(tmp_path, value):
    _refused(_written(tmp_path, _set_col("name", value)), "calls/name refers to strings outside the string table")


def test_the_highest_string_id_there_is_is_read(tmp_path):
    def edit(p: dict, w: DumpWriter) -> None:  # the last string interned in this step: the highest id in the table
        p["cols"]["family"] = p["cols"]["name"].copy()
    assert read_hdf5(_written(tmp_path, edit)).calls["family"].tolist() == ["a", "b"]


@pytest.mark.parametrize("value", [1, 2, 10 ** 6, -2])  # one shape in the table: id 1 is the first past it
def test_a_shape_id_naming_no_shape_is_refused(tmp_path, value):
    _refused(_written(tmp_path, _set_col("shape", value)), "calls/shape refers to shapes outside the shape table")


def test_shape_id_minus_one_is_no_shape_and_the_last_shape_is_read(tmp_path):
    def edit(p: dict, w: DumpWriter) -> None:
        p["cols"]["shape"] = np.array([-1, 0], p["cols"]["shape"].dtype)
    assert read_hdf5(_written(tmp_path, edit)).calls["shape"].tolist() == [None, (2,)]


def _stack_frames(value: int) -> Callable[[dict, DumpWriter], None]:
    def edit(p: dict, w: DumpWriter) -> None:
        sid, frames = p["stacks"][0]
        p["stacks"][0] = (sid, [frames[0], value])
    return edit


@pytest.mark.parametrize("value", [10 ** 6, -1])
def test_a_stack_frame_naming_no_string_is_refused(tmp_path, value):
    _refused(_written(tmp_path, _stack_frames(value)), "stacks/frames refers to strings outside the string table")


def _construct(which: int, value: int) -> Callable[[dict, DumpWriter], None]:
    def edit(p: dict, w: DumpWriter) -> None:
        arrays = [a.copy() for a in p["construct"]]
        arrays[which][0] = value
        p["construct"] = tuple(arrays)
    return edit


@pytest.mark.parametrize("which, value, table", [(0, 10 ** 6, "construct/call"), (0, -1, "construct/call"),
                                                 (1, 10 ** 6, "construct/parent"), (1, -2, "construct/parent")])
def test_a_construct_entry_naming_no_string_is_refused(tmp_path, which, value, table):
    _refused(_written(tmp_path, _construct(which, value)), f"{table} refers to strings outside the string table")


def test_a_construct_parent_of_minus_one_is_none(tmp_path):
    assert read_hdf5(_written(tmp_path, _construct(1, -1))).construct == {"a": None, "b": None}


def _tensor(field: int, value: int) -> Callable[[dict, DumpWriter], None]:
    def edit(p: dict, w: DumpWriter) -> None:
        row = list(p["tensors"][0])
        row[field] = value
        p["tensors"][0] = tuple(row)
    return edit


@pytest.mark.parametrize("field, value, pattern", [
    (0, 10 ** 6, "tensors/name refers to strings outside the string table"),
    (0, -1, "tensors/name refers to strings outside the string table"),
    (3, 10 ** 6, "tensors/dtype refers to strings outside the string table"),
    (4, 1, "tensors/shape refers to shapes outside the shape table"),
    (4, 10 ** 6, "tensors/shape refers to shapes outside the shape table"),
    (4, -1, "tensors/shape refers to shapes outside the shape table"),
])
def test_a_tensor_entry_naming_no_string_or_shape_is_refused(tmp_path, field, value, pattern):
    _refused(_written(tmp_path, _tensor(field, value)), pattern)


def _tensor_col(col: str, value: int) -> Callable[[dict], None]:
    def stage(data: dict) -> None:
        data[f"tensors/{col}"] = data[f"tensors/{col}"].copy()
        data[f"tensors/{col}"][0] = value
    return stage


@pytest.mark.parametrize("col, value, pattern", [
    ("offset", 10 ** 6, r"tensors/u4 has \d+ entries; the commit index says \d+ and the tensor index needs 1000002"),
    ("offset", -1, r"tensors/u4 has \d+ entries; the commit index says \d+ and the tensor index needs 1"),
    ("count", 10 ** 7, r"tensors/u4 has \d+ entries; the commit index says \d+ and the tensor index needs 10000000"),
    ("buffer", 3, "tensors/buffer holds an unknown buffer width"),
])
def test_tensor_bytes_the_index_names_must_be_in_the_file(tmp_path, col, value, pattern):
    _refused(_written(tmp_path, stage=_tensor_col(col, value)), pattern)


def test_a_tensor_ending_at_the_committed_end_reads(tmp_path):
    from msprobe_nb.store.hdf5_layout import TENSOR_CHUNK_BYTES

    end = TENSOR_CHUNK_BYTES // 4  # the step's buffer end: one chunk of float32
    parts = read_hdf5(_written(tmp_path, stage=_tensor_col("offset", end - 2)))
    assert parts.tensor_loader("t").tolist() == [0.0, 0.0]  # the chunk's last two (fill) entries


def test_the_first_string_id_past_the_table_is_refused(tmp_path):
    def edit(p: dict, w: DumpWriter) -> None:
        p["cols"]["name"] = p["cols"]["name"].copy()
        p["cols"]["name"][0] = len(w._strings)  # the table's length once this step's strings are committed
    _refused(_written(tmp_path, edit), "calls/name refers to strings outside the string table")


def test_tensors_whose_shape_is_not_the_tables_first_read(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["a"], "shape": [(7,)]})  # shape id 0, of a call only
        w.write_step(1, {"data_name": ["t"]}, tensors={"t": np.ones((2, 3), np.float32)})
    assert tuple(read_hdf5(d).tensor_loader("t").shape) == (2, 3)


def test_a_buffer_grown_by_a_step_that_failed_still_reads(tmp_path, monkeypatch):
    # the failed step's tensor bytes lie past the committed end: more entries than the commit names is fine
    import errno

    from msprobe_nb.store.hdf5_layout import TENSOR_CHUNK_BYTES

    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"data_name": ["a"]}, tensors={"a": np.arange(3, dtype=np.float32)})

        def fail(row: list) -> None:
            raise OSError(errno.EIO, "I/O error")
        monkeypatch.setattr(w, "_append_index", fail)
        with pytest.raises(OSError):
            w.write_step(1, {"data_name": ["b"]}, tensors={"b": np.ones(TENSOR_CHUNK_BYTES // 2, np.float32)})
        monkeypatch.undo()
    parts = read_hdf5(d)
    assert parts.meta["steps"] == [0] and parts.tensor_loader("a").tolist() == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("shapes", [[None, None], [(1,), (2, 2)]])  # no shape table at all; no row without one
def test_shape_columns_with_no_shape_or_every_row_shaped_read(tmp_path, shapes):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["a", "b"], "shape": shapes})
    assert read_hdf5(d).calls["shape"].tolist() == shapes
