"""compare(npu, bench) -> CompareResult: match rows, compute metrics, grade, find the first divergence.

The result is a DataFrame (one row per matched pair or unmatched row, NPU execution order) with extra
methods: :meth:`CompareResult.first_divergence`, :meth:`CompareResult.calls_summary`,
:meth:`CompareResult.to_msprobe_csv` and :attr:`CompareResult.unmatched`. Columns are listed in
``docs/compare.md``.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from . import precision_model
from .compare_table import add_tensor_metrics, build_table, diverging, mark_errors, result_frame
from .divergence import Divergence, find_divergences
from .grading import Thresholds, grade, summarize_calls
from .matching import Mapping, MatchError, match_rows
from .msprobe_csv import EXTRA_COLUMNS, MSPROBE_HEADERS, msprobe_frame  # noqa: F401 - re-exported
from .precision_model import Precision
from .ranks import check_world_sizes, collective_table, first_across_ranks

if TYPE_CHECKING:
    from msprobe_nb.store.dump import Dump

MODES = ("auto", "statistics", "tensor", "md5")
_REQUIRED = ("step", "rank", "call_index", "call", "name")


class CompareError(ValueError):
    """Two dumps cannot be compared (missing, empty, wrong kind, nothing in common, bad options)."""


@dataclass
class _Side:
    calls: pd.DataFrame
    dump: Any = None
    source: str = ""
    task: str = "statistics"


@dataclass
class _Context:
    mode: str
    npu: _Side
    bench: _Side
    thresholds: Thresholds
    pairs: pd.DataFrame
    unpaired: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    stack_ids: dict | None = None
    precision: Precision = field(default_factory=Precision)
    noisy: Any = None  #: the (step, rank) pairs judged by the precision model (pair ids), see precision_model
    unmatched_warning: str = ""  #: set when most rows of either side found no partner (see mostly_unmatched)
    gathered_stacks: dict | None = None  #: (call, step, rank) -> frames, for rows compared elsewhere (Dask)
    graded_reasons: Any = None  #: msprobe's reasons per row (a Series), before the verdicts: replay_verdicts


# --------------------------------------------------------------------------------------------- inputs
def _load_side(x: Any, label: str) -> _Side:
    if isinstance(x, (str, os.PathLike)):
        p = Path(x)
        if not p.exists():
            raise CompareError(f"{label} dump not found: {p}")
        try:
            from msprobe_nb.store.dump import load
        except ImportError as e:  # pragma: no cover - depends on the store layer being installed
            raise CompareError(f"cannot read dumps: msprobe_nb.store.dump is unavailable ({e})") from None
        try:
            dump = load(p)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CompareError(f"cannot read the {label} dump {p}: {e}") from None
        return _side_from_dump(dump, label, str(p))
    if isinstance(x, pd.DataFrame):
        return _Side(_check_calls(x, label), None, label, _infer_task(x))
    if hasattr(x, "calls"):
        return _side_from_dump(x, label, str(getattr(x, "source", "") or label))
    raise CompareError(f"{label}: expected a dump path, a Dump or a calls DataFrame, got {type(x).__name__}")


def _side_from_dump(dump: Any, label: str, source: str) -> _Side:
    calls = _check_calls(dump.calls, label)
    task = str(getattr(dump, "task", "") or _infer_task(calls))
    return _Side(calls, dump, source, task)


def _check_calls(df: Any, label: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise CompareError(f"{label}: calls is not a DataFrame")
    missing = [c for c in _REQUIRED if c not in df.columns]
    if missing:
        raise CompareError(f"{label}: not a calls table (missing columns {missing})")
    if df.empty:
        raise CompareError(f"{label} dump is empty: it recorded no calls")
    from msprobe_nb.store.schema import COLUMN_NAMES, coerce_calls
    if list(df.columns) != COLUMN_NAMES:
        df = coerce_calls(df)
    return df


def _infer_task(df: pd.DataFrame) -> str:
    if "data_name" in df.columns and (df["data_name"].fillna("") != "").any():
        return "tensor"
    if "hash" in df.columns and (df["hash"].fillna("") != "").any():
        return "md5"
    return "statistics"


def _resolve_mode(mode: str, npu: _Side, bench: _Side, notes: list[str]) -> str:
    if mode not in MODES:
        raise CompareError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    nt, bt = npu.task, bench.task
    if mode == "auto":
        if nt == bt == "tensor" and _has_tensors(npu) and _has_tensors(bench):
            return "tensor"
        if nt == bt == "md5":
            return "md5"
        if nt != bt:
            notes.append(f"NPU dump task is {nt!r}, bench dump task is {bt!r}: compared in statistics mode")
        return "statistics"
    if mode == "tensor":
        for side, label in ((npu, "NPU"), (bench, "bench")):
            if side.task != "tensor" or not _has_tensors(side):
                raise CompareError(f"tensor mode needs tensor dumps on both sides, but the {label} dump is "
                                   f"task {side.task!r}{'' if _has_tensors(side) else ' without tensor data'}; "
                                   "use mode='statistics'")
    if mode == "md5":
        for side, label in ((npu, "NPU"), (bench, "bench")):
            if (side.calls["hash"].fillna("") == "").all():
                raise CompareError(f"md5 mode needs content hashes, and the {label} dump has none")
    return mode


def _has_tensors(side: _Side) -> bool:
    return side.dump is not None and callable(getattr(side.dump, "tensor", None))


# --------------------------------------------------------------------------------------------- compare
def compare(npu: str | os.PathLike[str] | Dump | pd.DataFrame, bench: str | os.PathLike[str] | Dump | pd.DataFrame, *,
            mode: str = "auto", fuzzy: bool = False, mapping: Mapping | dict | str | Path | None = None,
            thresholds: Thresholds | dict | None = None, rank_map: dict | None = None, step_map: dict | None = None,
            progress: bool | None = None, precision: Precision | dict | bool | None = None) -> CompareResult:
    """Compare an NPU dump with a bench dump.

    ``npu`` / ``bench``: a dump path, a ``Dump`` or a calls DataFrame. ``mode``: auto | statistics |
    tensor | md5. ``fuzzy``: ignore call counters. ``mapping``: :class:`Mapping`, dict or JSON/YAML file.
    ``thresholds``: :class:`Thresholds` or a dict of its fields. ``rank_map`` / ``step_map``: pair NPU
    rank/step k with bench rank/step v. ``progress``: tqdm bar in tensor mode (default: on a terminal when
    there are over 100 tensors). ``precision``: the precision model's options (:class:`Precision`, a dict,
    or False for the exact rule alone; docs/compare.md). Raises :class:`CompareError` on input that cannot
    be compared.
    """
    th = _thresholds(thresholds)
    try:
        prec = Precision.of(precision)
    except ValueError as e:
        raise CompareError(str(e)) from None
    n_side, b_side = _load_side(npu, "NPU"), _load_side(bench, "bench")
    notes: list[str] = []
    mode = _resolve_mode(mode, n_side, b_side, notes)
    try:
        notes += check_world_sizes(n_side.calls, b_side.calls, _meta(n_side), _meta(b_side), rank_map)
        mp = Mapping.load(mapping)
        m = match_rows(n_side.calls, b_side.calls, fuzzy=fuzzy, mapping=mp, rank_map=rank_map, step_map=step_map)
    except MatchError as e:
        raise CompareError(str(e)) from None
    notes += m.notes
    t = build_table(n_side.calls, b_side.calls, m, mode, th)
    if not (t["match"] == "matched").any():
        raise CompareError(
            f"no row of the NPU dump matches the bench dump ({int((t['match'] == 'npu_only').sum())} NPU rows, "
            f"{int((t['match'] == 'bench_only').sum())} bench rows): they look like different models or runs. "
            f"NPU calls start {list(dict.fromkeys(n_side.calls['call'].head(50)))[:3]}, bench calls start "
            f"{list(dict.fromkeys(b_side.calls['call'].head(50)))[:3]}; try fuzzy=True or a mapping")
    said: list[str] = []  # notes a user must see at once, not only in the viewer or the CLI
    unmatched_warning = mostly_unmatched_warning(*side_rows(t["match"]))
    if unmatched_warning:
        said.append(unmatched_warning)
    if _same_dump(npu, bench, n_side, b_side):
        said.append("the NPU and bench dumps are the same dump: every call agrees by construction")
    notes += said
    from .setup_compare import setup_pointer  # the runs' set-ups, when both carry a record (docs/setup_check.md)
    if (pointer := setup_pointer(n_side.source, b_side.source)) is not None:
        notes.append(pointer)
        print(f"msprobe_nb: {pointer}")
    if mode == "tensor":
        add_tensor_metrics(t, n_side.dump, b_side.dump, th, progress)
    mark_errors(t, mode, th)
    noisy = precision_model.apply(t, prec, th.diverge_skip_ops)
    t["msprobe_result"], reasons = grade(t, mode, th)
    t["reasons"] = np.empty(len(reasons), dtype=object)
    t["reasons"][:] = reasons
    t["result"] = t["msprobe_result"]
    res = CompareResult(result_frame(t))
    res._ctx = _Context(mode, n_side, b_side, th, m.pairs, m.unpaired, notes, precision=prec, noisy=noisy,
                        unmatched_warning=unmatched_warning, graded_reasons=pd.Series(reasons, dtype=object))
    _one_verdict(res, th)
    _quiet_noise(res)
    for note in said + [n for n in notes if "without a counterpart" in n]:
        warnings.warn(note, stacklevel=2)
    return res


def side_rows(match: Any) -> tuple[int, int, int]:
    """(NPU rows, bench rows, matched rows) of a compare table's ``match`` column."""
    match = np.asarray(match, dtype=object)
    return (int((match != "bench_only").sum()), int((match != "npu_only").sum()), int((match == "matched").sum()))


