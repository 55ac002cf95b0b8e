"""A string or shape column that differs from the last step's in some rows (store/column_ids.py): the rows equal
to the last step's keep its ids, the others are looked up or interned, and the dump reads back the same with
the C pass (``store/_column_ids.c``) as without it."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from msprobe_nb.store import column_ids
from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter

needs_c = pytest.mark.skipif(column_ids._ids is None, reason="store._column_ids is not built")


@needs_c
def test_a_row_equal_to_the_last_steps_keeps_its_id_and_the_rest_are_looked_up():
    ids = column_ids._ids
    last = ["alpha", "b", (1, 2), None, "x"]
    last_ids = np.array([10, 11, 12, -1, 14], np.int32)
    table = {"alpha": 1, "b": 2, (1, 2): 3, "c": 4, None: -1}
    out = np.empty(6, np.int32)
    # equal text in a new object and an equal tuple keep the last step's ids (10, 12: not the table's 1, 3);
    # "c" differs from "x" and is the table's; "n" and 7 are lacking; the sixth row has no last row
    fresh = "".join(["al", "pha"])
    assert fresh is not last[0]
    lacking = ids([fresh, "n", (1, 2), None, "c", 7], table, last, last_ids, out)
    assert lacking == [1, 5] and out.tolist() == [10, -1, 12, -1, 4, -1]
    lacking = ids(["alpha", "zz"], table, None, None, out[:2])  # no last step: the table alone
    assert lacking == [1] and out[:2].tolist() == [1, -1]


@needs_c
def test_the_c_pass_refuses_what_it_cannot_read():
    ids, out = column_ids._ids, np.empty(2, np.int32)
    with pytest.raises(TypeError):  # unhashable, as a lookup would say
        ids(["a", ["b"]], {}, None, None, out)
    with pytest.raises(ValueError, match="one id per value"):
        ids(["a"], {}, None, None, out)
    with pytest.raises(ValueError, match="one int32 id per last value"):
        ids(["a", "b"], {}, ["a"], np.zeros(2, np.int32), out)
    with pytest.raises(ValueError, match="one int32 id per last value"):
        ids(["a", "b"], {}, ["a", "b"], np.zeros(2, np.int64), out)
    with pytest.raises(OverflowError):
        ids(["a", "b"], {"a": 2 ** 40}, None, None, out)


def _steps(seed: int, n_steps: int = 8, n: int = 40) -> list[dict[str, list]]:
    """Columns that change in a few rows from step to step, as a training loop's do: new texts (a step size),
    values back to older ones, None, NaN, a non-str value, shapes with None and a changed dimension."""
    rng = random.Random(seed)
    value = [rng.choice(["", "0.1", "True", None]) for _ in range(n)]
    name = [f"Functional.op.{i}.forward.input.0" for i in range(n)]
    shape = [rng.choice([(2, 3), (4,), None, ()]) for _ in range(n)]
    out = []
    for s in range(n_steps):
        for i in rng.sample(range(n), 5):
            value[i] = rng.choice([f"{0.001 * (s + 1):.6g}", None, math.nan, 3, "0.1", ""])
            shape[i] = rng.choice([(s, 2), None, (1, 2, 3)])
        name = [x if rng.random() < 0.9 else x.replace("op", f"op{s}") for x in name]
        out.append({"value": list(value), "name": [str(x) for x in name], "shape": list(shape)})
    return out


@pytest.mark.parametrize("seed", range(4))
def test_partly_changed_columns_read_back_the_same_either_way(seed, tmp_path, monkeypatch):
    steps = _steps(seed)
    frames = []
    for c in (column_ids._ids, None):
        monkeypatch.setattr(column_ids, "_ids", c)
        d = tmp_path / f"d{c is None}"
        with DumpWriter(d) as w:
            for s, cols in enumerate(steps):
                if s == 3:  # a step that fails after its columns were converted leaves no ids behind
                    with pytest.raises(ValueError, match="int32"):
                        w.write_step(s, {k: v[::-1] for k, v in cols.items()}, {2 ** 40: ["f.py:1"]})
                w.write_step(s, cols)
        frames.append(read_hdf5(d).calls)
    a, b = frames
    for col in ("value", "name", "shape"):
        assert a[col].tolist() == b[col].tolist()
    want = [v if isinstance(v, str) else "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
            for cols in steps for v in cols["value"]]
    assert a["value"].tolist() == want
    assert a["name"].tolist() == [v for cols in steps for v in cols["name"]]
    shapes = [None if s is None else tuple(s) for s in a["shape"].tolist()]
    assert shapes == [s for cols in steps for s in cols["shape"]]


@needs_c
def test_a_column_that_differs_in_some_rows_goes_by_row(tmp_path, monkeypatch):
    """The second step's value column differs from the first's in one row: it is converted by row, from the
    first step's ids, and the step's ids are remembered for the next."""
    calls = []
    real = column_ids._ids

    def spy(values, table, last, last_ids, out):
        if len(values) == 3:  # the value column (construct's columns are empty)
            calls.append(last is not None)
        return real(values, table, last, last_ids, out)
    monkeypatch.setattr(column_ids, "_ids", spy)
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(0, {"value": ["a", "b", "c"]})
        w.write_step(1, {"value": ["a", "z", "c"]})
        w.write_step(2, {"value": ["a", "z", "c"]})  # equal to the last step's: recalled whole
    assert calls == [False, True]
    assert read_hdf5(tmp_path / "d").calls["value"].tolist() == ["a", "b", "c", "a", "z", "c", "a", "z", "c"]
