"""Collectives recorded on 2 and 4 gloo ranks, DDP untouched, the overflow_check task, reusable dumps.

Each world size starts its processes once (``distributed_runs.run_ranks``) and runs every scenario in
that one process group; the tests read what the ranks wrote.
"""
from __future__ import annotations

import json
import zlib

import distributed_runs as runs
import numpy as np
import pytest
import torch
import torch.distributed as dist

from msprobe_nb.capture.collectives import group_record, layout
from msprobe_nb.capture.overflow_watch import CALLS_BEFORE, first_overflow
from msprobe_nb.config import load_config
from msprobe_nb.store.dump import load
from msprobe_nb.store.schema import Coded

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this build")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return runs.run_ranks(2, ["collectives", "ddp", "monitor_ddp", "overflow_check", "planted_change",
                              "planted_overflow"],
                          tmp_path_factory.mktemp("two_ranks"))


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    return runs.run_ranks(4, ["collectives", "ddp"], tmp_path_factory.mktemp("four_ranks"))


@pytest.fixture(params=["two", "four"])
def world_run(request):
    root = request.getfixturevalue(request.param)
    return {"two": 2, "four": 4}[request.param], root


def _rows(calls, rank: int, call: str):
    rows = calls[(calls["rank"] == rank) & (calls["call"] == call)]
    return {r.name[len(call) + 1:]: r for r in rows.itertuples(index=False)}


def _group(row) -> list[int]:
    assert row.value_type == "torch.ProcessGroup"
    return json.loads(row.value)["group_ranks"]


# ----------------------------------------------------------------------------- recorded on the ranks

@needs_gloo
def test_collectives_are_named_grouped_and_valued(world_run):
    world, root = world_run
    dump = load(root / "collectives" / "dump")
    calls = dump.calls
    total = world * (world + 1) / 2
    for call in ("Distributed.all_reduce.0.forward", "Distributed.irecv.0.forward"):  # batch_isend_irecv's
        assert "distributed_runs.py" in dump.stack(call)[0]  # the stack starts where the user called it
    for rank in range(world):
        facts = json.loads((root / "collectives" / f"facts{rank}.json").read_text())
        assert facts["errors"] == []
        r = _rows(calls, rank, "Distributed.all_reduce.0.forward")
        assert r["input.0"].max == rank + 1 and r["output.0"].max == r["output.0"].min == total  # sum over ranks
        assert _group(r["input.group"]) == list(range(world)) and r["input.group"].is_kwarg
        assert json.loads(r["input.group"].value)["group_id"] == f"{zlib.crc32(str(list(range(world))).encode()):08x}"
        b = _rows(calls, rank, "Distributed.broadcast.0.forward")
        assert b["input.0"].max == rank * 10 and b["output.0"].max == 0.0  # rank 0's values everywhere
        assert (b["input.1"].value_type, b["input.1"].value, b["output.1"].value) == ("int", "0", "0")  # src
        g = _rows(calls, rank, "Distributed.all_gather.0.forward")
        assert g["input.0"].kind == "none" and g["input.1"].max == rank  # the output list holds no input
        assert [g[f"output.0.{i}"].max for i in range(world)] == list(range(world))
        f = _rows(calls, rank, "Distributed._c10d_functional.all_reduce.0.forward")
        assert f["input.0"].max == rank + 1 and f["output.0"].max == total
        assert _group(f["input.group"]) == list(range(world))
        sub = _rows(calls, rank, "Distributed.all_reduce.2.forward")
        if rank < 2:
            assert _group(sub["input.group"]) == [0, 1] and sub["input.op"].value == '"RedOpType.MAX"'
            assert sub["output.0"].max == 2.0
        else:
            assert sub == {}


@needs_gloo
def test_async_ops_are_recorded_with_their_completed_values(world_run):
    world, root = world_run
    calls = load(root / "collectives" / "dump").calls
    for rank in range(world):
        facts = json.loads((root / "collectives" / f"facts{rank}.json").read_text())
        a = _rows(calls, rank, "Distributed.all_reduce.1.forward")
        assert a["input.async_op"].value == "true"
        assert a["input.0"].max == rank + 1
        assert a["output.0"].max == world * (world + 1) / 2  # after the work, before the user's mul_(100)
        assert facts["async_after"][0] == 100 * world * (world + 1) / 2
        prev = (rank - 1) % world
        i = _rows(calls, rank, "Distributed.irecv.0.forward")  # issued by batch_isend_irecv
        assert i["input.peer"].value == str(prev) and i["output.0"].max == prev  # what arrived, not +1000
        assert facts["recv_after"][0] == prev + 1000


