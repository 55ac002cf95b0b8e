"""The msprobe exporter's rules, pinned on tiny hand-made tables (issue 36: each test kills mutants of
store/msprobe_writer.py): statistics as msprobe writes them, tensor leaf keys and order, file names made
from dump content, nesting rebuilt from arg paths, record shapes per direction, task/level/stack/construct
files, shared and missing tensor files. Tensors are numpy arrays saved as .npy, but for the .pt files of two
tests (torch imported there only); a few seconds."""
from __future__ import annotations

import hashlib
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msprobe_nb.store.dump import Dump
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.msprobe_writer import build_records, export_msprobe, msprobe_data_name, safe_file_name
from msprobe_nb.store.schema import DumpParts

NAN = math.nan


def _row(call="Functional.relu.0.forward", io="input", arg="0", **kw) -> dict:
    c = {"call": call, "io": io, "arg": arg, "kind": "tensor", "dtype": "torch.float32", "shape": (2,),
         "numel": 2, "max": 1.0, "min": -1.0, "mean": 0.0, "norm": 2.0, "direction": "forward",
         "family": call.split(".")[0], "name": f"{call}.{io}.{arg}" if arg else f"{call}.{io}"}
    c.update(kw)
    return c


_DEFAULTS = {"step": 0, "rank": 0, "is_kwarg": False, "parent": "", "stack_id": -1, "hash": "", "value_type": "",
             "value": "", "data_name": "", "requires_grad": None, "nan_count": None, "module_path": "", "op": "",
             "counter": 0}


def _dump(rows: list[dict], *, task="statistics", level="L1", stacks=None, ranks=None, tensors=None) -> Dump:
    idx: dict[tuple, int] = {}
    for r in rows:
        for k, v in _DEFAULTS.items():
            r.setdefault(k, v)
        r.setdefault("call_index", idx.setdefault((r.get("step", 0), r.get("rank", 0), r["call"]), len(idx)))
    calls = pd.DataFrame(rows, dtype=object)
    return Dump(DumpParts(calls=calls, stacks=stacks or {}, meta={"task": task, "level": level, "ranks": ranks or []},
                          tensor_loader=None if tensors is None else tensors.__getitem__))


def _records(rows: list[dict]) -> dict:
    return build_records(_dump(rows).calls)


def _leaf(row: dict, call="Functional.relu.0.forward"):
    return _records([row])[call]["input_args"][0]


# ----------------------------------------------------------------------------- statistics and tensor leaves
def test_statistics_are_written_as_msprobe_writes_them():
    b = _leaf(_row(dtype="torch.bool", max=1.0, min=0.0, mean=0.5, norm=1.0))
    assert (b["Max"], b["Min"], b["Mean"]) == (True, False, 0.5) and type(b["Max"]) is bool
    i = _leaf(_row(dtype="torch.int64", max=3.0, min=-2.0, mean=0.5, norm=4.0))
    assert (i["Max"], i["Min"]) == (3, -2) and type(i["Max"]) is int and type(i["Mean"]) is float
    i = _leaf(_row(dtype="torch.int64", max=math.inf, min=2.5))
    assert i["Max"] == math.inf and i["Min"] == 2.5
    for dtype in ("torch.float32", "torch.complex64", "torch.half", "torch.double"):
        f = _leaf(_row(dtype=dtype, max=3.0))
        assert f["Max"] == 3.0 and type(f["Max"]) is float, dtype


@pytest.mark.parametrize("kw,written", [
    ({}, "nan"),                                                  # a float tensor: NaN may be its content
    ({"nan_count": 2}, "nan"),
    ({"nan_count": 0}, None),                                     # counted: no NaN element, so not computed
    ({"numel": 0}, None), ({"numel": None, "shape": None}, None),  # empty or unknown
    ({"dtype": "torch.int32"}, None),                             # an integer tensor holds no NaN
])
def test_a_nan_statistic_is_nan_where_the_tensor_may_hold_nan_else_null(kw, written):
    leaf = _leaf(_row(max=NAN, **kw))
    assert (leaf["Max"] if leaf["Max"] is None else "nan" if math.isnan(leaf["Max"]) else leaf["Max"]) == written


