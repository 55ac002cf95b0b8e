"""The HDF5 writer's rules, one by one (store/hdf5_writer.py, issue 36): steps keep their numbers, a dropped step
is marked (also when the disk refused the mark at first), a step that failed leaves nothing behind, and each
column's conversion accepts what the schema allows and names the column otherwise. Small files, no torch."""
from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from msprobe_nb.store import hdf5_appends
from msprobe_nb.store.hdf5_layout import COMMIT_MAGIC, GROUPS, INDEX_POS, INT_NA, TENSOR_CHUNK_BYTES
from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter
from msprobe_nb.store.schema import Coded


def _names(step: int, n: int = 2) -> dict[str, list]:
    return {"name": [f"s{step}.n{k}" for k in range(n)], "numel": list(range(n))}


def _steps(d: Path) -> list[int]:
    return sorted(set(read_hdf5(d).calls["step"].tolist()))


# ------------------------------------------------------------------ numbering and dropped steps
def test_a_dropped_step_keeps_every_later_steps_number_and_is_listed_with_its_errno(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, _names(0))
        w.write_step(1, _names(1))
        w.mark_dropped(2, errno.ENOSPC)
        w.write_step(3, _names(3))
        w.mark_dropped(4)
    parts = read_hdf5(d)
    assert _steps(d) == [0, 1, 3]
    assert parts.calls.loc[parts.calls["step"] == 3, "name"].tolist() == ["s3.n0", "s3.n1"]
    assert parts.meta["dropped_steps"] == [2, 4]
    why = {x["step"]: x["reason"] for x in parts.meta["dropped"]}
    assert f"errno {errno.ENOSPC}" in why[2] and "ENOSPC" in why[2]
    assert why[4] == "writing it failed"
    assert parts.meta["partial_steps"] == []


def test_an_errno_is_kept_to_sixteen_bits_and_never_spills_into_the_flags(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, _names(0))
        w.mark_dropped(1, errno.EIO + 0x10000)
        w.write_step(2, _names(2))
    parts = read_hdf5(d)
    assert parts.meta["dropped_steps"] == [1]
    assert f"errno {errno.EIO} " in parts.meta["dropped"][0]["reason"]
    assert parts.meta["partial_steps"] == [] and _steps(d) == [0, 2]


def test_a_partial_step_is_flagged_and_its_rows_kept(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, _names(0))
        w.write_step(1, _names(1), partial=True)
    parts = read_hdf5(d)
    assert parts.meta["partial_steps"] == [1] and parts.meta["dropped_steps"] == []
    assert _steps(d) == [0, 1]


def _refuse_index(monkeypatch, w: DumpWriter) -> None:
    def full(n: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(w, "_reserve_index", full)


def test_a_mark_the_disk_refused_is_written_before_the_next_commit(tmp_path, monkeypatch):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, _names(0))
        _refuse_index(monkeypatch, w)
        w.mark_dropped(1, errno.ENOSPC)  # refused silently: the mark stays pending
        w.mark_dropped(2, errno.ENOSPC)
        monkeypatch.undo()
        w.write_step(3, _names(3))
        with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
            steps = h["index/steps"][:, 0].tolist()
        assert steps[:4] == [0, 1, 2, 3]  # the marks in order, before the commit that followed them
    parts = read_hdf5(d)
    assert parts.meta["dropped_steps"] == [1, 2] and _steps(d) == [0, 3]


@pytest.mark.parametrize("disk_full_at_close", [False, True])
def test_a_mark_still_pending_at_close_is_written_then_and_close_twice_is_harmless(tmp_path, monkeypatch,
                                                                                   disk_full_at_close):
    d = tmp_path / "d"
    w = DumpWriter(d)
    w.write_step(0, _names(0))
    _refuse_index(monkeypatch, w)
    w.mark_dropped(1, errno.ENOSPC)
    if not disk_full_at_close:
        monkeypatch.undo()
    w.close()  # with the disk still full the mark is lost, but close() works
    monkeypatch.undo()
    w.close()  # twice is harmless, also with the mark still pending and the file closed
    assert read_hdf5(d).meta["dropped_steps"] == ([] if disk_full_at_close else [1])
    assert _steps(d) == [0] and "closed" in repr(w)


def test_step_numbers_must_fit_int32_for_steps_and_marks(tmp_path):
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(-(2 ** 31), _names(0))
        w.write_step(2 ** 31 - 1, _names(1))
        for bad in (2 ** 31, -(2 ** 31) - 1):
            with pytest.raises(ValueError, match=f"step {bad} does not fit int32"):
                w.write_step(bad, _names(2))
            with pytest.raises(ValueError, match=f"step {bad} does not fit int32"):
                w.mark_dropped(bad)
        w.mark_dropped(2 ** 31 - 1)
        w.mark_dropped(-(2 ** 31))
        assert "2 step(s)" in repr(w)
    assert _steps(tmp_path / "d") == [-(2 ** 31), 2 ** 31 - 1]


def test_a_closed_writer_refuses_a_step(tmp_path):
    w = DumpWriter(tmp_path / "d")
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write_step(0, _names(0))


def test_a_second_writer_for_an_existing_rank_file_is_refused(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, _names(0))
    with pytest.raises(FileExistsError, match="rank0.h5"):
        DumpWriter(d)
    assert _steps(d) == [0]
    assert not (d / "rank0.h5.tmp").exists()


