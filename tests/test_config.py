"""DumpConfig / load_config: msprobe files load, overrides coerce, mistakes are explained."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from msprobe_nb.config import ConfigError, ConfigWarning, DumpConfig, load_config

# config.json from the NPU-vs-GPU walkthrough (seed 003): 2024 layout with seed and legacy enable_dataloader
WALKTHROUGH = {
    "task": "statistics", "dump_path": "/home/data_dump", "rank": [], "step": [0], "level": "L1",
    "seed": 1234, "is_deterministic": False, "enable_dataloader": False,
    "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
}

# legacy msprobe layout: every task has a sub-dict, most of them not dump tasks
LEGACY = {
    "task": "tensor", "dump_path": "./dump", "rank": [0, "2-3"], "step": ["0-1"], "level": "mix",
    "async_dump": False, "acl_config": "./acl.json", "precision": "low", "risk_level": "ALL",
    "tensor": {"scope": [], "list": ["relu"], "data_mode": ["forward", "input"], "file_format": "npy",
               "summary_mode": "md5"},
    "statistics": {"scope": [], "list": [], "tensor_list": ["linear"], "data_mode": ["all"], "summary_mode": "xor"},
    "overflow_check": {"overflow_nums": 1},
    "run_ut": {"white_list": [], "black_list": [], "error_data_path": "./"},
    "grad_probe": {"grad_level": "L1", "param_list": [], "bounds": [-1, 0, 1]},
    "free_benchmark": {"scope": [], "list": [], "fuzz_device": "npu", "pert_mode": "improve_precision"},
}


def write(tmp_path: Path, data: object, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data, indent=2), encoding="utf-8")
    return path


def test_defaults() -> None:
    cfg = load_config()
    assert cfg == DumpConfig()
    assert (cfg.task, cfg.level, cfg.summary_mode) == ("statistics", "L1", "statistics")
    assert cfg.dump_path == "./msprobe_dump"
    assert cfg.rank == cfg.step == cfg.scope == cfg.list == cfg.tensor_list == []
    assert cfg.data_mode == ["all"] and cfg.seed is None and cfg.stack and not cfg.is_deterministic
    assert cfg.on_exists == "new" and cfg.framework == "pytorch" and cfg.extra == {}


def test_walkthrough_config_file(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_config(write(tmp_path, WALKTHROUGH))
    assert cfg.step == [0] and cfg.seed == 1234 and cfg.is_deterministic is False
    assert cfg.dump_path == "/home/data_dump" and cfg.data_mode == ["all"]
    assert cfg.extra == {"enable_dataloader": False}


def test_legacy_layout_uses_only_the_chosen_task_subdict(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, LEGACY))
    assert cfg.task == "tensor" and cfg.level == "mix"
    assert cfg.rank == [0, 2, 3] and cfg.step == [0, 1]
    assert cfg.list == ["relu"] and cfg.data_mode == ["forward", "input"] and cfg.summary_mode == "md5"
    assert cfg.tensor_list == []  # statistics sub-dict does not apply
    assert cfg.extra["statistics"]["summary_mode"] == "xor"
    assert cfg.extra["tensor"] == {"file_format": "npy"}
    assert cfg.extra["overflow_check"] == {"overflow_nums": 1}
    assert cfg.extra["acl_config"] == "./acl.json" and cfg.extra["risk_level"] == "ALL"
    assert {"run_ut", "grad_probe", "free_benchmark"} <= cfg.extra.keys()


def test_task_keyword_selects_its_subdict(tmp_path: Path) -> None:
    path = write(tmp_path, {"statistics": {"list": ["relu"]}, "tensor": {"list": ["matmul"], "data_mode": ["input"]}})
    assert load_config(path).list == ["relu"]
    cfg = load_config(path, task="tensor")
    assert cfg.list == ["matmul"] and cfg.data_mode == ["input"] and cfg.extra["statistics"] == {"list": ["relu"]}


@pytest.mark.parametrize(("value", "expected"), [
    ([], []), (None, []), (3, [3]), ("3", [3]), ("4-6", [4, 5, 6]), ([0, "2-4"], [0, 2, 3, 4]),
    ("0,1", [0, 1]), ("0, 2-3", [0, 2, 3]), ('[0, "5-6"]', [0, 5, 6]), ([3, 1, 1], [1, 3]), (["7"], [7]),
])
def test_rank_step_formats(value: object, expected: list[int]) -> None:
    assert load_config(step=value).step == expected
    assert DumpConfig(rank=value).rank == expected


@pytest.mark.parametrize("value", ["6-4", -1, "a", True, 1.5, ["1-x"], {"a": 1}, "0-99999999999"])
def test_rank_step_bad_values(value: object) -> None:
    with pytest.raises(ConfigError, match=r"keyword argument: step: invalid value"):
        load_config(step=value)


def test_keyword_overrides_win_and_are_coerced(tmp_path: Path) -> None:
    path = write(tmp_path, WALKTHROUGH)
    cfg = load_config(path, level="mix", dump_path="runs/npu", step="0,1", seed="42", dropout_off="true",
                      is_deterministic="1", host_random="no", stack="off", scope="A.0,B.1", list="relu,matmul",
                      data_mode="forward")
    assert (cfg.level, cfg.dump_path, cfg.step, cfg.seed) == ("mix", "runs/npu", [0, 1], 42)
    assert cfg.dropout_off and cfg.is_deterministic and not cfg.host_random and not cfg.stack
    assert cfg.scope == ["A.0", "B.1"] and cfg.list == ["relu", "matmul"] and cfg.data_mode == ["forward"]


def test_none_keyword_means_not_given(tmp_path: Path) -> None:
    path = write(tmp_path, WALKTHROUGH)
    assert load_config(path, seed=None, level=None).seed == 1234
    assert load_config(path, seed="none").seed is None


def test_case_insensitive_choices() -> None:
    cfg = load_config(level="l0", task="Tensor", summary_mode="XOR")
    assert (cfg.level, cfg.task, cfg.summary_mode) == ("L0", "tensor", "xor")
    assert load_config(level="MIX").level == "mix"


def test_hyphenated_keyword() -> None:
    assert load_config(**{"dump-path": "x y"}).dump_path == "x y"


def test_unknown_top_level_key_suggests(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, {"levle": "L1"}))
    msg = str(e.value)
    assert "config.json (top level)" in msg and "'levle'" in msg and "Did you mean 'level'" in msg
    assert "Allowed keys:" in msg and "dump_path" in msg
    assert e.value.key == "levle"


def test_unknown_subdict_key_suggests() -> None:
    with pytest.raises(ConfigError, match=r"'statistics' sub-dict\): unknown key 'scop'\. Did you mean 'scope'"):
        load_config({"statistics": {"scop": []}})


def test_misplaced_keys_say_where_they_belong() -> None:
    with pytest.raises(ConfigError, match="'seed' belongs at the top level"):
        load_config({"statistics": {"seed": 1}})
    with pytest.raises(ConfigError, match="'slice' belongs in a task sub-dict"):
        load_config({"slice": []})


def test_unknown_subdict_name_suggests() -> None:
    with pytest.raises(ConfigError, match="Did you mean 'statistics'"):
        load_config({"statistic": {}})


def test_unknown_keyword() -> None:
    with pytest.raises(ConfigError, match=r"keyword argument: unknown key 'levl'\. Did you mean 'level'"):
        load_config(levl="L1")
    with pytest.raises(ConfigError, match="unknown key 'extra'"):
        load_config(extra={})


def test_wrong_value_names_key_value_allowed_and_place(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, {"level": "L3"}))
    msg = str(e.value)
    assert "(top level): level: invalid value 'L3'" in msg and "L0 | L1 | mix | L2" in msg
    with pytest.raises(ConfigError, match=r"'statistics' sub-dict\): summary_mode: invalid value 'sha'.*crc32"):
        load_config({"statistics": {"summary_mode": "sha"}})
    with pytest.raises(ConfigError, match=r"keyword argument: is_deterministic: invalid value 'maybe'"):
        load_config(is_deterministic="maybe")
    with pytest.raises(ConfigError, match="seed: invalid value 4294967296; allowed: an int in 0..4294967295"):
        load_config(seed=2**32)
    with pytest.raises(ConfigError, match="seed: invalid value -1"):
        load_config(seed="-1")
    with pytest.raises(ConfigError, match="framework: invalid value 'mindspore'"):
        load_config(framework="mindspore")


def test_invalid_json_names_file_line_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "task": "statistics",\n  "level": L1\n}\n', "bad.json")
    with pytest.raises(ConfigError, match=r"bad\.json'?: invalid JSON at line 3, column 12"):
        load_config(path)


def test_deeply_nested_json_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    """100,000 nested arrays exceed the decoder's recursion limit: a ConfigError, not a raw RecursionError."""
    path = write(tmp_path, "[" * 100_000 + "]" * 100_000, "deep.json")
    with pytest.raises(ConfigError, match=r"deep\.json'?: JSON nested too deep"):
        load_config(path)


