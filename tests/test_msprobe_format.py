"""msprobe's on-disk format: reading real msprobe dumps, clear errors, and export that msprobe can read."""
from __future__ import annotations

import ast
import csv
import json
import math
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from msprobe_nb.store.dump import Dump, load
from msprobe_nb.store.hdf5_reader import DumpFormatError
from msprobe_nb.store.msprobe_reader import find_rank_dirs, load_tensor_file, parse_call, read_msprobe
from msprobe_nb.store.schema import COLUMNS, DumpParts


# ----------------------------------------------------------------------------- fixtures
def _csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _count_leaves(node) -> int:
    """Independent leaf count of a dump.json subtree: every tensor/value dict, null or scalar is one row."""
    if isinstance(node, list):
        return sum(_count_leaves(x) for x in node)
    if isinstance(node, dict) and "type" not in node and "class_type" not in node:
        return sum(_count_leaves(x) for x in node.values())
    return 1


def _write_rank(folder: Path, data: dict, *, task: str = "statistics", level: str = "L1",
                stack: dict | None = None, construct: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dump.json").write_text(json.dumps(
        {"task": task, "level": level, "framework": "pytorch", "dump_data_dir": None, "data": data}))
    if stack is not None:
        (folder / "stack.json").write_text(json.dumps(stack))
    if construct is not None:
        (folder / "construct.json").write_text(json.dumps(construct))
    return folder


def _t(shape=(2, 3), mx=1.0, mn=-1.0, mean=0.0, norm=2.0, dtype="torch.float32", **extra) -> dict:
    return {"type": "torch.Tensor", "dtype": dtype, "shape": list(shape), "Max": mx, "Min": mn,
            "Mean": mean, "Norm": norm, "requires_grad": True, **extra}


# ----------------------------------------------------------------------------- real data
def test_megatron_every_record_loads(megatron: Path):
    raw = json.loads((megatron / "dump.json").read_text())["data"]
    expected = sum(_count_leaves(v) for rec in raw.values() for v in rec.values())
    d = load(megatron)
    assert len(d.calls) == expected == 71
    assert list(d.calls.drop_duplicates("call")["call"]) == list(raw)  # every record, in order
    assert list(d.calls.drop_duplicates("call")["call_index"]) == list(range(len(raw)))
    assert {"NPU", "Distributed", "Module", "Tensor", "Torch"} <= set(d.calls["family"])
    assert d.task == "statistics" and d.level == "mix" and d.steps == [0] and d.ranks == [0]


def test_megatron_rows(megatron: Path):
    c = load(megatron).calls.set_index("name")
    fa = c.loc["NPU.npu_fusion_attention.0.forward.input.4"]
    assert (fa["family"], fa["op"], fa["counter"], fa["direction"]) == ("NPU", "npu_fusion_attention", 0, "forward")
    assert (fa["kind"], fa["value_type"], json.loads(fa["value"])) == ("value", "str", "SBH")
    group = c.loc["Distributed.all_reduce.0.forward.input.group"]
    assert (group["kind"], group["io"], group["arg"], bool(group["is_kwarg"])) == ("none", "input", "group", True)
    empty = c.loc["NPU.npu_fusion_attention.0.forward.output.3"]  # shape [0], all stats null
    assert empty["shape"] == (0,) and empty["numel"] == 0 and math.isnan(empty["max"])
    mask = c.loc["Tensor.__or__.0.forward.input.1"]
    assert (mask["max"], mask["min"], mask["dtype"]) == (1.0, 0.0, "torch.bool") and math.isnan(mask["mean"])
    assert c.loc["NPU.npu_fusion_attention.0.backward.input.1", "kind"] == "none"
    mod = c.loc["Module.module.module.language_model.encoder.layers.0.input_norm.RMSNorm.forward.0.output.0"]
    assert (mod["family"], mod["op"], mod["module_path"]) == (
        "Module", "RMSNorm", "module.module.language_model.encoder.layers.0.input_norm")
    assert mod["parent"] == "Module.module.module.language_model.encoder.layers.0.ParallelTransformerLayer.forward.0"