# ------------------------------------------------------------------ a failed step leaves nothing behind
def test_a_step_refused_for_bad_input_leaves_no_string_or_shape_behind(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["a"], "shape": [(1,)]})
        with pytest.raises(ValueError, match="counter"):
            w.write_step(1, {"name": ["b", "c"], "shape": [(5, 5), (1,)], "counter": [1, 2 ** 40]})
        w.write_step(2, {"name": ["c", "b", "a"], "shape": [(7,), (5, 5), (1,)]})
        w.write_step(3, {"name": ["b"], "shape": [(5, 5)]})
    calls = read_hdf5(d).calls
    assert calls["name"].tolist() == ["a", "c", "b", "a", "b"]
    assert calls["shape"].tolist() == [(1,), (7,), (5, 5), (1,), (5, 5)]
    assert calls["step"].tolist() == [0, 2, 2, 2, 3]


def test_a_step_whose_commit_failed_leaves_nothing_and_the_next_one_commits(tmp_path, monkeypatch):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["a"], "shape": [(1,)]}, stacks={1: ["x.py:1"]})
        real = w._append_index

        def fail(row):
            raise OSError(errno.EIO, "I/O error")
        monkeypatch.setattr(w, "_append_index", fail)
        with pytest.raises(OSError):
            w.write_step(1, {"name": ["new", "a"], "shape": [(3, 3), (1,)], "stack_id": [2, 1]},
                         stacks={2: ["y.py:2"]})
        monkeypatch.setattr(w, "_append_index", real)
        w.mark_dropped(1, errno.EIO)
        w.write_step(2, {"name": ["new", "other"], "shape": [(3, 3), (2,)], "stack_id": [2, 1]},
                     stacks={2: ["z.py:3"]})
        assert w.steps_written == 2
    parts = read_hdf5(d)
    assert parts.calls["name"].tolist() == ["a", "new", "other"]
    assert parts.calls["shape"].tolist() == [(1,), (3, 3), (2,)]
    assert parts.calls["step"].tolist() == [0, 2, 2]
    assert parts.meta["dropped_steps"] == [1]
    assert parts.stacks[2] == ["z.py:3"] and parts.stacks[1] == ["x.py:1"]


