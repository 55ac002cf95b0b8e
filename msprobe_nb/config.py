"""What to record: the dump configuration, read from msprobe-style config.json files, dicts or keywords.

``load_config`` accepts real msprobe config files (HEAD, legacy and the 2024 layout with ``seed``),
flattens the chosen task's sub-dict, coerces command-line strings and reports mistakes with the key,
where it was, what is allowed and a close match. msprobe keys the kit does not need are kept in
``DumpConfig.extra`` and, when ignoring them changes what gets recorded, warned about. Every key is
documented in ``docs/config.md``.
"""
from __future__ import annotations

import builtins
import dataclasses
import difflib
import json
import numbers
import os
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from msprobe_nb.options import DATA_MODES, OPTIONS, TASKS

__all__ = ["SEED_MAX", "ConfigError", "ConfigWarning", "DumpConfig", "load_config"]

SEED_MAX = 2**32 - 1  # numpy's legacy seeder takes 0..2**32-1; torch and random accept that range too


#: msprobe tasks the kit does not implement: their sub-dicts load (kept in ``extra``), the task name does not.
FOREIGN_TASKS = {
    "run_ut": "legacy name of msprobe's API pre-check; the kit's is task 'acc_check' (or mp.acc_check on a dump)",
    "diff_check": "msprobe real-time diff; compare two kit dumps instead",
    "nan_check": "NPU-only custom ops; the kit's task 'overflow_check' (or mp.find_overflow on a dump) works anywhere",
    "exception_dump": "MindSpore only",
    "free_benchmark": "legacy perturbation check, removed from msprobe",
    "grad_probe": "legacy gradient monitor; the kit's is mp.Monitor",
}

#: keys of a task sub-dict that the kit uses (flattened into DumpConfig fields)
TASK_KEYS = ("scope", "list", "data_mode", "summary_mode", "tensor_list")

#: msprobe task sub-dict keys the kit accepts and ignores -> why
IGNORED_TASK_KEYS = {
    "bench_path": "real-time MD5 diff against a previous dump is not implemented; compare two dumps instead",
    "diff_nums": "real-time MD5 diff is not implemented",
    "slice": "tensors are never sliced: statistics cover the whole tensor",
    "request_id": "vLLM per-request slicing is not implemented",
    "file_format": "MindSpore static-graph option",
    "backward_input": "legacy (2024) tensor option",
    "overflow_nums": "legacy overflow_check option",
    "check_mode": "MindSpore overflow option",
    "white_list": "acc_check option",
    "black_list": "acc_check option",
    "error_data_path": "acc_check option",
}
#: of those, the ones whose non-empty value would change what msprobe records: warned about
_WARN_TASK_KEYS = ("bench_path", "diff_nums", "slice", "request_id", "backward_input")

#: msprobe top-level keys the kit accepts and ignores -> why
IGNORED_TOP_KEYS = {
    "dump_enable": "hot reload of config.json is not implemented: the config is read once",
    "extra_info": "msprobe's switch for stack.json/construct.json; the kit maps it onto `stack`",
    "precision": "statistics precision is fixed by the kit's capture layer",
    "risk_level": "the kit never drops APIs; narrow the dump with scope/list instead",
    "custom_op_namespaces": "kept for the capture layer (torch.ops namespaces to wrap)",
    "enable_dataloader": "legacy DataLoader auto start/stop is not implemented",
    "acl_config": "NPU ACL kernel-dump config; the kit's L2 is aten ops, not NPU kernels",
}


