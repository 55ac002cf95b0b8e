"""``AccCheckResult``: the pre-check's table (a DataFrame, one row per graded output) and its questions.

Torch-free, so the viewers and ``compare_prechecks`` can read a saved pre-check (``AccCheckResult.read_csv``)
without loading torch. Rows: ``api`` (the call, ``Torch.softmax.0.forward``), ``direction``, ``output`` (the
output's path), ``dtype``, ``shape``, ``api_class`` and ``standard`` (the rule applied), ``verdict`` (pass,
warning, error, or unchecked with the reason it could not be graded), ``approximate`` (inputs generated from
statistics), ``reasons`` (every reason, ``" | "`` between them) and the standard's metrics.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["COLUMNS", "METRIC_COLUMNS", "VERDICTS", "AccCheckResult"]

#: verdicts, best first; "unchecked" rows name why the bench could not grade them
VERDICTS = ("pass", "warning", "error", "unchecked")
#: leading columns, in order; the metric columns follow
COLUMNS = ["step", "rank", "call_index", "api", "name", "family", "op", "direction", "output", "dtype", "shape",
           "api_class", "standard", "level", "verdict", "approximate", "reasons", "bench_dtype"]
#: every metric a standard may report, always present (NaN where the standard has none), so that tables of
#: several steps line up
METRIC_COLUMNS = ["max_abs_err", "max_rel_err", "mean_rel_err", "rmse", "small_value_err_ratio", "err_balance",
                  "rmse_ratio", "max_rel_err_ratio", "mean_rel_err_ratio", "small_value_err_ratio_ratio",
                  "err_balance_ratio", "ref_rmse", "ref_max_rel_err", "ref_mean_rel_err", "ref_small_value_err_ratio",
                  "ref_err_balance", "max_ulp_err", "mean_ulp_err", "ulp_err_ratio", "rel_err_ratio",
                  "within_tolerance", "mismatch", "mismatch_ratio", "special_mismatch", "zero_ratio",
                  "expected_zero_ratio"]
_RANK = {"pass": 0, "warning": 1, "error": 2, "unchecked": -1}


class AccCheckResult(pd.DataFrame):
    """The pre-check table; what pandas derives from it (``r[mask]``, ``r.sort_values(...)``) stays one."""

    _metadata = ["notes", "bench_device"]

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return AccCheckResult

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], *, notes: list[str] | None = None,
                  bench_device: str = "cpu") -> AccCheckResult:
        frame = pd.DataFrame(rows)
        for c in COLUMNS + METRIC_COLUMNS:
            if c not in frame.columns:
                frame[c] = pd.Series([float("nan")] * len(frame) if c in METRIC_COLUMNS else [None] * len(frame),
                                     dtype=float if c in METRIC_COLUMNS else object)
        for c in ("reasons", "standard", "level", "output", "bench_dtype"):
            frame[c] = frame[c].where(frame[c].notna(), "")
        frame["approximate"] = frame["approximate"].where(frame["approximate"].notna(), False).astype(bool)
        extra = [c for c in frame.columns if c not in COLUMNS and c not in METRIC_COLUMNS]
        out = cls(frame[COLUMNS + METRIC_COLUMNS + extra].reset_index(drop=True))
        out.notes = list(notes or [])
        out.bench_device = bench_device
        return out

    # ------------------------------------------------------------------ questions
    def failures(self) -> AccCheckResult:
        """The outputs whose device values are worse than a correct kernel's would be (verdict error)."""
        return self[self["verdict"] == "error"]

    def unchecked(self) -> AccCheckResult:
        """What the bench could not grade, each with the reason."""
        return self[self["verdict"] == "unchecked"]

    def failed_apis(self) -> list[str]:
        """The names of the failing APIs (``Torch.softmax.0.forward``), in call order."""
        f = self.failures()
        return list(dict.fromkeys(f.sort_values(["step", "rank", "call_index"], kind="stable")["api"]))

    def apis(self) -> pd.DataFrame:
        """One row per API call: its worst verdict (unchecked only when nothing of it was graded), outputs
        graded, the standards used and every reason."""
        if self.empty:
            return pd.DataFrame(columns=["step", "rank", "call_index", "api", "verdict", "outputs", "standards",
                                         "reasons"])
        t = pd.DataFrame(self)
        rank = t["verdict"].map(_RANK).fillna(-1)
        t = t.assign(_rank=rank)
        g = t.groupby(["step", "rank", "api"], sort=False)
        out = g.agg(call_index=("call_index", "min"), _rank=("_rank", "max"), outputs=("verdict", "size"),
                    standards=("standard", lambda s: ", ".join(dict.fromkeys(str(x) for x in s if x))),
                    reasons=("reasons", lambda s: " | ".join(str(x) for x in s if x)))
        inv = {v: k for k, v in _RANK.items()}
        out["verdict"] = out.pop("_rank").map(inv)
        return out.reset_index()[["step", "rank", "call_index", "api", "verdict", "outputs", "standards", "reasons"]]

    def counts(self) -> dict[str, int]:
        """Rows per verdict, and the APIs graded."""
        vc = pd.Series(self["verdict"]).value_counts()
        return {"rows": len(self), "apis": int(self["api"].nunique()) if len(self) else 0,
                **{v: int(vc.get(v, 0)) for v in VERDICTS}}

    # ------------------------------------------------------------------ files
    def to_csv(self, path: Any = None, **kw: Any) -> Any:  # noqa: D401 - pandas' signature
        """pandas' ``to_csv``; shapes are written as lists (``[4, 16]``)."""
        frame = pd.DataFrame(self)
        if "shape" in frame:
            frame["shape"] = frame["shape"].map(lambda s: list(s) if isinstance(s, tuple) else s)
        kw.setdefault("index", False)
        return frame.to_csv(path, **kw)

    @classmethod
    def read_csv(cls, path: str | os.PathLike) -> AccCheckResult:
        """A pre-check saved with ``to_csv`` (or ``msprobe-nb acc-check -o``)."""
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such pre-check CSV")
        frame = pd.read_csv(p, keep_default_na=False, na_values=[""])
        missing = [c for c in ("api", "output", "verdict") if c not in frame.columns]
        if missing:
            raise ValueError(f"{p}: not a pre-check CSV (no column {missing[0]!r})")
        frame["reasons"] = frame["reasons"].astype(object).where(frame["reasons"].notna(), "").astype(str) \
            if "reasons" in frame else ""
        return cls.from_rows(frame.to_dict("records"), notes=[f"read from {p}"])

    # ------------------------------------------------------------------ display
    def __repr__(self) -> str:  # a short header above pandas' table
        c = self.counts() if "verdict" in self.columns and "api" in self.columns else None
        if c is None:
            return super().__repr__()
        head = (f"<AccCheckResult: {c['apis']} APIs, {c['rows']} outputs: {c['pass']} pass, {c['warning']} warning, "
                f"{c['error']} error, {c['unchecked']} unchecked; bench {getattr(self, 'bench_device', '?')}>")
        return head + "\n" + super().__repr__()
