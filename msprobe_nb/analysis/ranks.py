"""Comparing runs of many ranks: world sizes, and the first divergence across ranks and steps.

Ranks pair by rank id (``matching.pair_groups``); this module checks that the two runs had the same world
size and finds where, over all ranks, the runs first part. Each (step, rank) pair has its own first
divergence (``divergence.py``); across ranks they are ordered by step, then by the collective order of
``rank_order.py``. A rank whose first divergence is a collective whose inputs agree on that rank while
another participant's inputs diverge did not part on its own: the difference reached it through that
collective. Of the others, the earliest is the origin:

* ``local``: the rank's own compute (or its data) parted first; where it then shows in a collective, that
  collective's inputs diverge on that rank only ("entered through" it) and its outputs on the ranks it
  reached ("spread through" it);
* ``collective``: a collective whose inputs agree on every participant and whose outputs diverge (the
  reduction itself computes differently, as an all_reduce in another order or precision does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from .divergence import Divergence
from .grading import INPUT_IO, OUTPUT_IO
from .matching import MatchError
from .rank_order import group_of, is_collective, order_key, participants, sync_order

#: columns of a collective table: one row per (step, rank, collective call) of the NPU run
COLLECTIVE_COLUMNS = ["step", "rank", "call", "call_index", "group", "in_div", "out_div"]


class WorldSizeError(MatchError):
    """The two runs ran on different numbers of ranks, and no ``rank_map`` says how to pair them."""


# --------------------------------------------------------------------------------------------- world size
def world_size(calls: pd.DataFrame, meta: dict | None = None) -> int | None:
    """The run's number of ranks: ``meta["world_size"]`` when the dump records it, else the ranks recorded
    when they are 0..n-1 with n >= 2 (a gap, or a single rank, may be a selection of ranks: unknown)."""
    ws = (meta or {}).get("world_size")
    if isinstance(ws, (int, np.integer)) and int(ws) > 0:
        return int(ws)
    ranks = sorted({int(r) for r in pd.unique(calls["rank"])})
    if len(ranks) >= 2 and ranks == list(range(len(ranks))):
        return len(ranks)
    return None


def check_world_sizes(npu: pd.DataFrame, bench: pd.DataFrame, npu_meta: dict | None = None,
                      bench_meta: dict | None = None, rank_map: dict | None = None) -> list[str]:
    """Notes on ranks present on one side only; :class:`WorldSizeError` when the world sizes differ (unless
    ``rank_map`` pairs the ranks explicitly)."""
    n_ranks = sorted({int(r) for r in pd.unique(npu["rank"])})
    b_ranks = sorted({int(r) for r in pd.unique(bench["rank"])})
    return rank_notes(n_ranks, b_ranks, world_size(npu, npu_meta), world_size(bench, bench_meta), rank_map)


def rank_notes(n_ranks: list[int], b_ranks: list[int], n_world: int | None, b_world: int | None,
               rank_map: dict | None = None) -> list[str]:
    """:func:`check_world_sizes` on rank lists and world sizes already known (the Dask path's file names)."""
    if not rank_map and n_world is not None and b_world is not None and n_world != b_world:
        raise WorldSizeError(
            f"the runs have different world sizes: the NPU run has {n_world} ranks ({_span(n_ranks)}), the bench "
            f"run {b_world} ({_span(b_ranks)}); ranks pair by id, so pass rank_map={{npu_rank: bench_rank}} to "
            "say which ranks to compare")
    if rank_map:
        mapped = {int(rank_map.get(r, r)) for r in n_ranks}
        only_n = [r for r in n_ranks if int(rank_map.get(r, r)) not in set(b_ranks)]
        only_b = [r for r in b_ranks if r not in mapped]
    else:
        only_n = sorted(set(n_ranks) - set(b_ranks))
        only_b = sorted(set(b_ranks) - set(n_ranks))
    notes = []
    if only_n:
        notes.append(f"ranks in the NPU dump only, not compared: {_span(only_n)}")
    if only_b:
        notes.append(f"ranks in the bench dump only, not compared: {_span(only_b)}")
    return notes


def _span(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks)) or "none"


