"""The order of calls across ranks: a collective call is a synchronisation point.

Ranks run concurrently, so wall-clock time says little about which rank went wrong first: a rank that
receives a NaN through an all_reduce may record it before the rank that made it records its own call. What
is certain is the collective order: every call a rank makes before the k-th collective happens before every
call any participating rank makes after that collective. This module turns that rule into a sort key.

Each call gets a logical clock (Lamport's rule): a collective's clock is one more than the largest clock
its participants reached before it, the same on every participant; a local call's clock is one more than
that of the last collective before it on its rank. A call that happens before another then always has a
smaller ``(clock, phase)`` (``phase`` 1 for the collective itself, whose outputs come after the local calls
of its epoch), and calls of one epoch on different ranks are concurrent: ``call_index``, then ``rank``,
break those ties (the earlier call of its rank first, as without collectives). A collective is identified
across ranks by its name (``Distributed.all_reduce.3.forward``:
msprobe's counters count each API per rank, so the k-th all_reduce of a rank meets the k-th of the others)
and, where the dump records it (the ``group`` keyword row, ``{"group_ranks": [...]}``), its process group:
rank 0's third all_reduce in group {0, 1} is not rank 2's third in group {2, 3}.
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

COLLECTIVE_PREFIX = "Distributed."

#: the columns :func:`sync_order` returns, one row per (step, rank, call)
ORDER_COLUMNS = ["step", "rank", "call", "call_index", "group", "collective", "clock", "phase"]


def is_collective(calls: np.ndarray | pd.Series) -> np.ndarray:
    """Which call names are collectives (``Distributed.*.forward``, msprobe's naming)."""
    s = pd.Series(np.asarray(calls, dtype=object)).astype(str)
    return (s.str.startswith(COLLECTIVE_PREFIX) & ~s.str.contains(".backward", regex=False)).to_numpy()


def group_of(rows: pd.DataFrame, value_column: str = "value") -> np.ndarray:
    """Each row's process group as text ("0,1"), from its call's ``group`` keyword row; "" where unknown."""
    out = np.full(len(rows), "", dtype=object)
    if "arg" not in rows.columns or value_column not in rows.columns:
        return out
    arg = rows["arg"].astype(object).to_numpy()
    at = np.flatnonzero(arg == "group")
    if not len(at):
        return out
    texts = {}
    for v in pd.unique(rows[value_column].astype(object).to_numpy()[at]):
        try:
            ranks = json.loads(v).get("group_ranks") if isinstance(v, str) and "group_ranks" in v else None
        except (ValueError, AttributeError):
            ranks = None
        texts[v] = ",".join(str(int(r)) for r in ranks) if isinstance(ranks, list) else ""
    keys = pd.DataFrame({"s": rows["step"].to_numpy()[at], "r": rows["rank"].to_numpy()[at],
                         "c": rows["call"].astype(object).to_numpy()[at],
                         "g": [texts[v] for v in rows[value_column].astype(object).to_numpy()[at]]})
    lookup = {(int(a), int(b), str(c)): g for a, b, c, g in zip(keys["s"], keys["r"], keys["c"], keys["g"])}
    calls = rows["call"].astype(object).to_numpy()
    steps, ranks_ = rows["step"].to_numpy(), rows["rank"].to_numpy()
    for i in np.flatnonzero(np.isin(calls, keys["c"].unique())):
        out[i] = lookup.get((int(steps[i]), int(ranks_[i]), str(calls[i])), "")
    return out


def calls_of(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (step, rank, call) with its first ``call_index`` (and ``group``), execution order per rank."""
    c = rows[["step", "rank", "call", "call_index"]].copy()
    c["group"] = rows["group"].astype(object).fillna("").to_numpy() if "group" in rows.columns else ""
    c["call_index"] = c["call_index"].astype("int64")
    c = c.sort_values(["step", "rank", "call_index"], kind="stable").drop_duplicates(["step", "rank", "call"])
    c["step"] = c["step"].astype("int64")
    c["rank"] = c["rank"].astype("int64")
    return c.reset_index(drop=True)


def _collective_clocks(seqs: dict[int, list[str]]) -> dict[int, list[int]]:
    """Lamport clocks of each rank's collectives (same clock for one collective on all its participants)."""
    ranks = sorted(seqs)
    if not ranks:
        return {}
    first = seqs[ranks[0]]
    if all(seqs[r] == first for r in ranks):  # one group, every rank in it: the k-th collective has clock k+1
        return {r: list(range(1, len(first) + 1)) for r in ranks}
    members: dict[str, list[int]] = {}
    for r in ranks:
        for name in dict.fromkeys(seqs[r]):
            members.setdefault(name, []).append(r)
    pos = {r: 0 for r in ranks}
    last = {r: 0 for r in ranks}
    out: dict[int, list[int]] = {r: [] for r in ranks}
    resolved: dict[str, int] = {}

    def advance(r: int, clock: int) -> None:
        out[r].append(clock)
        last[r] = clock
        pos[r] += 1

    remaining = sum(len(s) for s in seqs.values())
    while remaining:
        progressed = False
        for r in ranks:
            while pos[r] < len(seqs[r]):
                name = seqs[r][pos[r]]
                if name in resolved:  # a participant met it already (orders that disagree): come after it
                    advance(r, max(last[r] + 1, resolved[name]))
                elif all(pos[q] < len(seqs[q]) and seqs[q][pos[q]] == name for q in members[name]):
                    t = max(last[q] for q in members[name]) + 1
                    resolved[name] = t
                    for q in members[name]:
                        advance(q, t)
                else:
                    break
                progressed = True
        remaining = sum(len(seqs[r]) - pos[r] for r in ranks)
        if remaining and not progressed:  # the ranks' orders disagree: let the least advanced rank go on alone
            r = min((q for q in ranks if pos[q] < len(seqs[q])), key=lambda q: (last[q], q))
            name = seqs[r][pos[r]]
            resolved[name] = last[r] + 1
            advance(r, last[r] + 1)
    return out


def sync_order(rows: pd.DataFrame) -> pd.DataFrame:
    """``ORDER_COLUMNS`` for every (step, rank, call) of ``rows`` (a calls or compare table), sorted in the
    collective order: ``step``, ``clock``, ``phase``, ``call_index``, ``rank``."""
    c = calls_of(rows)
    c["collective"] = is_collective(c["call"].to_numpy())
    clock = np.zeros(len(c), dtype=np.int64)
    coll = c["collective"].to_numpy()
    for _, idx in c.groupby("step", sort=True).indices.items():
        sub = c.iloc[idx]
        per_rank = {int(r): np.asarray(i) for r, i in sub.groupby("rank", sort=True).indices.items()}
        ident = (sub["call"].astype(str) + "@" + sub["group"].astype(str)).to_numpy()
        seqs = {r: list(ident[i][coll[idx][i]]) for r, i in per_rank.items()}
        clocks = _collective_clocks(seqs)
        for r, i in per_rank.items():
            rows_at = idx[i]  # positions in c, execution order of the rank
            is_c = coll[rows_at]
            cc = np.asarray(clocks.get(r, []), dtype=np.int64)
            before = np.cumsum(is_c) - is_c  # collectives strictly before each call
            prev = np.where(before > 0, cc[np.maximum(before - 1, 0)] if len(cc) else 0, 0)
            clock[rows_at] = np.where(is_c, cc[np.minimum(before, max(len(cc) - 1, 0))] if len(cc) else 0,
                                      prev + 1)
    c["clock"] = clock
    c["phase"] = coll.astype(np.int64)
    return c.sort_values(["step", "clock", "phase", "call_index", "rank"], kind="stable").reset_index(drop=True)[
        ORDER_COLUMNS]


def order_key(order: pd.DataFrame) -> dict[tuple[int, int, str], tuple[int, int, int, int, int]]:
    """(step, rank, call) -> the sort key of :func:`sync_order`."""
    return {(int(s), int(r), str(c)): (int(s), int(k), int(p), int(i), int(r)) for s, r, c, i, k, p in zip(
        order["step"], order["rank"], order["call"], order["call_index"], order["clock"], order["phase"])}


def participants(order: pd.DataFrame) -> dict[tuple[int, int, str], list[int]]:
    """(step, rank, collective) -> the ranks that made that collective with that rank (its group's ranks
    that recorded it, where the group is known; else every rank that recorded a call of that name)."""
    cs = order[order["collective"]]
    out: dict[tuple[int, int, str], list[int]] = {}
    for (s, c, _), g in cs.groupby(["step", "call", "group"], sort=False):
        members = sorted(int(r) for r in g["rank"])
        for r in members:
            out[(int(s), r, str(c))] = members
    return out