def test_a_failed_step_across_a_chunk_boundary_leaves_the_committed_rows_whole(tmp_path, monkeypatch):
    """A step that fills the calls chunk writes the chunk to the main datasets and its leftover rows to the other
    tail slot; when its commit fails, the next step starts again from the committed rows of the first slot, so
    the file holds exactly the committed steps' rows."""
    chunk = GROUPS["calls"][0]
    d = tmp_path / "d"

    def rows(step: int, n: int) -> dict:
        return {"call_index": list(range(n)), "max": [step * 1e5 + i for i in range(n)]}

    with DumpWriter(d) as w:
        w.write_step(0, rows(0, chunk - 100))
        real = w._append_index

        def fail(row):
            raise OSError(errno.EIO, "I/O error")
        monkeypatch.setattr(w, "_append_index", fail)
        with pytest.raises(OSError):
            w.write_step(1, rows(1, chunk + 300))  # fills this chunk and the next, and 200 rows beyond
        monkeypatch.setattr(w, "_append_index", real)
        w.write_step(2, rows(2, 250))  # fills the chunk too, from the committed rows
        w.write_step(3, rows(3, chunk // 2))
    calls = read_hdf5(d).calls
    want = [rows(0, chunk - 100), rows(2, 250), rows(3, chunk // 2)]
    assert calls["step"].tolist() == [0] * (chunk - 100) + [2] * 250 + [3] * (chunk // 2)
    assert calls["max"].tolist() == [v for r in want for v in r["max"]]
    assert calls["call_index"].tolist() == [v for r in want for v in r["call_index"]]


def test_a_main_datasets_extent_grows_eight_chunks_at_once_and_readers_take_the_committed_rows(tmp_path,
                                                                                               monkeypatch):
    """A column's extent grows EXTENT_CHUNKS whole chunks at a time (one change of its object header per eight
    chunks written, not one per chunk); the chunks ahead are never written, and readers read exactly the
    committed rows."""
    chunk = GROUPS["calls"][0]
    grown: list[tuple[int, ...]] = []
    set_extent = hdf5_appends.DatasetWriter.set_extent

    def spy(self, shape):
        if self.ds.name == "/calls/max":
            grown.append(tuple(shape))
        set_extent(self, shape)
    monkeypatch.setattr(hdf5_appends.DatasetWriter, "set_extent", spy)
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        for step in range(9):  # fills nine chunks
            w.write_step(step, {"max": [step * 1e5 + i for i in range(chunk)]})
        w.write_step(9, {"max": [1.0, 2.0, 3.0]})
    assert hdf5_appends.EXTENT_CHUNKS == 8
    assert grown == [(8 * chunk,), (16 * chunk,)]
    with h5py.File(next(d.glob("*.h5")), "r") as f:
        assert f["calls/max"].shape == (16 * chunk,) and f["calls/max"].id.get_num_chunks() == 9
    calls = read_hdf5(d).calls
    assert calls["max"].tolist() == [s * 1e5 + i for s in range(9) for i in range(chunk)] + [1.0, 2.0, 3.0]
    assert calls["step"].tolist() == [s for s in range(9) for _ in range(chunk)] + [9, 9, 9]


def test_the_first_step_failing_keeps_the_empty_string_as_id_zero(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        with pytest.raises(ValueError):
            w.write_step(0, {"name": ["x", None], "counter": [0, 2 ** 40]})
        w.write_step(1, {"name": [None, "y", ""], "family": ["f", "", None]})
    calls = read_hdf5(d).calls
    assert calls["name"].tolist() == ["", "y", ""]
    assert calls["family"].tolist() == ["f", "", ""]


# ------------------------------------------------------------------ the columns a step hands over
def test_unknown_columns_and_unequal_lengths_are_named(tmp_path):
    with DumpWriter(tmp_path / "d") as w:
        with pytest.raises(ValueError, match=r"unknown column\(s\) \['nmae'\].*'name'"):
            w.write_step(0, {"nmae": ["x"]})
        with pytest.raises(ValueError, match="numel"):
            w.write_step(0, {"name": ["x", "y"], "numel": [1]})
        w.write_step(0, {})
    assert read_hdf5(tmp_path / "d").calls.empty


@pytest.mark.parametrize("col, bad, ok", [("step", 4, 3), ("rank", 0, 2)])
def test_a_step_or_rank_column_must_agree_with_the_writer(tmp_path, col, bad, ok):
    with DumpWriter(tmp_path / "d", rank=2) as w:
        with pytest.raises(ValueError, match=f"column '{col}' disagrees with the writer"):
            w.write_step(3, {"name": ["x", "y"], col: [ok, bad]})
        w.write_step(3, {"name": ["x", "y"], col: [ok, ok]})
    calls = read_hdf5(tmp_path / "d").calls
    assert calls["step"].tolist() == [3, 3] and calls["rank"].tolist() == [2, 2]


def test_integer_columns_take_whole_floats_and_name_what_they_refuse(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"call_index": np.array([1.0, 2.0]), "counter": [2 ** 31 - 1, -(2 ** 31)],
                         "stack_id": np.array([True, False])})
        for col, vals, what in [("call_index", np.array([1.5, 2.0]), r"column 'call_index': 1\.5 is not"),
                                ("call_index", np.array([np.inf, 2.0]), "call_index"),
                                ("call_index", [1, None], "missing values"),
                                ("counter", [2 ** 31, 0], "out of int32 range"),
                                ("counter", [-(2 ** 31) - 1, 0], "out of int32 range"),
                                ("call_index", ["1", "x"], "call_index"),
                                ("call_index", [1.5, 2], r"column 'call_index': 1\.5 is not an integer"),
                                ("call_index", [float("inf"), 2], "column 'call_index'"),
                                ("numel", np.array([2.5, np.nan]), r"column 'numel': 2\.5 is not an integer"),
                                ("numel", np.array([np.inf, 1.0]), r"column 'numel': inf is not an integer"),
                                ("tensor_id", [1.5, None], "column 'tensor_id'")]:
            with pytest.raises(ValueError, match=what):
                w.write_step(1, {"name": ["a", "b"], col: vals})
        w.write_step(1, {"call_index": [3, "4"], "counter": np.array([5, 6], np.uint8),
                         "numel": np.array([3.0, np.nan])})
    calls = read_hdf5(d).calls
    assert calls["call_index"].tolist() == [1, 2, 3, 4]
    assert calls["counter"].tolist() == [2 ** 31 - 1, -(2 ** 31), 5, 6]
    assert calls["stack_id"].tolist() == [1, 0, -1, -1]
    assert calls["numel"].tolist()[2] == 3 and pd.isna(calls["numel"].iloc[3]) and pd.isna(calls["numel"].iloc[0])


def test_nullable_integer_and_boolean_columns(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"numel": np.array([1, 2 ** 62], np.int64), "requires_grad": [True, None],
                         "is_kwarg": np.array([1, 0]), "nan_count": [None, 3]})
        w.write_step(1, {"numel": np.array([7, 8], np.uint32), "is_kwarg": [None, True],
                         "requires_grad": [False, 0]})
        with pytest.raises(ValueError, match=f"numel.*{INT_NA}.*reserved"):
            w.write_step(2, {"numel": np.array([INT_NA, 1], np.int64)})
    calls = read_hdf5(d).calls
    assert calls["numel"].tolist() == [1, 2 ** 62, 7, 8]
    assert calls["requires_grad"].tolist()[:1] == [True] and pd.isna(calls["requires_grad"].iloc[1])
    assert calls["requires_grad"].tolist()[2:] == [False, False]
    assert calls["is_kwarg"].tolist() == [True, False, False, True]
    assert pd.isna(calls["nan_count"].iloc[0]) and calls["nan_count"].tolist()[1] == 3
    assert pd.isna(calls["nan_count"].iloc[2])  # not handed over: missing, not 0


def test_float_columns_take_missing_values_as_nan(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"max": [1.5, None, "2"], "min": np.array([1, 2, 3]), "norm": [pd.NA, 2.5, None]})
    calls = read_hdf5(d).calls
    assert calls["max"].iloc[0] == 1.5 and np.isnan(calls["max"].iloc[1]) and calls["max"].iloc[2] == 2.0
    assert np.isnan(calls["norm"].iloc[0]) and calls["norm"].iloc[1] == 2.5 and np.isnan(calls["norm"].iloc[2])
    assert calls["min"].tolist() == [1.0, 2.0, 3.0]
    assert np.isnan(calls["mean"]).all()


def test_shapes_must_be_tuples_of_non_negative_ints(tmp_path):
    with DumpWriter(tmp_path / "d") as w:
        with pytest.raises(ValueError, match=r"column 'shape' row 1.*negative dimension"):
            w.write_step(0, {"shape": [(1,), (2, -1)]})
        with pytest.raises(ValueError, match="column 'shape' row 0"):
            w.write_step(0, {"shape": ["ab"]})
        w.write_step(0, {"shape": [[2, 3], (2, 3), None, ()]})
    assert read_hdf5(tmp_path / "d").calls["shape"].tolist() == [(2, 3), (2, 3), None, ()]


def test_coded_columns_check_their_codes_for_each_number_of_values(tmp_path):
    d = tmp_path / "d"
    codes = np.array([0, 1, 1])
    with DumpWriter(d) as w:
        w.write_step(0, {"name": Coded(codes, ("a", "b")), "family": Coded(codes, ("f", "g"))})
        for bad in (np.array([0, 2, 1]), np.array([-1, 0, 0]), np.array([0.0, 1.0, 1.0])):
            with pytest.raises(ValueError, match=r"column 'name': codes must be integers in \[0, 2\)"):
                w.write_step(1, {"name": Coded(bad, ("a", "b"))})
        # the same codes array with fewer values is checked again, not taken as checked
        with pytest.raises(ValueError, match=r"column 'family': codes must be integers in \[0, 1\)"):
            w.write_step(1, {"name": Coded(codes, ("a", "b")), "family": Coded(codes, ("f",))})
        w.write_step(1, {"name": Coded(np.array([], np.int64), ("a",))})
    calls = read_hdf5(d).calls
    assert calls["name"].tolist() == ["a", "b", "b"] and calls["family"].tolist() == ["f", "g", "g"]


def test_repeated_columns_are_reused_only_when_equal_and_of_the_same_type(tmp_path):
    d = tmp_path / "d"
    names = ("a", "b")
    with DumpWriter(d) as w:
        w.write_step(0, {"name": names, "counter": (1, 2), "shape": ((1,), (2,))})
        w.write_step(1, {"name": names, "counter": (1, 2), "shape": ((1,), (2,))})
        w.write_step(2, {"name": ("a", "c"), "counter": (1, 3), "shape": ((1,), (3,))})
        w.write_step(3, {"name": ["a", "c"], "counter": [1, 3], "shape": [(1,), (3,)]})
        w.write_step(4, {"counter": (1, 3)})  # name not handed over: defaults, not step 3's names
        w.write_step(5, {"name": ("a", "c")})
    calls = read_hdf5(d).calls
    assert calls["name"].tolist() == ["a", "b", "a", "b", "a", "c", "a", "c", "", "", "a", "c"]
    assert calls["counter"].tolist() == [1, 2, 1, 2, 1, 3, 1, 3, 1, 3, 0, 0]
    assert calls["shape"].tolist()[:8] == [(1,), (2,), (1,), (2,), (1,), (3,), (1,), (3,)]


def test_string_columns_with_missing_and_new_values_keep_every_id_across_steps(tmp_path):
    """A column holding None is remembered like one of known strings; None, NaN, pandas' NA and "" read as "",
    and a value that follows a None takes its own string, also where the step before was reused."""
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"value": ("x", None, "y")}, construct={"M.a": None, "M.b": "M.a"})
        w.write_step(1, {"value": ("x", None, "y")}, construct={"M.a": None, "M.b": "M.a"})
        w.write_step(2, {"value": ("x", "z", None)}, construct={"M.a": "M.b", "M.b": None})
        w.write_step(3, {"value": ("x", float("nan"), pd.NA)})
        w.write_step(4, {"value": ("x", float("nan"), pd.NA)})
        w.write_step(5, {"value": ("", 7, "z")})
        w.write_step(6, {"value": ("", 7.0, "z")})  # equal to step 5's tuple, but written as another string
    dump = read_hdf5(d)
    assert dump.calls["value"].tolist() == ["x", "", "y", "x", "", "y", "x", "z", "", "x", "", "", "x", "", "",
                                            "", "7", "z", "", "7.0", "z"]
    con = dump.meta["construct_by_step"]
    assert con[0, 0] == {"M.a": None, "M.b": "M.a"} == con[0, 1]
    assert con[0, 2] == {"M.a": "M.b", "M.b": None}


# ------------------------------------------------------------------ stacks, construct, tensors
def test_stacks_are_written_once_per_id_and_checked(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"stack_id": [1]}, stacks={1: ["a.py:1", "b.py:2"], 3: "one.py:9"})
        w.write_step(1, {"stack_id": [1]}, stacks={1: ["changed.py:1"], 2: ["c.py:3"]})
        with pytest.raises(ValueError, match=f"stack id {2 ** 31} does not fit int32"):
            w.write_step(2, {}, stacks={2 ** 31: ["x"]})
    stacks = read_hdf5(d).stacks
    assert stacks[1] == ["a.py:1", "b.py:2"] and stacks[2] == ["c.py:3"] and stacks[3] == ["one.py:9"]
    assert set(stacks) == {1, 2, 3}


