"""The collective order's rules on small hand-built many-rank tables (issue 36: tests that fail when a rule
breaks): process groups, orders that disagree between ranks, the group keyword row, what is a collective."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from helpers import ar, f, table

from msprobe_nb.analysis.rank_order import group_of, is_collective, order_key, participants, sync_order
from msprobe_nb.store.schema import coerce_calls


def _ranks(seq: dict[int, list[tuple[str, list[int] | None]]]) -> pd.DataFrame:
    """{rank: [(call, group ranks or None), ...]} in execution order: one tensor row per call, and the group
    keyword row of the collectives that name one."""
    rows = []
    for r, calls in seq.items():
        for i, (call, group) in enumerate(calls):
            rows.append(dict(step=0, rank=r, call_index=i, call=call, name=f"{call}.input.0", io="input", arg="0",
                             kind="tensor", dtype="torch.float32", shape=(4,), numel=4, max=1.0, min=-1.0))
            if group is not None:
                rows.append(dict(step=0, rank=r, call_index=i, call=call, name=f"{call}.input.group", io="input",
                                 arg="group", is_kwarg=True, kind="value", value_type="torch.ProcessGroup",
                                 value=json.dumps({"group_ranks": group})))
    t = coerce_calls(pd.DataFrame(rows))
    return t.assign(group=group_of(t))


def _clocks(o: pd.DataFrame) -> dict[int, list[int]]:
    """Each rank's clocks in its execution order."""
    o = o.sort_values(["rank", "call_index"])
    return {int(r): [int(k) for k in g["clock"]] for r, g in o.groupby("rank")}


def _own_order_kept(o: pd.DataFrame) -> bool:
    """Read in the collective order, each rank's calls come in its execution order."""
    return all(list(g["call_index"]) == sorted(g["call_index"]) for _, g in o.groupby("rank", sort=False))


AR = "Distributed.all_reduce.{}.forward"


def test_two_process_groups_then_the_world_give_lamport_clocks():
    # ranks {0,1}: all_reduce 0; ranks {2,3}: all_reduce 0 then 1; then all four: all_reduce 2 (then 1 on 0,1)
    g01, g23, world = [0, 1], [2, 3], [0, 1, 2, 3]
    seq = {r: [(f(0, 1)[0], None), (AR.format(0), g01), (f(1, 1)[0], None), (AR.format(2), world),
               (f(2, 1)[0], None)] for r in (0, 1)}
    seq.update({r: [(f(0, 1)[0], None), (AR.format(0), g23), (f(1, 1)[0], None), (AR.format(1), g23),
                    (f(3, 1)[0], None), (AR.format(2), world)] for r in (2, 3)})
    o = sync_order(_ranks(seq))
    # a local call is one past the collective before it; the world's collective one past the largest clock
    assert _clocks(o) == {0: [1, 1, 2, 3, 4], 1: [1, 1, 2, 3, 4], 2: [1, 1, 2, 2, 3, 3], 3: [1, 1, 2, 2, 3, 3]}
    assert list(o["phase"]) == [int(c.startswith("Distributed.")) for c in o["call"]]
    world_at = [i for i, c in enumerate(o["call"]) if c == AR.format(2)]
    assert world_at == list(range(world_at[0], world_at[0] + 4))  # the four side by side
    assert set(o["call"].iloc[world_at[-1] + 1:]) == {f(2, 1)[0]}  # and only what follows it after them
    assert _own_order_kept(o)
    parts = participants(o)
    assert parts[(0, 1, AR.format(0))] == [0, 1] and parts[(0, 3, AR.format(0))] == [2, 3]
    assert parts[(0, 2, AR.format(2))] == [0, 1, 2, 3]
    assert order_key(o)[(0, 2, AR.format(1))] == (0, 2, 1, 3, 2)  # (step, clock, phase, call_index, rank)


@pytest.mark.parametrize("second", [["A", "C", "B"], ["A", "B", "C"]])
def test_ranks_whose_collective_orders_disagree_keep_each_own_order(second):
    names = {k: f"Distributed.broadcast.{k}.forward" for k in "ABC"}
    seq = {0: [(names[k], None) for k in "ABC"], 1: [(names[k], None) for k in second]}
    o = sync_order(_ranks(seq))
    assert _own_order_kept(o)
    if second == ["A", "B", "C"]:
        assert _clocks(o) == {0: [1, 2, 3], 1: [1, 2, 3]}
    else:  # rank 0 goes on alone with B, then both meet C, then rank 1's B comes after its C
        assert _clocks(o) == {0: [1, 2, 3], 1: [1, 3, 4]}


def test_opposite_collective_orders_still_give_each_rank_increasing_clocks():
    seq = {0: [(AR.format(0), None), (AR.format(1), None)], 1: [(AR.format(1), None), (AR.format(0), None)]}
    o = sync_order(_ranks(seq))
    assert _clocks(o) == {0: [1, 2], 1: [2, 3]}
    assert _own_order_kept(o)


def _named(seq: dict[int, str]) -> pd.DataFrame:
    """{rank: "AD"}: each letter a collective of that rank, in order (no group rows: met by name)."""
    return _ranks({r: [(f"Distributed.broadcast.{k}.forward", None) for k in ks] for r, ks in seq.items()})


