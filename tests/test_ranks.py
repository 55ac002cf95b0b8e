"""Comparing many ranks: pairing by rank id, world sizes, the collective order and first_divergence across ranks."""
from __future__ import annotations

import pandas as pd
import pytest
from helpers import INTEROP, ar, f, four_ranks, table

from msprobe_nb import compare
from msprobe_nb.analysis.compare import CompareError
from msprobe_nb.analysis.rank_order import participants, sync_order
from msprobe_nb.analysis.ranks import RankDivergence, rank_step_summary, verdict_grid


# -------------------------------------------------------------------------------------------- the real dumps
@pytest.fixture(scope="module")
def interop():
    if not INTEROP.is_dir():
        pytest.skip(f"the msprobe two-rank dumps are not here ({INTEROP}: ../shared is absent)")
    return compare(INTEROP / "npu", INTEROP / "bench")


def test_msprobe_two_rank_tree_is_read_by_step_and_rank():
    if not INTEROP.is_dir():
        pytest.skip(f"the msprobe two-rank dumps are not here ({INTEROP}: ../shared is absent)")
    from msprobe_nb import load
    d = load(INTEROP / "npu")
    assert d.steps == [0, 1] and d.ranks == [0, 1]
    b = d.calls[d.calls["call"] == "Distributed.broadcast.0.forward"]
    assert set(b["rank"]) == {0, 1} and set(b["step"]) == {0, 1}
    out = b[(b["io"] == "output") & (b["arg"] == "0") & (b["step"] == 0)].set_index("rank")["max"]
    assert out[0] == out[1]  # rank 1 received rank 0's vector


def test_first_divergence_names_rank_0_and_the_broadcast_that_spread_it(interop):
    own = {d.rank: d for d in interop.divergences() if d.step == 0}
    # on its own, rank 1 looks like the broadcast parted there: its inputs agree, its outputs do not
    assert own[1].call == "Distributed.broadcast.0.forward" and own[1].kind == "call"
    d = interop.first_divergence()
    assert isinstance(d, RankDivergence)
    assert (d.rank, d.step, d.call) == (0, 0, "Distributed.broadcast.0.forward")
    assert d.origin == "local" and d.input_ranks == [0]
    assert d.through == "Distributed.broadcast.0.forward" and d.spread_to == {1: "Distributed.broadcast.0.forward"}
    assert "rank 0 parts first" in str(d) and "to rank(s) 1 through Distributed.broadcast.0.forward" in str(d)
    assert interop.first_divergence(rank=1).call == "Distributed.broadcast.0.forward"  # one rank: as before
    assert d.to_dict()["spread_to"] == {1: "Distributed.broadcast.0.forward"}


def test_rank_step_summary_of_the_real_dumps(interop):
    s = rank_step_summary(pd.DataFrame(interop), interop.pairs, interop.divergences())
    assert list(zip(s["step"], s["rank"])) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert s["rows"].sum() == (interop["match"] != "bench_only").sum()
    assert s.set_index(["step", "rank"]).loc[(0, 1), "first_call"] == "Distributed.broadcast.0.forward"
    assert verdict_grid(s).shape == (2, 2)


# -------------------------------------------------------------------------------------------- planted changes
def test_a_change_planted_on_one_rank_at_one_step_is_named_there():
    r = compare(four_ranks(2, 1), four_ranks(None, 1))
    d = r.first_divergence()
    assert (d.rank, d.step, d.call, d.kind) == (2, 1, "Functional.f.1.forward", "call")
    assert d.origin == "local" and d.through == "Distributed.all_reduce.0.forward" and d.input_ranks == [2]
    assert d.spread_to == {0: "Distributed.all_reduce.0.forward", 1: "Distributed.all_reduce.0.forward",
                           3: "Distributed.all_reduce.0.forward"}
    assert d.ranks == [0, 1, 2, 3] and d.other_origins == []


def test_collective_order_not_call_index_decides_between_ranks():
    # both ranks part on their own; rank 1 at its call #1, after the all_reduce, rank 0 at its call #3, before
    # it: rank 0 parts first although its call number is higher
    npu = table({0: [f(0, 1), f(1, 1), f(2, 1), f(3, 1, 9.0), ar(0, 1, 2.0)], 1: [ar(0, 1, 2.0), f(1, 2.0, 7.0)]})
    bench = table({0: [f(0, 1), f(1, 1), f(2, 1), f(3, 1), ar(0, 1, 2.0)], 1: [ar(0, 1, 2.0), f(1, 2.0, 2.0)]})
    d = compare(npu, bench).first_divergence()
    assert (d.rank, d.call) == (0, "Functional.f.3.forward")
    assert d.other_origins == [(1, "Functional.f.1.forward")] and d.spread_to == {}


def test_a_rank_that_received_the_difference_is_not_the_origin():
    # rank 1's own first divergence is the all_reduce (its inputs agree): it received rank 0's difference
    npu = table({0: [f(0, 1), f(1, 1), f(2, 1), f(3, 1, 9.0), ar(0, 9.0, 9.0)],
                 1: [ar(0, 1, 9.0), f(1, 9.0, 7.0)]})
    bench = table({0: [f(0, 1), f(1, 1), f(2, 1), f(3, 1), ar(0, 1, 2.0)], 1: [ar(0, 1, 2.0), f(1, 2.0, 2.0)]})
    d = compare(npu, bench).first_divergence()
    assert (d.rank, d.call) == (0, "Functional.f.3.forward")
    assert d.spread_to == {1: "Distributed.all_reduce.0.forward"} and d.other_origins == []


