"""Comparing dumps of many ranks on Dask: one task per rank, the driver gathers only what it needs.

``compare_on_dask(npu, bench)`` pairs the two dumps' rank files by name (the kit's ``rank<N>.h5``, or
msprobe's ``step<N>/rank<R>/`` folders) without reading them, and sends each pair to a Dask worker, which
loads the two files, runs the in-process :func:`~msprobe_nb.analysis.compare.compare` on them and sends back
a summary: the pair's counts and verdict, its first divergence and its collectives' divergence flags (small,
whatever the dump's size). The rows themselves stay out of the driver unless asked for: ``rows=True``
gathers them into one :class:`CompareResult` equal to the in-process compare of the whole dumps, and
:meth:`RankCompare.rows_frame` gives them as a lazy ``dask.dataframe`` (one partition per rank) to filter on
the workers before computing.

The cluster: a ``distributed`` ``LocalCluster`` of ``workers`` processes by default, the scheduler at
``scheduler`` (``"tcp://host:8786"``) when given, or a ``client`` you already hold. Dask is an optional extra
(``pip install msprobe_nb[dask]``), imported only here and only when called.
"""
from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .divergence import Divergence
from .ranks import COLLECTIVE_COLUMNS, RankDivergence, first_across_ranks, rank_notes, rank_step_summary

_RANK_FILE = re.compile(r"^rank(\d+)\.h5$")
_STEP_DIR = re.compile(r"^step(\d+)$")
_RANK_DIR = re.compile(r"^rank(\d*)$")


class DaskUnavailable(ImportError):
    """Dask or distributed is not installed."""


def _need_dask() -> Any:
    try:
        import dask  # noqa: F401
        import distributed
    except ImportError as e:
        raise DaskUnavailable(f"comparing on Dask needs dask and distributed ({e}); install them with "
                              "pip install 'msprobe_nb[dask]'") from None
    return distributed


# --------------------------------------------------------------------------------------------- units
@dataclass(frozen=True)
class Unit:
    """One task: an NPU rank file (or msprobe rank folder) and its bench counterpart."""

    npu: str
    bench: str
    rank: int
    bench_rank: int
    step: int | None = None  #: msprobe folders hold one step each; kit rank files hold every step


def _kit_ranks(path: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in sorted(path.iterdir()) if (m := _RANK_FILE.match(p.name))}


def _msprobe_ranks(path: Path) -> dict[tuple[int, int], Path]:
    out = {}
    for sd in sorted(path.iterdir()):
        m = _STEP_DIR.match(sd.name)
        if m and sd.is_dir():
            for rd in sorted(sd.iterdir()):
                r = _RANK_DIR.match(rd.name)
                if r and rd.is_dir():
                    out[(int(m.group(1)), int(r.group(1) or 0))] = rd
    return out


def plan_units(npu: str | os.PathLike, bench: str | os.PathLike, rank_map: dict | None = None,
               step_map: dict | None = None) -> tuple[list[Unit], list[str]]:
    """The tasks for two dump folders, paired by rank id (``rank_map`` renames NPU ranks), and the notes on
    ranks of one side only; :class:`~msprobe_nb.analysis.ranks.WorldSizeError` when the world sizes differ."""
    n, b = Path(npu), Path(bench)
    for p, label in ((n, "NPU"), (b, "bench")):
        if not p.is_dir():
            raise FileNotFoundError(f"{label} dump {p}: comparing on Dask needs a dump folder (rank<N>.h5 files, "
                                    "or msprobe's step<N>/rank<R>/ folders)")
    rmap = {int(k): int(v) for k, v in (rank_map or {}).items()}
    smap = {int(k): int(v) for k, v in (step_map or {}).items()}
    nk, bk = _kit_ranks(n), _kit_ranks(b)
    if nk and bk:
        notes = rank_notes(sorted(nk), sorted(bk), _world(nk), _world(bk), rmap)
        units = [Unit(str(nk[r]), str(bk[rmap.get(r, r)]), r, rmap.get(r, r)) for r in sorted(nk)
                 if rmap.get(r, r) in bk]
        return units, notes
    nm, bm = _msprobe_ranks(n), _msprobe_ranks(b)
    if not nm or not bm:
        raise FileNotFoundError(f"{n if not (nk or nm) else b}: no rank<N>.h5 files and no step<N>/rank<R>/ folders "
                                "(both dumps must be of one kind)")
    n_ranks, b_ranks = sorted({r for _, r in nm}), sorted({r for _, r in bm})
    notes = rank_notes(n_ranks, b_ranks, _world(dict.fromkeys(n_ranks)), _world(dict.fromkeys(b_ranks)), rmap)
    units = []
    for (s, r), p in sorted(nm.items()):
        key = (smap.get(s, s), rmap.get(r, r))
        if key in bm:
            units.append(Unit(str(p), str(bm[key]), r, key[1], s))
    return units, notes