def test_megatron_old_stack_format_and_tree(megatron: Path):
    d = load(megatron)
    stacks = json.loads((megatron / "stack.json").read_text())
    assert d.stack("Tensor.__add__.0.forward") == stacks["Tensor.__add__.0.forward"]
    assert d.stack("NPU.npu_fusion_attention.0.backward") == []  # not in stack.json
    assert d.stacks["stack_id"].dtype == "int32" and len(d.stacks) <= len(stacks)
    layer = "Module.module.module.language_model.encoder.layers.0.ParallelTransformerLayer.forward.0"
    attn = "Module.module.module.language_model.encoder.layers.0.self_attention.ParallelAttention.forward.0"
    assert attn in d.children(layer) and "Torch.cos.0.forward" in d.children(attn)
    assert d.ancestors("Torch.cos.0.forward")[:2] == [attn, layer]
    assert d.tree["Tensor.__add__.0.forward"] == ""  # construct.json writes "" at top level here


@pytest.mark.parametrize(("dump_dir", "csv_name", "side"), [
    ("stat_L1_npu", "compare_stat_L1.csv", "NPU"),
    ("stat_L1_bench", "compare_stat_L1.csv", "Bench"),
    ("tensor_L1_npu", "compare_tensor_L1.csv", "NPU"),
])
def test_toy_rows_equal_msprobe_compare_csv(toy: Path, dump_dir: str, csv_name: str, side: str):
    rows = _csv_rows(toy / csv_name)
    d = load(toy / dump_dir)
    assert set(d.calls["name"]) == {r[f"{side} Name"] for r in rows}
    if side == "NPU":
        assert list(d.calls["name"]) == [r["NPU Name"] for r in rows]  # same order as msprobe's table
    by_name = d.calls.set_index("name")
    for r in rows:
        row = by_name.loc[r[f"{side} Name"]]
        if row["kind"] == "tensor":
            assert row["dtype"] == r[f"{side} Dtype"]
            assert list(row["shape"]) == json.loads(r[f"{side} Tensor Shape"])
            for col, key in (("max", "max"), ("min", "min"), ("mean", "mean"), ("norm", "l2norm")):
                text = r[f"{side} {key}"]
                if text in ("None", "N/A", ""):
                    assert math.isnan(row[col])
                elif text in ("True", "False"):
                    assert row[col] == (text == "True")
                else:
                    assert row[col] == pytest.approx(float(text), rel=1e-12)
        elif row["kind"] == "value":
            assert r[f"{side} Dtype"] == f"<class '{row['value_type']}'>"
        else:
            assert r[f"{side} Dtype"] == "N/A"


def test_toy_new_stack_format_matches_csv(toy: Path):
    d = load(toy / "stat_L1_npu")
    rows = _csv_rows(toy / "compare_stat_L1.csv")
    raw = json.loads((toy / "stat_L1_npu" / "stack.json").read_text())
    shared = next(v for v in raw.values() if len(v[0]) > 1)
    assert d.stack(shared[0][0]) == d.stack(shared[0][1]) == shared[1]
    checked = 0
    for r in rows:
        if r["NPU_Stack_Info"] not in ("N/A", ""):
            call = d.calls.loc[d.calls["name"] == r["NPU Name"], "call"].iloc[0]
            assert d.stack(call) == ast.literal_eval(r["NPU_Stack_Info"])
            checked += 1
    assert checked > 10
    assert d.tree and set(d.tree.values()) == {""}  # L1: construct.json is {}


def test_tensor_mode_pt_files_load(toy: Path):
    d = load(toy / "tensor_L1_npu")
    assert d.task == "tensor"
    for name in ("Torch.softmax.0.forward.input.0", "Torch.softmax.0.forward.output.0"):
        row = d.calls.set_index("name").loc[name]
        by_row, by_file = d.tensor(name), d.tensor(row["data_name"])
        assert isinstance(by_row, torch.Tensor) and torch.equal(by_row, by_file)
        assert tuple(by_row.shape) == row["shape"]
        assert by_row.max().item() == pytest.approx(row["max"])
        assert by_row.double().norm().item() == pytest.approx(row["norm"], rel=1e-5)
    with pytest.raises(FileNotFoundError, match="Functional.linear.0.forward.input.0.pt"):
        d.tensor("Functional.linear.0.forward.input.0")  # only two .pt files were kept
    with pytest.raises(KeyError, match="no saved tensor"):
        load(toy / "stat_L1_npu").tensor("Functional.linear.0.forward.input.0")


