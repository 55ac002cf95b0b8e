"""The Dump object and load(): dispatch, subsets, side tables, tensors, summary, export of kit dumps."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from msprobe_nb.store.dump import Dump, load
from msprobe_nb.store.hdf5_reader import DumpFormatError
from msprobe_nb.store.schema import DumpParts, empty_calls

SOFTMAX = ("Torch.softmax.0.forward.input.0.pt", "Torch.softmax.0.forward.output.0.pt")


@pytest.fixture
def kit_dump(toy: Path, tmp_path: Path) -> tuple[Path, pd.DataFrame]:
    """A two-rank kit HDF5 dump made from the toy tensor dump (calls, two tensors, a few stacks)."""
    writer = pytest.importorskip("msprobe_nb.store.hdf5_writer")
    src = load(toy / "tensor_L1_npu")
    tensors = {name: src.tensor(name) for name in SOFTMAX}
    calls = src.calls.copy()
    calls.loc[~calls["data_name"].isin(SOFTMAX), "data_name"] = ""
    calls["stack_id"] = (calls["call_index"] % 3).astype("int32")
    stacks = {i: [f"File <workdir>/a.py, line {i}, in f, \n x = g()"] for i in range(3)}
    parts = []
    for rank in (0, 1):
        part = calls.assign(rank=rank)
        parts.append(part)
        with writer.DumpWriter(tmp_path / "kit", rank=rank, meta={"task": "tensor", "level": "L1"}) as w:
            w.write_step(0, {c: part[c] for c in part.columns}, stacks=stacks, tensors=tensors)
    return tmp_path / "kit", pd.concat(parts, ignore_index=True)


def test_load_dispatch(toy: Path, tmp_path: Path):
    d = load(toy / "stat_L1_npu")
    assert isinstance(d, Dump) and d.meta["format"] == "msprobe" and d.task == "statistics" and d.level == "L1"
    assert d.source.endswith("stat_L1_npu")
    pd.testing.assert_frame_equal(load(toy / "stat_L1_npu", kind="msprobe").calls, d.calls)
    with pytest.raises(ValueError, match="kind must be one of"):
        load(toy / "stat_L1_npu", kind="csv")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load(tmp_path / "nothing")
    with pytest.raises(DumpFormatError):
        load(toy / "stat_L1_npu", kind="hdf5")


def test_kit_hdf5_dump_loads_and_exports(kit_dump: tuple[Path, pd.DataFrame], tmp_path: Path):
    path, expected = kit_dump
    d = load(path)
    assert d.meta.get("format") != "msprobe" and d.ranks == [0, 1] and d.task == "tensor"
    pd.testing.assert_frame_equal(d.calls, expected, check_dtype=False)
    with pytest.raises(ValueError, match="pass step= and rank="):
        d.tensor("Torch.softmax.0.forward.input.0")
    t = d.tensor("Torch.softmax.0.forward.input.0", rank=1)
    assert tuple(t.shape) == (8, 4, 16, 16)

    out = d.export_msprobe(tmp_path / "exp")
    for rank in (0, 1):
        files = sorted(p.name for p in (out / "step0" / f"rank{rank}" / "dump_tensor_data").iterdir())
        assert files == sorted(SOFTMAX)
    back = load(out)
    pd.testing.assert_frame_equal(back.calls, d.calls)
    assert back.tensor("Torch.softmax.0.forward.output.0", step=0, rank=1).equal(
        d.tensor("Torch.softmax.0.forward.output.0", rank=1))
    stack = json.loads((out / "step0" / "rank1" / "stack.json").read_text())
    assert sorted(stack) == ["0", "1", "2"]


def test_select_repr_steps_ranks(megatron: Path):
    one = load(megatron)
    calls = pd.concat([one.calls.assign(step=s, rank=r) for s in (0, 1) for r in (0, 1, 2)], ignore_index=True)
    d = Dump(DumpParts(calls=calls, stacks=one.stack_frames, construct=dict(one.tree), meta=one.meta,
                       tensor_loader=None, source="synthetic"))
    assert d.steps == [0, 1] and d.ranks == [0, 1, 2] and len(d) == 6 * 71
    sub = d.select(step=1, rank=[0, 2])
    assert sub.steps == [1] and sub.ranks == [0, 2] and len(sub) == 2 * 71
    assert sub.calls.index.equals(pd.RangeIndex(len(sub)))
    assert d.select(rank=2).stack("Tensor.__add__.0.forward") == one.stack("Tensor.__add__.0.forward")
    assert repr(sub) == "<Dump msprobe statistics mix: steps 1, ranks 0,2, 24 calls, 142 rows, from 'synthetic'>"
    assert "ranks 0..2" in repr(d)
    empty = d.select(step=7)
    assert len(empty) == 0 and empty.steps == [] and "steps []" in repr(empty)


def test_tree_and_stacks(megatron: Path):
    d = load(megatron)
    assert d.construct == d.tree
    emb = "Module.module.module.language_model.embedding.word_embeddings.VocabParallelEmbedding.forward.0"
    assert d.children(emb) == ["Tensor.__or__.0.forward", "Distributed.all_reduce.0.forward"]
    assert d.ancestors(emb) == ["Module.module.module.language_model.embedding.Embedding.forward.0"]
    assert d.ancestors("Tensor.__add__.0.forward") == []
    assert list(d.stacks.columns) == ["stack_id", "frames"] and isinstance(d.stacks["frames"][0], list)
    with pytest.raises(KeyError, match="no call"):
        d.stack("Torch.nothing.0.forward")


def test_summary(megatron: Path, tmp_path: Path):
    s = load(megatron).summary()
    assert list(s.columns) == ["family", "direction", "calls", "rows", "tensors", "values", "nones",
                               "nan_rows", "inf_rows"]
    npu = s.set_index(["family", "direction"]).loc[("NPU", "forward")]
    assert (npu["calls"], npu["rows"], npu["values"], npu["nones"]) == (2, 28, 12, 4)
    assert s["rows"].sum() == 71 and (s["nan_rows"] == 0).all()

    bad = {"type": "torch.Tensor", "dtype": "torch.float16", "shape": [4], "requires_grad": False}
    data = {"Torch.exp.0.forward": {
        "input_args": [{**bad, "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0}], "input_kwargs": {},
        "output": [{**bad, "Max": "inf", "Min": 1.0, "Mean": "inf", "Norm": "inf"},
                   {**bad, "Max": float("nan"), "Min": float("nan"), "Mean": float("nan"), "Norm": float("nan")}]}}
    (tmp_path / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": data}))
    row = load(tmp_path / "dump.json").summary().iloc[0]
    assert (row["rows"], row["nan_rows"], row["inf_rows"]) == (3, 1, 1)


def test_empty_dump_and_tensor_errors(toy: Path):
    d = Dump(DumpParts(calls=empty_calls()))
    assert len(d) == 0 and d.steps == [] and len(d.summary()) == 0 and d.tree == {}
    with pytest.raises(KeyError, match="no row or data_name"):
        d.tensor("x")
    stat = load(toy / "stat_L1_npu")
    with pytest.raises(KeyError, match="no saved tensor"):
        stat.tensor("Torch.softmax.0.forward.input.0")