def _world(ranks: dict) -> int | None:
    rs = sorted(ranks)
    return len(rs) if len(rs) >= 2 and rs == list(range(len(rs))) else None


# --------------------------------------------------------------------------------------------- one task
def compare_unit(unit: Unit, options: dict[str, Any], rows: bool) -> dict[str, Any]:
    """Run on a worker: load one rank pair, compare it, return its summary (and its rows if asked)."""
    from .compare import compare, side_rows
    from .ranks import collective_table

    opts = dict(options)
    # a user's rank_map pairs ranks explicitly (no world-size check); else the check runs on each pair's meta
    opts["rank_map"] = {unit.rank: unit.bench_rank} if opts.get("rank_map") or unit.rank != unit.bench_rank \
        else None
    if unit.step is not None and opts.get("step_map"):
        opts["step_map"] = {k: v for k, v in opts["step_map"].items() if int(k) == unit.step} or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the notes come back with the summary
        res = compare(unit.npu, unit.bench, **opts)
    divs = res.divergences()
    t = pd.DataFrame(res)
    out = {"unit": unit, "mode": res.mode, "notes": res.notes, "pairs": res.pairs, "unpaired": res.unpaired,
           "summary": rank_step_summary(t, res.pairs, divs), "divergences": divs,
           "collectives": collective_table(t), "sides": side_rows(t["match"]),
           "unmatched_warning": res._ctx.unmatched_warning}
    if rows:
        out["rows"] = t
        out["stacks"] = _npu_stacks(res, t)
    return out


def _npu_stacks(res: Any, t: pd.DataFrame) -> dict[tuple[str, int, int], list[str]]:
    """(call, step, rank) -> the NPU call's frames, for every call with NPU rows: the gathered result has no
    dump to read them from, and the msprobe CSV's NPU_Stack_Info needs them."""
    if not len(t):
        return {}
    keys = t.loc[t["match"] != "bench_only", ["call", "step", "rank"]].drop_duplicates()
    out = {}
    for call, step, rank in zip(keys["call"], keys["step"].astype(int), keys["rank"].astype(int)):
        frames = res._stack_of(call, step, rank)
        if frames:
            out[(call, step, rank)] = frames
    return out


def unit_rows(unit: Unit, options: dict[str, Any], pair_of: dict[tuple[int, int], int]) -> pd.DataFrame:
    """One partition of :meth:`RankCompare.rows_frame`: the pair's compared rows, ``pair`` numbered as the
    in-process compare of the whole dumps numbers it."""
    t = compare_unit(unit, options, rows=True)
    return _renumber(t["rows"], t["pairs"], pair_of)


def _renumber(t: pd.DataFrame, pairs: pd.DataFrame, pair_of: dict[tuple[int, int], int]) -> pd.DataFrame:
    local = {i: pair_of[(int(s), int(r))] for i, (s, r) in enumerate(zip(pairs["step"], pairs["rank"]))}
    t = t.copy()
    t["pair"] = t["pair"].map(local).astype(t["pair"].dtype)
    return t