def test_tensor_leaf_keys_in_msprobe_order_and_types():
    leaf = _leaf(_row(hash="abcd", data_name="x.npy", requires_grad=True))
    assert list(leaf) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "md5", "data_name"]
    assert leaf["type"] == "torch.Tensor" and leaf["shape"] == [2] and leaf["requires_grad"] is True
    xor = _leaf(_row(hash="abcd", max=NAN, min=NAN, mean=NAN, norm=NAN))  # a summary mode: no statistics
    assert list(xor) == ["type", "dtype", "shape", "md5", "requires_grad"] and xor["requires_grad"] is None
    assert _leaf(_row(value_type="DTensor"))["type"] == "torch.Tensor"
    assert _leaf(_row(value_type="numpy.ndarray"))["type"] == "numpy.ndarray"
    assert _leaf(_row(shape=None, numel=None))["shape"] is None
    assert "md5" not in _leaf(_row())


def test_value_leaves_come_back_as_written():
    call = "Functional.relu.0.forward"
    rec = _records([_row(arg="0", kind="value", value='"..."'),
                    _row(arg="1", kind="value", value_type="int", value="3"),
                    _row(arg="2", kind="value", value_type="torch.memory_format",
                         value='{"type": "torch.memory_format", "format": "contiguous"}'),
                    _row(arg="3", kind="value", value_type="P2POp", value='{"class_type": "P2POp", "peer": 1}'),
                    _row(arg="4", kind="value", value_type="slice", value='{"type": "other"}'),
                    _row(arg="5", kind="none"),
                    _row(arg="6", kind="value", value_type="", value="")])[call]
    assert rec["input_args"] == ["...", {"type": "int", "value": 3},
                                 {"type": "torch.memory_format", "format": "contiguous"},
                                 {"class_type": "P2POp", "peer": 1}, {"type": "slice", "value": {"type": "other"}},
                                 None, None]


# ----------------------------------------------------------------------------- file names
def test_data_names_keep_msprobe_file_names_and_others_become_row_names():
    assert msprobe_data_name("", "a.b") == ""
    assert msprobe_data_name("x.pt", "row") == "x.pt" and msprobe_data_name("x.npy", "row") == "x.npy"
    assert msprobe_data_name("x.bin", "r.input.0") == "r.input.0.pt"
    assert msprobe_data_name("step0/x.pt", "r/input.0") == "r_input.0.pt"
    assert msprobe_data_name("..", "r") == "r.pt"


def test_safe_file_names_stay_in_their_folder_and_long_ones_stay_distinct():
    assert safe_file_name("a/b\\c\x1f\x7f\udc80 d\x80é") == "a_b_c___ d\x80é"
    assert safe_file_name("x" * 200) == "x" * 200
    name = "x" * 201
    cut = safe_file_name(name)
    assert cut == "x" * 183 + "-" + hashlib.sha256(name.encode()).hexdigest()[:16] and len(cut) == 200
    long = "é" * 150  # 300 bytes: cut on a character boundary
    cut = safe_file_name(long)
    assert cut == "é" * 91 + "-" + hashlib.sha256(long.encode()).hexdigest()[:16]
    assert safe_file_name("y" * 40, limit=30) == "y" * 13 + "-" + hashlib.sha256(b"y" * 40).hexdigest()[:16]


# ----------------------------------------------------------------------------- nesting and records
def test_arg_paths_rebuild_lists_with_gaps_and_dicts():
    call = "Functional.relu.0.forward"
    rec = _records([_row(arg="0"), _row(arg="2.1"), _row(arg="3.a"), _row(arg="3.01"), _row(arg="3.²")])[call]
    args = rec["input_args"]
    assert len(args) == 4 and args[1] == [] and args[2][0] == [] and args[2][1]["type"] == "torch.Tensor"
    assert list(args[3]) == ["a", "01", "²"]