@needs_gloo
def test_send_and_recv_record_their_peer(world_run):
    world, root = world_run
    calls = load(root / "collectives" / "dump").calls
    for rank in range(world):
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        s = _rows(calls, rank, "Distributed.send.0.forward")
        r = _rows(calls, rank, "Distributed.recv.0.forward")
        assert s["input.peer"].value == str(nxt) and s["input.1"].value == str(nxt)
        assert r["input.peer"].value == str(prev) and r["output.0"].max == prev
        i = _rows(calls, rank, "Distributed.isend.0.forward")
        assert i["input.peer"].value == str(nxt) and i["input.0"].max == rank


@needs_gloo
def test_ddp_training_is_bitwise_identical_with_recording(world_run):
    world, root = world_run
    folder = root / "ddp"
    for rank in range(world):
        got = torch.load(folder / f"ddp{rank}.pt")
        off_losses, off_params = got.pop("off")
        assert set(got) == {"L1", "mix"}
        for level, (losses, params) in got.items():
            assert all(torch.equal(a, b) for a, b in zip(off_losses, losses)), (rank, level)
            assert all(torch.equal(a, b) for a, b in zip(off_params, params)), (rank, level)


@needs_gloo
def test_ddp_bucket_all_reduce_is_not_seen_at_l1_or_mix(two):
    """What docs/distributed.md says: DDP's reducer all-reduces in C++, out of the function mode's sight,
    so a DDP dump holds no Distributed call and its parameter gradients are each rank's local ones."""
    calls = load(two / "ddp" / "ddp_mix").calls
    assert not (calls["family"] == "Distributed").any()
    grads = calls[calls["name"] == "Module.module.0.Linear.parameters_grad.0.weight"].set_index(["step", "rank"])
    assert grads.loc[(0, 0), "norm"] != grads.loc[(0, 1), "norm"]


@needs_gloo
def test_the_monitor_on_ddp_ranks_is_bitwise_neutral_and_reads_the_all_reduced_gradients(two):
    """Two ranks, gradient accumulation with ``no_sync``: each rank's file holds the gradients the optimizer
    got (after DDP's all-reduce: alike on both ranks, though each rank had its own data), two micro-batches a
    step, and the losses, gradients and parameters are bitwise those of the run without the monitor."""
    import msprobe_nb as mp

    folder = two / "monitor_ddp"
    got = [torch.load(folder / f"monitor{rank}.pt") for rank in range(2)]
    for rank, r in enumerate(got):
        for key in ("losses", "grads", "params"):
            assert all(torch.equal(a, b) for a, b in zip(r["off"][key], r["on"][key], strict=True)), (rank, key)
    m = mp.load_monitor(folder / "mon")
    assert sorted(m.meta) == [0, 1]
    grads = m.stats[m.stats["kind"] == "grad"].set_index(["rank", "step", "name"])["norm"]
    for rank, r in enumerate(got):
        for step, norms in enumerate(r["on"]["norms"]):
            for name, norm in norms.items():
                assert grads[(rank, step, name)] == pytest.approx(norm, rel=1e-6), (rank, step, name)
    assert grads.xs(0, level="rank").equals(grads.xs(1, level="rank"))  # all-reduced: the same on both ranks
    assert got[0]["on"]["losses"][0] != got[1]["on"]["losses"][0]  # while each rank's data differed
    micro = m.scalars["micro_batches"]
    assert len(micro) == 4 and (micro == 2).all()


@needs_gloo
def test_overflow_check_writes_only_the_calls_around_each_ranks_first_overflow(two):
    dump = load(two / "overflow_check" / "dump")
    calls = dump.calls
    assert sorted(calls["step"].unique()) == [1]  # step 0 had none; nothing recorded after it
    assert set(calls["stack_id"]) <= set(dump.stacks["stack_id"])  # stacks first met at step 0 are kept
    last = {}
    for rank in (0, 1):
        mine = calls[calls["rank"] == rank].sort_values("call_index")
        order = mine.drop_duplicates("call")["call"].tolist()
        assert len(order) == CALLS_BEFORE + 1
        last[rank] = order[-1]
        out = mine[(mine["call"] == order[-1]) & (mine["io"] == "output")]
        assert (out["posinf_count"] > 0).all()
    assert last == {0: "Distributed.all_reduce.0.forward", 1: "Torch.mul.1.forward"}