def mostly_unmatched_warning(n_rows: int, b_rows: int, n_matched: int) -> str:
    """The warning when most rows of either side (not only the smaller) found no partner, else ''."""
    mostly = [f"{n - n_matched:,} of {n:,} {side} rows have no {other} counterpart"
              for side, other, n in (("NPU", "bench", n_rows), ("bench", "NPU", b_rows)) if n_matched < 0.5 * n]
    if not mostly:
        return ""
    return (f"{'; '.join(mostly)} (only {n_matched:,} rows matched): are these dumps of the same model and step? "
            "fuzzy=True or a mapping may pair more")


def gathered_result(rows: pd.DataFrame, *, mode: str, thresholds: Thresholds | dict | None, pairs: pd.DataFrame,
                    unpaired: pd.DataFrame, notes: list[str], stacks: dict | None = None,
                   unmatched_warning: str = "") -> CompareResult:
    """A CompareResult over rows compared elsewhere and gathered (the Dask path): its methods work on them;
    without the dumps it has no tensors, and only the NPU stacks in ``stacks`` ((call, step, rank) -> frames)."""
    res = CompareResult(rows)
    empty = rows.iloc[:0]
    res._ctx = _Context(mode, _Side(empty), _Side(empty), _thresholds(thresholds), pairs, unpaired, list(notes),
                        gathered_stacks=dict(stacks or {}), unmatched_warning=unmatched_warning)
    return res


