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


# ------------------------------------------------------------- the rules, one by one (issue 36's survivors)
def _row(call, io, v, *, lo=None, rank=0, step=0, ci=0, kind="tensor", numel=4, counts=None, parent="",
         dtype="torch.float16"):
    """One leaf row of ``call`` with max ``v`` and min ``lo`` (-v by default); ``counts``: (nan, +inf, -inf)."""
    row = dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.{io}.0", io=io, arg="0", kind=kind,
               dtype=dtype, shape=(4,), numel=numel, max=v, min=-v if lo is None else lo, mean=np.nan, norm=np.nan,
               parent=parent)
    if counts is not None:
        row.update(nan_count=counts[0], posinf_count=counts[1], neginf_count=counts[2])
    return row


def _calls(rows):
    return coerce_calls(pd.DataFrame(rows))


@pytest.mark.parametrize("mx,mn", [(INF, 0.5), (2.0, -INF), (NAN, -3.0), (3.0, NAN), (INF, NAN), (NAN, -INF)])
def test_without_counts_either_statistic_being_inf_or_nan_is_an_overflow(mx, mn):
    # one +inf in a tensor leaves its min finite: the max alone must tell, and the min alone
    t = _calls([_row("Torch.a.0.forward", "input", 1.0), _row("Torch.a.0.forward", "output", 1.0),
                _row("Torch.b.0.forward", "input", 1.0, ci=1), _row("Torch.b.0.forward", "output", mx, lo=mn, ci=1)])
    assert nonfinite(t).tolist() == [False, False, False, True]
    o = find_overflow(t)
    assert (o.call, o.kind) == ("Torch.b.0.forward", "call")


def test_a_one_element_or_unsized_tensor_holding_nan_is_an_overflow():
    # a NaN loss is a one-element tensor; a dump without shapes has no numel: both still tell
    for numel in (1, np.nan):
        t = _calls([_row("Torch.a.0.forward", "input", 1.0), _row("Torch.a.0.forward", "output", 2.0),
                    _row("Torch.loss.0.forward", "input", 2.0, ci=1),
                    _row("Torch.loss.0.forward", "output", NAN, ci=1, numel=numel)])
        assert find_overflow(t).call == "Torch.loss.0.forward", numel


def test_a_non_finite_scalar_argument_is_not_an_overflow():
    # masked_fill(x, mask, -inf): the -inf is the value argument; its finite tensor output is no overflow
    rows = [_row("Tensor.masked_fill.0.forward", "input", 1.0), _row("Tensor.masked_fill.0.forward", "output", 1.0)]
    rows.append({**_row("Tensor.masked_fill.0.forward", "input", -INF, lo=-INF, kind="value", numel=1,
                        counts=(0, 0, 1), dtype="float"), "name": "Tensor.masked_fill.0.forward.input.2"})
    t = _calls(rows)
    assert not nonfinite(t).any()
    assert find_overflow(t) is None


def test_the_description_counts_what_is_there_and_names_at_most_four_rows():
    one = _calls([_row("Torch.a.0.forward", "input", 1.0, counts=(0, 0, 0)),
                  _row("Torch.a.0.forward", "output", INF, lo=0.0, counts=(0, 1, 0))])
    o = find_overflow(one)
    assert o.why.endswith("Torch.a.0.forward.output.0 (1 +inf)"), o.why
    nan = one.assign(nan_count=[0, 1], posinf_count=[0, 0], max=[1.0, NAN], min=[-1.0, NAN])
    assert find_overflow(nan).why.endswith("Torch.a.0.forward.output.0 (1 NaN)")
    for n, more in ((2, ""), (4, ""), (5, " (+1 more)"), (9, " (+5 more)")):
        rows = [_row("Torch.a.0.forward", "input", 1.0)]
        rows += [{**_row("Torch.a.0.forward", "output", INF), "name": f"Torch.a.0.forward.output.{k}"}
                 for k in range(n)]
        why = find_overflow(_calls(rows)).why
        assert why.count("Torch.a.0.forward.output.") == min(n, 4) and why.endswith(f"output.{min(n, 4) - 1} "
                                                                                   f"(max inf, min -inf){more}"), why