def test_construct_parents_missing_or_named(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {}, construct={"Module.a.forward.0": None, "Module.b.forward.0": "Module.a.forward.0"})
        w.write_step(1, {}, construct={"Module.c.forward.0": float("nan")})
    con = read_hdf5(d).construct
    flat = {k: v for part in (con.values() if all(isinstance(v, dict) for v in con.values()) else [con])
            for k, v in part.items()}
    assert flat["Module.b.forward.0"] == "Module.a.forward.0"
    assert flat["Module.a.forward.0"] is None and flat["Module.c.forward.0"] is None


def test_each_steps_tensors_start_on_a_fresh_chunk_and_read_back_exactly(tmp_path):
    import torch  # tensors are read back as torch tensors

    d = tmp_path / "d"
    a = np.arange(10, dtype=np.float32)
    b = np.arange(3, dtype=np.float64) / 3
    c = np.arange(5, dtype=np.int16)
    with DumpWriter(d, meta={"task": "tensor"}) as w:
        w.write_step(0, {"data_name": ["a", "b"]}, tensors={"a": a, "b": b})
        w.write_step(1, {"data_name": ["c", "a2"]}, tensors={"c": c, "a2": a + 1})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        rows = h["index/steps"][()]
        # a buffer's chunk is the unit a step starts on: TENSOR_CHUNK_BYTES of entries
        assert {w: h[f"tensors/u{w}"].chunks for w in (1, 2, 4, 8)} == {
            w: (TENSOR_CHUNK_BYTES // w,) for w in (1, 2, 4, 8)}
    rows = rows[rows[:, INDEX_POS["commit"]] == COMMIT_MAGIC]
    chunk4, chunk2 = TENSOR_CHUNK_BYTES // 4, TENSOR_CHUNK_BYTES // 2
    # the committed end of each buffer: step 1 starts on the chunk after step 0's, so a committed compressed
    # chunk is never written again
    assert rows[:, INDEX_POS["u4"]].tolist() == [chunk4, 2 * chunk4]
    assert rows[:, INDEX_POS["u8"]].tolist() == [TENSOR_CHUNK_BYTES // 8] * 2
    assert rows[:, INDEX_POS["u2"]].tolist() == [0, chunk2]
    parts = read_hdf5(d)
    for name, want in (("a", a), ("b", b), ("c", c), ("a2", a + 1)):
        got = parts.tensor_loader(name)
        assert torch.equal(got, torch.from_numpy(want)), name


def _codec(ds) -> str | None:
    """The compression filter of a dataset by name: h5py names lzf and gzip, and calls bitshuffle 'unknown'."""
    plist = ds.id.get_create_plist()
    ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
    return "bitshuffle" if 32008 in ids else ds.compression


@pytest.mark.parametrize("kw, filt", [({}, "bitshuffle"), ({"compression": "lzf"}, "lzf"),
                                      ({"compression": 0}, "gzip"), ({"compression": 9}, "gzip"),
                                      ({"tensor_compression": None}, None), ({"tensor_compression": "lzf"}, "lzf"),
                                      ({"compression": 4, "tensor_compression": 1}, "gzip"),
                                      ({"compression": "lzf", "tensor_compression": "bitshuffle"}, "bitshuffle")])
def test_compression_options_reach_the_files_datasets(tmp_path, kw, filt):
    d = tmp_path / "d"
    with DumpWriter(d, **kw) as w:
        w.write_step(0, {"name": ["x"]}, tensors={"t": np.ones(4, np.float32)})
    table = "gzip" if isinstance(kw.get("compression"), int) else kw.get("compression", "bitshuffle")
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        assert _codec(h["tensors/u4"]) == filt
        assert h["tensors/u1"].shuffle is False  # bytes have nothing to shuffle
        # HDF5's byte shuffle before lzf and gzip; bitshuffle transposes the bits itself
        assert all(h[f"tensors/u{w}"].shuffle is (filt in ("lzf", "gzip")) for w in (2, 4, 8))
        assert _codec(h["calls/name"]) == table
        assert h["calls/name"].shuffle is (table != "bitshuffle") and h["calls/name"].fletcher32
        if isinstance(kw.get("tensor_compression"), int):
            assert h["tensors/u4"].compression_opts == kw["tensor_compression"]
    loaded = read_hdf5(d)
    assert loaded.calls["name"].tolist() == ["x"]
    assert loaded.tensor_loader("t").tolist() == [1.0] * 4


def test_a_dump_needing_a_filter_this_python_lacks_is_refused_naming_what_to_install(tmp_path):
    """A bitshuffle dump read where hdf5plugin is not installed: the read that needs the filter says so,
    naming the file, the filter and what to install, instead of calling the chunk corrupt. Rows still in the
    (uncompressed) tail and tables in lzf read as they are."""
    import subprocess
    import sys

    whole = tmp_path / "whole"  # 5000 rows: a whole compressed chunk of every column
    with DumpWriter(whole) as w:
        w.write_step(0, {"name": [f"n{i}" for i in range(5000)]})
    tail = tmp_path / "tail"  # 3 rows, all in the uncompressed tail
    with DumpWriter(tail) as w:
        w.write_step(0, {"name": ["a", "b", "c"]})
    tensors = tmp_path / "tensors"  # the tables in lzf, the tensors in bitshuffle
    with DumpWriter(tensors, compression="lzf", tensor_compression="bitshuffle") as w:
        w.write_step(0, {"name": ["t"], "data_name": ["t"]}, tensors={"t": np.arange(70000, dtype=np.float32)})
    code = (
        "import sys; sys.modules['hdf5plugin'] = None\n"  # as if not installed: importing it raises ImportError
        "import msprobe_nb\n"
        "from msprobe_nb.store.errors import DumpFormatError\n"
        "from msprobe_nb.store.hdf5_reader import read_hdf5\n"
        "try:\n    read_hdf5(sys.argv[1])\n"
        "except DumpFormatError as e:\n    print('refused:', e)\n"
        "print(len(read_hdf5(sys.argv[2]).calls))\n"
        "parts = read_hdf5(sys.argv[3])\n"
        "print(len(parts.calls))\n"
        "try:\n    parts.tensor_loader('t')\n"
        "except DumpFormatError as e:\n    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}  # HDF5 then finds no plugin itself
    out = subprocess.run([sys.executable, "-c", code, str(whole), str(tail), str(tensors)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 4 and lines[1:3] == ["3", "1"], out.stdout
    for line, where in ((lines[0], "whole"), (lines[3], "tensors")):
        assert line.startswith("refused:") and where in line, line
        assert "'bitshuffle'" in line and "pip install hdf5plugin" in line and "corrupt" not in line, line


def test_only_the_bitshuffle_filter_is_loaded_and_the_package_import_is_the_fallback(tmp_path):
    """store/hdf5_filters.py: importing hdf5plugin loads all twelve of its filter libraries (about 6 MB of
    resident memory in every recording process); the kit registers bitshuffle alone, and imports the package
    only where that fails. Either way the dump reads back."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from msprobe_nb.store import hdf5_filters as F\n"
        "if sys.argv[2] == 'fallback':\n    F._register_bitshuffle = lambda: False\n"
        "import numpy as np\n"
        "from msprobe_nb.store.hdf5_writer import DumpWriter\n"
        "from msprobe_nb.store.hdf5_reader import read_hdf5\n"
        "with DumpWriter(sys.argv[1]) as w:\n    w.write_step(0, {'name': [f'n{i}' for i in range(5000)]})\n"
        "print(len(read_hdf5(sys.argv[1]).calls), 'hdf5plugin' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HDF5_PLUGIN_PATH"}
    for how, imported in (("alone", "False"), ("fallback", "True")):
        out = subprocess.run([sys.executable, "-c", code, str(tmp_path / how), how], capture_output=True, text=True,
                             env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["5000", imported], (how, out.stdout)


def test_bitshuffle_without_hdf5plugin_is_refused_before_a_file_is_made(tmp_path, monkeypatch):
    from msprobe_nb.store import hdf5_filters

    monkeypatch.setattr(hdf5_filters, "_loaded", False)  # as if the import had failed
    d = tmp_path / "d"
    with pytest.raises(ValueError, match=r"^compression 'bitshuffle' needs the hdf5plugin package.*'lzf' or a gzip"):
        DumpWriter(d)
    with pytest.raises(ValueError, match=r"^tensor_compression 'bitshuffle' needs the hdf5plugin package"):
        DumpWriter(d, compression="lzf", tensor_compression="bitshuffle")
    assert not (d / "rank0.h5").exists()
    with DumpWriter(d, compression="lzf") as w:  # the codecs h5py has itself still work
        w.write_step(0, {"name": ["x"]})
    assert read_hdf5(d).calls["name"].tolist() == ["x"]


@pytest.mark.parametrize("kw, what", [({"compression": 10}, "compression"), ({"compression": -1}, "compression"),
                                      ({"compression": True}, "compression"), ({"compression": "gzip"}, "compression"),
                                      ({"tensor_compression": 10}, "tensor_compression"),
                                      ({"tensor_compression": "zstd"}, "tensor_compression")])
def test_bad_compression_options_are_refused_and_leave_no_file(tmp_path, kw, what):
    d = tmp_path / "d"
    with pytest.raises(ValueError, match=what):
        DumpWriter(d, **kw)
    assert not (d / "rank0.h5").exists() and not (d / "rank0.h5.tmp").exists()
    with DumpWriter(d) as w:  # the rank is free again: the failed writer released its lock
        w.write_step(0, {"name": ["x"]})


def test_hundreds_of_steps_and_marks_keep_their_numbers_across_index_blocks(tmp_path):
    d = tmp_path / "d"
    dropped = set(range(3, 700, 7))
    with DumpWriter(d) as w:
        for s in range(700):
            if s in dropped:
                w.mark_dropped(s)
            else:
                w.write_step(s, {"name": [f"n{s}"]})
    parts = read_hdf5(d)
    assert parts.meta["dropped_steps"] == sorted(dropped)
    assert parts.calls["step"].tolist() == [s for s in range(700) if s not in dropped]
    assert parts.calls["name"].tolist() == [f"n{s}" for s in range(700) if s not in dropped]


def test_nullable_integer_columns_and_only_they_declare_their_na_value(tmp_path):
    # a reader of the file in another language learns the <NA> marker from the attribute (docs/hdf5_schema.md)
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["x"]})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        enc = {c: h[f"calls/{c}"].attrs["encoding"] for c in h["calls"]}
        na = {c: int(h[f"calls/{c}"].attrs["na_value"]) for c in h["calls"] if "na_value" in h[f"calls/{c}"].attrs}
    nullable = {c for c, e in enc.items() if e == "nullable_int64"}
    assert nullable >= {"numel", "nan_count", "tensor_id"}
    assert na == dict.fromkeys(nullable, INT_NA)


def test_stack_ids_at_the_ends_of_int32_and_handed_in_any_order(tmp_path):
    d = tmp_path / "d"
    lo, hi = -(2 ** 31), 2 ** 31 - 1
    with DumpWriter(d) as w:
        w.write_step(0, {"stack_id": [hi, lo, 5, 2]}, stacks={hi: ["hi.py:1"], lo: ["lo.py:1"], 5: ["five.py:5"],
                                                              2: ["two.py:2"], -70: ["neg.py:70"]})
        for bad in (2 ** 31, lo - 1):
            with pytest.raises(ValueError, match=f"stack id {bad} does not fit int32"):
                w.write_step(1, {}, stacks={bad: ["x"]})
    stacks = read_hdf5(d).stacks
    assert stacks == {hi: ["hi.py:1"], lo: ["lo.py:1"], 5: ["five.py:5"], 2: ["two.py:2"], -70: ["neg.py:70"]}


def test_the_commit_row_lands_in_a_chunk_that_exists_before_it_is_written(tmp_path, monkeypatch):
    # the crash-safety design (docs/hdf5_schema.md): writing the commit row changes no HDF5 metadata, so a kill
    # during it leaves the file as it was before or with the step committed; the index's chunks are allocated
    # before the flush that precedes it
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        real = w._append_index
        seen = []

        def append(row):
            before = w._index.id.get_num_chunks()
            real(row)
            seen.append((before, w._index.id.get_num_chunks()))
        monkeypatch.setattr(w, "_append_index", append)
        for s in range(600):  # three index blocks
            if s % 5 == 4:
                w.mark_dropped(s)
            else:
                w.write_step(s, {"name": ["x"]})
    assert len(seen) == 600 and all(b == a for b, a in seen)
    assert read_hdf5(d).meta["dropped_steps"] == list(range(4, 600, 5))


def test_string_options_and_values_built_at_run_time_are_taken_like_literals(tmp_path):
    d = tmp_path / "d"
    lzf = "".join(["l", "z", "f"])  # e.g. read from a config file: equal to "lzf", not the same object
    with DumpWriter(d, compression=lzf, tensor_compression="".join(["l", "z", "f"])) as w:
        w.write_step(0, {"arg": [0, 1.5, np.str_("x"), True], "name": ["a", "b", "c", "d"]},
                     tensors={"t": np.ones(3, np.float32)})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        assert h["tensors/u4"].compression == "lzf" and h["calls/name"].compression == "lzf"
    assert read_hdf5(d).calls["arg"].tolist() == ["0", "1.5", "x", "True"]


# ------------------------------------------------------------------ mutation survivors (numbering and commit)
def test_the_writer_makes_missing_folders_and_claims_its_rank_until_closed(tmp_path):
    from msprobe_nb.store.dump_dir import DumpInUseError, DumpLock

    d = tmp_path / "runs" / "a" / "b"  # a path the user named, not there yet
    w = DumpWriter(d)
    with pytest.raises(DumpInUseError, match="rank 0"):
        DumpLock.claim(d, 0)  # another writer of this rank (here: this process, another descriptor) waits
    w.write_step(0, _names(0))
    w.close()
    DumpLock.claim(d, 0).release()  # free again once closed
    assert _steps(d) == [0]


def test_a_writer_handed_its_ranks_lock_keeps_it_for_its_owner(tmp_path):
    from msprobe_nb.store.dump_dir import DumpLock

    d = tmp_path / "d"
    d.mkdir()
    lock = DumpLock.claim(d, 3)
    with DumpWriter(d, rank=3, lock=lock) as w:  # claiming it again would fail: the lock is held already
        w.write_step(0, _names(0))
    assert lock.path is not None and lock.path.exists()  # still the owner's: the writer does not release it
    lock.release()
    assert _steps(d) == [0]


def test_the_default_writer_lets_readers_in_while_it_writes(tmp_path):
    # docs/hdf5_schema.md: SWMR by default, so a notebook reads a dump that is still being written
    with DumpWriter(tmp_path / "d") as w:
        assert w._file is not None and w._file.swmr_mode
    with DumpWriter(tmp_path / "e", swmr=False) as w:
        assert w._file is not None and not w._file.swmr_mode


@pytest.mark.parametrize("level, ok", [(0, True), (9, True), (-1, False), (10, False), (True, False)])
def test_tensor_gzip_levels_are_zero_to_nine(tmp_path, level, ok):
    d = tmp_path / "d"
    if not ok:
        with pytest.raises(ValueError, match="tensor_compression must be"):
            DumpWriter(d, tensor_compression=level)
        return
    with DumpWriter(d, tensor_compression=level) as w:
        w.write_step(0, {"name": ["x"]}, tensors={"t": np.ones(4, np.float32)})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        assert h["tensors/u4"].compression == "gzip" and h["tensors/u4"].compression_opts == level


def test_same_built_at_run_time_takes_the_tables_compression(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d, compression=3, tensor_compression="".join(["s", "a", "m", "e"])) as w:  # from a config
        w.write_step(0, {"name": ["x"]}, tensors={"t": np.ones(4, np.float32)})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        assert h["tensors/u4"].compression == "gzip" and h["tensors/u4"].compression_opts == 3


def test_steps_far_beyond_int32_are_refused_too(tmp_path):
    with DumpWriter(tmp_path / "d") as w:
        for bad in (2 ** 40, -(2 ** 40)):
            with pytest.raises(ValueError, match="does not fit int32"):
                w.write_step(bad, _names(0))
            with pytest.raises(ValueError, match="does not fit int32"):
                w.mark_dropped(bad)
        w.write_step(1, _names(1))
    assert _steps(tmp_path / "d") == [1] and read_hdf5(tmp_path / "d").meta["dropped_steps"] == []


def test_every_new_shape_of_a_failed_step_is_forgotten(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"name": ["a"], "shape": [(1,)]})
        with pytest.raises(ValueError, match="counter"):
            w.write_step(1, {"name": ["b", "c", "e"], "shape": [(5, 5), (6, 6), (7, 7)], "counter": [1, 2, 2 ** 40]})
        w.write_step(2, {"name": ["c"], "shape": [(6, 6)]})
        w.write_step(3, {"name": ["e", "b"], "shape": [(7, 7), (5, 5)]})
        # the tensors' shapes are interned last: a bad third tensor fails the step after two new shapes
        with pytest.raises(TypeError, match="'bad'"):
            w.write_step(4, {"data_name": ["t1", "t2"]}, tensors={"t1": np.zeros((2, 3), np.float32),
                                                                  "t2": np.zeros((4, 5), np.float32), "bad": [1]})
        w.write_step(5, {"data_name": ["t2"]}, tensors={"t2": np.ones((4, 5), np.float32)})
    parts = read_hdf5(d)
    assert parts.calls["shape"].tolist() == [(1,), (6, 6), (7, 7), (5, 5), None]
    assert tuple(parts.tensor_loader("t2").shape) == (4, 5)


def test_new_stacks_of_a_later_step_read_back_their_own_frames(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:
        w.write_step(0, {"stack_id": [0]}, stacks={0: ["a.py:1", "b.py:2"]})
        w.write_step(1, {"stack_id": [1]}, stacks={1: ["c.py:3"], 2: ["d.py:4", "e.py:5", "f.py:6"]})
        w.write_step(2, {"stack_id": [3]}, stacks={3: ["g.py:7"]})
    assert read_hdf5(d).stacks == {0: ["a.py:1", "b.py:2"], 1: ["c.py:3"], 2: ["d.py:4", "e.py:5", "f.py:6"],
                                   3: ["g.py:7"]}


def test_one_stack_id_handed_twice_in_a_step_is_written_once(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d) as w:  # "1000" and 1000 name the same id (int() of each); the first one is kept
        w.write_step(0, {"stack_id": [1000]}, stacks={1000: ["first.py:1"], "1000": ["second.py:2"]})
    assert read_hdf5(d).stacks == {1000: ["first.py:1"]}


def test_a_step_filling_whole_chunks_takes_no_extra_chunk(tmp_path):
    d = tmp_path / "d"
    chunk4 = TENSOR_CHUNK_BYTES // 4
    with DumpWriter(d, tensor_compression=None) as w:
        w.write_step(0, {"data_name": ["a"]}, tensors={"a": np.ones(chunk4, np.float32)})  # exactly one chunk
        w.write_step(1, {"data_name": ["b"]}, tensors={"b": np.full(3, 2, np.float32)})
    with h5py.File(d / "rank0.h5", "r", swmr=True) as h:
        rows = h["index/steps"][()]
        assert h["tensors/u4"].shape == (2 * chunk4,)
    rows = rows[rows[:, INDEX_POS["commit"]] == COMMIT_MAGIC]
    assert rows[:, INDEX_POS["u4"]].tolist() == [chunk4, 2 * chunk4]
    assert read_hdf5(d).tensor_loader("b").tolist() == [2.0, 2.0, 2.0]


def test_the_index_grows_a_whole_block_at_a_time_and_no_more(tmp_path):
    from msprobe_nb.store.hdf5_layout import INDEX_BLOCK

    d = tmp_path / "d"
    extents = {}
    with DumpWriter(d) as w:
        for s in range(INDEX_BLOCK + 1):
            w.write_step(s, {})
            extents[s + 1] = w._index.shape[0]
    assert extents[1] == extents[INDEX_BLOCK] == INDEX_BLOCK and extents[INDEX_BLOCK + 1] == 2 * INDEX_BLOCK
    assert len(read_hdf5(d).meta.get("dropped_steps", [])) == 0


def test_a_waiting_mark_and_the_next_commit_across_an_index_block(tmp_path, monkeypatch):
    # the mark the disk refused and the commit that follows it need two reserved rows: the last of a block
    # and the first of the next
    from msprobe_nb.store.hdf5_layout import INDEX_BLOCK

    d = tmp_path / "d"
    with DumpWriter(d) as w:
        for s in range(INDEX_BLOCK - 1):
            w.write_step(s, {"name": [f"n{s}"]})
        _refuse_index(monkeypatch, w)
        w.mark_dropped(INDEX_BLOCK - 1, errno.ENOSPC)
        monkeypatch.undo()
        w.write_step(INDEX_BLOCK, {"name": ["last"]})
    parts = read_hdf5(d)
    assert parts.meta["dropped_steps"] == [INDEX_BLOCK - 1]
    assert parts.calls["step"].tolist()[-2:] == [INDEX_BLOCK - 2, INDEX_BLOCK]
    assert parts.calls["name"].tolist()[-1] == "last"