def _meta(side: _Side) -> dict:
    meta = getattr(side.dump, "meta", None)
    return meta if isinstance(meta, dict) else {}


def _same_dump(npu: Any, bench: Any, n_side: _Side, b_side: _Side) -> bool:
    """The two arguments are one dump (the same object, or the same path)."""
    if npu is bench or (n_side.dump is not None and n_side.dump is b_side.dump):
        return True
    if isinstance(npu, (str, os.PathLike)) and isinstance(bench, (str, os.PathLike)):
        try:
            return Path(npu).resolve() == Path(bench).resolve()
        except OSError:
            return False
    return False


def _one_verdict(res: CompareResult, th: Thresholds) -> None:
    """One notion of bad, shown one way: ``result`` is msprobe's grading (kept in ``msprobe_result``, which
    the msprobe CSV writes) raised to a warning where a row diverges, and to an error on the diverging rows
    of each first divergence, so the call the runs part at is never graded "pass"."""
    result = res["result"].to_numpy(dtype=object).copy()
    reasons = res["reasons"].to_numpy(dtype=object).copy()
    div = res["diverges"].to_numpy(dtype=bool)
    err = res["err"].to_numpy(dtype=float)
    rtol = th.rtol_of(res["npu_dtype"], res["bench_dtype"])
    for i in np.flatnonzero(div & (result == "pass")):
        why = f"relative error {err[i]:.3g} above the tolerance {rtol[i]:.3g}" if np.isfinite(err[i]) else \
            "a hard mismatch (shape, value, dtype or NaN/inf)"
        result[i] = "warning"
        reasons[i] = list(reasons[i]) + [f"warning: diverges from the bench: {why}"]
    if div.any():
        calls, steps, ranks = (res[c].to_numpy() for c in ("call", "step", "rank"))
        for d in res.divergences():
            rows = np.flatnonzero((calls == d.call) & (steps == d.step) & (ranks == d.rank) & div)
            for i in rows:
                if result[i] != "error" or not any(r.startswith("error: first divergence") for r in reasons[i]):
                    result[i] = "error"
                    reasons[i] = list(reasons[i]) + [f"error: first divergence of step {d.step}, rank {d.rank}: "
                                                     f"{d.message}"]
    res["result"] = result
    res["reasons"] = reasons