def test_calls_are_typed(toy: Path):
    c = load(toy / "stat_L1_npu").calls
    for col, (dtype, _) in COLUMNS.items():
        assert str(c[col].dtype) == ("object" if dtype == "object" else dtype), col
    assert c["max"].dtype == "float64" and c["counter"].dtype == "int32" and c["call_index"].dtype == "int64"
    row = c.set_index("name").loc["Functional.embedding.0.forward.input.0"]
    assert row["max"] == 126.0 and math.isnan(row["mean"]) and row["numel"] == 128 and not row["requires_grad"]


# ----------------------------------------------------------------------------- names and layouts
@pytest.mark.parametrize(("call", "family", "op", "path", "counter", "direction"), [
    ("Functional.linear.0.forward", "Functional", "linear", "", 0, "forward"),
    ("Tensor.__getitem__.12.backward", "Tensor", "__getitem__", "", 12, "backward"),
    ("Aten.add.Tensor.3.forward", "Aten", "add.Tensor", "", 3, "forward"),
    ("NPU.npu_fusion_attention.0.forward", "NPU", "npu_fusion_attention", "", 0, "forward"),
    ("Distributed.all_reduce.1.forward", "Distributed", "all_reduce", "", 1, "forward"),
    ("Module.block.fc.Linear.forward.2", "Module", "Linear", "block.fc", 2, "forward"),
    ("Module.layers.0.Block.backward.0", "Module", "Block", "layers.0", 0, "backward"),
    ("Module.head.Linear.parameters_grad.0", "Module", "Linear", "head", 0, "parameters_grad"),
    ("Module.head.Linear.parameters_grad", "Module", "Linear", "head", 0, "parameters_grad"),
    ("my_var.3.debug", "my_var", "", "", 3, "debug"),
])
def test_parse_call(call, family, op, path, counter, direction):
    assert parse_call(call) == {"family": family, "op": op, "module_path": path, "counter": counter,
                                "direction": direction}


def test_layouts_steps_ranks_and_proc(tmp_path: Path):
    rec = {"Torch.add.0.forward": {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]}}
    root = tmp_path / "dump"
    for step, rank in [(0, "rank0"), (0, "rank1"), (1, "rank0"), (1, "rank1"), (10, "rank2")]:
        _write_rank(root / f"step{step}" / rank, rec)
    d = load(root)
    assert d.steps == [0, 1, 10] and d.ranks == [0, 1, 2] and len(d.calls) == 10
    assert load(root / "step1").steps == [1] and load(root / "step1").ranks == [0, 1]
    assert (load(root / "step10" / "rank2").steps, load(root / "step10" / "rank2").ranks) == ([10], [2])
    assert load(root / "step10" / "rank2" / "dump.json").ranks == [2]
    assert d.select(step=1).steps == [1] and d.select(rank=[0, 2]).ranks == [0, 2]
    assert len(d.select(step=1, rank=1).calls) == 2

    proc = _write_rank(tmp_path / "other" / "step0" / "proc4242", rec)
    pd_ = load(proc.parent)
    assert pd_.ranks == [0] and any("proc4242" in n for n in pd_.meta["notes"])
    bare = tmp_path / "bare.json"
    shutil.copy(proc / "dump.json", bare)
    assert (load(bare).steps, load(bare).ranks) == ([0], [0])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpFormatError, match="no msprobe dump found"):
        find_rank_dirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError):
        load(tmp_path / "missing")