def test_over_long_integer_is_a_config_error_naming_the_file(tmp_path: Path) -> None:
    """A 5,001-digit seed is past Python's integer-string limit: a ConfigError, not a raw ValueError."""
    path = write(tmp_path, '{"seed": ' + "1" * 5001 + "}", "long.json")
    with pytest.raises(ConfigError, match=r"long\.json'?: unreadable JSON value") as info:
        load_config(path)
    assert type(info.value) is ConfigError


def test_top_level_must_be_object(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="top level must be a JSON object"):
        load_config(write(tmp_path, "[1, 2]"))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.json' does not exist"):
        load_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(str(tmp_path))
    with pytest.raises(ConfigError, match="expected a path, a dict"):
        load_config(42)  # type: ignore[arg-type]


def test_bom_and_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"level": "L0", "level": "mix"}')
    with pytest.warns(ConfigWarning, match="'level' appears twice"):
        assert load_config(path).level == "mix"


def test_scope_needs_zero_or_two_names() -> None:
    assert load_config(scope=["a", "b"]).scope == ["a", "b"]
    with pytest.raises(ConfigError, match=r"scope: invalid value \['a'\]; allowed: \[\] or exactly 2"):
        load_config(scope=["a"])
    with pytest.raises(ConfigError, match=r"'statistics' sub-dict\): scope"):
        load_config({"statistics": {"scope": ["a", "b", "c"]}})


