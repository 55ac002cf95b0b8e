"""L2 (aten dispatch mode): in-place and out= outputs are summarised after the op, and self-compares of
identical runs stay clean (no record-function handles, no ScriptObject addresses among the values)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import msprobe_nb as mp
from msprobe_nb.store.hdf5_reader import read_hdf5


def test_outputs_of_inplace_and_out_aten_ops_carry_the_statistics_after_the_op(tmp_path):
    """At the Python dispatch key the version counter of a written tensor is not bumped yet: its output
    row must not reuse the summary taken for its input row, and the input row must keep the old values."""
    x = torch.zeros(4)
    y, z = torch.ones(4), torch.zeros(4)
    with mp.record(dump_path=tmp_path / "d", level="L2"):
        x.add_(1.0)
        x.mul_(3.0)
        torch.add(y, y, out=z)
        torch.neg(x)
    calls = read_hdf5(tmp_path / "d").calls.set_index("name")
    mx = calls["max"]
    assert mx["Aten.add_.0.forward.input.0"] == 0.0
    assert mx["Aten.add_.0.forward.output.0"] == 1.0
    assert mx["Aten.mul_.0.forward.input.0"] == 1.0
    assert mx["Aten.mul_.0.forward.output.0"] == 3.0
    assert mx["Aten.add.0.forward.input.out"] == 0.0
    assert mx["Aten.add.0.forward.output.0"] == 2.0
    assert mx["Aten.neg.0.forward.input.0"] == 3.0
    assert calls.loc["Aten.neg.0.forward.input.0", "producer"] == "Aten.mul_.0.forward"


def _adam_run(path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    x = torch.randn(3, 6)
    dbg = mp.Debugger(dump_path=path, level="L2", task="statistics")
    dbg.start()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
    dbg.stop()
    dbg.close()
    assert dbg.errors == []


def test_two_identical_runs_with_an_adam_step_agree_at_l2(tmp_path):
    """The optimizer step opens a record-function, whose handle (a ScriptObject) is a new object each run."""
    _adam_run(tmp_path / "a")
    _adam_run(tmp_path / "b")
    a, b = mp.load(tmp_path / "a"), mp.load(tmp_path / "b")
    result = mp.compare(a, b)
    assert result.first_divergence() is None
    assert result.counts()["error"] == 0
    calls = read_hdf5(tmp_path / "a").calls
    assert not calls.op.str.startswith("_record_function").any()
    assert not calls.value.str.contains("0x", na=False).any()
    assert "Aten.addcdiv_.0.forward" in set(calls.call)  # the step itself is recorded


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo in this build")
def test_opaque_arguments_are_recorded_by_their_class_not_their_address(tmp_path):
    """c10d ops take and return ScriptObjects (ProcessGroup, ReduceOp, Work): stable class names."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        x = torch.ones(4)
        with mp.record(dump_path=tmp_path / "d", level="L2"):
            dist.all_reduce(x)
    finally:
        dist.destroy_process_group()
    rows = mp.load(tmp_path / "d").calls
    rows = rows[rows.call == "Aten.allreduce_.0.forward"].set_index("name")
    assert rows.loc["Aten.allreduce_.0.forward.input.1", "value"] == '"__torch__.torch.classes.c10d.ProcessGroup"'
    assert rows.loc["Aten.allreduce_.0.forward.output.1", "value"] == '"__torch__.torch.classes.c10d.Work"'
    assert not rows.value.str.contains("0x", na=False).any()