def _quiet_noise(res: CompareResult) -> None:
    """In pairs judged by the precision model, rows within precision keep no level their metrics alone gave
    them (``msprobe_result`` keeps msprobe's grade); an anomalous call's output rows say why."""
    noisy = res._ctx.noisy
    if noisy is None or not len(noisy):
        return
    inp = np.isin(res["pair"].to_numpy(dtype=np.int64), noisy)
    keep = inp & ~res["diverges"].to_numpy(dtype=bool)
    result, reasons = precision_model.quiet_noise(res["result"].to_numpy(dtype=object),
                                                  res["reasons"].tolist(), keep)
    anom = inp & (res["verdict"].to_numpy(dtype=object) == precision_model.ANOMALOUS)
    tol = res._ctx.precision.tolerance
    for i in np.flatnonzero(anom):
        reasons[i] = list(reasons[i]) + [f"warning: {precision_model.describe(res.iloc[i], tol)}"]
        if result[i] == "pass":
            result[i] = "warning"
    res["result"] = result
    res["reasons"] = pd.Series(reasons, index=res.index, dtype=object)


def _thresholds(th: Any) -> Thresholds:
    if th is None:
        return Thresholds()
    if isinstance(th, Thresholds):
        return th
    if isinstance(th, dict):
        unknown = sorted(set(th) - set(Thresholds.fields()))
        if unknown:
            raise CompareError(f"unknown thresholds {unknown}; known: {', '.join(Thresholds.fields())}")
        try:
            return Thresholds(**th)
        except ValueError as e:
            raise CompareError(str(e)) from None
    raise CompareError(f"thresholds must be a Thresholds or a dict, got {type(th).__name__}")


# --------------------------------------------------------------------------------------------- result
def summary_text(head: str, notes: list[str], first: Any) -> str:
    """A comparison's summary: its counts line, its notes, then its first divergence (or that there is none)."""
    lines = [head, *(f"note: {n}" for n in notes)]
    lines.append(str(first) if first is not None else "no divergence: every matched row agrees within tolerance")
    return "\n".join(lines)


