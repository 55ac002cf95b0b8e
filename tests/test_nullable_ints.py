"""The writer's nullable integer columns handed over as floats (NaN: no value): the C pass of
``store/_nullable_ints.c`` gives the ints, the missing marks and the errors that numpy's own way gives."""
from __future__ import annotations

import numpy as np
import pytest

from msprobe_nb.store import column_values
from msprobe_nb.store.hdf5_layout import INT_NA

needs_c = pytest.mark.skipif(column_values._from_floats is None, reason="store._nullable_ints is not built")

EDGES = [0.0, -0.0, 1.0, -1.0, np.nan, 2.0 ** 53, 2.0 ** 53 + 2, -(2.0 ** 63), 2.0 ** 62, 4096.0]
BAD = [0.5, -1.5, np.inf, -np.inf, 2.0 ** 63, -(2.0 ** 64), 1e300]


def _both(values, na, dtype, monkeypatch):
    """nullable() with the C pass, then without it (numpy's passes): each result, or each error's text."""
    got = []
    for c in (column_values._from_floats, None):
        monkeypatch.setattr(column_values, "_from_floats", c)
        try:
            got.append(column_values.nullable(values, len(values), na, dtype, int))
        except ValueError as e:
            got.append(str(e))
    return got


@needs_c
@pytest.mark.parametrize("seed", range(5))
def test_random_columns_give_the_same_ints_either_way(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    values = np.floor(rng.normal(0, 1e6, 1000))
    values[rng.random(1000) < 0.3] = np.nan
    values[:len(EDGES)] = EDGES
    for na, dtype in ((INT_NA, np.int64), (-1, np.int8)):  # Int64 and boolean columns
        c, py = _both(values, na, dtype, monkeypatch)
        assert c.dtype == py.dtype == dtype
        np.testing.assert_array_equal(c, py)
    c, py = _both(values[::3].astype(np.float32), INT_NA, np.int64, monkeypatch)  # float32, not contiguous
    np.testing.assert_array_equal(c, py)


@needs_c
@pytest.mark.parametrize("bad", BAD)
def test_a_value_that_is_no_int64_is_named_either_way(bad, monkeypatch):
    values = np.array([1.0, np.nan, 2.0, bad, 3.5])  # the first bad value is the one named
    c, py = _both(values, INT_NA, np.int64, monkeypatch)
    assert c == py == f"{float(bad)!r} is not an integer"


@needs_c
def test_the_c_pass_checks_its_buffers():
    with pytest.raises(ValueError, match="as many"):
        column_values._from_floats(np.zeros(3), 0, np.empty(2, np.int64))
    assert column_values._from_floats(np.zeros(0), 0, np.empty(0, np.int64)) == -1


@needs_c
def test_a_store_extension_of_another_layout_or_none_at_all_gives_no_function():
    from msprobe_nb.store.c_functions import optional_function
    assert optional_function("_nullable_ints", column_values.NULLABLE_INTS_ABI, "from_floats") is not None
    assert optional_function("_nullable_ints", column_values.NULLABLE_INTS_ABI + 1, "from_floats") is None
    assert optional_function("_no_such_extension", 1, "from_floats") is None