def test_a_collective_unblocked_late_in_a_pass_is_still_met_by_all_its_ranks_at_once():
    # rank 0 waits on rank 2 for A, which waits on rank 3 for C: once C and A are done, D is ready on ranks 0
    # and 1 and is one collective: the same clock on both, one past rank 0's A
    o = sync_order(_named({0: "AD", 1: "D", 2: "CA", 3: "C"}))
    assert _clocks(o) == {0: [2, 3], 1: [3], 2: [1, 2], 3: [1]}


def test_a_rank_waiting_at_a_collective_another_went_past_alone_meets_it_there():
    # N on {0,1,2}, P on {0,2}; rank 2 does P first: a cycle. Rank 0 goes on alone with N; rank 1, already
    # at N, shares its clock; rank 2 meets N after its P
    o = sync_order(_named({0: "NP", 1: "N", 2: "PN"}))
    assert _clocks(o) == {0: [1, 2], 1: [1], 2: [2, 3]}
    assert _own_order_kept(o)


def test_a_long_step_whose_orders_disagree_late_is_ordered():
    # hundreds of collectives a step (as in a real model), then two in opposite orders on ranks 2 and 3
    n = 300
    seq = {r: [(AR.format(k), [0, 1]) for k in range(n)] for r in (0, 1)}
    tail = {2: [n + 1, n + 2], 3: [n + 2, n + 1]}
    seq.update({r: [(AR.format(k), [2, 3]) for k in range(n + 1)] + [(AR.format(k), [2, 3]) for k in tail[r]]
                for r in (2, 3)})
    o = sync_order(_ranks(seq))
    c = _clocks(o)
    assert c[0] == list(range(1, n + 1)) and c[2][:n + 1] == list(range(1, n + 2))
    assert c[2][n + 1:] == [n + 2, n + 3] and c[3][n + 1:] == [n + 3, n + 4]


@pytest.mark.parametrize("value", [None, float("nan"), "not json", json.dumps({"other": 1}), json.dumps([0, 1]),
                                   json.dumps(["group_ranks"]), '{"group_ranks": '])
def test_a_group_row_without_group_ranks_leaves_the_group_unknown(value):
    t = table({0: [ar(0, 1, 1)]}, group=[0, 1])
    t.loc[t["arg"] == "group", "value"] = value
    assert list(group_of(t)) == [""] * len(t)


def test_the_group_is_given_to_every_row_of_its_call_and_only_there():
    t = table({0: [f(0, 1), ar(0, 1, 1)], 1: [ar(0, 1, 1)]}, group=[0, 1])
    # the other keyword rows of a collective (msprobe records op and async_op too) are not its group
    kw = t[t["arg"] == "group"].assign(arg="op", name=lambda d: d["call"] + ".input.op", value="ReduceOp.SUM")
    t = pd.concat([t, kw], ignore_index=True)
    g = group_of(t)
    assert [x for x, c in zip(g, t["call"]) if c.startswith("Distributed.")] == ["0,1"] * 8
    assert [x for x, c in zip(g, t["call"]) if not c.startswith("Distributed.")] == ["", ""]
    assert list(group_of(t.drop(columns=["value"]))) == [""] * len(t)
    # whatever the order of a call's rows (the group row first, here)
    t2 = t.sort_values("arg", ascending=False, kind="stable").reset_index(drop=True)
    assert [x for x, c in zip(group_of(t2), t2["call"]) if c.startswith("Distributed.")] == ["0,1"] * 8


def test_only_forward_distributed_calls_are_collectives():
    calls = ["Distributed.all_reduce.0.forward", "Distributed.all_reduce.0.backward", "Functional.f.0.forward",
             "Tensor.Distributed.x.0.forward", "Distributed.recv_backward.0.forward"]  # a name, not a direction
    assert list(is_collective(calls)) == [True, False, False, False, True]


def test_local_calls_between_many_collectives_sit_one_past_the_collective_before_them():
    seq = {r: [(f(0, 1)[0], None)] + [c for k in range(4) for c in ((AR.format(k), None), (f(k + 1, 1)[0], None))]
           for r in (0, 1)}
    o = sync_order(_ranks(seq))
    assert _clocks(o) == {0: [1, 1, 2, 2, 3, 3, 4, 4, 5], 1: [1, 1, 2, 2, 3, 3, 4, 4, 5]}


def test_one_rank_with_collectives_is_ordered_by_its_own_calls():
    o = sync_order(_ranks({3: [(f(0, 1)[0], None), (AR.format(0), None), (f(1, 1)[0], None)]}))
    assert list(o["call"]) == [f(0, 1)[0], AR.format(0), f(1, 1)[0]] and _clocks(o) == {3: [1, 1, 2]}


def test_groups_whose_collectives_sort_before_rank_0s_still_get_their_own_clocks():
    # ranks 2 and 3 make two collectives in their group, ranks 0 and 1 one in theirs (named to sort after)
    o = sync_order(_named({0: "B", 1: "B", 2: "AC", 3: "AC"}))
    assert _clocks(o) == {0: [1], 1: [1], 2: [1, 2], 3: [1, 2]}


def test_a_collective_of_one_group_does_not_wait_for_a_same_named_one_of_another_group():
    bc = "Distributed.broadcast.0.forward"
    seq = {r: [(AR.format(0), [0, 1])] for r in (0, 1)}
    seq.update({r: [(bc, [2, 3]), (AR.format(0), [2, 3])] for r in (2, 3)})
    assert _clocks(sync_order(_ranks(seq))) == {0: [1], 1: [1], 2: [1, 2], 3: [1, 2]}
