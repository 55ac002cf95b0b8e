"""Helpers shared by several test files (never test modules importing each other): calls tables built by hand
for the many-rank tests, and where the reference data beside the repository lives."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from msprobe_nb.store.schema import coerce_calls

#: read-only reference data beside the repository (real msprobe dumps); tests that need it skip without it
SHARED = Path(__file__).resolve().parents[2] / "shared"
#: msprobe's own two-rank dumps with collectives (../shared/interop)
INTEROP = SHARED / "interop" / "msprobe-2rank-collectives"


def table(ranks: dict[int, list[tuple[str, dict[str, float]]]], step: int = 0, group: list[int] | None = None):
    """{rank: [(call, {"input.0": v, "output.0": v}), ...]}: one tensor row per leaf, max v, min -v."""
    rows = []
    for rank, calls in ranks.items():
        for ci, (call, leaves) in enumerate(calls):
            for suffix, v in leaves.items():
                io, arg = suffix.split(".", 1)
                rows.append(dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.{suffix}", io=io,
                                 arg=arg, kind="tensor", dtype="torch.float32", shape=(4,), numel=4, max=v, min=-v,
                                 mean=v / 10, norm=2 * v))
            if group is not None and call.startswith("Distributed."):
                rows.append(dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.input.group",
                                 io="input", arg="group", is_kwarg=True, kind="value",
                                 value_type="torch.ProcessGroup", value=json.dumps({"group_ranks": group})))
    return coerce_calls(pd.DataFrame(rows))


def f(k: int, x: float, y: float | None = None):
    return (f"Functional.f.{k}.forward", {"input.0": x, "output.0": x if y is None else y})


def ar(k: int, x: float, y: float):
    return (f"Distributed.all_reduce.{k}.forward", {"input.0": x, "output.0": y})


def four_ranks(plant_rank: int | None, plant_step: int, steps: int = 3):
    """4 ranks, 3 steps: f0, f1, all_reduce 0, f2, all_reduce 1; a change planted on one rank's f1 at one step."""
    parts = []
    for s in range(steps):
        ranks = {}
        for r in range(4):
            planted = r == plant_rank and s == plant_step
            y1 = 2.0 * (1.5 if planted else 1.0)
            after = 1.5 if plant_rank is not None and s == plant_step else 1.0
            ranks[r] = [f(0, 1.0), f(1, 1.0, y1), ar(0, y1, 8.0 * after), f(2, 8.0 * after), ar(1, 8.0 * after,
                                                                                              32.0 * after)]
        parts.append(table(ranks, step=s))
    return pd.concat(parts, ignore_index=True)
