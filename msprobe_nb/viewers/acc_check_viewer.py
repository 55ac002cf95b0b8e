"""``AccCheckViewer(pre)``: browse a pre-check (one row per graded output) like a comparison: verdict
filter, sort by any metric, and the detail of one API: its standard, every reason and its metrics.

The same plain-Python core as the other viewers (:class:`~msprobe_nb.viewers.base.BaseViewer`: ``state``,
``set_state``, ``rows``, ``selected``). It reads the pre-check's table only (torch-free), so a CSV written by
``msprobe-nb acc-check -o`` can be browsed where torch is absent.
"""
from __future__ import annotations

import html
from typing import Any, ClassVar

import pandas as pd

from msprobe_nb.precheck.result import AccCheckResult

from .base import BaseViewer
from .detail import Detail
from .table import VERDICTS, cell_styles, reasons_by_severity, render_html
from .viewer_widgets import ViewerWidgets, opt, toggles_layout

__all__ = ["AccCheckViewer", "viewer_table"]


#: the error ratios to the reference kernel; ``err`` is the worst of them
RATIO_COLUMNS = ("rmse_ratio", "max_rel_err_ratio", "mean_rel_err_ratio", "small_value_err_ratio_ratio",
                 "err_balance_ratio", "ulp_err_ratio", "rel_err_ratio")


def viewer_table(pre: pd.DataFrame) -> pd.DataFrame:
    """The pre-check as the viewers' table: ``call`` (the API), ``result`` (the verdict; "unchecked" rows
    keep theirs), ``io`` and ``arg`` (the output), ``reasons`` (the one that set the verdict first) and ``err``
    (the worst of :data:`RATIO_COLUMNS`), in call order."""
    t = pd.DataFrame(pre).copy()
    t["call"] = t["api"].astype(str)
    t["result"] = t["verdict"].astype(str)
    t["io"] = "output"
    t["arg"] = t["output"].fillna("").astype(str)
    t["reasons"] = [" | ".join(reasons_by_severity(str(r).split(" | "))) if r else ""
                    for r in t["reasons"].fillna("").astype(str)]
    ratios = [c for c in RATIO_COLUMNS if c in t.columns]
    # the worst ratio to the reference kernel, a number (sorts and plots as one); NaN where none was measured
    t["err"] = t[ratios].apply(pd.to_numeric, errors="coerce").max(axis=1) if ratios else float("nan")
    return t.sort_values(["step", "rank", "call_index"], kind="stable").reset_index(drop=True)


class AccCheckViewer(BaseViewer):
    """Browse a pre-check: ``AccCheckViewer(pre)`` with an ``AccCheckResult`` or the path of its CSV."""

    COLUMNS: list[str] = ["call_index", "call", "arg", "result", "standard", "dtype", "shape",
                          "max_rel_err", "rmse_ratio", "mean_rel_err_ratio", "max_rel_err_ratio",
                          "max_ulp_err", "ulp_err_ratio", "mismatch", "zero_ratio", "approximate", "err"]
    METRICS: list[str] = ["err", "rmse_ratio", "mean_rel_err_ratio", "max_rel_err_ratio", "max_rel_err",
                          "max_ulp_err", "mismatch"]
    DETAIL_COLUMNS: ClassVar[list[str]] = ["direction", "arg", "result", "api_class", "standard", "level", "dtype",
                                           "shape", "bench_dtype", "approximate", "max_abs_err", "max_rel_err",
                                           "mean_rel_err", "rmse", "small_value_err_ratio", "err_balance",
                                           "rmse_ratio", "max_rel_err_ratio", "mean_rel_err_ratio",
                                           "small_value_err_ratio_ratio", "err_balance_ratio", "max_ulp_err",
                                           "ulp_err_ratio", "within_tolerance", "mismatch", "zero_ratio",
                                           "expected_zero_ratio"]

    def __init__(self, pre: Any, *, columns: list[str] | None = None, page_size: int = 50):
        if isinstance(pre, (str, bytes)) or hasattr(pre, "__fspath__"):
            pre = AccCheckResult.read_csv(pre)
        if not isinstance(pre, pd.DataFrame) or "verdict" not in pre.columns or "api" not in pre.columns:
            raise TypeError("AccCheckViewer takes the table acc_check() returns (or its CSV path)")
        self.pre = pre
        super().__init__(viewer_table(pre), columns=columns, page_size=page_size)

    def _header_html(self) -> str:
        c = AccCheckResult(self.pre).counts()
        return (f"<b>AccCheckViewer</b> <span style='font-size:12px'>{c['apis']} APIs, {c['rows']} outputs: "
                f"{c['pass']} pass, {c['warning']} warning, {c['error']} error, {c['unchecked']} unchecked</span>")

    def _extra_filter_widgets(self, shell: ViewerWidgets) -> list:
        """The verdict filter as buttons (the verdicts this pre-check holds, "unchecked" last)."""
        import ipywidgets as W

        have = shell.table_view.ix.uniques("result") if shell.table_view.ix.has("result") else []
        levels = [v for v in (*VERDICTS, "unchecked") if v in have]
        shell.w["verdict"] = W.ToggleButtons(options=["all", *levels], value="all", description="verdict",
                                             style={"button_width": "auto", "description_width": "auto"},
                                             layout=toggles_layout())
        shell.bind("verdict", opt)
        return [shell.w["verdict"]]

    def _extra_state_widgets(self) -> tuple[str, ...]:
        return ("verdict",)

    def _mark_call(self) -> str | None:
        return self.state.selected

    def _build_detail(self, rows: pd.DataFrame) -> Detail:
        r0 = rows.iloc[0]
        call, step, rank = str(r0["call"]), int(r0["step"]), int(r0["rank"])
        reasons = [x for text in rows["reasons"] for x in str(text).split(" | ") if x]
        cols = [c for c in self.DETAIL_COLUMNS if c in rows.columns and
                (c in ("direction", "arg", "result", "standard") or rows[c].notna().any())]
        head = (f"<h4 style='margin:4px 0'>{html.escape(call)}</h4><p style='font-size:12px'>step {step}, rank "
                f"{rank}, {html.escape(str(r0.get('family', '')))}.{html.escape(str(r0.get('op', '')))}, graded by "
                f"{html.escape(', '.join(dict.fromkeys(str(s) for s in rows['standard'] if s)) or 'nothing')}</p>")
        why = "".join(f"<li>{html.escape(x)}</li>" for x in reasons) or "<li>every rule holds</li>"
        body = render_html(rows, cols, cell_styles(rows[cols], self.thresholds))
        return Detail(call=call, step=step, rank=rank, rows=rows, reasons=reasons,
                      html=head + f"<ul style='font-size:12px'>{why}</ul>" + body)