def test_data_mode_rules() -> None:
    assert load_config(data_mode=["forward", "input", "forward"]).data_mode == ["forward", "input"]
    assert load_config(data_mode=[]).data_mode == ["all"]
    with pytest.raises(ConfigError, match="'all' must be alone"):
        load_config(data_mode=["all", "forward"])
    with pytest.raises(ConfigError, match="data_mode: invalid value"):
        load_config(data_mode=["fwd"])


def test_md5_task_alias() -> None:
    cfg = load_config(task="md5")
    assert (cfg.task, cfg.summary_mode) == ("statistics", "md5")
    assert load_config({"task": "md5", "statistics": {"list": ["relu"]}}).list == ["relu"]
    with pytest.raises(ConfigError, match="'md5' means summary_mode 'md5'"):
        load_config(task="md5", summary_mode="xor")


def test_l2_tensor_without_list_is_allowed() -> None:
    cfg = load_config(level="L2", task="tensor")
    assert cfg.level == "L2" and cfg.list == []
    assert load_config(task="tensor", async_dump=True).async_dump  # msprobe needs a list here; the kit does not


def test_foreign_msprobe_task_is_explained() -> None:
    with pytest.raises(ConfigError, match="msprobe task 'run_ut' is not a kit dump task.*task 'acc_check'"):
        load_config({"task": "run_ut"})
    with pytest.raises(ConfigError, match=r"keyword argument: task: invalid value 'stats'"):
        load_config(task="stats")