class ConfigError(ValueError):
    """A config key or value that cannot be used; ``key`` names the offending key when there is one."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class ConfigWarning(UserWarning):
    """An accepted msprobe key the kit ignores in a way that changes what gets recorded."""


# --------------------------------------------------------------------------- value coercion
_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off", ""}
_MAX_IDS = 1_000_000  # guard against typos like "0-1000000000"


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}: invalid value {value!r}; allowed: {allowed}", key)


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise _bad(key, value, "true or false (strings true/false/1/0/yes/no/on/off accepted)")


def _as_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if isinstance(value, str):
        by_lower = {c.lower(): c for c in choices}
        hit = by_lower.get(value.strip().lower())
        if hit is not None:
            return hit
    raise _bad(key, value, " | ".join(choices))


def _as_seed(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", "null", "off", ""):
            return None
        try:
            value = int(text)
        except ValueError:
            raise _bad(key, value, f"an int in 0..{SEED_MAX}, or none") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= int(value) <= SEED_MAX:
        raise _bad(key, value, f"an int in 0..{SEED_MAX}, or none")
    return int(value)


def _split_text(value: str) -> list[Any]:
    """'0,1' / '[0, "2-4"]' / 'relu' -> list of items (command-line and magic strings)."""
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError:
            items = text.strip("[]").split(",")
        return [i.strip().strip("'\"") if isinstance(i, str) else i for i in items]
    return [t.strip() for t in text.split(",") if t.strip()]


def _as_ids(key: str, value: Any) -> list[int]:
    """rank/step: int, "3", "4-6", "0,2-4", or a list mixing ints and "a-b" ranges -> sorted unique ints."""
    allowed = 'a list of ints >= 0 and "a-b" ranges, e.g. [0, "2-4"], "3", "0,1" ([] = all)'
    if value is None:
        return []
    items = _split_text(value) if isinstance(value, str) else value
    if isinstance(items, numbers.Integral) and not isinstance(items, bool):
        items = [items]
    if not isinstance(items, (list, tuple, set, frozenset, range)):
        raise _bad(key, value, allowed)
    out: set[int] = set()
    for item in items:
        if isinstance(item, str):
            text = item.strip()
            lo, sep, hi = text.partition("-")
            try:
                a, b = (int(lo), int(hi)) if sep else (int(text), int(text))
            except ValueError:
                raise _bad(key, value, allowed) from None
            if a < 0 or b < a:
                raise _bad(key, value, allowed + f" (range {text!r} is empty or negative)")
            if b - a >= _MAX_IDS:
                raise _bad(key, value, allowed + f" (range {text!r} is too long)")
            out.update(range(a, b + 1))
        elif isinstance(item, numbers.Integral) and not isinstance(item, bool) and int(item) >= 0:
            out.add(int(item))
        else:
            raise _bad(key, value, allowed)
    return sorted(out)


def _as_strs(key: str, value: Any) -> list[str]:
    allowed = 'a list of strings, or a comma-separated string ("a,b")'
    if value is None:
        return []
    items = _split_text(value) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise _bad(key, value, allowed)
    return list(items)


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# --------------------------------------------------------------------------- the config
@dataclass
class DumpConfig:
    """Everything that decides what a dump records. Construction coerces and validates every field."""

    task: str = "statistics"
    dump_path: str = "./msprobe_dump"
    rank: builtins.list[int] = field(default_factory=builtins.list)
    step: builtins.list[int] = field(default_factory=builtins.list)
    level: str = "L1"
    seed: int | None = None
    is_deterministic: bool = False
    async_dump: bool = False
    scope: builtins.list[str] = field(default_factory=builtins.list)
    list: builtins.list[str] = field(default_factory=builtins.list)
    data_mode: builtins.list[str] = field(default_factory=lambda: ["all"])
    summary_mode: str = "statistics"
    tensor_list: builtins.list[str] = field(default_factory=builtins.list)
    dropout_off: bool = False
    host_random: bool = False
    on_exists: str = "new"
    stack: bool = True
    compress_tensors: bool = False
    compile: str = "compiled"
    framework: str = "pytorch"
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for o in OPTIONS:  # coerced and checked by kind, in the table's order (the first bad key is named)
            setattr(self, o.name, _COERCE[o.kind](o, getattr(self, o.name)))
            check = _CHECKS.get(o.name)
            if check is not None:
                check(getattr(self, o.name))
        if self.task == "md5":  # kit alias: statistics with CRC-32 hashes
            if self.summary_mode not in ("statistics", "md5"):
                raise ConfigError(f"task: 'md5' means summary_mode 'md5' but summary_mode is "
                                  f"{self.summary_mode!r}; use task 'statistics' with that summary_mode", "task")
            self.task, self.summary_mode = "statistics", "md5"
        if not isinstance(self.extra, Mapping):
            raise _bad("extra", self.extra, "a dict")
        self.extra = dict(self.extra)

    @staticmethod
    def _check_data_mode(modes: builtins.list[str]) -> builtins.list[str]:
        allowed = '["all"] or a combination of "forward", "backward", "input", "output"'
        clean: builtins.list[str] = []
        for m in modes:
            if m.strip().lower() not in DATA_MODES:
                raise _bad("data_mode", modes, allowed)
            c = m.strip().lower()
            if c not in clean:
                clean.append(c)
        if "all" in clean and len(clean) > 1:
            raise ConfigError(f"data_mode: 'all' must be alone, got {modes!r}; allowed: {allowed}", "data_mode")
        return clean

    # ------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field (stored in a dump's metadata; ``load_config`` reads it back)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))

    def describe(self) -> str:
        """One-line human summary, e.g. ``statistics L1, steps 0-1, all ranks, seed 1234 -> ./dump``."""
        what = self.task
        if self.task != "structure" and self.summary_mode != "statistics":
            what += f" ({self.summary_mode})"
        parts = [f"{what} {self.level}",
                 f"steps {_ranges(self.step)}" if self.step else "all steps",
                 f"ranks {_ranges(self.rank)}" if self.rank else "all ranks"]
        if self.scope:
            parts.append(f"scope {self.scope[0]}..{self.scope[1]}")
        if self.list:
            parts.append(f"list {', '.join(self.list)}" if len(self.list) <= 3 else f"list of {len(self.list)}")
        if self.data_mode != ["all"]:
            parts.append("data " + "+".join(self.data_mode))
        if self.tensor_list and self.task == "statistics":
            parts.append(f"tensors for {len(self.tensor_list)} names")
        parts.append(f"seed {self.seed}" if self.seed is not None else "no seed")
        flags = [name for name, on in (("deterministic", self.is_deterministic), ("dropout off", self.dropout_off),
                                       ("host random", self.host_random), ("async", self.async_dump),
                                       ("no stack", not self.stack)) if on]
        parts += flags
        return ", ".join(parts) + f" -> {self.dump_path}"


def _as_path(key: str, value: Any) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise _bad(key, value, "a non-empty path (any characters except NUL)")
    return value


def _check_scope(scope: list[str]) -> None:
    if len(scope) not in (0, 2):
        raise _bad("scope", scope, "[] or exactly 2 names [start, end]")


#: option kind (options.py) -> coercion of a value to it
_COERCE = {
    "choice": lambda o, v: _as_choice(o.name, v, o.choices),
    "bool": lambda o, v: _as_bool(o.name, v),
    "ids": lambda o, v: _as_ids(o.name, v),
    "names": lambda o, v: _as_strs(o.name, v),
    "data_mode": lambda o, v: DumpConfig._check_data_mode(_as_strs(o.name, v) or ["all"]),
    "seed": lambda o, v: _as_seed(o.name, v),
    "path": lambda o, v: _as_path(o.name, v),
}
#: checks of one option beyond its kind, right after it is coerced
_CHECKS = {"scope": _check_scope}

_FIELDS = tuple(f.name for f in dataclasses.fields(DumpConfig) if f.name != "extra")
_KW_KEYS = _FIELDS + tuple(IGNORED_TOP_KEYS)          # allowed keyword overrides
_TOP_KEYS = _KW_KEYS + ("extra",)                      # allowed plain top-level keys (besides sub-dicts)
_SUB_KEYS = TASK_KEYS + tuple(IGNORED_TASK_KEYS)       # allowed keys inside a kit task sub-dict
_KIT_SUBDICTS = ("statistics", "tensor", "structure", "md5", "overflow_check", "acc_check")
_ALL_TOP = _TOP_KEYS + _KIT_SUBDICTS + tuple(FOREIGN_TASKS)


# --------------------------------------------------------------------------- loading
def did_you_mean(word: str, allowed: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the closest of ``allowed`` (empty when none is close): config keys, and the
    magics' and the command line's flags alike."""
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def unknown_flags(words: Iterable[str], allowed: Iterable[str]) -> str:
    """The message for flags a shell does not know, each with its did-you-mean: ``unrecognized arguments:
    --levle (did you mean '--level'?)``. Words that are not flags are listed as they are."""
    allowed = [a for a in allowed if a.startswith("--") and a != "--help"]
    parts = []
    for w in words:
        hint = did_you_mean(w.split("=", 1)[0], allowed) if w.startswith("-") else ""
        parts.append(f"{w} ({hint.strip().replace('Did', 'did')})" if hint else w)
    return "unrecognized arguments: " + " ".join(parts)


