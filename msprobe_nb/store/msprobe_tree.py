"""Where an msprobe dump's files are: ``step*/rank*`` folders (``proc*`` too), or a bare dump.json.

``find_rank_dirs`` names each rank folder with the step and rank its path implies; a folder whose name says
neither is read as step 0, rank 0 with a note saying so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from msprobe_nb.store.errors import DumpFormatError  # one error class for every dump reader, without h5py

_RANK_RE = re.compile(r"rank([0-9]{0,9})")
_PROC_RE = re.compile(r"proc([0-9]+)")
_STEP_RE = re.compile(r"step([0-9]{1,9})")
#: deepest nesting accepted inside one record (msprobe writes a handful of levels; Python recursion ends near 1000)

@dataclass
class RankDir:
    """One msprobe rank folder (or a bare dump.json) with the step/rank its path implies."""

    dump_json: Path
    step: int = 0
    rank: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.dump_json.parent


def _rank_of(folder: Path) -> tuple[int, str] | None:
    """(rank, note) implied by a rank*/proc* folder name, None for other names."""
    m = _RANK_RE.fullmatch(folder.name)
    if m:
        return int(m.group(1) or 0), ""
    m = _PROC_RE.fullmatch(folder.name)
    if m:
        return 0, f"{folder}: msprobe wrote proc{m.group(1)} (no rank known at dump time); read as rank 0"
    return None


def _step_of(folder: Path) -> int | None:
    m = _STEP_RE.fullmatch(folder.name)
    return int(m.group(1)) if m else None


def _rank_dirs_of_step(step_dir: Path, step: int) -> list[RankDir]:
    rank_of = {d: r for d in step_dir.iterdir() if d.is_dir() and (d / "dump.json").is_file() and (r := _rank_of(d))}
    subs = list(rank_of)
    ranked = sorted((d for d in subs if _RANK_RE.fullmatch(d.name)), key=lambda d: rank_of[d][0])
    procs = sorted(d for d in subs if _PROC_RE.fullmatch(d.name))
    out = [RankDir(d / "dump.json", step, rank_of[d][0]) for d in ranked]
    if procs and not ranked:
        for i, d in enumerate(procs):
            out.append(RankDir(d / "dump.json", step, i, [
                f"{d}: msprobe wrote {d.name} (no rank known at dump time); read as rank {i}"]))
    elif procs:
        out[0].notes.append(f"{step_dir}: ignored {', '.join(d.name for d in procs)} beside rank folders")
    return out


def find_rank_dirs(path: str | Path) -> list[RankDir]:
    """Every dump.json under ``path`` (a dump.json, a rank dir, a step dir or a dump root), in step/rank order."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or folder")
    if p.is_file():
        return [_single(p)]
    for name in ("dump.json", "debug.json"):  # debug.json: level "debug" (PrecisionDebugger.save)
        if (p / name).is_file():
            return [_single(p / name)]
    step = _step_of(p)
    found = _rank_dirs_of_step(p, 0 if step is None else step)
    if found:
        return found
    steps = sorted(((n, d) for d in p.iterdir() if d.is_dir() and (n := _step_of(d)) is not None),
                   key=lambda nd: nd[0])
    for n, d in steps:
        found.extend(_rank_dirs_of_step(d, n))
    if not found:
        raise DumpFormatError(
            f"{p}: no msprobe dump found (expected dump.json, rank*/dump.json or step*/rank*/dump.json)")
    return found


def _single(dump_json: Path) -> RankDir:
    """A dump.json given directly: step/rank from its folder names when they follow msprobe's layout."""
    folder = dump_json.parent
    rank = _rank_of(folder)
    if rank is None:
        return RankDir(dump_json)
    step = _step_of(folder.parent)
    return RankDir(dump_json, 0 if step is None else step, rank[0], [rank[1]] if rank[1] else [])


def is_plain_file_name(name: str) -> bool:
    """A single path component that cannot lead anywhere else: no folders, no "..", no NUL, at most 255 bytes."""
    return (name not in ("", ".", "..") and not any(c in name for c in "/\\\0")
            and len(name.encode("utf-8", "surrogatepass")) <= 255)