def test_on_ten_ranks_every_rank_the_overflow_reached_is_named_and_the_report_lists_eight():
    calls = {0: [f("Functional.linear.0.forward", 1, 2), f("Torch.exp.0.forward", 2, INF),
                 f("Distributed.all_reduce.0.forward", INF, INF)]}
    for r in range(1, 10):
        calls[r] = [f("Functional.linear.0.forward", 1, 2), f("Torch.mul.0.forward", 2, 3),
                    f("Distributed.all_reduce.0.forward", 3, INF)]
    o = find_overflow(table(calls))
    assert (o.rank, o.call, o.kind) == (0, "Torch.exp.0.forward", "call")
    assert o.received == {r: "Distributed.all_reduce.0.forward" for r in range(1, 10)}
    text = str(o)
    assert [q for q in range(10) if f"rank {q} received" in text] == list(range(1, 9))


def test_the_answer_lists_only_its_own_rows_and_the_rank_filter_keeps_to_its_rank():
    # step 0: rank 0's exp gets NaN from the data; rank 1's exp makes an inf; step 1: rank 0's exp makes one,
    # and the add and mul after it (names either side of exp's) pass it on
    nan = dict(counts=(4, 0, 0))
    s0 = _calls([_row("Torch.exp.0.forward", "input", NAN, **nan), _row("Torch.exp.0.forward", "output", NAN, **nan),
                 _row("Torch.exp.0.forward", "input", 1.0, rank=1), _row("Torch.exp.0.forward", "output", INF, rank=1)])
    o = find_overflow(s0)
    assert (o.rank, o.kind, list(o.rows["name"])) == (1, "call", ["Torch.exp.0.forward.output.0"])
    assert list(o.rows.columns) == ["name", "io", "nan_count", "posinf_count", "neginf_count", "max", "min"]
    assert list(o.rows.index) == [0]
    o = find_overflow(s0, rank=0)
    assert (o.rank, o.kind, len(o.rows)) == (0, "inputs", 2)
    s1 = _calls([_row("Torch.exp.0.forward", "input", NAN), _row("Torch.exp.0.forward", "output", NAN),
                 _row("Torch.exp.0.forward", "input", 1.0, step=1), _row("Torch.exp.0.forward", "output", INF, step=1),
                 _row("Torch.add.0.forward", "input", INF, step=1, ci=1),
                 _row("Torch.add.0.forward", "output", INF, step=1, ci=1),
                 _row("Torch.mul.0.forward", "input", INF, step=1, ci=2),
                 _row("Torch.mul.0.forward", "output", INF, step=1, ci=2)])
    o = find_overflow(s1)
    assert (o.step, o.call, list(o.rows["name"])) == (1, "Torch.exp.0.forward", ["Torch.exp.0.forward.output.0"])


def test_a_collective_that_overflows_itself_says_so():
    calls = {r: [f("Functional.linear.0.forward", 1, 60000), f("Distributed.all_reduce.0.forward", 60000, INF)]
             for r in range(2)}
    assert find_overflow(table(calls)).why.startswith("a collective whose inputs are finite on every rank")


BLOCK, LIN, EXP = "Module.block.Block.forward.0", "Functional.linear.0.forward", "Torch.exp.0.forward"