def _unknown(key: str, where: str, allowed: tuple[str, ...], elsewhere: Mapping[str, str]) -> ConfigError:
    msg = f"{where}: unknown key {key!r}."
    if key in elsewhere:
        msg += f" {key!r} belongs {elsewhere[key]}."
    else:
        msg += did_you_mean(key, allowed)
    return ConfigError(msg + f" Allowed keys: {', '.join(sorted(allowed))}", key)


def _read_json(path: Path) -> Any:
    if not path.is_file():
        what = "is a directory, not a file" if path.is_dir() else "does not exist"
        raise ConfigError(f"config file {str(path)!r} {what}")

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in items:
            if k in out:
                warnings.warn(f"{path}: key {k!r} appears twice; the last value wins", ConfigWarning, stacklevel=2)
            out[k] = v
        return out

    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: {e}") from None
    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {str(path)!r}: invalid JSON at line {e.lineno}, column {e.colno}: "
                          f"{e.msg}") from None
    except RecursionError:  # arrays/objects nested deeper than the decoder's recursion limit
        raise ConfigError(f"config file {str(path)!r}: JSON nested too deep to read") from None
    except ValueError as e:  # e.g. an integer longer than Python's integer-string limit (4300 digits)
        raise ConfigError(f"config file {str(path)!r}: unreadable JSON value: {e}") from None