# --------------------------------------------------------------------------------------------- the result
@dataclass
class RankCompare:
    """What the driver holds after a Dask compare: per (step, rank) summaries, never all rows at once."""

    mode: str
    summary: pd.DataFrame  #: :data:`~msprobe_nb.analysis.ranks.SUMMARY_COLUMNS`, one row per compared pair
    pairs: pd.DataFrame
    unpaired: pd.DataFrame
    notes: list[str]
    collectives: pd.DataFrame  #: :data:`~msprobe_nb.analysis.ranks.COLLECTIVE_COLUMNS` of every rank
    pair_divergences: list[Divergence] = field(default_factory=list)
    result: Any = None  #: the gathered CompareResult (``rows=True`` only)
    units: list[Unit] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    unmatched_warning: str = ""  #: set when most rows of either side, over all ranks, found no partner

    @property
    def mostly_unmatched(self) -> bool:
        """Most rows of either side found no partner (as :attr:`CompareResult.mostly_unmatched`: compare_on_dask
        warns, the CLI exits 3)."""
        return bool(self.unmatched_warning)

    def divergences(self) -> list[Divergence]:
        """The first divergence of each (step, rank) pair, in (step, rank) order."""
        return list(self.pair_divergences)

    def first_divergence(self, step: int | None = None, rank: int | None = None) -> Divergence | None:
        """As :meth:`CompareResult.first_divergence`: over several ranks, a :class:`RankDivergence`."""
        ds = [d for d in self.pair_divergences if (step is None or d.step == step) and (rank is None or d.rank == rank)]
        if not ds:
            return None
        if rank is None and self.summary["rank"].nunique() > 1:
            return first_across_ranks(ds, self.collectives, sorted(int(r) for r in self.summary["rank"].unique()))
        return min(ds, key=lambda d: (d.step, d.call_index, d.rank))

    def counts(self) -> dict[str, int]:
        s = self.summary
        return {"rows": int(s["rows"].sum()), **{k: int(s[k].sum()) for k in ("pass", "warning", "error",
                                                                                "unmatched", "diverging")}}

    def grid(self) -> pd.DataFrame:
        """Rank x step table of verdicts (viewers/rank_grid.py shows it)."""
        from .ranks import verdict_grid
        return verdict_grid(self.summary)

    def rows_frame(self, client: Any = None) -> Any:
        """The compared rows as a lazy ``dask.dataframe`` (one partition per rank pair, computed on the
        workers when asked): ``r.rows_frame().query("result == 'error'").compute()``."""
        _need_dask()
        import dask.dataframe as dd

        pair_of = _pair_index(self.pairs)
        meta = self.result.iloc[:0] if self.result is not None else \
            pd.DataFrame(compare_unit(self.units[0], self.options, rows=True)["rows"].iloc[:0])
        return dd.from_map(unit_rows, self.units, options=self.options, pair_of=pair_of, meta=pd.DataFrame(meta),
                           enforce_metadata=False)

    def summary_text(self) -> str:
        """A few lines: mode, counts, notes and the first divergence (as ``CompareResult.summary``)."""
        from .compare import summary_text

        c = self.counts()
        return summary_text(f"mode {self.mode}: {c['rows']} rows over {len(self.summary)} (step, rank) pairs, "
                            f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['unmatched']} "
                            "unmatched (compared on Dask)", self.notes, self.first_divergence())


def _pair_index(pairs: pd.DataFrame) -> dict[tuple[int, int], int]:
    keys = sorted(zip(pairs["step"].astype(int), pairs["rank"].astype(int)))
    return {k: i for i, k in enumerate(keys)}


# --------------------------------------------------------------------------------------------- the driver
@contextmanager
def dask_client(workers: int = 2, scheduler: str | None = None, client: Any = None) -> Iterator[Any]:
    """A ``distributed.Client``: ``client`` as is, one connected to ``scheduler``, or a new LocalCluster of
    ``workers`` single-threaded processes (closed on exit, with the cluster)."""
    distributed = _need_dask()
    if client is not None:
        yield client
        return
    if scheduler:
        with distributed.Client(scheduler) as c:
            yield c
        return
    if int(workers) < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    with distributed.LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as c:
        yield c