@pytest.mark.parametrize("index,kind", [("1039", list), ("1040", dict), ("999999999", dict), ("1234567890", dict)])
def test_a_lone_far_index_makes_a_dict_not_a_huge_list(index, kind):
    call = "Functional.relu.0.forward"
    out = _records([_row(arg="0"), _row(arg=f"1.{index}")])[call]["input_args"][1]
    assert type(out) is kind
    if kind is list:
        assert len(out) == int(index) + 1 and all(x == [] for x in out[:-1])


def test_arg_paths_that_cannot_be_rebuilt_are_refused_naming_the_call():
    with pytest.raises(ValueError, match="a leaf and a container share the same arg path"):
        _records([_row(arg="0"), _row(arg="0.1")])
    with pytest.raises(ValueError, match="Functional.relu.0.forward input_args: args are not positions"):
        _records([_row(arg="a")])


def test_records_take_msprobe_shapes_per_direction():
    fwd = "Module.net.Linear.forward.0"
    rows = [_row(fwd, "output", "0"), _row(fwd, "input", "0"), _row(fwd, "input", "dim", is_kwarg=True),
            _row(fwd, "parameters", "weight")]
    assert list(_records(rows)[fwd]) == ["input_args", "input_kwargs", "output", "parameters"]
    assert list(_records([_row(fwd, "output", "0")])[fwd]) == ["input_args", "input_kwargs", "output"]
    assert _records([_row(fwd, "output", "0")])[fwd]["input_kwargs"] == {}
    bwd = "Module.net.Linear.backward.0"
    rec = _records([_row(bwd, "output", "0", direction="backward"), _row(bwd, "input", "0", direction="backward")])
    assert list(rec[bwd]) == ["input", "output"]
    assert _records([_row(bwd, "output", "0", direction="backward")])[bwd]["input"] == []
    grad = "Module.net.Linear.parameters_grad"
    rec = _records([_row(grad, "parameters_grad", "weight", direction="parameters_grad", name=f"{grad}.weight"),
                    _row(grad, "parameters_grad", "bias.0", direction="parameters_grad"),
                    _row(grad, "parameters_grad", "bias.1", direction="parameters_grad")])[grad]
    assert list(rec) == ["weight", "bias"] and len(rec["weight"]) == 1 and len(rec["bias"]) == 2
    dbg = "my_var.0.debug"
    rec = _records([_row(dbg, "y", "", direction="debug"), _row(dbg, "k", "0", direction="debug")])[dbg]
    assert list(rec) == ["y", "k"] and rec["y"]["type"] == "torch.Tensor" and len(rec["k"]) == 1


def test_records_follow_call_index_and_keep_each_calls_rows_together():
    a, b = "Functional.relu.0.forward", "Functional.gelu.0.forward"
    rows = [_row(b, call_index=1), _row(a, call_index=0), _row(b, "output", call_index=1)]
    data = build_records(_dump(rows).calls)
    assert list(data) == [a, b] and list(data[b]) == ["input_args", "input_kwargs", "output"]
    assert len(data[b]["output"]) == 1


# ----------------------------------------------------------------------------- files
def _read(out: Path, name: str, step=0, rank=0):
    return json.loads((out / f"step{step}" / f"rank{rank}" / name).read_text(encoding="utf-8"))


def test_task_and_level_from_the_dump_or_from_its_calls(tmp_path):
    mod, api = "Module.net.Linear.forward.0", "Functional.relu.0.forward"
    cases = [("tensor", "L0", [api], "tensor", "L0"), ("", "", [api], "statistics", "L1"),
             ("md5", "x", [mod], "statistics", "L0"), ("", "", [mod, api], "statistics", "mix"),
             ("debug", "debug", [api], "statistics", "debug"), ("statistics", "mix", [api], "statistics", "mix")]
    for i, (task, level, calls, want_task, want_level) in enumerate(cases):
        out = export_msprobe(_dump([_row(c) for c in calls], task=task, level=level), tmp_path / str(i))
        head = _read(out, "dump.json")
        assert (head["task"], head["level"], head["framework"], head["dump_data_dir"]) == (
            want_task, want_level, "pytorch", None), (task, level, calls)
    tensors = {"x.npy": np.arange(2.0)}
    out = export_msprobe(_dump([_row(data_name="x.npy")], task="", tensors=tensors), tmp_path / "t")
    head = _read(out, "dump.json")
    assert head["task"] == "tensor" and head["dump_data_dir"] == str((out / "step0/rank0/dump_tensor_data").resolve())