def _warn_ignored(given: Mapping[str, Any], sub_ignored: Mapping[str, Any], sub_name: str) -> None:
    """Warn about ignored msprobe keys whose value would have changed what msprobe records."""
    risk = given.get("risk_level")
    if risk is not None and str(risk).upper() != "ALL":
        warnings.warn(f"risk_level={risk!r} ignored: the kit records every API (msprobe would have silently "
                      "dropped the ones it rates low-risk); use scope/list to narrow the dump",
                      ConfigWarning, stacklevel=3)
    for key in ("enable_dataloader", "dump_enable"):
        if given.get(key) not in (None, False, "false", "False"):
            warnings.warn(f"{key}={given[key]!r} ignored: {IGNORED_TOP_KEYS[key]}", ConfigWarning, stacklevel=3)
    for key in _WARN_TASK_KEYS:
        if sub_ignored.get(key) not in (None, "", [], {}, -1):
            warnings.warn(f"{key}={sub_ignored[key]!r} in the {sub_name!r} sub-dict ignored: "
                          f"{IGNORED_TASK_KEYS[key]}", ConfigWarning, stacklevel=3)


def _raw_from(config: Any) -> tuple[dict[str, Any], str]:
    if config is None:
        return {}, "config"
    if isinstance(config, DumpConfig):
        return config.to_dict(), "DumpConfig"
    if isinstance(config, Mapping):
        return dict(config), "config dict"
    if isinstance(config, (str, os.PathLike)):
        path = Path(config).expanduser()
        raw = _read_json(path)
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a JSON object {{...}}, got {type(raw).__name__}")
        return raw, str(path)
    raise ConfigError(f"config: expected a path, a dict, a DumpConfig or None, got {type(config).__name__}")


@dataclass
class _Gathered:
    """What the phases of :func:`load_config` collect: field values, where each came from, msprobe keys kept
    in ``extra``, ignored top-level keys given (warned about) and ignored task sub-dict keys."""

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    given: dict[str, Any] = field(default_factory=dict)
    sub_ignored: dict[str, Any] = field(default_factory=dict)

    def set(self, key: str, value: Any, where: str) -> None:
        if key in IGNORED_TOP_KEYS:
            self.extra[key] = self.given[key] = value
        else:
            self.values[key] = value
        self.sources[key] = where


