"""The msprobe reader's rules, pinned on tiny hand-written dumps (issue 36: each test kills mutants of
store/msprobe_reader.py that the format tests let through): call-name shapes, an empty dump's columns, leaf
kinds and their values, shapes, the error messages naming the file and the JSON path, stack.json and
construct.json forms, the notes on ranks that disagree. No torch model; the whole file runs in about two seconds."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from msprobe_nb.store.msprobe_reader import DumpFormatError, parse_call, read_json, read_msprobe
from msprobe_nb.store.schema import COLUMN_NAMES

CALL = "Functional.relu.0.forward"


def _dump(folder: Path, data: dict, *, task="statistics", level="L1", framework="pytorch", stack=None,
          construct=None, dump_data_dir=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dump.json").write_text(json.dumps({"task": task, "level": level, "framework": framework,
                                                  "dump_data_dir": dump_data_dir, "data": data}, ensure_ascii=False),
                                      encoding="utf-8")
    if stack is not None:
        (folder / "stack.json").write_text(json.dumps(stack))
    if construct is not None:
        (folder / "construct.json").write_text(json.dumps(construct))
    return folder


def _t(shape=(2, 3), **extra) -> dict:
    shape = list(shape) if isinstance(shape, tuple) else shape
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": 1.0, "Min": -1.0, "Mean": 0.0,
            "Norm": 2.0, "requires_grad": False, **extra}


def _rows(tmp_path: Path, record: dict, call: str = CALL, **kw):
    return read_msprobe(_dump(tmp_path / "d", {call: record}, **kw)).calls


def _refused(tmp_path: Path, record: dict, call: str = CALL, **kw) -> str:
    folder = _dump(tmp_path / "d", {call: record}, **kw)
    with pytest.raises(DumpFormatError) as e:
        read_msprobe(folder)
    msg = str(e.value)
    assert msg.startswith(str(folder / "dump.json")), msg
    return msg


# ----------------------------------------------------------------------------- call names
@pytest.mark.parametrize("call,family,op,module_path,counter,direction", [
    ("Module.net.Linear.forward.7", "Module", "Linear", "net", 7, "forward"),  # odd position of the direction
    ("Module.Linear.forward.2", "Module", "Linear", "", 2, "forward"),          # the root module
    ("Cell.a.b.Dense.backward.3", "Cell", "Dense", "a.b", 3, "backward"),
    ("Module.net.Linear.parameters_grad", "Module", "Linear", "net", 0, "parameters_grad"),
    ("Module.net.Linear.forward.7.x", "Module", "Linear", "net", 0, "forward"),  # no counter after two tokens
    ("Module.backward.1", "Module", "backward.1", "", 0, ""),                  # no class: kept as text
    ("Functional.linear.123456789.forward", "Functional", "linear", "", 123456789, "forward"),  # 9 digits
    ("Functional.linear.9999999999.forward", "Functional", "linear.9999999999.forward", "", 0, ""),  # > int32
    ("Aten.add.Tensor.4.backward", "Aten", "add.Tensor", "", 4, "backward"),
    ("model.layer.0.debug", "model", "layer", "", 0, "debug"),                  # debug.json "<name>.<n>.debug"
    ("grad.norm.3.debug", "grad", "norm", "", 3, "debug"),
    ("Distributed.all_reduce", "Distributed", "all_reduce", "", 0, ""),
    # odd names are kept as text, never a crash
    ("forward", "forward", "", "", 0, ""),
    ("7.debug", "7", "debug", "", 0, ""),
    ("0.0.0.x.forward", "0", "0.0.x.forward", "", 0, ""),
    ("Functional.linear.0.x.forward", "Functional", "linear.0.x.forward", "", 0, ""),
])
def test_call_names_split_into_family_op_module_path_counter_and_direction(call, family, op, module_path, counter,
                                                                           direction):
    assert parse_call(call) == {"family": family, "op": op, "module_path": module_path, "counter": counter,
                                "direction": direction}


# ----------------------------------------------------------------------------- tables
def test_an_empty_dump_reads_as_an_empty_table_with_every_column(tmp_path):
    calls = read_msprobe(_dump(tmp_path / "d", {})).calls
    assert list(calls.columns) == COLUMN_NAMES and len(calls) == 0


def test_row_names_io_and_kwargs_of_every_record_key(tmp_path):
    calls = _rows(tmp_path, {"input_args": [_t()], "input_kwargs": {"dim": _t()}, "output": [_t()],
                             "parameters": {"weight": _t()}, "input": [_t()], "gradient": [_t()]},
                  call="Module.net.Linear.forward.0")
    got = {n: (io, k) for n, io, k in zip(calls["name"], calls["io"], calls["is_kwarg"], strict=True)}
    c = "Module.net.Linear.forward.0"
    assert got == {f"{c}.input.0": ("input", False), f"{c}.input.dim": ("input", True),
                   f"{c}.output.0": ("output", False), f"{c}.parameters.weight": ("parameters", False),
                   f"{c}.gradient.0": ("gradient", False)} and len(calls) == 6  # input and input_args share names


def test_parameter_gradients_are_named_by_parameter_and_never_kwargs(tmp_path):
    c = "Module.net.Linear.parameters_grad"
    calls = _rows(tmp_path, {"weight": [_t()], "bias": [_t(), _t()], "scale": None, "empty": []}, call=c)
    assert list(calls["name"]) == [f"{c}.weight", f"{c}.bias.0", f"{c}.bias.1", f"{c}.scale"]
    assert list(calls["io"]) == ["parameters_grad"] * 4 and not calls["is_kwarg"].any()
    assert list(calls["kind"]) == ["tensor", "tensor", "tensor", "none"]


def test_a_recompute_call_keeps_its_input_and_output_rows(tmp_path):
    c = "Functional.relu.0.recompute"
    calls = _rows(tmp_path, {"input_args": [_t()], "output": [_t()]}, call=c)
    assert list(calls["name"]) == [f"{c}.input.0", f"{c}.output.0"]
    assert list(calls["direction"]) == ["recompute"] * 2


def test_tensor_leaves_shapes_stats_and_value_types(tmp_path):
    calls = _rows(tmp_path, {"input_args": [
        _t(), {**_t((4,)), "type": "numpy.ndarray"}, {**_t((1,)), "type": "mindspore.Tensor"},
        {"type": "torch.nn.Parameter", "dtype": "torch.float16", "shape": [5]},  # dtype and shape: a tensor
        {"type": "torch.Tensor", "dtype": "torch.float32", "Max": 3.0},         # a tensor without shape
        {"type": "torch.Tensor", "dtype": None, "md5": None, "data_name": None, "shape": [1]},
    ]})
    assert list(calls["kind"]) == ["tensor"] * 6
    assert list(calls["value_type"]) == ["", "numpy.ndarray", "mindspore.Tensor", "torch.nn.Parameter", "", ""]
    assert list(calls["shape"]) == [(2, 3), (4,), (1,), (5,), None, (1,)]
    assert list(calls["numel"].astype(object).where(calls["numel"].notna(), None)) == [6, 4, 1, 5, None, 1]
    assert list(calls["dtype"]) == ["torch.float32"] * 3 + ["torch.float16", "torch.float32", ""]
    assert calls["hash"].iloc[5] == "" and calls["data_name"].iloc[5] == ""
    assert calls["max"].iloc[4] == 3.0 and np.isnan(calls["min"].iloc[4])


def test_the_largest_shape_int64_holds_reads_and_one_more_element_is_refused(tmp_path):
    calls = _rows(tmp_path, {"input_args": [_t((2 ** 63 - 1,)), _t((3, 0, 2 ** 64))]})
    assert list(calls["numel"]) == [2 ** 63 - 1, 0]
    for shape in ([2 ** 63], [2 ** 62, 2]):
        msg = _refused(tmp_path, {"input_args": [_t(shape)]})
        assert f'data["{CALL}"]["input_args"][0]["shape"] is {shape}: more elements than any tensor' in msg


@pytest.mark.parametrize("shape,why", [([-1], "a dimension is negative"), ([3, -1], "a dimension is negative"),
                                       (5, "expected a list of integers"), ("2,3", "expected a list of integers"),
                                       ([2, True], "expected a list of integers")])
def test_a_bad_shape_is_refused_naming_its_path(tmp_path, shape, why):
    msg = _refused(tmp_path, {"input_args": [_t(shape)]})
    assert f'data["{CALL}"]["input_args"][0]["shape"] is ' in msg and why in msg


def test_a_bad_requires_grad_or_text_field_is_refused_naming_its_path(tmp_path):
    msg = _refused(tmp_path, {"input_args": [_t(requires_grad="yes")]})
    assert f'data["{CALL}"]["input_args"][0]["requires_grad"] is \'yes\', expected true/false' in msg
    msg = _refused(tmp_path, {"input_args": [_t(dtype=5, md5=5)]})
    assert f'data["{CALL}"]["input_args"][0]["dtype"] is 5, expected a string' in msg
    msg = _refused(tmp_path, {"input_args": [_t(dtype=5, md5=5, data_name=5)]})
    assert f'data["{CALL}"]["input_args"][0]["dtype"] is 5, expected a string' in msg


def test_value_leaves_keep_their_text_unescaped_and_odd_records_whole(tmp_path):
    calls = _rows(tmp_path, {"input_args": [
        "é…", {"type": "str", "value": "日本"}, {"type": "slice", "value": [0, 2, None], "note": "é"},
        {"type": "int", "value": 3, "dtype": "int64"}, {"class_type": "MyCfg", "value": 1}]})
    assert list(calls["kind"]) == ["value"] * 5
    assert list(calls["value"]) == ['"é…"', '"日本"', '{"type": "slice", "value": [0, 2, null], "note": "é"}',
                                    '{"type": "int", "value": 3, "dtype": "int64"}',
                                    '{"class_type": "MyCfg", "value": 1}']
    assert list(calls["value_type"]) == ["", "str", "slice", "int", "MyCfg"]


def test_record_values_of_the_wrong_kind_are_refused(tmp_path):
    msg = _refused(tmp_path, {"input_kwargs": [_t()]})
    assert f'data["{CALL}"]["input_kwargs"] is ' in msg and "expected an object" in msg
    msg = _refused(tmp_path, {"input_args": {"x": _t()}})
    assert f'data["{CALL}"]["input_args"] is ' in msg and "expected a list" in msg


def _nested(k: int, leaf):
    for _ in range(k):
        leaf = [leaf]
    return leaf


def test_arguments_nested_up_to_the_depth_limit_read_and_deeper_is_refused(tmp_path):
    calls = _rows(tmp_path, {"input_args": _nested(99, _t())})  # the tensor 100 keys deep
    assert list(calls["arg"]) == [".".join(["0"] * 99)]
    msg = _refused(tmp_path, {"input_args": _nested(100, _t())})
    assert f'data["{CALL}"]["input_args"][0][0]... nests deeper than 100 levels' in msg


def test_a_value_nested_up_to_the_depth_limit_reads_and_deeper_is_refused(tmp_path):
    calls = _rows(tmp_path, {"input_args": [{"type": "list", "value": _nested(97, 1)}]})
    assert calls["value"].iloc[0] == json.dumps(_nested(97, 1))
    msg = _refused(tmp_path, {"input_args": [{"type": "list", "value": _nested(98, 1)}]})
    assert f'data["{CALL}"]["input_args"][0]... nests deeper than 100 levels' in msg


# ----------------------------------------------------------------------------- JSON files
def test_read_json_names_what_is_wrong(tmp_path):
    f = tmp_path / "x.json"
    f.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(DumpFormatError, match=r"not UTF-8 text \(byte 7\)"):
        read_json(f)
    f.write_text('{"data": {\n')
    with pytest.raises(DumpFormatError, match=r"invalid JSON at line 2 column 1: .*\(the file looks truncated\)"):
        read_json(f)
    f.write_text('{"data": {"a": x}}\n')
    with pytest.raises(DumpFormatError) as e:
        read_json(f)
    assert "invalid JSON at line 1 column 16: Expecting value" in str(e.value) and "truncated" not in str(e.value)
    f.write_text('{"a": %s}' % ("1" * 5000))
    with pytest.raises(DumpFormatError) as e:
        read_json(f)
    assert str(e.value) == (f"{f}: a number has too many digits to read (Exceeds the limit (4300 digits) for "
                            "integer string conversion: value has 5000 digits)")
    f.write_text('{"a": 1, "b": 2, "a": 3}')
    with pytest.raises(DumpFormatError, match="key 'a' appears twice in one object"):
        read_json(f)
    big = {f"k{i}": i for i in range(300)}  # more keys than small ints: no false duplicate
    f.write_text(json.dumps(big))
    assert read_json(f) == big


@pytest.mark.parametrize("entry", [[["c"]], [["c"], ["f"], ["g"]], [CALL, ["frame"]], [[CALL], "frame text"]])
def test_a_stack_entry_of_neither_form_is_refused(tmp_path, entry):
    folder = _dump(tmp_path / "d", {CALL: {"input_args": [_t()]}}, stack={"0": entry})
    with pytest.raises(DumpFormatError, match=r"stack.json: \['0'\] is neither \[\[calls\], \[frames\]\]"):
        read_msprobe(folder)


def test_both_stack_forms_give_each_call_its_frames(tmp_path):
    other = "Functional.gelu.0.forward"
    new = {"0": [[CALL, other], ["File a.py, line 1", "File b.py, line 2"]]}
    old = {CALL: ["File a.py, line 1", "File b.py, line 2"], other: ["File c.py, line 3"]}
    for stack, ids in ((new, [0, 0]), (old, [0, 1])):
        parts = read_msprobe(_dump(tmp_path / "d", {CALL: {"input_args": [_t()]}, other: {"input_args": [_t()]}},
                                   stack=stack))
        assert list(parts.calls["stack_id"]) == ids
        assert parts.stacks[0] == ["File a.py, line 1", "File b.py, line 2"]


@pytest.mark.parametrize("value", [["Module.a.A.forward.0"], ["Module.a.A.forward.0", 1, 2],
                                   ["Module.a.A.forward.0", [1]], 5])
def test_a_construct_entry_of_no_known_form_is_refused(tmp_path, value):
    folder = _dump(tmp_path / "d", {CALL: {"input_args": [_t()]}}, construct={CALL: value})
    with pytest.raises(DumpFormatError, match="expected a parent call name, null or"):
        read_msprobe(folder)


def test_construct_parents_micro_steps_and_user_named_calls(tmp_path):
    debug = "z_probe.0.debug"  # sorts after megatron_micro_step_number: still a call
    parent = "Module.a.A.forward.0"
    parts = read_msprobe(_dump(tmp_path / "d", {CALL: {"input_args": [_t()]}, debug: {"input_args": [_t()]}},
                               construct={CALL: [parent, 3], debug: parent, "megatron_micro_step_number": 2}))
    assert parts.construct == {CALL: parent, debug: parent}
    assert list(parts.calls["parent"]) == [parent, parent]
    rank = parts.meta["ranks"][0]
    assert rank["micro_step"] == {CALL: 3} and rank["megatron_micro_step_number"] == 2


# ----------------------------------------------------------------------------- ranks and loading
def test_ranks_that_disagree_on_task_or_level_are_noted_once_each(tmp_path):
    root = tmp_path / "dump"
    _dump(root / "rank0", {CALL: {"input_args": [_t()]}}, task="statistics", level="L1")
    _dump(root / "rank1", {CALL: {"input_args": [_t()]}}, task="tensor", level="L0")
    meta = read_msprobe(root).meta
    assert meta["notes"] == [f"{root / 'rank1' / 'dump.json'}: task 'tensor' differs from 'statistics'",
                             f"{root / 'rank1' / 'dump.json'}: level 'L0' differs from 'L1'"]
    assert (meta["task"], meta["level"], meta["framework"]) == ("statistics", "L1", "pytorch")


def test_tensor_files_outside_the_dump_are_refused_by_default_and_the_switch_is_keyword_only(tmp_path):
    np.save(tmp_path / "outside.npy", np.arange(3.0))
    folder = _dump(tmp_path / "d", {CALL: {"input_args": [_t(data_name="x.npy")]}})
    (folder / "dump_tensor_data").mkdir()
    (folder / "dump_tensor_data" / "x.npy").symlink_to(tmp_path / "outside.npy")
    with pytest.raises(DumpFormatError, match="outside the dump folder"):
        read_msprobe(folder).tensor_loader("x.npy")
    with pytest.raises(TypeError):
        read_msprobe(folder, True)