def test_ignored_keys_warn_when_they_matter() -> None:
    with pytest.warns(ConfigWarning, match="risk_level='FOCUS' ignored: the kit records every API"):
        cfg = load_config({"risk_level": "FOCUS"})
    assert cfg.extra["risk_level"] == "FOCUS"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config({"risk_level": "ALL", "dump_enable": False, "precision": "high",
                     "custom_op_namespaces": ["_C_ascend"], "statistics": {"slice": []}})
    with pytest.warns(ConfigWarning, match="enable_dataloader=True ignored"):
        load_config(enable_dataloader=True)
    with pytest.warns(ConfigWarning, match=r"slice=.*'statistics' sub-dict ignored"):
        cfg = load_config({"statistics": {"slice": [{"dim": 0, "size": 2, "begin": 0, "end": 1}]}})
    assert "slice" in cfg.extra["statistics"]


def test_extra_info_maps_to_stack() -> None:
    assert load_config({"extra_info": False}).stack is False
    assert load_config({"extra_info": False}, stack=True).stack is True
    with pytest.raises(ConfigError, match=r"\(top level\) \(extra_info\): stack: invalid value"):
        load_config({"extra_info": "sometimes"})


def test_dump_path_accepts_any_characters(tmp_path: Path) -> None:
    for p in ("my dumps/run 1", "數據/运行", "./a++b/dump", "C:\\runs\\npu"):
        assert load_config(dump_path=p).dump_path == p
    assert load_config(dump_path=tmp_path / "x y").dump_path == str(tmp_path / "x y")
    with pytest.raises(ConfigError, match="dump_path: invalid value ''"):
        load_config(dump_path="")


def test_top_level_task_keys_and_conflicts() -> None:
    assert load_config({"list": ["relu"]}).list == ["relu"]
    assert load_config({"list": ["relu"], "statistics": {"list": ["relu"]}}).list == ["relu"]
    with pytest.raises(ConfigError, match="'list' is \\['a'\\] at the top level but \\['b'\\]"):
        load_config({"list": ["a"], "statistics": {"list": ["b"]}})


def test_round_trip_and_views() -> None:
    cfg = load_config({"risk_level": "ALL"}, task="tensor", level="mix", step="0-2,5", seed=7, is_deterministic=True,
                      scope=["Module.a.forward.0", "Module.b.forward.0"], dump_path="runs/npu")
    data = cfg.to_dict()
    assert json.loads(json.dumps(data)) == data and data["extra"] == {"risk_level": "ALL"}
    assert load_config(data) == cfg and load_config(cfg) == cfg
    assert load_config(cfg, level="L1").level == "L1"
    line = cfg.describe()
    assert "\n" not in line
    for part in ("tensor mix", "steps 0-2,5", "all ranks", "seed 7", "deterministic", "-> runs/npu",
                 "scope Module.a.forward.0..Module.b.forward.0"):
        assert part in line
    assert "no seed" in DumpConfig().describe() and "(md5)" in load_config(task="md5").describe()


def test_extra_must_be_a_dict() -> None:
    with pytest.raises(ConfigError, match=r"\(top level\): extra: invalid value \[1\]"):
        load_config({"extra": [1]})


def test_direct_construction_validates() -> None:
    with pytest.raises(ValueError, match="level"):
        DumpConfig(level="L9")
    assert DumpConfig(step="1-2", seed="5").step == [1, 2]
    with pytest.raises(ConfigError, match="extra: invalid value"):
        DumpConfig(extra=[1])  # type: ignore[arg-type]
