"""FSDP2 and DTensor tensor parallelism under recording: bitwise training, rows on every rank, shards as rows.

The FSDP2 failure this guards against ("Trying to resize storage that is not resizable" in FSDP's reshard)
came from ``Tensor.numpy()``, which marks a storage not resizable for good: the kit read unsharded parameters
through it. The single-process test checks every storage the kit reads stays resizable, at every level and
task, with and without the C paths; the gloo runs train FSDP2 and tensor-parallel models for real.
"""
from __future__ import annotations

import json

import pytest
import sharded_runs as runs
import torch
import torch.distributed as dist

import msprobe_nb as mp

needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available in this build")


def _no_c_paths(monkeypatch) -> None:
    from msprobe_nb.capture import recorder, stacks, stats
    monkeypatch.setattr(recorder, "_build_rows", None)
    monkeypatch.setattr(stacks, "_stack_key", None)
    for name in ("_fused_at", "_int_at", "_norms_into"):
        monkeypatch.setattr(stats, name, None)


@pytest.mark.parametrize("c_paths", [True, False], ids=["C", "python"])
@pytest.mark.parametrize("task", ["statistics", "md5", "tensor"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_recording_leaves_every_storage_resizable(tmp_path, monkeypatch, level, task, c_paths):
    if not c_paths:
        _no_c_paths(monkeypatch)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    seen: list[torch.Tensor] = []
    for m in model:
        m.register_forward_hook(lambda _m, args, out: seen.extend([*args, out]))
    x = torch.randn(5, 8)
    with mp.record(dump_path=str(tmp_path / "d"), level=level, task=task, model=model):
        out = model(x)
        (out @ out.t()).sum().backward()  # a transpose: the kit's strided path
    seen += [x, out, *model.parameters(), *(p.grad for p in model.parameters())]
    for t in seen:
        storage = t.untyped_storage()
        storage.resize_(storage.nbytes())  # raises "not resizable" where the kit pinned it


def _outcome(results: dict) -> dict:
    base = results["None"]
    assert not isinstance(base, str), base
    out = {}
    for level, got in results.items():
        if isinstance(got, str):
            out[level] = got.strip().splitlines()[-1]
            continue
        same = all(torch.equal(a, b) for a, b in zip(got[0], base[0], strict=True)) and \
            all(torch.equal(a, b) for a, b in zip(got[1], base[1], strict=True))
        out[level] = "bitwise" if same else "differs"
    return out


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    return runs.run_sharded(2, tmp_path_factory.mktemp("sharded"), ["fsdp", "fsdp_planted", "tp"])


@needs_gloo
@pytest.mark.parametrize("scenario,levels", [("fsdp", ["L0", "L1", "mix", "L2"]), ("tp", ["L1", "mix"])])
def test_sharded_training_is_bitwise_and_recorded_on_every_rank(two, scenario, levels):
    for rank in range(2):
        results = torch.load(two / scenario / f"result{rank}.pt", weights_only=False)
        assert _outcome(results) == {"None": "bitwise", **{lv: "bitwise" for lv in levels}}
    for level in levels:
        calls = mp.load(two / scenario / level).calls
        assert sorted(set(zip(calls["rank"], calls["step"]))) == [(r, s) for r in range(2) for s in range(3)]


@needs_gloo
def test_fsdp2_collectives_are_distributed_calls(two):
    calls = mp.load(two / "fsdp" / "L1").calls
    ops = set(calls.loc[calls["family"] == "Distributed", "op"].astype(str))
    assert "all_gather_single" in ops  # FSDP2's all-gather of each group's parameters, as the caller named it
    aten = set(mp.load(two / "fsdp" / "L2").calls["call"].astype(str))  # L2 also sees backward's reduce-scatter
    assert {"Aten._allgather_base_.0.forward", "Aten._reduce_scatter_base_.0.backward"} <= aten


@needs_gloo
def test_a_dtensor_argument_is_its_local_shard_with_its_placement(two):
    calls = mp.load(two / "tp" / "L1").calls
    rows = calls[(calls["rank"] == 1) & (calls["step"] == 0) & (calls["call"] == "Functional.linear.0.forward")]
    weight = rows[(rows["io"] == "input") & (rows["arg"] == "1")].iloc[0]
    assert weight["value_type"] == "DTensor" and tuple(weight["shape"]) == (8, 16)  # a column shard of (16, 16)
    facts = json.loads(weight["value"])
    assert facts["placements"] == ["Shard(dim=0)"] and facts["global_shape"] == [16, 16] and facts["mesh_shape"] == [2]
    # the statistics are the shard's own values: rank 1 holds rows 8-15 of the first layer's weight
    torch.manual_seed(0)
    full = torch.nn.Linear(16, 16).weight.detach()[8:]
    assert weight["max"] == pytest.approx(full.max().item()) and weight["norm"] == pytest.approx(full.norm().item())
    # no row reads a wrapper's memory as values (it gave norms of 1e30 and inf); a pending functional collective's
    # result (AsyncCollectiveTensor) is not summarised at all, so its row holds NaN
    norms = calls.loc[calls["kind"] == "tensor", "norm"]
    assert (norms[norms == norms].abs() < 1e3).all() and (norms == norms).mean() > 0.9


@needs_gloo
def test_a_change_planted_on_rank_1_under_fsdp2_is_named_on_rank_1(two):
    npu, bench = two / "fsdp_planted" / "npu" / "mix", two / "fsdp_planted" / "bench" / "mix"
    d = mp.compare(npu, bench).first_divergence()
    assert (d.rank, d.step, d.call) == (runs.PLANTED["rank"], runs.PLANTED["step"], runs.PLANTED["call"])
    assert mp.compare(bench, bench).first_divergence() is None


@needs_gloo
def test_fsdp2_without_the_c_paths_records_the_same_rows(two, tmp_path):
    root = runs.run_sharded(2, tmp_path, ["fsdp_l1"], c_paths=False)
    for rank in range(2):
        assert _outcome(torch.load(root / "fsdp_l1" / f"result{rank}.pt", weights_only=False)) == \
            {"None": "bitwise", "L1": "bitwise"}
    assert mp.compare(root / "fsdp_l1" / "L1", two / "fsdp" / "L1").first_divergence() is None


@needs_gloo
def test_fsdp2_on_four_ranks(tmp_path):
    root = runs.run_sharded(4, tmp_path, ["fsdp_l1"])
    for rank in range(4):
        assert _outcome(torch.load(root / "fsdp_l1" / f"result{rank}.pt", weights_only=False)) == \
            {"None": "bitwise", "L1": "bitwise"}
    calls = mp.load(root / "fsdp_l1" / "L1").calls
    assert sorted(set(calls["rank"])) == [0, 1, 2, 3]