def test_stack_json_is_renumbered_from_zero_and_skips_calls_without_a_stack(tmp_path):
    a, b, c, d = (f"Functional.f{i}.0.forward" for i in range(4))
    rows = [_row(a, stack_id=7), _row(b, stack_id=3), _row(c, stack_id=-1), _row(d, stack_id=9), _row(a, "output")]
    out = export_msprobe(_dump(rows, stacks={3: ["f3"], 7: ["f7", "g7"], 0: ["unused"]}), tmp_path / "o")
    assert _read(out, "stack.json") == {"0": [[b], ["f3"]], "1": [[a], ["f7", "g7"]]}


def test_construct_json_parents_and_micro_steps(tmp_path):
    a, b = "Functional.relu.0.forward", "Module.net.Linear.forward.0"
    out = export_msprobe(_dump([_row(a)], level="L1"), tmp_path / "l1")
    assert _read(out, "construct.json") == {}
    ranks = [{"step": 0, "rank": 0, "micro_step": {a: 1}, "megatron_micro_step_number": 2}]
    out = export_msprobe(_dump([_row(b), _row(a, parent=b)], level="L1", ranks=ranks), tmp_path / "p")
    cons = _read(out, "construct.json")
    assert list(cons) == ["megatron_micro_step_number", b, a]
    assert cons == {"megatron_micro_step_number": 2, b: None, a: [b, 1]}
    out = export_msprobe(_dump([_row(b)], level="L0"), tmp_path / "l0")
    assert _read(out, "construct.json") == {b: None}


def test_json_is_utf8_and_lone_surrogates_become_escapes(tmp_path):
    out = export_msprobe(_dump([_row(kind="value", value='"é"', arg="0")]), tmp_path / "u")
    raw = (out / "step0/rank0/dump.json").read_bytes()
    assert '"é"'.encode() in raw and b"\n \"task\"" in raw  # indent 1
    out = export_msprobe(_dump([_row(kind="value", value='"\\udc80"', arg="0")]), tmp_path / "s")
    raw = (out / "step0/rank0/dump.json").read_bytes()
    assert b'"\\udc80"' in raw and raw.isascii() and b"\n \"task\"" in raw


def test_shared_tensors_are_copied_missing_ones_warned_and_tensors_false_writes_none(tmp_path):
    torch = pytest.importorskip("torch")
    tensors = {"step0/a": torch.arange(3.0), "step0/b": torch.ones(2)}
    rows = [_row(arg="0", data_name="step0/a"), _row(arg="1", data_name="step0/a"),
            _row(arg="2", data_name="step0/gone"), _row(arg="3", data_name="step0/gone"),
            _row(arg="4", data_name="step0/b")]

    def loader(key):
        if key not in tensors:
            raise FileNotFoundError(key)
        return tensors[key]

    d = _dump(rows, task="tensor", tensors={})
    d._parts.tensor_loader = loader
    with pytest.warns(UserWarning, match=r"2 tensor file\(s\) absent from the source were not exported, e\.g\. "
                                         r"step0/rank0/dump_tensor_data/Functional.relu.0.forward.input.2.pt"):
        out = export_msprobe(d, tmp_path / "o")
    files = out / "step0/rank0/dump_tensor_data"
    assert sorted(p.name for p in files.iterdir()) == [f"Functional.relu.0.forward.input.{i}.pt" for i in (0, 1, 4)]
    assert torch.load(files / "Functional.relu.0.forward.input.1.pt", weights_only=True).tolist() == [0.0, 1.0, 2.0]
    out = export_msprobe(d, tmp_path / "n", tensors=False)
    assert not (out / "step0/rank0/dump_tensor_data").exists()
    assert _read(out, "dump.json")["dump_data_dir"] is not None