def load_config(config: str | os.PathLike | Mapping[str, Any] | DumpConfig | None = None,
                **overrides: Any) -> DumpConfig:
    """Build a DumpConfig from an msprobe-style config.json path, a dict, a DumpConfig or defaults.

    Keyword overrides (snake_case; strings from a command line are coerced) win over the file. A keyword
    set to None counts as not given; pass ``seed="none"`` to switch off a seed set in the file.
    """
    raw, src = _raw_from(config)
    top_where = f"{src} (top level)"
    kw = _keywords(overrides)
    _check_top_keys(raw, top_where)
    active = _active_task(raw, kw, top_where)
    if not isinstance(raw.get("extra") or {}, Mapping):
        raise ConfigError(f"{top_where}: extra: invalid value {raw['extra']!r}; allowed: a dict", "extra")
    got = _Gathered(extra=dict(raw.get("extra") or {}))
    _from_subdicts(raw, src, active, got)
    _from_top_level(raw, src, top_where, active, got)
    for key, value in kw.items():
        got.set(key, value, "keyword argument")
    if "extra_info" in got.given and "stack" not in got.values:  # msprobe's switch for stack.json + construct.json
        got.values["stack"], got.sources["stack"] = got.given["extra_info"], got.sources["extra_info"] + \
            " (extra_info)"
    _warn_ignored(got.given, got.sub_ignored, active)
    try:
        return DumpConfig(**got.values, extra=got.extra)
    except ConfigError as e:
        where = got.sources.get(e.key or "")
        if where:
            raise ConfigError(f"{where}: {e}", e.key) from None
        raise


def _keywords(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword overrides by field name (dashes allowed), None meaning not given; unknown names refused."""
    kw: dict[str, Any] = {}
    for key, value in overrides.items():
        key = key.replace("-", "_")
        if key not in _KW_KEYS:
            raise _unknown(key, "keyword argument", _KW_KEYS, {})
        if value is not None:
            kw[key] = value
    return kw


def _check_top_keys(raw: Mapping[str, Any], top_where: str) -> None:
    for key in raw:
        if key not in _ALL_TOP:
            raise _unknown(key, top_where, _ALL_TOP,
                           {k: 'in a task sub-dict ("statistics": {...})' for k in IGNORED_TASK_KEYS})


def _active_task(raw: Mapping[str, Any], kw: Mapping[str, Any], top_where: str) -> str:
    """The task whose sub-dict applies (msprobe tasks the kit does not implement are refused, saying why)."""
    where = "keyword argument" if "task" in kw else top_where
    task = kw.get("task", raw.get("task", "statistics"))
    if isinstance(task, str) and task.strip().lower() in FOREIGN_TASKS:
        t = task.strip().lower()
        raise ConfigError(f"{where}: task: msprobe task {t!r} is not a kit dump task ({FOREIGN_TASKS[t]}); "
                          f"allowed: {' | '.join(TASKS)}", "task")
    try:
        task = _as_choice("task", task, TASKS)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}", "task") from None
    return "statistics" if task == "md5" and "md5" not in raw else task


def _from_subdicts(raw: Mapping[str, Any], src: str, active: str, got: _Gathered) -> None:
    """The active task's sub-dict gives task keys; other sub-dicts (and msprobe's own tasks) go to extra."""
    for name in _KIT_SUBDICTS + tuple(FOREIGN_TASKS):
        if name not in raw:
            continue
        sub, where = raw[name], f"{src} ({name!r} sub-dict)"
        if name in FOREIGN_TASKS:
            got.extra[name] = sub
            continue
        if not isinstance(sub, Mapping):
            raise ConfigError(f"{where}: expected an object {{...}} of task options, got {sub!r}", name)
        for key in sub:
            if key not in _SUB_KEYS:
                raise _unknown(key, where, _SUB_KEYS, {k: "at the top level" for k in _KW_KEYS if k not in TASK_KEYS})
        if name != active:
            got.extra[name] = dict(sub)
            continue
        for key, value in sub.items():
            if key in TASK_KEYS:
                got.values[key], got.sources[key] = value, where
            else:
                got.sub_ignored[key] = value
        if got.sub_ignored:
            got.extra[name] = dict(got.sub_ignored)


def _from_top_level(raw: Mapping[str, Any], src: str, top_where: str, active: str, got: _Gathered) -> None:
    """Top-level keys; a task key given both here and in the active sub-dict must agree."""
    for key, value in raw.items():
        if key in _KIT_SUBDICTS or key in FOREIGN_TASKS or key == "extra":
            continue
        if key not in IGNORED_TOP_KEYS and key in got.values and got.values[key] != value:
            raise ConfigError(f"{src}: {key!r} is {value!r} at the top level but {got.values[key]!r} in the "
                              f"{active!r} sub-dict; keep one", key)
        got.set(key, value, top_where)
