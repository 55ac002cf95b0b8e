"""``find_overflow(dump)``: the first call whose inputs are finite and whose outputs are not, over all ranks.

From a recorded dump (the kit's HDF5 or an msprobe dump tree), on any device: a tensor is non-finite when
its ``nan_count`` / ``posinf_count`` / ``neginf_count`` say so, or, where no counts were recorded, when its
max or min is inf or NaN. Calls are scanned step by step in the collective order of ``rank_order.py``, not
by time: a rank that receives a NaN through an all_reduce is not where it was made. A collective whose
inputs are finite on its rank but not on another participant only passes the value on; one whose inputs are
finite on every participant and whose outputs are not overflowed itself (a float16 sum, say). Where a
module's outputs overflow, the innermost call inside it that overflows too is named.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from .grading import INPUT_IO, OUTPUT_IO
from .rank_order import group_of, order_key, participants, sync_order

if TYPE_CHECKING:
    from msprobe_nb.store.dump import Dump

_FLOAT_WORDS = ("float", "half", "double", "complex")


@dataclass
class Overflow:
    """Where the first non-finite value was made."""

    call: str
    step: int
    rank: int
    call_index: int
    #: "call" (finite inputs, non-finite outputs), "collective" (a collective whose inputs are finite on
    #: every rank) or "inputs" (no call made it: the first call that receives non-finite inputs)
    kind: str
    why: str
    rows: pd.DataFrame  #: the call's non-finite rows (name, io, counts, max, min)
    received: dict[int, str] = field(default_factory=dict)  #: rank -> collective it got a non-finite value by

    def to_dict(self) -> dict[str, Any]:
        return {"call": self.call, "step": self.step, "rank": self.rank, "call_index": self.call_index,
                "kind": self.kind, "why": self.why, "rows": list(self.rows["name"]), "received": dict(self.received)}

    def __str__(self) -> str:
        lines = [f"first overflow: {self.call} (step {self.step}, rank {self.rank}, call #{self.call_index})",
                 f"  {self.why}"]
        for q, c in sorted(self.received.items())[:8]:
            lines.append(f"  rank {q} received a non-finite value through {c}")
        return "\n".join(lines)

    __repr__ = __str__


def nonfinite(calls: pd.DataFrame) -> np.ndarray:
    """Which rows hold a NaN or an infinity (tensor rows only)."""
    tensor = calls["kind"].astype(object).to_numpy() == "tensor"
    counts = np.zeros(len(calls), dtype=bool)
    counted = np.zeros(len(calls), dtype=bool)
    for col in ("nan_count", "posinf_count", "neginf_count"):
        v = pd.to_numeric(calls[col], errors="coerce").to_numpy(dtype=float)
        counted |= ~np.isnan(v)
        counts |= np.nan_to_num(v) > 0
    mx = pd.to_numeric(calls["max"], errors="coerce").to_numpy(dtype=float)
    mn = pd.to_numeric(calls["min"], errors="coerce").to_numpy(dtype=float)
    numel = pd.to_numeric(calls["numel"], errors="coerce").fillna(1).to_numpy(dtype=float)
    dtype = calls["dtype"].astype(str).str.lower()
    is_float = np.zeros(len(calls), dtype=bool)
    for w in _FLOAT_WORDS:
        is_float |= dtype.str.contains(w, regex=False).to_numpy()
    # NaN statistics: a tensor holding NaN, or statistics not recorded (an md5 dump): only the former in a
    # dump that has statistics at all
    recorded = bool(np.isfinite(mx[tensor]).any()) if tensor.any() else False
    nan_stat = tensor & is_float & (numel > 0) & (np.isnan(mx) | np.isnan(mn)) & recorded
    stat_bad = np.isinf(mx) | np.isinf(mn) | nan_stat
    return tensor & np.where(counted, counts, stat_bad)


def _describe(rows: pd.DataFrame) -> str:
    out = []
    for r in rows.itertuples(index=False):
        what = [f"{int(v)} {label}" for v, label in ((r.nan_count, "NaN"), (r.posinf_count, "+inf"),
                                                     (r.neginf_count, "-inf")) if pd.notna(v) and v > 0]
        if not what:
            what = [f"max {r.max}, min {r.min}"]
        out.append(f"{r.name} ({', '.join(what)})")
    more = f" (+{len(out) - 4} more)" if len(out) > 4 else ""
    return "; ".join(out[:4]) + more


def _calls_table(dump: Any) -> pd.DataFrame:
    if isinstance(dump, pd.DataFrame):
        return dump
    if isinstance(dump, (str, os.PathLike)):
        from msprobe_nb.store.dump import load
        dump = load(dump)
    calls = getattr(dump, "calls", None)
    if not isinstance(calls, pd.DataFrame):
        raise TypeError(f"find_overflow needs a dump path, a Dump or a calls DataFrame, got {type(dump).__name__}")
    return calls


def find_overflow(dump: str | os.PathLike[str] | Dump | pd.DataFrame, *, step: int | None = None,
                  rank: int | None = None) -> Overflow | None:
    """The first call, over all ranks in step and collective order, whose inputs are finite and whose outputs
    are not; None when every recorded tensor is finite. ``dump``: a path, a ``Dump`` or a calls table;
    ``step`` / ``rank`` restrict the search."""
    c = _calls_table(dump)
    if step is not None:
        c = c[c["step"] == step]
    if rank is not None:
        c = c[c["rank"] == rank]
    bad = nonfinite(c)
    if not bad.any():
        return None
    io = c["io"].astype(object).to_numpy()
    f = pd.DataFrame({"step": c["step"].astype("int64").to_numpy(), "rank": c["rank"].astype("int64").to_numpy(),
                      "call": c["call"].astype(object).to_numpy(), "in_bad": bad & np.isin(io, INPUT_IO),
                      "out_bad": bad & np.isin(io, OUTPUT_IO)})
    per_call = f.groupby(["step", "rank", "call"], sort=False).agg(in_bad=("in_bad", "any"), out_bad=("out_bad", "any"))
    state = {k: (bool(i), bool(o)) for k, i, o in zip(per_call.index, per_call["in_bad"], per_call["out_bad"])}
    order = sync_order(c.assign(group=group_of(c)))
    keys = order_key(order)
    parts = participants(order)
    parent = _parents(c)

    received: dict[int, str] = {}
    made = []  # (step, rank, call, kind)
    first_in = None
    for s, r, call, coll in zip(order["step"], order["rank"], order["call"], order["collective"]):
        s, r, call = int(s), int(r), str(call)
        in_bad, out_bad = state.get((s, r, call), (False, False))
        if in_bad and first_in is None:
            first_in = (s, r, call)
        if in_bad or not out_bad:
            continue
        if coll:
            others = [q for q in parts.get((s, r, call), []) if q != r and state.get((s, q, call), (False,))[0]]
            if others:
                received.setdefault(r, call)
                continue
        made.append((s, r, call, "collective" if coll else "call"))
        if s != made[0][0]:
            break
    if made:
        s, r, call, kind = _innermost(made, parent, keys)
    elif first_in is not None:
        (s, r, call), kind = first_in, "inputs"
    else:  # pragma: no cover - a non-finite row is an input or an output
        return None
    at = (c["step"].to_numpy() == s) & (c["rank"].to_numpy() == r) & (c["call"].astype(object).to_numpy() == call)
    rows = c.loc[at & bad, ["name", "io", "nan_count", "posinf_count", "neginf_count", "max", "min"]]
    desc = _describe(rows)
    if kind == "call":
        why = f"its inputs are finite and its outputs are not: {desc}"
    elif kind == "collective":
        why = f"a collective whose inputs are finite on every rank, and its outputs are not: {desc}"
    else:
        why = ("no recorded call made a non-finite value: this call already receives one, from the data, the "
               f"parameters or an unrecorded operation: {desc}")
    ci = int(keys[(s, r, call)][3])
    return Overflow(call=call, step=s, rank=r, call_index=ci, kind=kind, why=why, rows=rows.reset_index(drop=True),
                    received={q: v for q, v in received.items() if q != r})


def _parents(c: pd.DataFrame) -> dict[tuple[int, int, str], str]:
    if "parent" not in c.columns:
        return {}
    first = c.drop_duplicates(["step", "rank", "call"])
    return {(int(s), int(r), str(k)): str(p or "") for s, r, k, p in zip(
        first["step"], first["rank"], first["call"], first["parent"].astype(object).fillna(""))}


def _innermost(made: list[tuple], parent: dict, keys: dict) -> tuple:
    """The first overflowing call; while a call nested inside it (same step and rank) overflows too, that one."""
    s, r, call, kind = made[0]
    for s2, r2, c2, k2 in made[1:]:
        if (s2, r2) != (s, r):
            continue
        p, depth = parent.get((s2, r2, c2), ""), 0
        while p and depth < 256:
            if p == call:
                call, kind = c2, k2
                break
            p, depth = parent.get((s2, r2, p), ""), depth + 1
    return s, r, call, kind