@needs_gloo
def test_planted_change_dumps_part_first_on_the_planted_rank_step_and_call(two):
    keys = ["rank", "step", "name"]
    bench = load(two / "planted_change" / "bench").calls.set_index(keys)
    npu = load(two / "planted_change" / "npu").calls.set_index(keys)
    assert bench.index.equals(npu.index)
    differs = npu[~np.isclose(npu["norm"], bench["norm"], rtol=0, atol=0, equal_nan=True)].reset_index()
    first = differs.sort_values(["step", "call_index"]).iloc[0]
    assert (first["rank"], first["step"], first["call"]) == tuple(runs.CHANGE[k] for k in ("rank", "step", "call"))
    on0 = differs[differs["rank"] == 0].sort_values(["step", "call_index"]).iloc[0]
    assert on0["step"] == runs.CHANGE["step"] and on0["call"].startswith("Distributed.all_reduce.")
    assert on0["name"].endswith(".output.0")  # rank 0's inputs agree: the change came through the collective


@needs_gloo
def test_planted_overflow_dump_starts_on_rank_1_after_rank_0_sees_inf(two):
    calls = load(two / "planted_overflow" / "dump").calls
    cols = ("call_index", "io", "nan_count", "posinf_count", "neginf_count")
    firsts = {}
    for rank in (0, 1):
        mine = calls[calls["rank"] == rank]
        i = first_overflow({c: mine[c].to_numpy() for c in cols})
        firsts[rank] = (i, mine[mine["call_index"] == i]["call"].iloc[0])
    assert firsts[1][1] == runs.OVERFLOW["call"] and firsts[0][1] == runs.OVERFLOW["spread_by"]
    assert firsts[0][0] < firsts[1][0]  # by call index, rank 0's non-finite output comes first


# ----------------------------------------------------------------------------- in process

def test_arguments_are_laid_out_as_callers_write_them():
    pos, kw = layout(dist.broadcast, (torch.ones(2),), {"src": 0, "group": None, "async_op": False,
                                                         "group_src": None})
    assert len(pos) == 2 and pos[1] == 0 and kw == {}
    pos, kw = layout(dist.all_reduce, (torch.ones(2),), {"op": dist.ReduceOp.MAX, "group": "g",
                                                          "async_op": True})
    assert len(pos) == 1 and kw == {"op": dist.ReduceOp.MAX, "group": "g", "async_op": True}
    pos, kw = layout(dist.isend, (torch.ones(2),), {"dst": None, "group": None, "tag": 0, "group_dst": 1})
    assert len(pos) == 1 and kw == {"group_dst": 1}


def test_group_record_is_none_without_a_process_group():
    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    assert group_record(None) is None


def test_first_overflow_needs_finite_inputs_and_a_non_finite_output():
    index = Coded(np.array([0, 0, 1, 1, 2, 2]), [0, 1, 2])
    io = Coded(np.array([0, 1, 0, 1, 0, 1]), ["input", "output"])
    inf = np.array([0, 0, 1, 1, 0, 1], dtype=float)  # call 1: inf in and out; call 2: finite in, inf out
    zero = np.zeros(6)
    assert first_overflow({"call_index": index, "io": io, "nan_count": zero, "posinf_count": inf,
                           "neginf_count": zero}) == 2
    assert first_overflow({"call_index": index, "io": io, "nan_count": zero, "posinf_count": zero,
                           "neginf_count": zero}) is None