def compare_on_dask(npu: str | os.PathLike, bench: str | os.PathLike, *, workers: int = 2,
                    scheduler: str | None = None, client: Any = None, rows: bool = False,
                    progress: bool | None = None, rank_map: dict | None = None, step_map: dict | None = None,
                    **options: Any) -> RankCompare:
    """Compare two dump folders rank by rank on Dask (see the module docstring).

    ``options`` are :func:`compare`'s (``mode``, ``fuzzy``, ``mapping``, ``thresholds``). ``rows=True``
    also gathers every compared row into ``.result``, a CompareResult equal to the in-process compare.
    ``progress``: a bar over the finished ranks (default: on a terminal or in a notebook).
    """
    from msprobe_nb.progress import bar

    from .compare import CompareError, gathered_result, mostly_unmatched_warning
    from .matching import MatchError

    try:
        units, notes = plan_units(npu, bench, rank_map, step_map)
    except MatchError as e:
        raise CompareError(str(e)) from None
    if not units:
        raise CompareError(f"no rank of the NPU dump {npu} has a counterpart in the bench dump {bench}: "
                           f"{'; '.join(notes)}. Pass rank_map={{npu_rank: bench_rank}} to pair them")
    options = dict(options, step_map=step_map, rank_map=rank_map)
    options.pop("progress", None)
    parts: list[dict[str, Any]] = []
    with dask_client(workers, scheduler, client) as c:
        distributed = _need_dask()
        futures = c.map(compare_unit, units, options=options, rows=rows, pure=False)
        done = distributed.as_completed(futures)
        for fut in bar(done, total=len(futures), desc="comparing ranks", unit="rank", minimum=2, explicit=progress):
            try:
                parts.append(fut.result())
            except CompareError as e:
                raise CompareError(f"{_unit_of(fut, futures, units)}: {e}") from None
            fut.release()
    parts.sort(key=lambda p: (p["unit"].rank, p["unit"].step or 0))
    pairs = pd.concat([p["pairs"] for p in parts], ignore_index=True).sort_values(["step", "rank"],
                                                                                   kind="stable").reset_index(drop=True)
    unpaired = pd.concat([p["unpaired"] for p in parts], ignore_index=True)
    summary = pd.concat([p["summary"] for p in parts], ignore_index=True).sort_values(
        ["step", "rank"], kind="stable").reset_index(drop=True)
    colls = [p["collectives"] for p in parts if len(p["collectives"])]
    collectives = pd.concat(colls, ignore_index=True) if colls else parts[0]["collectives"]
    divs = sorted((d for p in parts for d in p["divergences"]), key=lambda d: (d.step, d.rank))
    # the pairs' own unmatched warnings give way to one over all ranks, as the in-process compare says it
    unmatched = mostly_unmatched_warning(*(sum(p["sides"][i] for p in parts) for i in range(3)))
    for p in parts:
        notes += [n for n in p["notes"] if n not in notes and n != p.get("unmatched_warning")]
    if unmatched:
        notes.append(unmatched)
        warnings.warn(unmatched, stacklevel=2)
    mode = parts[0]["mode"]
    out = RankCompare(mode, summary, pairs, unpaired, notes, collectives[COLLECTIVE_COLUMNS], divs, None, units,
                      options, unmatched)
    if rows:
        pair_of = _pair_index(pairs)
        frames = [_renumber(p["rows"], p["pairs"], pair_of) for p in parts]
        t = pd.concat(frames, ignore_index=True)
        t = t.iloc[t["pair"].to_numpy().argsort(kind="stable")].reset_index(drop=True)
        stacks = {k: v for p in parts for k, v in p.get("stacks", {}).items()}
        out.result = gathered_result(t, mode=mode, thresholds=options.get("thresholds"), pairs=pairs,
                                     unpaired=unpaired, notes=notes, stacks=stacks, unmatched_warning=unmatched)
    return out


def _unit_of(fut: Any, futures: list, units: list[Unit]) -> str:
    for f, u in zip(futures, units):
        if f.key == fut.key:
            return f"rank {u.rank}" + (f" step {u.step}" if u.step is not None else "") + f" ({u.npu})"
    return "a rank"


__all__ = ["RankCompare", "RankDivergence", "Unit", "compare_on_dask", "dask_client", "plan_units"]
