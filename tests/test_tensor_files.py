"""Tensor mode checks that each tensor file is the tensor its dump describes before comparing it."""
from __future__ import annotations

import pandas as pd
import torch

from msprobe_nb.analysis.compare import compare
from msprobe_nb.store.schema import coerce_calls


class _Dump:
    task = "tensor"

    def __init__(self, rows, tensors):
        self.calls, self._tensors = coerce_calls(pd.DataFrame(rows)), tensors

    def tensor(self, key, step=None, rank=None):
        return self._tensors[key]


def _rows(shape, vmax, vmin):
    return [dict(step=0, rank=0, call_index=0, call="Torch.f.0.forward", name=f"Torch.f.0.forward.{io}.0", io=io,
                 arg="0", kind="tensor", dtype="torch.float32", shape=shape, max=vmax, min=vmin, mean=0.0, norm=1.0,
                 data_name=f"{io}.pt") for io in ("input", "output")]


def test_a_file_of_another_shape_or_content_is_an_error_not_a_pass():
    x = torch.linspace(-1, 1, 128 * 64).reshape(128, 64)
    bench = _Dump(_rows((128, 64), 1.0, -1.0), {"input.pt": x, "output.pt": x})
    # the NPU dump says (128, 64) in [-1, 1]; its input file holds a (3, 3) tensor, its output file all 7.0
    npu = _Dump(_rows((128, 64), 1.0, -1.0), {"input.pt": torch.zeros(3, 3), "output.pt": torch.full((128, 64), 7.0)})
    r = compare(npu, bench, mode="tensor").set_index("name")
    for io, why in (("input", "shape [3, 3]"), ("output", "max is 7")):
        row = r.loc[f"Torch.f.0.forward.{io}.0"]
        assert row["result"] == "error" and row["tensor_status"] == "file"
        assert any(why in s and "contradicts the dump" in s for s in row["reasons"]), row["reasons"]
        assert bool(row["diverges"])
    # the same files, described truthfully, compare as usual
    ok = _Dump(_rows((128, 64), 1.0, -1.0), {"input.pt": x, "output.pt": x})
    assert set(compare(ok, bench, mode="tensor")["result"]) == {"pass"}


def test_compare_leaves_the_dumps_it_is_given_unchanged():
    rows = _rows((4,), 1.0, -1.0)
    for r in rows:
        r["op"] = ""  # msprobe dumps carry no op: compare derives it from the name
    a, b = _Dump(rows, {}), _Dump(rows, {})
    before = a.calls.copy()
    compare(a, b, mode="statistics")
    pd.testing.assert_frame_equal(a.calls, before)