def test_overflow_check_names_the_innermost_call_not_the_module_around_it(tmp_path):
    """At mix a module call starts before the calls inside it: when its output overflows because an API
    inside it did, the window ends at that API (the module's entry would leave only the module)."""
    import msprobe_nb as mp

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4)

        def forward(self, x):
            return self.norm(self.lin(x) * 1e38)  # finite after the mul, inf inside layer_norm's variance

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Block())
    with mp.record(dump_path=str(tmp_path / "d"), level="mix", task="overflow_check", model=model):
        model(torch.randn(2, 4))
    calls = list(dict.fromkeys(load(tmp_path / "d").calls.sort_values("call_index")["call"]))
    assert calls[-1] == "Functional.layer_norm.0.forward", calls
    assert "Tensor.__mul__.0.forward" in calls and len(calls) == CALLS_BEFORE + 1


def test_overflow_check_is_a_kit_task():
    assert load_config(task="overflow_check").task == "overflow_check"
    assert load_config({"task": "overflow_check", "overflow_check": {"overflow_nums": 1}}).task == "overflow_check"


class _Done:
    """Stands for a Work without a future, or an AsyncCollectiveTensor: complete once told so."""

    def __init__(self):
        self.completed = False

    def is_completed(self) -> bool:
        return self.completed


@pytest.mark.parametrize("via", ["work", "act"])
def test_pending_outputs_are_read_once_complete_and_dropped_after_the_step(via):
    import sys
    import weakref

    from msprobe_nb.capture.collectives import _Pending
    from msprobe_nb.capture.recorder import Recorder
    from msprobe_nb.config import DumpConfig

    rec = Recorder(DumpConfig(stack=False))
    coll = rec.collectives
    names = []
    for _ in range(2):
        c = rec.open_api("Distributed", "irecv", sys._getframe())
        t = torch.full((3,), 2.0)
        rec.add_rows(c, "forward", "input", (t,))
        done = _Done()
        p = _Pending(c, [t], {}, coll.epoch, work=done if via == "work" else None, tensor=t)
        if via == "act":
            p.act = weakref.ref(done)
        coll.pending.append(p)
        coll.poll()
        assert coll.pending == [p]  # not complete: nothing read yet
        t.fill_(5.0)  # what the collective wrote in place
        done.completed = True
        names.append(c.call)
        if len(names) == 1:
            coll.poll()
            assert coll.pending == []
        else:
            coll.step_ends()  # seen complete only at the step's end
    cols = rec.materialize()["columns"]
    out = [(n, mx) for n, mx in zip(cols["name"], cols["max"]) if n.endswith(".output.0")]
    assert out == [(f"{names[0]}.output.0", 5.0), (f"{names[1]}.output.0", 5.0)]
    c = rec.open_api("Distributed", "irecv", sys._getframe())
    late = _Done()
    coll.pending.append(_Pending(c, [torch.ones(1)], {}, coll.epoch - 1, work=late))
    late.completed = True
    coll.poll()  # completed after its step was written: dropped, not added to this step
    assert coll.pending == [] and all(r[1] != f"{c.call}.output.0" for r in rec.rows)


def _shape(node):
    """A record's layout: lists and their lengths, leaves by type; statistics left out."""
    if isinstance(node, list):
        return [_shape(x) for x in node]
    if isinstance(node, dict) and "type" not in node:
        return {k: _shape(v) for k, v in node.items()}
    return None if node is None else node["type"]


@needs_gloo
def test_collectives_export_in_msprobes_layout_and_read_back(two, shared_dir, tmp_path):
    dump = load(two / "collectives" / "dump")
    out = dump.export_msprobe(tmp_path / "msprobe")
    back = load(out).calls.set_index(["rank", "step", "name"])
    mine = dump.calls.set_index(["rank", "step", "name"])
    assert mine.index.sort_values().equals(back.index.sort_values())  # every row survives the round trip
    assert (mine["value"] == back.loc[mine.index, "value"]).all()
    ours = json.loads((out / "step0" / "rank1" / "dump.json").read_text())["data"]
    real = json.loads((shared_dir / "interop" / "msprobe-2rank-collectives" / "bench" / "step0" / "rank1"
                       / "dump.json").read_text())["data"]  # msprobe 26.2.0 on gloo, default group
    for call in ("Distributed.broadcast.0.forward", "Distributed.all_gather.0.forward",
                 "Distributed.all_reduce.0.forward"):
        for key in ("input_args", "output"):
            assert _shape(ours[call][key]) == _shape(real[call][key]), (call, key)
        assert _shape(ours[call]["input_kwargs"]) == {"group": "torch.ProcessGroup"}  # msprobe: {} here