class CompareResult(pd.DataFrame):
    """The compare table (a DataFrame) plus the context needed for divergence and export.

    What pandas derives from it (``r[mask]``, ``r.query(...)``, ``r.sort_values(...)``, ``r.copy()``,
    ``r.head()``) is a CompareResult with the same context, so its methods work on the rows it holds:
    ``r[r["step"] == 3].first_divergence()``. ``pd.DataFrame(r)`` gives a plain frame.
    """

    _metadata = ["_ctx"]

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return CompareResult

    def _needs(self, *columns: str) -> None:
        missing = [c for c in columns if c not in self.columns]
        if missing:
            raise CompareError(f"this table lacks the compare columns {missing}: select rows (not columns) of a "
                               "compare result to keep its methods")
        if getattr(self, "_ctx", None) is None:
            raise CompareError("this table has no compare context: it was not made by compare()")

    # -- context
    @property
    def mode(self) -> str:
        """statistics | tensor | md5."""
        return self._ctx.mode

    @property
    def thresholds(self) -> Thresholds:
        return self._ctx.thresholds

    @property
    def notes(self) -> list[str]:
        """Things the user should know about this comparison (unpaired ranks, task differences, ...)."""
        return list(self._ctx.notes)

    @property
    def pairs(self) -> pd.DataFrame:
        """The (step, rank) pairs compared."""
        return self._ctx.pairs.copy()

    @property
    def unpaired(self) -> pd.DataFrame:
        """(side, step, rank, rows) of groups that had no counterpart and were not compared."""
        return self._ctx.unpaired.copy()

    @property
    def mostly_unmatched(self) -> bool:
        """Most rows of either side found no partner: the dumps may be of different models or steps (compare
        warns, the viewer's header says so, the CLI exits 3)."""
        return bool(getattr(self._ctx, "unmatched_warning", ""))

    @property
    def unmatched(self) -> pd.DataFrame:
        """Rows without a partner on the other side (``match`` is npu_only or bench_only)."""
        cols = ["step", "rank", "call_index", "call", "name", "match", "bench_name", "kind", "match_note"]
        return pd.DataFrame(self.loc[self["match"] != "matched", cols]).reset_index(drop=True)

    def counts(self) -> dict[str, int]:
        """Number of rows per result, plus unmatched rows and diverging rows."""
        vc = pd.Series(self["result"]).value_counts()
        return {"rows": len(self), "pass": int(vc.get("pass", 0)), "warning": int(vc.get("warning", 0)),
                "error": int(vc.get("error", 0)), "unmatched": int((self["match"] != "matched").sum()),
                "diverging": int(self["diverges"].sum())}

    def calls_summary(self) -> pd.DataFrame:
        """One row per call: worst result, all reasons, rows, unmatched rows, worst row and errors."""
        return summarize_calls(pd.DataFrame(self))

    # -- divergence
    def _stack_of(self, call: str, step: int, rank: int, side: str = "npu") -> list[str]:
        """Frames recorded for an NPU call (``side="bench"``: a bench call, its own step and rank); [] when none."""
        dump = (self._ctx.npu if side == "npu" else self._ctx.bench).dump
        if dump is None:
            gathered = (getattr(self._ctx, "gathered_stacks", None) or {}) if side == "npu" else {}
            return list(gathered.get((call, int(step), int(rank)), []))
        ctx = self._ctx
        key = "stack_ids" if side == "npu" else "bench_stack_ids"
        if getattr(ctx, key, None) is None:  # from the side's whole table: a selection of rows shares ctx
            c = (ctx.npu if side == "npu" else ctx.bench).calls
            t = c.loc[c["stack_id"] >= 0, ["call", "step", "rank", "stack_id"]].drop_duplicates(["call", "step",
                                                                                                   "rank"])
            setattr(ctx, key, dict(zip(zip(t["call"], t["step"].astype(int), t["rank"].astype(int)),
                                       t["stack_id"].astype(int))))
        sid = getattr(ctx, key).get((call, int(step), int(rank)))
        frames = getattr(dump, "stack_frames", None)
        if isinstance(frames, dict):
            return list(frames.get(sid, [])) if sid is not None else []
        try:
            return list(dump.stack(call) or [])
        except Exception:  # noqa: BLE001 - a stack is a nicety, never a failure
            return []

    def divergences(self, thresholds: Thresholds | None = None) -> list[Divergence]:
        """The first divergence of each (step, rank) pair (of the rows this table holds)."""
        t, th = self._diverging(thresholds)
        ds = find_divergences(t, th, self._stack_of, self.mode)
        noisy = getattr(self._ctx, "noisy", None)
        if noisy is not None and len(noisy) and "verdict" in t.columns:
            self._explain(ds, t)
        return ds

    def _explain(self, ds: list[Divergence], t: pd.DataFrame) -> None:
        """The precision model's figures in the message of each divergence found in a noisy pair."""
        anom = t[(t["verdict"] == precision_model.ANOMALOUS) & t["pair"].isin(self._ctx.noisy)]
        for d in ds:
            rows = anom[(anom["call"] == d.call) & (anom["step"] == d.step) & (anom["rank"] == d.rank)]
            if d.kind == "call" and len(rows):
                worst = rows.loc[rows["bound_ratio"].astype(float).idxmax()]
                d.message = precision_model.describe(worst, self._ctx.precision.tolerance) + \
                    " (the runs differ by precision noise up to here)"

    def precision_summary(self) -> str:
        """One line from the precision model: every call within precision (the largest ratio and where),
        or the calls beyond it; for pairs bitwise equal up to a planted cause, the exact rule decides."""
        self._needs("pair", "call", "verdict")
        noisy = getattr(self._ctx, "noisy", None)
        t = pd.DataFrame(self)
        if noisy is None or not len(noisy) or not t["pair"].isin(noisy).any():
            return "no precision noise: the runs agree bitwise up to their first difference (exact rule)" \
                if self["diverges"].any() or (self["err"].fillna(0) > 0).any() else "the runs agree bitwise"
        return precision_model.summary_line(t[t["pair"].isin(noisy)])

    def _diverging(self, thresholds: Thresholds | None) -> tuple[pd.DataFrame, Thresholds]:
        """The rows as a plain frame, ``diverges`` recomputed when ``thresholds`` moves the tolerance."""
        self._needs("pair", "call", "io", "match", "diverges", "err")
        t = pd.DataFrame(self)
        th = thresholds or self.thresholds
        if thresholds is not None and (thresholds.diverge_rtol, thresholds.diverge_rtol_by_dtype) != \
                (self.thresholds.diverge_rtol, self.thresholds.diverge_rtol_by_dtype):
            t["diverges"] = diverging(t, th)
            noisy = getattr(self._ctx, "noisy", None)
            if noisy is not None and len(noisy) and "verdict" in t.columns:
                t["diverges"] = precision_model.precision_diverges(t, t["diverges"].to_numpy(dtype=bool),
                                                                   t["verdict"].to_numpy(dtype=object), noisy)
        return t, th

    def first_divergence(self, step: int | None = None, rank: int | None = None,
                         thresholds: Thresholds | None = None) -> Divergence | None:
        """The earliest call whose inputs agree and outputs diverge (see docs/compare.md); None if all agree.

        Without ``rank``, over several ranks: a :class:`~msprobe_nb.analysis.ranks.RankDivergence`, the
        earliest step, then the collective order across ranks, with the rank where the runs part and how
        the difference spread through collectives (docs/distributed.md).
        """
        ds = [d for d in self.divergences(thresholds)
              if (step is None or d.step == step) and (rank is None or d.rank == rank)]
        if not ds:
            return None
        if rank is None and self["rank"].nunique() > 1:
            t, _ = self._diverging(thresholds)
            return first_across_ranks(ds, collective_table(t), sorted(int(r) for r in pd.unique(self["rank"])))
        return min(ds, key=lambda d: (d.step, d.call_index, d.rank))

    # -- export
    def to_msprobe_csv(self, path: str | os.PathLike, *, include_bench_only: bool = True) -> Path:
        """Write msprobe's compare CSV for this mode (its columns and order, our extra columns after)."""
        df = msprobe_frame(self, include_bench_only=include_bench_only)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(path, index=False, lineterminator="\n")
        return path

    def to_msprobe_frame(self, *, include_bench_only: bool = True) -> pd.DataFrame:
        """The msprobe CSV as a DataFrame of strings."""
        return msprobe_frame(self, include_bench_only=include_bench_only)

    def summary(self) -> str:
        """A few lines: mode, counts, notes and the first divergence."""
        c = self.counts()
        first = self.first_divergence()
        text = summary_text(f"mode {self.mode}: {c['rows']} rows, {c['pass']} pass, {c['warning']} warning, "
                            f"{c['error']} error, {c['unmatched']} unmatched", self.notes, first)
        noisy = getattr(self._ctx, "noisy", None)
        if first is None and noisy is not None and len(noisy) and "verdict" in self.columns:
            text += f"\nprecision model: {self.precision_summary()}"
        return text