# --------------------------------------------------------------------------------------------- collectives
def collective_table(t: pd.DataFrame) -> pd.DataFrame:
    """``COLLECTIVE_COLUMNS`` from a compare table: which collectives' inputs and outputs diverge, per rank.

    It is all the cross-rank rule needs besides each pair's first divergence, and it is small: a Dask worker
    returns its rank's part instead of the compared rows.
    """
    npu = t[t["match"].astype(object) != "bench_only"]
    coll = npu[is_collective(npu["call"].to_numpy())]
    if coll.empty:
        return pd.DataFrame({c: pd.Series(dtype=d) for c, d in zip(
            COLLECTIVE_COLUMNS, ("int64", "int64", object, "int64", object, bool, bool))})
    io = coll["io"].astype(object).to_numpy()
    div = coll["diverges"].to_numpy(dtype=bool)
    f = pd.DataFrame({"step": coll["step"].astype("int64").to_numpy(), "rank": coll["rank"].astype("int64").to_numpy(),
                      "call": coll["call"].astype(object).to_numpy(),
                      "call_index": coll["call_index"].astype("int64").to_numpy(),
                      "group": group_of(coll, "npu_value"),
                      "in_div": div & np.isin(io, INPUT_IO), "out_div": div & np.isin(io, OUTPUT_IO)})
    return f.groupby(["step", "rank", "call"], sort=False, as_index=False).agg(
        call_index=("call_index", "min"), group=("group", "max"), in_div=("in_div", "any"),
        out_div=("out_div", "any"))[COLLECTIVE_COLUMNS]


def _keys(coll: pd.DataFrame, divs: list[Divergence]) -> dict[tuple[int, int, str], tuple]:
    """Order keys of the divergences' calls, from the collectives plus the divergences' own calls."""
    local = pd.DataFrame({"step": [d.step for d in divs], "rank": [d.rank for d in divs],
                          "call": [d.call for d in divs], "call_index": [d.call_index for d in divs]})
    local["group"] = ""
    rows = pd.concat([coll[["step", "rank", "call", "call_index", "group"]], local], ignore_index=True)
    return order_key(sync_order(rows))


# --------------------------------------------------------------------------------------------- result
@dataclass(repr=False)
class RankDivergence(Divergence):
    """The first divergence over all ranks: the origin rank's own :class:`Divergence`, and how it spread."""

    #: "local" (the rank's own compute or data parted first) or "collective" (a collective whose inputs
    #: agree on every rank computes different outputs)
    origin: str = "local"
    through: str | None = None  #: the first collective that carried the difference to other ranks
    spread_to: dict[int, str] = field(default_factory=dict)  #: rank -> collective it received it through
    input_ranks: list[int] = field(default_factory=list)  #: ranks whose inputs to ``through`` diverge
    other_origins: list[tuple[int, str]] = field(default_factory=list)  #: (rank, call) parting on their own
    ranks: list[int] = field(default_factory=list)  #: ranks compared in this step
    local: dict[int, Divergence] = field(default_factory=dict)  #: each rank's own first divergence this step

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out.update(origin=self.origin, through=self.through, spread_to=dict(self.spread_to),
                   input_ranks=list(self.input_ranks), other_origins=list(self.other_origins), ranks=list(self.ranks))
        return out

    def __str__(self) -> str:
        head = (f"first divergence over {len(self.ranks)} ranks: {self.call} (step {self.step}, rank {self.rank}, "
                f"call #{self.call_index})")
        lines = [head, f"  {self.rank_message}"]
        lines += str(Divergence.__str__(self)).splitlines()[1:]
        return "\n".join(lines)

    __repr__ = __str__

    @property
    def rank_message(self) -> str:
        """One sentence on where the difference started and how it reached the other ranks."""
        r = self.rank
        if self.origin == "collective":
            msg = (f"{self.call} receives agreeing inputs on every rank but its outputs diverge (on rank(s) "
                   f"{_span(sorted([r, *self.spread_to]))}): the collective itself computes differently")
        elif self.through and self.input_ranks == [r]:
            msg = (f"rank {r} parts first, in its local compute: the inputs of {self.through} diverge on rank {r} "
                   "only, and agree on every other rank")
        else:
            msg = f"rank {r} parts first, in its local compute (step {self.step})"
        if self.spread_to:
            by: dict[str, list[int]] = {}
            for q, c in sorted(self.spread_to.items()):
                by.setdefault(c, []).append(q)
            spread = "; ".join(f"to rank(s) {_span(qs)} through {c}" for c, qs in by.items())
            msg += f"; it spread {spread} (their inputs agree, their outputs diverge)"
        if self.other_origins:
            msg += "; also parting on their own this step: " + ", ".join(f"rank {q} at {c}"
                                                                          for q, c in self.other_origins[:8])
        return msg


