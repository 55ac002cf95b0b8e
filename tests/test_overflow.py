"""find_overflow: the first call, over all ranks in collective order, whose inputs are finite and outputs not."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from msprobe_nb import find_overflow, load
from msprobe_nb.analysis.overflow import nonfinite
from msprobe_nb.store.schema import coerce_calls

INF, NAN = math.inf, math.nan


def table(ranks: dict[int, list[tuple[str, dict]]], step: int = 0, counts: bool = True, parent: dict | None = None):
    """{rank: [(call, {"input.0": v, ...})]}: a float tensor per leaf with max v, min -v (NaN/inf where v is)."""
    rows = []
    for rank, calls in ranks.items():
        for ci, (call, leaves) in enumerate(calls):
            for suffix, v in leaves.items():
                io, arg = suffix.split(".", 1)
                row = dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.{suffix}", io=io, arg=arg,
                           kind="tensor", dtype="torch.float16", shape=(4,), numel=4, max=v, min=-v, mean=v / 4,
                           norm=abs(v), parent=(parent or {}).get(call, ""))
                if counts:
                    row.update(nan_count=int(math.isnan(v)), posinf_count=int(v == INF), neginf_count=int(v == INF))
                rows.append(row)
    return coerce_calls(pd.DataFrame(rows))


def f(name: str, x: float, y: float):
    return (name, {"input.0": x, "output.0": y})


def test_an_overflow_on_rank_1_is_found_on_rank_1_not_in_rank_0s_all_reduce():
    # rank 0's all_reduce is its call #1 and the first non-finite output in time and in call order; rank 1's
    # exp overflows at its call #3, before the all_reduce that carries the inf to rank 0
    calls = {0: [f("Functional.linear.0.forward", 1, 2), f("Distributed.all_reduce.0.forward", 2, INF)],
             1: [f("Functional.linear.0.forward", 1, 2), f("Functional.mul.0.forward", 2, 3),
                 f("Functional.mul.1.forward", 3, 11), f("Torch.exp.0.forward", 11, INF),
                 f("Distributed.all_reduce.0.forward", INF, INF)]}
    o = find_overflow(table(calls))
    assert (o.rank, o.step, o.call, o.kind) == (1, 0, "Torch.exp.0.forward", "call")
    assert o.received == {0: "Distributed.all_reduce.0.forward"}
    assert "inputs are finite" in o.why and "Torch.exp.0.forward.output.0" in o.why and "+inf" in o.why
    assert "rank 0 received a non-finite value through Distributed.all_reduce.0.forward" in str(o)


def test_the_collective_order_decides_between_two_overflows():
    # rank 0 overflows at its call #1, after the all_reduce; rank 1 at its call #3, before it: rank 1 is first
    calls = {0: [f("Distributed.all_reduce.0.forward", 1, 2), f("Torch.exp.0.forward", 2, INF)],
             1: [f("Functional.a.0.forward", 1, 1), f("Functional.b.0.forward", 1, 1),
                 f("Functional.c.0.forward", 1, 1), f("Torch.exp.0.forward", 1, INF),
                 f("Distributed.all_reduce.0.forward", 1, 2)]}
    o = find_overflow(table(calls))
    assert (o.rank, o.call, o.call_index) == (1, "Torch.exp.0.forward", 3)


def test_a_collective_that_overflows_itself():
    calls = {r: [f("Functional.linear.0.forward", 1, 60000), f("Distributed.all_reduce.0.forward", 60000, INF)]
             for r in range(2)}
    o = find_overflow(table(calls))
    assert (o.rank, o.call, o.kind) == (0, "Distributed.all_reduce.0.forward", "collective")


def test_the_innermost_call_of_an_overflowing_module_is_named():
    calls = {0: [f("Module.block.Block.forward.0", 1, INF), f("Functional.linear.0.forward", 1, 5),
                 f("Torch.exp.0.forward", 5, INF)]}
    parent = {"Functional.linear.0.forward": "Module.block.Block.forward.0",
              "Torch.exp.0.forward": "Module.block.Block.forward.0"}
    assert find_overflow(table(calls, parent=parent)).call == "Torch.exp.0.forward"
    assert find_overflow(table(calls)).call == "Module.block.Block.forward.0"  # no tree: the module itself


def test_non_finite_inputs_from_the_start_and_steps():
    o = find_overflow(table({0: [f("Functional.linear.0.forward", NAN, NAN), f("Torch.exp.0.forward", NAN, NAN)]}))
    assert (o.call, o.kind) == ("Functional.linear.0.forward", "inputs") and "receives one" in o.why
    two = pd.concat([table({0: [f("Torch.exp.0.forward", 1, 2)]}, step=0),
                     table({0: [f("Torch.exp.0.forward", 1, INF)]}, step=1)])
    assert find_overflow(two).step == 1
    assert find_overflow(two, step=0) is None
    assert find_overflow(table({0: [f("Torch.exp.0.forward", 1, 2)]})) is None


def test_statistics_without_counts_still_tell():
    t = table({0: [f("Torch.a.0.forward", 1, 2), f("Torch.b.0.forward", 2, NAN)]}, counts=False)
    assert nonfinite(t).tolist() == [False, False, False, True]
    assert find_overflow(t).call == "Torch.b.0.forward"
    ints = t.assign(dtype="torch.int64", max=np.nan, min=np.nan)  # integer tensors: NaN means "no statistic"
    assert not nonfinite(ints).any()


def test_an_empty_tensor_without_statistics_is_not_an_overflow():
    # an empty float tensor has no max/min (NaN in a dump without counts): the NaN that follows is the overflow
    t = table({0: [f("Torch.a.0.forward", 1, 2), f("Torch.b.0.forward", 2, NAN)]}, counts=False)
    empty = t["name"] == "Torch.a.0.forward.output.0"
    t.loc[empty, ["max", "min", "mean", "norm"]] = np.nan
    t.loc[empty, "numel"] = 0
    assert nonfinite(t).tolist() == [False, False, False, True]
    assert find_overflow(t).call == "Torch.b.0.forward"


def test_kit_hdf5_and_its_msprobe_export(tmp_path):
    from msprobe_nb.store.hdf5_writer import DumpWriter
    calls = {0: [f("Functional.linear.0.forward", 1, 2), f("Distributed.all_reduce.0.forward", 2, INF)],
             1: [f("Functional.linear.0.forward", 1, 2), f("Torch.exp.0.forward", 2, INF),
                 f("Distributed.all_reduce.0.forward", INF, INF)]}
    t = table(calls)
    for r, part in t.groupby("rank"):
        with DumpWriter(tmp_path / "kit", rank=int(r), meta={"task": "statistics", "level": "L1"}) as w:
            w.write_step(0, {c: part[c].tolist() for c in part.columns if c not in ("step", "rank")}, {}, {}, {})
    d = load(tmp_path / "kit")
    assert d.ranks == [0, 1]
    assert (find_overflow(d).rank, find_overflow(d).call) == (1, "Torch.exp.0.forward")
    d.export_msprobe(tmp_path / "ms")
    assert (find_overflow(tmp_path / "ms").rank, find_overflow(tmp_path / "ms").call) == (1, "Torch.exp.0.forward")


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="dump path, a Dump or a calls DataFrame"):
        find_overflow(42)


def test_step_and_rank_restrict_the_search_and_the_answer_names_only_its_own_rows():
    # the same call overflows at steps 0 and 1 on both ranks: each (step, rank) asked for is answered by its
    # own rows; six non-finite outputs are described four by name, then "(+2 more)"
    six = {f"output.{k}": INF for k in range(6)}
    one = {r: [f("Functional.linear.0.forward", 1, 2), ("Torch.exp.0.forward", {"input.0": 2, **six})]
           for r in range(2)}
    t = pd.concat([table(one, step=0), table(one, step=1)], ignore_index=True)
    for s in (0, 1):
        for r in (0, 1):
            o = find_overflow(t, step=s, rank=r)
            assert (o.step, o.rank, o.call, o.kind) == (s, r, "Torch.exp.0.forward", "call")
            assert len(o.rows) == 6 and o.why.endswith("(+2 more)") and o.why.count("+inf") == 4
    o = find_overflow(t)  # over both steps: the first, with the rows of that step only
    assert o.step == 0 and len(o.rows) == 6
    assert find_overflow(t, step=2) is None