def test_npy_tensors_are_saved_as_numpy(tmp_path):
    d = _dump([_row(data_name="x.npy")], task="tensor", tensors={"x.npy": np.arange(3.0)})
    out = export_msprobe(d, tmp_path / "o")
    assert np.load(out / "step0/rank0/dump_tensor_data/x.npy", allow_pickle=False).tolist() == [0.0, 1.0, 2.0]


def test_every_step_and_rank_gets_its_folder(tmp_path):
    rows = [_row(step=0, rank=0), _row(step=0, rank=1), _row(step=2, rank=0)]
    out = export_msprobe(_dump(rows), tmp_path / "o")
    assert sorted(str(p.relative_to(out)) for p in out.glob("step*/rank*/dump.json")) == [
        "step0/rank0/dump.json", "step0/rank1/dump.json", "step2/rank0/dump.json"]


# ----------------------------------------------------------------------------- edges
def test_safe_file_names_keep_characters_past_the_surrogates():
    assert safe_file_name("\ud800\udfff\ue000\uffff😀") == "__\ue000\uffff😀"


def test_object_arrays_are_never_pickled_into_npy_files(tmp_path):
    d = _dump([_row(data_name="x.npy")], task="tensor", tensors={"x.npy": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="Object arrays cannot be saved when allow_pickle=False"):
        export_msprobe(d, tmp_path / "o")


def _gone(key):
    raise FileNotFoundError(key)


def test_the_missing_tensors_warning_names_the_callers_line(tmp_path):
    d = _dump([_row(data_name="gone.npy")], task="tensor", tensors={})
    d._parts.tensor_loader = _gone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_msprobe(d, tmp_path / "o")
    assert [w.filename for w in caught] == [__file__]


def test_a_dtensor_shard_read_from_a_file_is_written_as_a_plain_tensor():
    assert _leaf(_row(value_type="".join(["D", "Tensor"])))["type"] == "torch.Tensor"  # not an interned literal


def test_an_l1_dump_read_from_a_file_gets_an_empty_construct_json(tmp_path):
    level = "".join(["L", "1"])  # as read from a file: not the interned literal
    out = export_msprobe(_dump([_row()], level=level), tmp_path / "o")
    assert _read(out, "construct.json") == {}


@pytest.mark.parametrize("args,kind,length", [
    ([str(i) for i in range(63)] + ["2000"], list, 2001),  # 64 items: a far index up to 16 * 64 + 1024 is a list
    (["0", "1055"], list, 1056), (["0", "1056"], dict, 2),
])
def test_how_far_an_index_may_reach_grows_with_the_number_of_items(args, kind, length):
    call = "Functional.relu.0.forward"
    out = _records([_row(arg=f"0.{a}") for a in args])[call]["input_args"][0]
    assert type(out) is kind and len(out) == length


def test_rows_sharing_a_tensor_file_name_write_it_once(tmp_path):
    d = _dump([_row(arg="0", data_name="x.npy"), _row(arg="1", data_name="x.npy")], task="tensor",
              tensors={"x.npy": np.arange(2.0)})
    out = export_msprobe(d, tmp_path / "o")
    assert [p.name for p in (out / "step0/rank0/dump_tensor_data").iterdir()] == ["x.npy"]
    assert [a["data_name"] for a in _read(out, "dump.json")["data"]["Functional.relu.0.forward"]["input_args"]] == [
        "x.npy", "x.npy"]


def test_a_tensor_row_read_from_a_file_is_written_as_a_tensor():
    assert _leaf(_row(kind="".join(["ten", "sor"])))["type"] == "torch.Tensor"  # not the interned literal


def test_recompute_and_undirected_calls_keep_their_io_keys_as_they_are():
    rec = "Functional.relu.0.recompute"
    got = _records([_row(rec, "input", "0", direction="recompute"), _row(rec, "output", "0", direction="recompute")])
    assert list(got[rec]) == ["input", "output"] and len(got[rec]["input"]) == 1
    plain = "Distributed.barrier"
    got = _records([_row(plain, "input", "0", direction="")])
    assert list(got[plain]) == ["input"] and len(got[plain]["input"]) == 1


def test_exporting_again_into_the_same_folder_overwrites_it(tmp_path):
    d = _dump([_row(data_name="x.npy")], task="tensor", tensors={"x.npy": np.arange(2.0)})
    first = export_msprobe(d, tmp_path / "o")
    again = export_msprobe(d, tmp_path / "o")
    assert first == again and np.load(again / "step0/rank0/dump_tensor_data/x.npy").tolist() == [0.0, 1.0]


def test_a_statistics_dump_writes_no_tensor_files_and_tensors_is_keyword_only(tmp_path):
    d = _dump([_row(data_name="x.npy")], task="statistics", tensors={"x.npy": np.arange(2.0)})
    out = export_msprobe(d, tmp_path / "o")
    assert _read(out, "dump.json")["dump_data_dir"] is None
    assert not (out / "step0/rank0/dump_tensor_data").exists()
    with pytest.raises(TypeError):
        export_msprobe(d, tmp_path / "p", False)


def test_the_missing_tensors_warning_gives_the_first_step_and_rank_as_its_example(tmp_path):
    rows = [_row(step=1, rank=1, data_name="a.npy"), _row(step=1, rank=0, data_name="b.npy"),
            _row(step=0, rank=1, data_name="c.npy")]
    d = _dump(rows, task="tensor", tensors={})
    d._parts.tensor_loader = _gone
    with pytest.warns(UserWarning, match=r"3 tensor file\(s\) .* e\.g\. step0/rank1/dump_tensor_data/c\.npy$"):
        export_msprobe(d, tmp_path / "o")


def test_two_tensors_meeting_in_one_file_name_are_refused_naming_both_rows(tmp_path):
    a, b = "a/b.0.forward", "a_b.0.forward"
    d = _dump([_row(a, data_name=f"step0/{a}.input.0"), _row(b, data_name=f"step0/{b}.input.0")], task="tensor",
              tensors={})
    with pytest.raises(DumpFormatError) as e:
        export_msprobe(d, tmp_path / "o")
    assert str(e.value) == (f"records '{a}.input.0' and '{b}.input.0' (step 0, rank 0) would both be saved as "
                            f"dump_tensor_data/{b}.input.0.pt; nothing was exported")
    assert not (tmp_path / "o").exists()


def test_mix_level_with_families_after_module_in_sort_order(tmp_path):
    rows = [_row("Module.net.Linear.forward.0"), _row("Tensor.add.0.forward"), _row("Torch.mul.0.forward")]
    out = export_msprobe(_dump(rows, level=""), tmp_path / "o")
    assert _read(out, "dump.json")["level"] == "mix"


def test_a_planted_symlink_for_dump_json_is_refused_and_its_target_kept(tmp_path):
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    for name in ("dump.json", "stack.json", "construct.json"):
        rank = tmp_path / name / "o" / "step0" / "rank0"
        rank.mkdir(parents=True)
        (rank / name).symlink_to(victim)
        with pytest.raises(DumpFormatError, match="outside the output folder"):
            export_msprobe(_dump([_row()]), tmp_path / name / "o")
        assert victim.read_text() == "keep me"


def test_rows_sharing_a_tensor_key_read_from_a_file_write_it_once(tmp_path):
    keys = ["".join(["x", ".npy"]) for _ in range(2)]  # equal keys, distinct objects, as read from a file
    d = _dump([_row(arg="0", data_name=keys[0]), _row(arg="1", data_name=keys[1])], task="tensor",
              tensors={"x.npy": np.arange(2.0)})
    out = export_msprobe(d, tmp_path / "o")
    assert [p.name for p in (out / "step0/rank0/dump_tensor_data").iterdir()] == ["x.npy"]


def test_a_file_name_collision_is_refused_whichever_row_comes_first(tmp_path):
    a, b = "a_b.0.forward", "a/b.0.forward"
    d = _dump([_row(a, data_name=f"step0/{a}.input.0"), _row(b, data_name=f"step0/{b}.input.0")], task="tensor",
              tensors={})
    with pytest.raises(DumpFormatError, match=f"records '{a}.input.0' and '{b}.input.0'"):
        export_msprobe(d, tmp_path / "o")


def _fresh(text: str) -> str:
    """``text`` as a new string object, as a value read from a file is (not the interned literal)."""
    return "".join(list(text))


def test_kinds_and_directions_read_from_a_file_are_written_alike():
    assert _leaf(_row(kind=_fresh("value"), value_type="int", value="3")) == {"type": "int", "value": 3}
    bwd = "Module.net.Linear.backward.0"
    rec = _records([_row(bwd, "output", "0", direction=_fresh("backward"))])[bwd]
    assert list(rec) == ["input", "output"] and rec["input"] == []


def test_tensor_type_names_other_than_a_dtensor_are_kept():
    for typ in ("AsyncCollectiveTensor", "numpy.ndarray", "Bfloat16Tensor"):
        assert _leaf(_row(value_type=typ))["type"] == typ


def test_a_parameter_leaf_and_a_container_at_one_name_are_refused():
    grad = "Module.net.Linear.parameters_grad"
    with pytest.raises(ValueError, match="a leaf and a container share the same arg path"):
        _records([_row(grad, "parameters_grad", "weight", direction="parameters_grad"),
                  _row(grad, "parameters_grad", "weight.1", direction="parameters_grad")])


def test_api_only_dumps_are_l1_and_a_mix_dump_lists_every_call_in_construct_json(tmp_path):
    out = export_msprobe(_dump([_row("Torch.mul.0.forward"), _row("Tensor.add.0.forward")], level=""),
                         tmp_path / "l1")
    assert _read(out, "dump.json")["level"] == "L1"
    a, b = "Module.net.Linear.forward.0", "Torch.mul.0.forward"
    out = export_msprobe(_dump([_row(a), _row(b)], level="mix"), tmp_path / "mix")
    assert _read(out, "construct.json") == {a: None, b: None}


def test_calls_past_index_256_keep_all_their_rows():
    a = "Functional.relu.0.forward"
    rows = [_row(a, "input", "0", call_index=300), _row(a, "output", "0", call_index=300)]
    rec = build_records(_dump(rows).calls)[a]
    assert len(rec["input_args"]) == 1 and len(rec["output"]) == 1


def test_a_shared_tensor_is_copied_whichever_file_name_sorts_first(tmp_path):
    torch = pytest.importorskip("torch")
    rows = [_row(arg="1", data_name="step0/a"), _row(arg="0", data_name="step0/a")]
    d = _dump(rows, task="tensor", tensors={"step0/a": torch.arange(2.0)})
    out = export_msprobe(d, tmp_path / "o")
    files = out / "step0/rank0/dump_tensor_data"
    assert sorted(p.name for p in files.iterdir()) == ["Functional.relu.0.forward.input.0.pt",
                                                       "Functional.relu.0.forward.input.1.pt"]


def test_the_last_character_before_the_surrogates_is_kept():
    assert safe_file_name("\ud7ff") == "\ud7ff"


def test_digit_keys_with_a_leading_zero_stay_dict_keys():
    call = "Functional.relu.0.forward"
    out = _records([_row(arg="0.01"), _row(arg="0.02")])[call]["input_args"][0]
    assert type(out) is dict and list(out) == ["01", "02"]


def test_through_dump_export_msprobe_the_missing_tensors_warning_names_the_callers_line(tmp_path):
    d = _dump([_row(data_name="gone.npy")], task="tensor", tensors={})
    d._parts.tensor_loader = _gone
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        d.export_msprobe(tmp_path / "o")
    assert [w.filename for w in caught] == [__file__]