def test_a_collective_whose_inputs_agree_everywhere_is_the_origin():
    npu = table({r: [f(0, 1), ar(0, 1, 2.5), f(1, 2.5)] for r in range(2)})
    bench = table({r: [f(0, 1), ar(0, 1, 2.0), f(1, 2.0)] for r in range(2)})
    d = compare(npu, bench).first_divergence()
    assert d.origin == "collective" and d.call == "Distributed.all_reduce.0.forward" and d.rank == 0
    assert d.spread_to == {1: "Distributed.all_reduce.0.forward"} and "computes differently" in str(d)


def test_independent_origins_on_two_ranks_are_both_listed():
    npu = table({0: [f(0, 1, 3.0), ar(0, 3.0, 5.0)], 1: [f(0, 1, 3.0), ar(0, 3.0, 5.0)]})
    bench = table({0: [f(0, 1), ar(0, 1, 2.0)], 1: [f(0, 1), ar(0, 1, 2.0)]})
    d = compare(npu, bench).first_divergence()
    assert (d.rank, d.call) == (0, "Functional.f.0.forward") and d.other_origins == [(1, "Functional.f.0.forward")]


# -------------------------------------------------------------------------------------------- the order itself
def test_sync_order_puts_every_call_before_a_collective_ahead_of_every_call_after_it():
    t = table({0: [f(0, 1), f(1, 1), f(2, 1), ar(0, 1, 1), f(3, 1)], 1: [ar(0, 1, 1), f(0, 1)]})
    o = sync_order(t)
    seq = list(zip(o["rank"], o["call"]))
    at = seq.index((1, "Distributed.all_reduce.0.forward"))  # the collective of both ranks, side by side
    assert seq.index((0, "Distributed.all_reduce.0.forward")) == at + 1
    assert all(seq.index((0, f"Functional.f.{k}.forward")) < at for k in range(3))
    assert seq.index((1, "Functional.f.0.forward")) > at and seq.index((0, "Functional.f.3.forward")) > at


def test_on_four_ranks_each_call_sits_between_the_collectives_that_bracket_it_on_its_rank():
    # 4 ranks x 3 steps: f0, f1, all_reduce 0, f2, all_reduce 1. Read in the collective order, a step is: every
    # rank's f0 and f1, the four all_reduce 0 side by side, every rank's f2, the four all_reduce 1
    o = sync_order(four_ranks(None, 0))
    for s in range(3):
        seq = [c.split(".")[1] + c.split(".")[2] for c in o.loc[o["step"] == s, "call"]]
        assert seq == ["f0"] * 4 + ["f1"] * 4 + ["all_reduce0"] * 4 + ["f2"] * 4 + ["all_reduce1"] * 4, (s, seq)
    assert list(o["step"]) == sorted(o["step"])


def test_process_groups_keep_same_named_collectives_apart():
    # ranks {0,1} and {2,3} each all_reduce in their own group; then one all_reduce over all four
    ranks = {r: [f(0, 1), ar(0, 1, 1), f(1, 1), ("Distributed.all_reduce.1.forward", {"input.0": 1, "output.0": 1})]
             for r in range(4)}
    t = pd.concat([table({r: ranks[r][:3]}, group=[0, 1] if r < 2 else [2, 3]) for r in range(4)]
                  + [table({r: ranks[r]}, group=[0, 1, 2, 3]).query("call_index == 3") for r in range(4)])
    from msprobe_nb.analysis.rank_order import group_of
    o = sync_order(t.assign(group=group_of(t)))
    parts = participants(o)
    assert parts[(0, 0, "Distributed.all_reduce.0.forward")] == [0, 1]
    assert parts[(0, 2, "Distributed.all_reduce.0.forward")] == [2, 3]
    assert parts[(0, 3, "Distributed.all_reduce.1.forward")] == [0, 1, 2, 3]


# -------------------------------------------------------------------------------------------- world sizes
def test_world_sizes_that_differ_are_an_error_naming_both():
    four = table({r: [f(0, 1)] for r in range(4)})
    two = table({r: [f(0, 1)] for r in range(2)})
    with pytest.raises(CompareError, match=r"NPU run has 4 ranks .* bench run 2"):
        compare(four, two)
    r = compare(four, two, rank_map={0: 0, 1: 1, 2: 0, 3: 1})
    assert sorted(r.pairs["bench_rank"]) == [0, 0, 1, 1]


def test_ranks_on_one_side_only_are_listed():
    npu = table({0: [f(0, 1)], 2: [f(0, 1)]})
    bench = table({r: [f(0, 1)] for r in range(3)})
    with pytest.warns(UserWarning, match="without a counterpart"):
        r = compare(npu, bench)
    assert "ranks in the bench dump only, not compared: 1" in r.notes


def test_a_recorded_world_size_wins_over_the_ranks_seen():
    from msprobe_nb.analysis.ranks import world_size
    t = table({0: [f(0, 1)], 1: [f(0, 1)]})
    assert world_size(t) == 2 and world_size(t, {"world_size": 8}) == 8
    assert world_size(table({0: [f(0, 1)]})) is None  # one rank may be a selection