def test_the_innermost_call_is_searched_on_the_answers_rank_only():
    # both ranks' Block overflows; only one rank's exp inside it does: the other rank's answer is its Block
    def rank(r, with_exp, first=0):
        rows = [_row(LIN, "input", 1.0, rank=r, ci=0), _row(LIN, "output", 1.0, rank=r, ci=0)] if first else []
        rows += [_row(BLOCK, "input", 1.0, rank=r, ci=first), _row(BLOCK, "output", INF, rank=r, ci=first),
                 _row(LIN, "input", 1.0, rank=r, ci=first + 1, parent=BLOCK) if not first else
                 _row("Functional.gelu.0.forward", "input", 1.0, rank=r, ci=first + 1, parent=BLOCK)]
        if with_exp:
            rows += [_row(EXP, "input", 5.0, rank=r, ci=first + 2, parent=BLOCK),
                     _row(EXP, "output", INF, rank=r, ci=first + 2, parent=BLOCK)]
        return rows
    o = find_overflow(_calls(rank(0, False) + rank(1, True)))  # rank 0's Block comes first
    assert (o.rank, o.call) == (0, BLOCK)
    o = find_overflow(_calls(rank(0, True, first=1) + rank(1, False)))  # rank 1's Block comes first
    assert (o.rank, o.call) == (1, BLOCK)


def test_the_innermost_call_is_found_past_other_ranks_overflows_at_a_late_step():
    # step 300: rank 0's Block (call #0), rank 1's exp (call #1), rank 0's exp inside Block (call #2)
    rows = [_row(BLOCK, "input", 1.0, step=300), _row(BLOCK, "output", INF, step=300),
            _row(LIN, "input", 1.0, step=300, ci=1, parent=BLOCK),
            _row(LIN, "output", 5.0, step=300, ci=1, parent=BLOCK),
            _row(EXP, "input", 5.0, step=300, ci=2, parent=BLOCK),
            _row(EXP, "output", INF, step=300, ci=2, parent=BLOCK),
            _row(LIN, "input", 1.0, step=300, rank=1), _row(LIN, "output", 1.0, step=300, rank=1),
            _row(EXP, "input", 1.0, step=300, rank=1, ci=1), _row(EXP, "output", INF, step=300, rank=1, ci=1)]
    o = find_overflow(_calls(rows))
    assert (o.step, o.rank, o.call, o.call_index) == (300, 0, EXP, 2)


def test_only_a_call_nested_in_the_overflowing_module_replaces_it():
    # the first overflow is module m; later, calls inside its siblings a and z overflow: m stays the answer
    m, a, z = "Module.m.M.forward.0", "Module.a.A.forward.0", "Module.z.Z.forward.0"
    rows = [_row(m, "input", 1.0), _row(m, "output", INF)]
    for k, (mod, call) in enumerate(((a, "Torch.exp.0.forward"), (z, "Torch.exp.1.forward"))):
        rows += [_row(mod, "input", 1.0, ci=1 + 2 * k), _row(mod, "output", 1.0, ci=1 + 2 * k),
                 _row(call, "input", 1.0, ci=2 + 2 * k, parent=mod),
                 _row(call, "output", INF, ci=2 + 2 * k, parent=mod)]
    o = find_overflow(_calls(rows))
    assert o.call == m


def test_a_cycle_in_a_damaged_module_tree_ends():
    import signal

    def stop(*_):
        raise TimeoutError("find_overflow did not end on a parent cycle")
    rows = [_row(BLOCK, "input", 1.0, parent=EXP), _row(BLOCK, "output", INF, parent=EXP),
            _row("Torch.x.0.forward", "input", 1.0, ci=1, parent=LIN),
            _row("Torch.x.0.forward", "output", INF, ci=1, parent=LIN),
            _row(LIN, "input", 1.0, ci=2, parent="Torch.x.0.forward"),
            _row(LIN, "output", 1.0, ci=2, parent="Torch.x.0.forward")]
    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        o = find_overflow(_calls(rows))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert o.call == BLOCK


def test_step_and_rank_are_keywords_only():
    t = table({0: [f("Torch.exp.0.forward", 1, INF)]})
    with pytest.raises(TypeError):
        find_overflow(t, 0)  # a step passed by position could be taken for a rank: refused
    assert find_overflow(dump=t).call == "Torch.exp.0.forward"
