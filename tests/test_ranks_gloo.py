"""The analysis on real gloo runs of 2 ranks recorded by the kit: a planted change and a planted overflow.

The runs come from ``distributed_runs`` (the capture tests' scenarios), started once for this module.
"""
from __future__ import annotations

import distributed_runs as runs
import pytest
import torch.distributed as dist

from msprobe_nb import compare, find_overflow

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this build")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return runs.run_ranks(2, ["planted_change", "planted_overflow"], tmp_path_factory.mktemp("gloo"))


def test_a_change_planted_on_rank_1_at_step_1_is_named_there(two):
    r = compare(two / "planted_change" / "npu", two / "planted_change" / "bench")
    d = r.first_divergence()
    assert (d.rank, d.step, d.call) == tuple(runs.CHANGE[k] for k in ("rank", "step", "call"))
    assert d.origin == "local" and d.input_ranks == [1]
    assert list(d.spread_to) == [0] and d.spread_to[0].startswith("Distributed.all_reduce.")
    assert d.through == d.spread_to[0]


def test_an_overflow_planted_on_rank_1_is_found_on_rank_1(two):
    o = find_overflow(two / "planted_overflow" / "dump")
    assert (o.rank, o.step, o.call, o.kind) == (runs.OVERFLOW["rank"], runs.OVERFLOW["step"], runs.OVERFLOW["call"],
                                                "call")
    # rank 0's all_reduce output is non-finite earlier by call index (its 4th call): it only received the inf
    assert o.received == {0: runs.OVERFLOW["spread_by"]}