def test_values_param_grads_and_megatron_construct(tmp_path: Path):
    data = {
        "Module.head.Linear.forward.0": {
            "input_args": [_t(), [{"type": "int", "value": 1}, {"type": "slice", "value": [1, 3, None]}]],
            "input_kwargs": {"memory_format": {"type": "torch.memory_format", "format": "channels_last"},
                             "inf_max": _t(mx="inf", mn="-inf", mean="nan", norm=None)},
            "output": {"a": _t(), "b": None},
            "parameters": {"weight": _t((4, 8)), "bias": _t((4,))},
        },
        "Tensor.__getitem__.0.forward": {"input_args": [_t(), "..."], "input_kwargs": {}, "output": [_t()]},
        "Module.head.Linear.parameters_grad.0": {"weight": [_t((4, 8))], "bias": [_t((4,), mx=True, mn=False,
                                                                                     dtype="torch.bool")]},
        "Module.head.Linear.backward.0": {"input": [_t()], "output": [None, _t()]},
    }
    construct = {"megatron_micro_step_number": 2, "Module.head.Linear.forward.0": [None, 1],
                 "Tensor.__getitem__.0.forward": ["Module.head.Linear.forward.0", 1],
                 "Module.head.Linear.backward.0": [None, 1]}
    src = _write_rank(tmp_path / "src", data, level="mix", construct=construct)
    d = load(src)
    c = d.calls.set_index("name")
    assert list(d.calls["name"]) == [
        "Module.head.Linear.forward.0.input.0", "Module.head.Linear.forward.0.input.1.0",
        "Module.head.Linear.forward.0.input.1.1", "Module.head.Linear.forward.0.input.memory_format",
        "Module.head.Linear.forward.0.input.inf_max", "Module.head.Linear.forward.0.output.a",
        "Module.head.Linear.forward.0.output.b", "Module.head.Linear.forward.0.parameters.weight",
        "Module.head.Linear.forward.0.parameters.bias", "Tensor.__getitem__.0.forward.input.0",
        "Tensor.__getitem__.0.forward.input.1", "Tensor.__getitem__.0.forward.output.0",
        "Module.head.Linear.parameters_grad.0.weight", "Module.head.Linear.parameters_grad.0.bias",
        "Module.head.Linear.backward.0.input.0", "Module.head.Linear.backward.0.output.0",
        "Module.head.Linear.backward.0.output.1"]
    assert json.loads(c.loc["Module.head.Linear.forward.0.input.1.1", "value"]) == [1, 3, None]
    inf = c.loc["Module.head.Linear.forward.0.input.inf_max"]
    assert (inf["max"], inf["min"], bool(inf["is_kwarg"])) == (math.inf, -math.inf, True)
    assert math.isnan(inf["mean"]) and math.isnan(inf["norm"])
    grad = c.loc["Module.head.Linear.parameters_grad.0.bias"]
    assert (grad["direction"], grad["io"], grad["arg"], grad["max"], grad["min"]) == (
        "parameters_grad", "parameters_grad", "bias", 1.0, 0.0)
    assert c.loc["Tensor.__getitem__.0.forward.input.1", "value"] == '"..."'
    assert d.tree["Tensor.__getitem__.0.forward"] == "Module.head.Linear.forward.0"
    assert d.meta["ranks"][0]["megatron_micro_step_number"] == 2

    out = d.export_msprobe(tmp_path / "out")
    back = load(out)
    pd.testing.assert_frame_equal(d.calls, back.calls)
    written = json.loads((out / "step0" / "rank0" / "dump.json").read_text())["data"]
    assert written["Module.head.Linear.forward.0"]["input_kwargs"]["memory_format"] == \
        data["Module.head.Linear.forward.0"]["input_kwargs"]["memory_format"]
    assert written["Module.head.Linear.parameters_grad.0"]["bias"][0]["Max"] is True
    assert written["Tensor.__getitem__.0.forward"]["input_args"][1] == "..."
    assert list(written["Module.head.Linear.forward.0"]["output"]) == ["a", "b"]
    cons = json.loads((out / "step0" / "rank0" / "construct.json").read_text())
    assert cons["megatron_micro_step_number"] == 2
    assert cons["Tensor.__getitem__.0.forward"] == ["Module.head.Linear.forward.0", 1]


def test_debug_json(tmp_path: Path):
    data = {"my_var.0.debug": {"y": _t(), "k": [_t(), {"type": "int", "value": 3}]},
            "my_var_grad.0.debug": {"y": _t(), "k": [None, None]}}
    (tmp_path / "debug.json").write_text(json.dumps({"task": "statistics", "level": "debug", "data": data}))
    d = load(tmp_path)
    assert list(d.calls["name"]) == ["my_var.0.debug.y", "my_var.0.debug.k.0", "my_var.0.debug.k.1",
                                     "my_var_grad.0.debug.y", "my_var_grad.0.debug.k.0", "my_var_grad.0.debug.k.1"]
    assert set(d.calls["direction"]) == {"debug"} and d.level == "debug"
    back = load(d.export_msprobe(tmp_path / "out"))
    pd.testing.assert_frame_equal(d.calls, back.calls)


