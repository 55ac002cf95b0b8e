"""The set-up record on disk: ``setup_rank<N>.json`` in a dump folder or a monitor folder (docs/setup_check.md).

Plain JSON, written whole and atomically (a temporary file renamed over the last version), so a reader
never sees half a record. Reading checks everything before it is used: size, encoding, nesting, and the
shape of each section; a hostile or damaged record raises :class:`DumpFormatError` naming the file and
what is wrong.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from msprobe_nb.store.errors import DumpFormatError, show

__all__ = ["FORMAT", "MAX_BYTES", "SECTIONS", "VERSION", "read_setup", "setup_path", "setup_ranks", "write_setup"]

FORMAT = "msprobe_nb.setup"
VERSION = 1
#: a record above this size is refused (a model of 100,000 tensors is about 20 MB)
MAX_BYTES = 64 << 20
_MAX_DEPTH = 12
#: the record's sections, and the type each must have
SECTIONS = {"environment": dict, "versions": dict, "determinism": dict, "model": dict, "optimizer": dict,
            "data": dict, "randomness": dict}
_FILE = re.compile(r"^setup_rank(\d+)\.json$")


def setup_path(folder: str | os.PathLike[str], rank: int) -> Path:
    return Path(folder) / f"setup_rank{int(rank)}.json"


def write_setup(folder: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Write ``record`` (``collect_setup``'s) as ``<folder>/setup_rank<rank>.json``; returns the path."""
    path = setup_path(folder, int(record.get("rank", 0)))
    text = json.dumps({"format": FORMAT, "version": VERSION, **record}, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def setup_ranks(folder: str | Path) -> list[int]:
    """The ranks with a set-up record in ``folder``."""
    p = Path(folder)
    if not p.is_dir():
        return []
    return sorted(int(m.group(1)) for q in p.iterdir() if (m := _FILE.match(q.name)))


def read_setup(path: str | Path, rank: int | None = None) -> dict[str, Any]:
    """The record in ``path``: a ``setup_rank<N>.json`` file, or a folder holding them (``rank``: which; by
    default rank 0, or the only one). FileNotFoundError when there is none; DumpFormatError when it is damaged."""
    p = Path(path)
    if p.is_dir():
        ranks = setup_ranks(p)
        if not ranks:
            raise FileNotFoundError(f"{p}: no set-up record (setup_rank<N>.json) in this folder")
        want = rank if rank is not None else (0 if 0 in ranks else ranks[0])
        if want not in ranks:
            raise FileNotFoundError(f"{p}: no set-up record of rank {want} (ranks {ranks})")
        p = setup_path(p, want)
    return _check(p, _load(p))


def _bad(path: Path, why: str) -> DumpFormatError:
    return DumpFormatError(f"set-up record {str(path)!r}: {why}")


def _load(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise _bad(path, f"{size} bytes, over the {MAX_BYTES} a record may have")
        raw = path.read_bytes()
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _bad(path, f"cannot be read ({e})") from None
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise _bad(path, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _bad(path, f"not valid JSON (truncated or damaged: {e.msg} at line {e.lineno} column {e.colno})") \
            from None
    except (RecursionError, ValueError) as e:
        raise _bad(path, f"not a record ({str(e)[:200] or 'nested too deeply'})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"holds the non-JSON constant {name}")


def _depth(value: Any, limit: int) -> int:
    stack, deepest = [(value, 1)], 1
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > limit:
            return d
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest


def _tensor_table(path: Path, where: str, table: Any, shape: bool = True) -> None:
    if not isinstance(table, dict):
        raise _bad(path, f"{where} is {type(table).__name__}, not an object of tensors")
    for name, t in table.items():
        if not isinstance(t, dict) or not isinstance(t.get("hash", ""), str) or not isinstance(t.get("dtype", ""), str):
            raise _bad(path, f"{where}[{show(name)}] is {show(t)}, not {{shape, dtype, hash}}")
        dims = t.get("shape", [])
        if shape and (not isinstance(dims, list) or not all(isinstance(n, int) and not isinstance(n, bool)
                                                            and n >= 0 for n in dims)):
            raise _bad(path, f"{where}[{show(name)}].shape is {show(dims)}, not a list of sizes")


def _check(path: Path, rec: Any) -> dict[str, Any]:
    if not isinstance(rec, dict):
        raise _bad(path, f"holds {type(rec).__name__}, not a record object")
    if rec.get("format") != FORMAT:
        raise _bad(path, f"format is {show(rec.get('format'))}, not {FORMAT!r}")
    version = rec.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= VERSION:
        raise _bad(path, f"version {show(version)} is not one this kit reads (1..{VERSION})")
    if _depth(rec, _MAX_DEPTH) > _MAX_DEPTH:
        raise _bad(path, f"nested deeper than {_MAX_DEPTH} levels")
    for key in ("rank", "world_size"):
        v = rec.get(key, 0 if key == "rank" else 1)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise _bad(path, f"{key} is {show(v)}, not a whole number >= 0")
    for name, section_type in SECTIONS.items():
        if name in rec and not isinstance(rec[name], section_type):
            raise _bad(path, f"section {name!r} is {type(rec[name]).__name__}, not an object")
    env = rec.get("environment", {}).get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise _bad(path, f"environment.env is {show(env)}, not an object of strings")
    model = rec.get("model", {})
    for kind in ("parameters", "buffers"):
        if kind in model:
            _tensor_table(path, f"model.{kind}", model[kind])
    if not isinstance(model.get("modules", {}), dict) or not isinstance(model.get("config", {}), dict):
        raise _bad(path, "model.modules and model.config must be objects")
    groups = rec.get("optimizer", {}).get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups):
        raise _bad(path, f"optimizer.groups is {show(groups)}, not a list of objects")
    batches = rec.get("data", {}).get("batches", [])
    if not isinstance(batches, list):
        raise _bad(path, f"data.batches is {show(batches)}, not a list")
    for i, b in enumerate(batches):
        _tensor_table(path, f"data.batches[{i}]", b)
    sites = rec.get("randomness", {}).get("sites", [])
    if not isinstance(sites, list) or not all(isinstance(s, dict) and isinstance(s.get("count", 0), int)
                                              for s in sites):
        raise _bad(path, f"randomness.sites is {show(sites)}, not a list of {{site, api, count}}")
    rec["path"] = str(path)
    return rec