def first_across_ranks(divergences: list[Divergence], coll: pd.DataFrame,
                       ranks: list[int] | None = None) -> RankDivergence | None:
    """The earliest divergence over all ranks (step, then collective order), with how it spread.

    ``divergences``: the first divergence of each (step, rank) pair; ``coll``: the :func:`collective_table`
    of the compared rows (a concatenation of per-rank tables works the same).
    """
    if not divergences:
        return None
    step = min(d.step for d in divergences)
    divs = [d for d in divergences if d.step == step]
    coll = coll[coll["step"] == step]
    keys = _keys(coll, divs)
    parts = participants(sync_order(coll)) if len(coll) else {}
    state = {(int(r), str(c)): (bool(i), bool(o)) for r, c, i, o in zip(
        coll["rank"], coll["call"], coll["in_div"], coll["out_div"])}

    def inputs_diverge_on(rank: int, call: str) -> list[int]:
        return [q for q in parts.get((step, rank, call), []) if state.get((q, call), (False, False))[0]]

    received: dict[int, str] = {}
    for d in divs:
        if (d.step, d.rank, d.call) in parts and not state.get((d.rank, d.call), (True, False))[0]:
            if [q for q in inputs_diverge_on(d.rank, d.call) if q != d.rank]:
                received[d.rank] = d.call
    candidates = [d for d in divs if d.rank not in received] or divs
    candidates.sort(key=lambda d: keys[(d.step, d.rank, d.call)])
    d0 = candidates[0]
    is_coll = (d0.step, d0.rank, d0.call) in parts
    origin = "collective" if is_coll and not inputs_diverge_on(d0.rank, d0.call) else "local"
    through, via = None, None
    if received:
        via = min(received, key=lambda q: keys[(step, q, received[q])])
        through = received[via]
    elif origin == "collective":
        through, via = d0.call, d0.rank
    spread = dict(received)
    if origin == "collective":
        spread.update({q: d0.call for q in parts.get((step, d0.rank, d0.call), [])
                       if q != d0.rank and state.get((q, d0.call), (False, False))[1]})
    fields = {k: getattr(d0, k) for k in Divergence.__dataclass_fields__}
    return RankDivergence(**fields, origin=origin, through=through, spread_to=spread,
                          input_ranks=inputs_diverge_on(via, through) if through and via is not None else [],
                          other_origins=[(d.rank, d.call) for d in candidates[1:]],
                          ranks=sorted(set(ranks or []) | {d.rank for d in divs} | {int(r) for r in coll["rank"]}),
                          local={d.rank: d for d in divs})


# --------------------------------------------------------------------------------------------- rank x step
#: columns of :func:`rank_step_summary`: one row per compared (step, rank) pair
SUMMARY_COLUMNS = ["step", "rank", "bench_step", "bench_rank", "rows", "pass", "warning", "error", "unmatched",
                   "diverging", "verdict", "first_call", "first_kind", "first_call_index"]
_WORST = {"pass": 0, "warning": 1, "error": 2}


def rank_step_summary(t: pd.DataFrame, pairs: pd.DataFrame, divergences: list[Divergence]) -> pd.DataFrame:
    """``SUMMARY_COLUMNS`` of a compare table: counts, the worst result and the first divergence of each pair.

    ``verdict`` is the worst ``result`` of the pair's rows ("pass" when all pass, "unmatched" when no row
    matched), the grid the viewer shows; the Dask path builds the same table from each worker's part.
    """
    if t.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    res = t["result"].astype(object).to_numpy()
    f = pd.DataFrame({"step": t["step"].astype("int64").to_numpy(), "rank": t["rank"].astype("int64").to_numpy(),
                      "pass": res == "pass", "warning": res == "warning", "error": res == "error",
                      "unmatched": t["match"].astype(object).to_numpy() != "matched",
                      "diverging": t["diverges"].to_numpy(dtype=bool),
                      "worst": np.vectorize(_WORST.get, otypes=[float])(res)})
    f = f[t["match"].astype(object).to_numpy() != "bench_only"]
    g = f.groupby(["step", "rank"], sort=True).agg(
        rows=("pass", "size"), **{k: (k, "sum") for k in ("pass", "warning", "error", "unmatched", "diverging")},
        worst=("worst", "max")).reset_index()
    names = {v: k for k, v in _WORST.items()}
    g["verdict"] = [names.get(int(w), "unmatched") if np.isfinite(w) else "unmatched" for w in g["worst"]]
    p = pairs[["step", "rank", "bench_step", "bench_rank"]].astype("int64")
    g = p.merge(g.drop(columns="worst"), on=["step", "rank"], how="left")
    first = {(d.step, d.rank): d for d in divergences}
    g["first_call"] = [first[k].call if k in first else "" for k in zip(g["step"], g["rank"])]
    g["first_kind"] = [first[k].kind if k in first else "" for k in zip(g["step"], g["rank"])]
    g["first_call_index"] = [first[k].call_index if k in first else -1 for k in zip(g["step"], g["rank"])]
    for k in ("rows", "pass", "warning", "error", "unmatched", "diverging"):
        g[k] = g[k].fillna(0).astype("int64")
    g["verdict"] = g["verdict"].fillna("unmatched")
    return g[SUMMARY_COLUMNS]


def verdict_grid(summary: pd.DataFrame) -> pd.DataFrame:
    """Rank x step table of verdicts from :func:`rank_step_summary` ("" where a pair was not compared)."""
    if summary.empty:
        return pd.DataFrame()
    g = summary.pivot(index="rank", columns="step", values="verdict").fillna("")
    g.index.name, g.columns.name = "rank", "step"
    return g
