"""The CompareViewer shows the precision model's verdicts (issue 30, item 4).

On a noisy pair (tests/noise_harness.py: the small CNN at L1, about one bf16 ulp of noise on every compute call)
with one wrong kernel planted (the second relu 3 % off), the viewer opens on the first *anomalous* call, its
detail says why in figures, and a Precision tab draws own and inherited error along execution order with the
anomaly marked. On the clean pair it opens on the "within precision" summary and marks no anomaly.
"""
from __future__ import annotations

import warnings

import pytest

pytest.importorskip("ipywidgets")
import noise_harness as H  # noqa: E402

from msprobe_nb.analysis.compare import compare  # noqa: E402
from msprobe_nb.viewers import precision_plot as PP  # noqa: E402
from msprobe_nb.viewers.compare_viewer import CompareViewer  # noqa: E402

PLANTED = "Functional.relu.1.forward"
_CACHE: dict = {}


def result(tmp_path_factory, plant=None, **kw):
    """The compare of the (noisy, planted) CNN pair at L1, each dump recorded once per session."""
    base = tmp_path_factory.getbasetemp()
    if "bench" not in _CACHE:
        _CACHE["bench"] = H.record(base / "pv_bench", "cnn", level="L1")
    if plant not in _CACHE:
        _CACHE[plant] = H.record(base / f"pv_npu_{plant is not None}", "cnn", level="L1",
                                 noise=H.DeviceNoise(plant=plant))
    key = (plant, repr(kw))
    if key not in _CACHE:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _CACHE[key] = compare(_CACHE[plant], _CACHE["bench"], **kw)
    return _CACHE[key]


def test_the_viewer_opens_on_the_first_anomalous_call_with_its_verdict(tmp_path_factory):
    r = result(tmp_path_factory, ("relu", 1))
    v = CompareViewer(r)
    w = v.widgets
    assert v.state.selected == PLANTED  # selected in the grid, its detail below
    detail = w["detail"].value
    assert detail.startswith(f"<h4 style='margin:4px 0'>{PLANTED} ")
    assert "class='msnb-verdict'" in detail and "<b>precision:</b> anomalous: own error" in detail
    assert "what bf16 allows for" in detail and "tolerance 3x" in detail
    # the detail table carries the figures too
    for col in ("verdict", "bound_ratio", "own_err", "inherited_err", "bound"):
        assert f"<th>{col}</th>" in detail
    assert "<b>precision model:</b> 2 call(s) beyond bf16 precision, first " + PLANTED in w["header"].value


def test_the_verdict_text_follows_the_row_and_the_tolerance(tmp_path_factory):
    r = result(tmp_path_factory, ("relu", 1))
    v = CompareViewer(r)
    calls = r[r["call"] == PLANTED]
    assert v.verdict_text(calls).startswith("anomalous: own error") and v.verdict_text(calls).endswith("[output.0]")
    fine = r[r["call"] == "Functional.conv2d.0.forward"]
    assert v.verdict_text(fine).startswith("within precision: output error")
    assert v.verdict_text(r[r["call"] == "Module.c1.Conv2d.forward.0"]) == ""  # a module is not judged
    r5 = result(tmp_path_factory, ("relu", 1), precision={"tolerance": 5})  # the viewer says the result's own
    v5 = CompareViewer(r5)
    assert v5.tolerance == 5 and "tolerance 5x" in v5.verdict_text(r5[r5["call"] == PLANTED])
    r50 = result(tmp_path_factory, ("relu", 1), precision={"tolerance": 50})  # within at 50x
    assert CompareViewer(r50).verdict_text(r50[r50["call"] == PLANTED]).startswith("within precision")


def test_the_precision_tab_draws_own_and_inherited_error_with_the_anomaly(tmp_path_factory):
    r = result(tmp_path_factory, ("relu", 1))
    v = CompareViewer(r)
    w = v.widgets
    titles = list(w["tabs"].titles)
    assert "Precision" in titles
    assert bytes(w["precision_img"].value) == b""  # drawn when first shown
    w["tabs"].selected_index = titles.index("Precision")
    assert bytes(w["precision_img"].value)[:4] == b"\x89PNG"
    s = PP.precision_series(r)
    assert list(s["call_index"]) == sorted(s["call_index"]) and s["call_index"].is_unique
    anom = s[s["verdict"] == "anomalous"]
    assert anom["call"].iloc[0] == PLANTED
    planted_ci = int(r.loc[r["call"] == PLANTED, "call_index"].iloc[0])
    fig = v.precision_figure()
    assert PP.anomaly_x(fig) == planted_ci
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"inherited error", "own error", "bound (inherited + own allowance)"} <= set(labels)
    assert f"first anomalous: {PLANTED}" in labels
    # the other tabs still draw on their own (tabs are dispatched by title)
    w["tabs"].selected_index = titles.index("Trace")
    assert "first divergence" in w["trace"].value or "no trace" in w["trace"].value


def test_a_clean_noisy_pair_opens_on_the_within_precision_summary(tmp_path_factory):
    r = result(tmp_path_factory)
    v = CompareViewer(r)
    w = v.widgets
    assert v.divergence is None and v.state.selected is None
    assert "<b>no divergence</b>: every call within bf16 precision; largest output error" in w["header"].value
    fig = v.precision_figure()
    assert PP.anomaly_x(fig) is None and "every call within bf16 precision" in fig.axes[0].get_title()
    v.goto("Functional.conv2d.1.forward")
    assert "<b>precision:</b> within precision: output error" in w["detail"].value


def test_without_verdicts_there_is_no_precision_tab(tmp_path_factory):
    r = result(tmp_path_factory, ("relu", 1), precision=False)
    v = CompareViewer(r)
    assert "Precision" not in list(v.widgets["tabs"].titles)
    assert "msnb-verdict" not in v.widgets["detail"].value and v.verdict_text(r[r["call"] == PLANTED]) == ""
    assert PP.precision_series(r).empty
    assert PP.anomaly_x(PP.precision_along_order(r)) is None