# ----------------------------------------------------------------------------- clear errors
def test_truncated_json_names_file_and_position(toy: Path, tmp_path: Path):
    text = (toy / "stat_L1_npu" / "dump.json").read_text()
    bad = tmp_path / "rank0"
    bad.mkdir()
    (bad / "dump.json").write_text(text[: len(text) // 2])
    with pytest.raises(DumpFormatError, match=r"dump\.json: invalid JSON at line \d+ column \d+.*truncated") as e:
        load(bad)
    assert str(bad / "dump.json") in str(e.value)
    (bad / "dump.json").write_text("")
    with pytest.raises(DumpFormatError, match="empty"):
        read_msprobe(bad)
    (bad / "dump.json").write_text('{"task": "statistics", "data": [1, 2]}')
    with pytest.raises(DumpFormatError, match='"data" object'):
        read_msprobe(bad)


def test_string_where_number_belongs(tmp_path: Path):
    rec = {"Functional.linear.0.forward": {"input_args": [_t(), _t(mx="big")], "input_kwargs": {}, "output": []}}
    folder = _write_rank(tmp_path / "rank0", rec)
    with pytest.raises(DumpFormatError) as e:
        load(folder)
    msg = str(e.value)
    assert str(folder / "dump.json") in msg and '["Max"]' in msg and "Functional.linear.0.forward" in msg
    assert "input_args" in msg and "'big'" in msg
    rec["Functional.linear.0.forward"]["input_args"] = [_t(shape=["2", 3])]
    _write_rank(folder, rec)
    with pytest.raises(DumpFormatError, match=r'\["shape"\].*list of integers'):
        load(folder)


def test_corrupt_stack_and_construct(tmp_path: Path):
    rec = {"Torch.add.0.forward": {"input_args": [], "input_kwargs": {}, "output": [_t()]}}
    folder = _write_rank(tmp_path / "rank0", rec, stack={"0": {"not": "a stack"}})
    with pytest.raises(DumpFormatError, match=r"stack\.json"):
        load(folder)
    folder = _write_rank(tmp_path / "rank1", rec, construct={"Torch.add.0.forward": 5})
    with pytest.raises(DumpFormatError, match=r"construct\.json.*Torch\.add\.0\.forward"):
        load(folder)


class _Payload:
    """Something that is not a tensor: loading it must never run its unpickling."""

    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pickled_object_in_pt_is_refused(tmp_path: Path):
    rec = {"Torch.add.0.forward": {"input_args": [_t(data_name="Torch.add.0.forward.input.0.pt")],
                                   "input_kwargs": {}, "output": [_t(data_name="Torch.add.0.forward.output.0.pt")]}}
    folder = _write_rank(tmp_path / "rank0", rec, task="tensor")
    (folder / "dump_tensor_data").mkdir()
    evil = folder / "dump_tensor_data" / "Torch.add.0.forward.input.0.pt"
    torch.save(_Payload(), evil)
    torch.save({"not": torch.zeros(2)}, folder / "dump_tensor_data" / "Torch.add.0.forward.output.0.pt")
    d = load(folder)
    with pytest.raises(DumpFormatError, match="cannot load the tensor safely") as e:
        d.tensor("Torch.add.0.forward.input.0")
    assert str(evil) in str(e.value)
    with pytest.raises(DumpFormatError, match="holds a dict, expected a single tensor"):
        d.tensor("Torch.add.0.forward.output.0")
    with pytest.raises(DumpFormatError, match="not a plain file name"):
        d._parts.tensor_loader("../dump.json")


def test_npy_tensors(tmp_path: Path):
    good, bad = tmp_path / "a.npy", tmp_path / "b.npy"
    np.save(good, np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(bad, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    t = load_tensor_file(good)
    assert isinstance(t, torch.Tensor) and t.shape == (2, 3)
    with pytest.raises(DumpFormatError, match="b.npy"):
        load_tensor_file(bad)


# ----------------------------------------------------------------------------- export round trips
@pytest.mark.parametrize("which", ["toy_stat", "toy_bench", "megatron"])
def test_export_round_trip(which: str, toy: Path, megatron: Path, tmp_path: Path):
    src = {"toy_stat": toy / "stat_L1_npu", "toy_bench": toy / "stat_L1_bench", "megatron": megatron}[which]
    d = load(src)
    out = d.export_msprobe(tmp_path / "exp")
    rank_dir = out / "step0" / "rank0"
    assert sorted(p.name for p in rank_dir.iterdir()) == ["construct.json", "dump.json", "stack.json"]
    written = json.loads((rank_dir / "dump.json").read_text())
    assert list(written) == ["task", "level", "framework", "dump_data_dir", "data"]
    assert written["data"] == json.loads((src / "dump.json").read_text())["data"] or which == "megatron"
    stack = json.loads((rank_dir / "stack.json").read_text())
    assert "0" in stack and all(isinstance(v[0], list) and isinstance(v[1], list) for v in stack.values())
    back = read_msprobe(out)
    pd.testing.assert_frame_equal(d.calls, Dump(back).calls)
    assert back.stacks == d.stack_frames
    assert Dump(back).tree == d.tree


def test_export_tensor_mode(toy: Path, tmp_path: Path):
    d = load(toy / "tensor_L1_npu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = d.export_msprobe(tmp_path / "exp")
    assert any("not exported" in str(w.message) for w in caught)  # the toy keeps only two .pt files
    rank_dir = out / "step0" / "rank0"
    assert sorted(p.name for p in (rank_dir / "dump_tensor_data").iterdir()) == [
        "Torch.softmax.0.forward.input.0.pt", "Torch.softmax.0.forward.output.0.pt"]
    head = json.loads((rank_dir / "dump.json").read_text())
    assert head["task"] == "tensor" and head["dump_data_dir"] == str((rank_dir / "dump_tensor_data").resolve())
    back = load(out)
    pd.testing.assert_frame_equal(d.calls, back.calls)
    saved = torch.load(rank_dir / "dump_tensor_data" / "Torch.softmax.0.forward.input.0.pt", weights_only=True)
    assert saved.is_contiguous() and not saved.requires_grad
    assert torch.equal(saved, d.tensor("Torch.softmax.0.forward.input.0"))


def test_export_multi_rank_round_trip(megatron: Path, tmp_path: Path):
    one = load(megatron)
    frames = []
    for step, rank in [(0, 0), (0, 1), (1, 0), (1, 1)]:
        part = one.calls.copy()
        part["step"], part["rank"] = step, rank
        frames.append(part)
    calls = pd.concat(frames, ignore_index=True)
    calls.loc[calls["rank"] == 1, "stack_id"] = -1  # rank 1 without stacks
    multi = Dump(DumpParts(calls=calls, stacks=one.stack_frames, construct=dict(one.tree), meta=one.meta))
    out = multi.export_msprobe(tmp_path / "exp")
    assert sorted(str(p.relative_to(out)) for p in out.glob("step*/rank*")) == [
        "step0/rank0", "step0/rank1", "step1/rank0", "step1/rank1"]
    back = load(out)
    pd.testing.assert_frame_equal(multi.calls, back.calls)
    assert back.steps == [0, 1] and back.ranks == [0, 1]
    assert repr(back).startswith("<Dump msprobe statistics mix: steps 0,1, ranks 0,1, 48 calls, 284 rows")


# ----------------------------------------------------------------------------- msprobe itself (optional)
def _msprobe_cli() -> list[str] | None:
    exe = os.environ.get("MSPROBE_BIN") or shutil.which("msprobe")
    return [exe] if exe else None


@pytest.mark.skipif(_msprobe_cli() is None, reason="msprobe (mindstudio-probe) is not installed; set MSPROBE_BIN")
def test_msprobe_compare_reads_export(toy: Path, tmp_path: Path):
    """msprobe's own compare of our exports gives msprobe's own CSV, cell for cell."""
    load(toy / "stat_L1_npu").export_msprobe(tmp_path / "npu")
    load(toy / "stat_L1_bench").export_msprobe(tmp_path / "bench")
    subprocess.run([*_msprobe_cli(), "compare", "-tp", str(tmp_path / "npu" / "step0" / "rank0" / "dump.json"),
                    "-gp", str(tmp_path / "bench" / "step0" / "rank0" / "dump.json"), "-o", str(tmp_path / "out")],
                   check=True, capture_output=True, timeout=300)
    produced = _csv_rows(next((tmp_path / "out").glob("compare_result_*.csv")))
    assert produced == _csv_rows(toy / "compare_stat_L1.csv")
