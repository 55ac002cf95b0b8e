"""compare_monitors' rules on hand-made records (analysis/monitor_compare.py): which rows part and why, the
bitwise and the band modes of first_divergence(), the sign and histogram directions, learning rates. The
records are built as DataFrames (no torch, no files), so the mutation run (tools/mutation.py) judges a mutant
of the rules in about a second; tests/test_monitor_compare.py holds the same rules on real training runs."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from msprobe_nb.analysis.monitor_compare import (
    BAND_RTOL,
    BAND_STEPS,
    DIRECTION_MIN,
    NORM_TOLERANCE,
    MonitorDivergence,
    compare_monitors,
)
from msprobe_nb.analysis.monitor_frame import MonitorFrame

NAMES = ["fc1.weight", "fc2.weight"]


def frame(series: dict, steps: int, loss=None, lr=None, extra=None, signs=None, rank: int = 0, meta=None):
    """A record: ``series`` {(name, kind): norms, one per step (a number: the same every step)}; ``loss`` and
    ``lr`` one per step; ``extra`` {(name, kind): {column: values}}; ``signs``: (table, bytes) of rank 0."""
    rows = []
    for (name, kind), v in series.items():
        vals = np.broadcast_to(np.asarray(v, np.float64), (steps,))
        cols = {c: np.broadcast_to(np.asarray(x, np.float64), (steps,)) for c, x in (extra or {}).get((name, kind),
                                                                                                     {}).items()}
        for s in range(steps):
            rows.append({"step": s, "rank": rank, "name": name, "kind": kind, "norm": vals[s], "nan": 0.0,
                         "inf": 0.0, "numel": 100.0, **{c: x[s] for c, x in cols.items()}})
    stats = pd.DataFrame(rows)
    sc = pd.DataFrame({"step": np.arange(steps), "rank": rank})
    if loss is not None:
        sc["loss"] = np.broadcast_to(np.asarray(loss, np.float64), (steps,))
    for k, v in (lr or {}).items():
        sc[k] = np.broadcast_to(np.asarray(v, np.float64), (steps,))
    m = {"parameters": NAMES, "groups": [["fc1.weight"], ["fc2.weight"]], **(meta or {})}
    return MonitorFrame("/nonexistent/run", stats, sc, {rank: m}, list(NAMES), {rank: signs} if signs else {})


def walk(n: int, start: float = 1.0, seed: int = 0) -> np.ndarray:
    """A norm series that drifts from step to step."""
    return start * np.exp(np.cumsum(np.random.default_rng(seed).normal(0, 0.05, n)))


# ------------------------------------------------------------------------------------------------ the table
def test_norm_ratios_and_which_rows_part():
    tol = 0.25  # a binary fraction: a ratio exactly at the tolerance
    a = frame({("w", "grad"): [1.0, 0.0, 1.0 + tol, 1.5, np.nan, np.inf, np.nan, 0.5, 1.0 - tol]}, 9)
    b = frame({("w", "grad"): [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, np.nan, 1.0, 1.0]}, 9)
    t = compare_monitors(a, b, norm_tolerance=tol).table.set_index("step")
    assert t.loc[1, "norm_ratio"] == 1.0  # both zero
    assert t.loc[2, "norm_ratio"] == 1 + tol
    assert list(t["parts"]) == [False, False, False, True, True, True, False, True, False]  # at the tolerance: not
    assert NORM_TOLERANCE == 0.01 and compare_monitors(a, b).table["parts"].iloc[2]
    assert t["layer"].iloc[0] == "w"
    assert list(compare_monitors(a, b).table.columns[:4]) == ["step", "rank", "name", "kind"]


def test_a_zero_norm_against_a_nonzero_one_parts():
    a, b = frame({("x.w", "weight"): [0.0, 1.0]}, 2), frame({("x.w", "weight"): [1.0, 0.0]}, 2)
    t = compare_monitors(a, b).table
    assert list(t["norm_ratio"]) == [0.0, np.inf] and list(t["parts"]) == [True, True]
    assert list(t["layer"]) == ["x", "x"]


def test_the_tolerances_are_arguments_and_are_checked():
    a, b = frame({("w", "grad"): 1.05}, 2), frame({("w", "grad"): 1.0}, 2)
    assert compare_monitors(a, b).table["parts"].all()
    assert not compare_monitors(a, b, norm_tolerance=0.1).table["parts"].any()
    for bad in ({"norm_tolerance": -0.1}, {"direction_min": 1.5}, {"direction_min": -0.1}, {"band_steps": 0},
                {"band_rtol": -1e-3}):
        with pytest.raises(ValueError, match="norm_tolerance must be >= 0"):
            compare_monitors(a, b, **bad)
    assert compare_monitors(a, b, direction_min=0.0, band_steps=1, band_rtol=0.0).norm_tolerance == NORM_TOLERANCE


def test_histogram_overlap_is_the_direction_where_there_are_no_sign_bitmaps():
    ha = {("w", "grad"): {"hist_0": [10, 10, 0, 0], "hist_1": [10, 10, 20, 0], "hist_2": [0, 0, 0, 0]}}
    hb = {("w", "grad"): {"hist_0": [10, 20, 0, 0], "hist_1": [10, 0, 20, 0], "hist_2": [0, 20, 0, 0]}}
    a, b = frame({("w", "grad"): 1.0}, 4, extra=ha), frame({("w", "grad"): 1.0}, 4, extra=hb)
    t = compare_monitors(a, b).table
    d = t["direction"].to_numpy()
    assert d[0] == 1.0 and d[1] == pytest.approx(0.5)  # min(1/2, 1/3) + min(1/2, 0) + min(0, 2/3), halves
    assert d[2] == 1.0 and np.isnan(d[3])  # an empty histogram: no direction
    assert list(t["parts"]) == [False, True, False, False]
    c = compare_monitors(a, b, direction_min=0.4).table
    assert not c["parts"].any()


def test_without_histograms_on_both_sides_there_is_no_direction():
    a = frame({("w", "grad"): 1.0}, 2, extra={("w", "grad"): {"hist_0": [1, 1], "hist_1": [1, 1]}})
    b = frame({("w", "grad"): 1.0}, 2)
    assert compare_monitors(a, b).table["direction"].isna().all()


def _signs(steps_bytes: dict, numel: int = 16):
    """(table, bytes) of sign bitmaps: {step: bytes of name ``w``}."""
    rows, blob = [], []
    for step, bs in steps_bytes.items():
        rows.append({"step": step, "name": "w", "numel": numel, "start": len(blob), "nbytes": len(bs)})
        blob += list(bs)
    return pd.DataFrame(rows), np.asarray(blob, np.uint8)


def test_sign_agreement_is_the_share_of_gradient_signs_that_agree():
    sa = _signs({0: [0xFF, 0x00], 1: [0xFF, 0x00], 2: [0xFF, 0x00]})
    sb = _signs({0: [0xFF, 0x00], 1: [0x0F, 0x00], 2: [0x00, 0xFF]})
    a = frame({("w", "grad"): 1.0, ("w", "weight"): 1.0}, 3, signs=sa)
    b = frame({("w", "grad"): 1.0, ("w", "weight"): 1.0}, 3, signs=sb)
    t = compare_monitors(a, b).table
    g = t.loc[t["kind"] == "grad"].set_index("step")["direction"]
    assert list(g) == [1.0, 12 / 16, 0.0]
    assert t.loc[t["kind"] == "weight", "direction"].isna().all()  # signs are the gradients'
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.kind, fd.mode) == (1, "grad", "bitwise") and fd.direction == 12 / 16


def test_bitmaps_of_different_sizes_are_not_compared():
    sa, sb = _signs({0: [0xFF]}, numel=8), _signs({0: [0x00]}, numel=7)
    a, b = frame({("w", "grad"): 1.0}, 1, signs=sa), frame({("w", "grad"): 1.0}, 1, signs=sb)
    assert compare_monitors(a, b).table["direction"].isna().all()


def test_sign_bitmaps_of_several_gradients_in_one_step():
    ta = pd.DataFrame({"step": [0, 0], "name": ["w", "v"], "numel": [8, 8], "start": [0, 1], "nbytes": [1, 1]})
    tb = pd.DataFrame({"step": [0, 0], "name": ["v", "w"], "numel": [8, 8], "start": [0, 1], "nbytes": [1, 1]})
    a = frame({("w", "grad"): 1.0, ("v", "grad"): 1.0}, 1, signs=(ta, np.array([0xFF, 0xF0], np.uint8)))
    b = frame({("w", "grad"): 1.0, ("v", "grad"): 1.0}, 1, signs=(tb, np.array([0xF0, 0x0F], np.uint8)))
    t = compare_monitors(a, b).table.set_index("name")["direction"]
    assert t["w"] == 0.5 and t["v"] == 1.0


# ---------------------------------------------------------------------------------- first divergence: bitwise
def test_bitwise_equal_runs_never_part():
    s = {("fc1.weight", "weight"): walk(30), ("fc1.weight", "grad"): walk(30, seed=1)}
    c = compare_monitors(frame(s, 30, loss=walk(30, seed=2)), frame(s, 30, loss=walk(30, seed=2)))
    assert c.first_divergence() is None
    assert repr(c) == f"MonitorComparison({len(c)} row(s); first divergence: none)" and len(c) == 60


def test_the_first_value_that_differs_at_all_and_the_earliest_kind_in_it():
    n = 30
    w, g, m = walk(n), walk(n, seed=1), walk(n, seed=2)
    g2, m2, w2 = g.copy(), m.copy(), w.copy()
    g2[12:] *= 1 + 1e-7  # far under the tolerance: bitwise runs part at any difference
    m2[12:] *= 1.5  # the optimizer state parts far more in the same step, but comes later in a step
    w2[15:] *= 1.1
    a = frame({("fc1.weight", "grad"): g2, ("fc1.weight", "exp_avg"): m2, ("fc2.weight", "weight"): w2}, n)
    b = frame({("fc1.weight", "grad"): g, ("fc1.weight", "exp_avg"): m, ("fc2.weight", "weight"): w}, n)
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what, fd.mode, fd.band) == (12, "fc1.weight", "grad", "gradient",
                                                                      "bitwise", (1.0, 1.0))
    assert fd.layer == "fc1" and fd.rank == 0
    assert fd.norm_ratio == pytest.approx(1 + 1e-7) and np.isnan(fd.direction)
    assert fd.reason.startswith("the first value that differs: norm ") and "bitwise equal before" in fd.reason
    assert str(fd) == f"step 12, rank 0: grad of fc1.weight (layer fc1) (gradient first): {fd.reason}"


def test_of_one_kind_the_row_that_parts_the_most_is_named():
    n = 10
    a = frame({("fc1.weight", "grad"): [1.0] * 5 + [1.01] * 5, ("fc2.weight", "grad"): [1.0] * 5 + [0.5] * 5,
               ("fc3.weight", "grad"): [1.0] * 5 + [1.2] * 5}, n)
    b = frame({("fc1.weight", "grad"): 1.0, ("fc2.weight", "grad"): 1.0, ("fc3.weight", "grad"): 1.0}, n)
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name) == (5, "fc2.weight")  # |log 0.5| > |log 1.2| > |log 1.01|


def test_the_loss_can_be_the_first_value_that_differs():
    s = {("fc1.weight", "grad"): walk(20)}
    loss = walk(20, seed=3)
    loss2 = loss.copy()
    loss2[7:] += 1e-9
    fd = compare_monitors(frame(s, 20, loss=loss2), frame(s, 20, loss=loss)).first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what) == (7, "loss", "scalar", "loss")
    assert fd.reason == "the loss is the first value that differs"
    s2 = {("fc1.weight", "grad"): np.r_[walk(20)[:9], walk(20)[9:] * 1.5]}
    fd = compare_monitors(frame(s2, 20, loss=loss2), frame(s, 20, loss=loss)).first_divergence()
    assert fd.step == 7 and fd.kind == "scalar"  # the loss first, though a gradient parts later
    fd = compare_monitors(frame(s2, 20, loss=loss), frame(s, 20, loss=loss)).first_divergence()
    assert fd.step == 9 and fd.kind == "grad"


def test_a_loss_that_differs_at_the_first_step_makes_the_runs_differ_from_the_start():
    s = {("fc1.weight", "grad"): walk(40)}
    loss = walk(40, seed=4)
    c = compare_monitors(frame(s, 40, loss=loss * (1 + 1e-6)), frame(s, 40, loss=loss))
    assert c.first_divergence() is None  # band mode: every ratio stays 1


def test_nan_on_both_sides_is_equal_and_a_direction_below_one_differs():
    s = {("fc1.weight", "grad"): [np.nan] * 4 + [1.0] * 4}
    c = compare_monitors(frame(s, 8, loss=[np.nan] * 8), frame(s, 8, loss=[np.nan] * 8))
    assert c.first_divergence() is None
    ha = {("fc1.weight", "grad"): {"hist_0": [5] * 6 + [6, 6], "hist_1": [5] * 8}}
    hb = {("fc1.weight", "grad"): {"hist_0": [5] * 8, "hist_1": [5] * 8}}
    fd = compare_monitors(frame({("fc1.weight", "grad"): 1.0}, 8, extra=ha),
                          frame({("fc1.weight", "grad"): 1.0}, 8, extra=hb)).first_divergence()
    assert fd.step == 6 and fd.mode == "bitwise" and fd.direction < 1


def test_only_kinds_in_a_steps_causal_order_decide():
    a = frame({("fc1.weight", "grad"): 1.0, ("fc1.weight", "other"): [1.0, 2.0]}, 2)
    b = frame({("fc1.weight", "grad"): 1.0, ("fc1.weight", "other"): 1.0}, 2)
    assert compare_monitors(a, b).first_divergence() is None


def test_empty_records_have_no_divergence():
    e = MonitorFrame("/x", pd.DataFrame(columns=["step", "rank", "name", "kind", "norm"]),
                     pd.DataFrame(columns=["step", "rank"]), {0: {}}, [], {})
    c = compare_monitors(e, e)
    assert c.first_divergence() is None and len(c) == 0


# ------------------------------------------------------------------------------------ first divergence: band
def _two_devices(n: int, exit_at: int | None, factor: float = 1.05, kind: str = "grad", seed: int = 0):
    """Runs that differ from the start: a's norms are b's times a ratio that wobbles within 1e-4 over the early
    steps; from ``exit_at`` one series' ratio is ``factor`` times more."""
    rng = np.random.default_rng(seed)
    base = {("fc1.weight", kind): walk(n, seed=1), ("fc2.weight", kind): walk(n, seed=2)}
    ratios = {k: 1.002 * (1 + rng.uniform(-1e-4, 1e-4, n)) for k in base}
    if exit_at is not None:
        ratios[("fc2.weight", kind)][exit_at:] *= factor
    a = frame({k: v * ratios[k] for k, v in base.items()}, n)
    return a, frame(base, n), ratios


def test_runs_that_differ_from_the_start_part_where_a_ratio_leaves_its_band():
    a, b, ratios = _two_devices(60, 37)
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.mode, fd.what) == (37, "fc2.weight", "grad", "band", "gradient")
    r = ratios[("fc2.weight", "grad")][:BAND_STEPS]
    lo, hi = math.log(r.min()), math.log(r.max())
    width = max(hi - lo, math.log1p(BAND_RTOL))
    assert fd.band == pytest.approx((math.exp(lo - width), math.exp(hi + width)), rel=1e-9)
    assert fd.norm_ratio == pytest.approx(ratios[("fc2.weight", "grad")][37])
    assert f"over steps 0-{BAND_STEPS - 1}" in fd.reason and "left the band [" in fd.reason


def test_a_series_inside_its_widened_band_does_not_part():
    a, b, _ = _two_devices(60, 37, factor=1 + 0.5 * BAND_RTOL)  # within the least half-width
    assert compare_monitors(a, b).first_divergence() is None
    a, b, _ = _two_devices(60, 37, factor=1 - 3 * BAND_RTOL)  # below the band
    assert compare_monitors(a, b).first_divergence().step == 37


def test_the_band_is_its_own_width_where_that_is_wider_than_band_rtol():
    n = 60
    b = frame({("fc1.weight", "grad"): walk(n)}, n)
    r = np.r_[np.tile([1.01, 1.0], BAND_STEPS // 2), np.full(n - BAND_STEPS, 1.015)]  # within 1.0-1.01 +- 0.01
    a = frame({("fc1.weight", "grad"): walk(n) * r}, n)
    assert compare_monitors(a, b).first_divergence() is None
    r[45] = 1.0205 * 1.01  # past 1.01 + its own width
    a = frame({("fc1.weight", "grad"): walk(n) * r}, n)
    fd = compare_monitors(a, b).first_divergence()
    assert fd.step == 45 and fd.band == pytest.approx((1 / 1.01, 1.01 ** 2), rel=1e-9)
    assert compare_monitors(a, b, band_rtol=0.05).first_divergence() is None


def test_the_band_steps_are_an_argument():
    a, b, _ = _two_devices(60, 10)
    fd = compare_monitors(a, b, band_steps=5).first_divergence()
    assert fd.step == 10 and "over steps 0-4" in fd.reason
    assert compare_monitors(a, b).first_divergence() is None  # a change within the early steps widens the band


def test_too_few_steps_for_a_band():
    a, b, _ = _two_devices(BAND_STEPS, 5)
    assert compare_monitors(a, b).first_divergence() is None
    a, b, _ = _two_devices(BAND_STEPS + 1, BAND_STEPS)
    assert compare_monitors(a, b).first_divergence().step == BAND_STEPS


def test_in_band_mode_a_side_turning_non_finite_parts_first():
    a, b, _ = _two_devices(40, None)
    a.stats.loc[(a.stats["step"] == 30) & (a.stats["name"] == "fc1.weight"), "norm"] = np.inf
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name) == (30, "fc1.weight") and "(one side not finite)" in fd.reason
    assert fd.mode == "band"


def test_in_band_mode_a_direction_drop_parts():
    n = 40
    a, b, _ = _two_devices(n, None)
    h = {("fc1.weight", "grad"): {"hist_0": [5] * 33 + [9] * 7, "hist_1": [5] * n}}
    hb = {("fc1.weight", "grad"): {"hist_0": [5] * n, "hist_1": [5] * n}}
    a = frame({k: a.stats.loc[(a.stats["name"] == k[0]), "norm"].to_numpy() for k in
               [("fc1.weight", "grad"), ("fc2.weight", "grad")]}, n, extra={**h, ("fc2.weight", "grad"): {}})
    b = frame({k: b.stats.loc[(b.stats["name"] == k[0]), "norm"].to_numpy() for k in
               [("fc1.weight", "grad"), ("fc2.weight", "grad")]}, n, extra=hb)
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name, fd.mode) == (33, "fc1.weight", "band")
    assert fd.direction == pytest.approx(5 / 14 + 0.5) and "direction similarity" in fd.reason
    assert f"(below {DIRECTION_MIN:g})" in fd.reason


def test_in_band_mode_the_earliest_kind_of_the_step_is_named():
    n = 50
    a, b, _ = _two_devices(n, 30, factor=1.5, kind="exp_avg")
    aw, bw, _ = _two_devices(n, 30, factor=1.02, kind="weight", seed=3)
    a = MonitorFrame("/a", pd.concat([a.stats, aw.stats], ignore_index=True), a.scalars, a.meta, a.order, {})
    b = MonitorFrame("/b", pd.concat([b.stats, bw.stats], ignore_index=True), b.scalars, b.meta, b.order, {})
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.kind, fd.what) == (30, "weight", "weight")


# ------------------------------------------------------------------------------------------ learning rates
def test_a_learning_rate_change_is_named_by_its_groups_first_parameter():
    s = {("fc1.weight", "grad"): walk(10), ("fc2.weight", "grad"): walk(10, seed=1)}
    lr_b = {"lr": 1e-3, "lr/1": 1e-2}
    lr_a = {"lr": 1e-3, "lr/1": [1e-2] * 4 + [2e-2] * 6}
    c = compare_monitors(frame(s, 10, lr=lr_a), frame(s, 10, lr=lr_b))
    assert list(c.lr["step"]) == [4, 5, 6, 7, 8, 9] and set(c.lr["name"]) == {"fc2.weight"}
    fd = c.first_divergence()
    assert (fd.step, fd.name, fd.kind, fd.what, fd.layer) == (4, "fc2.weight", "lr", "learning rate", "fc2")
    assert fd.norm_ratio == 2.0 and fd.reason == "learning rate 0.02 vs 0.01"
    # a parting value in the same step: the learning rate counts first; an earlier one wins
    s2 = {("fc1.weight", "grad"): np.r_[walk(10)[:4], walk(10)[4:] * 2], ("fc2.weight", "grad"): walk(10, seed=1)}
    assert compare_monitors(frame(s2, 10, lr=lr_a), frame(s, 10, lr=lr_b)).first_divergence().kind == "lr"
    s3 = {("fc1.weight", "grad"): np.r_[walk(10)[:3], walk(10)[3:] * 2], ("fc2.weight", "grad"): walk(10, seed=1)}
    assert compare_monitors(frame(s3, 10, lr=lr_a), frame(s, 10, lr=lr_b)).first_divergence().step == 3


def test_learning_rates_equal_to_twelve_digits_do_not_differ_and_a_zero_rate_gives_inf():
    s = {("fc1.weight", "grad"): 1.0}
    c = compare_monitors(frame(s, 3, lr={"lr": 1e-3 * (1 + 1e-13)}), frame(s, 3, lr={"lr": 1e-3}))
    assert c.lr.empty and c.first_divergence() is None
    fd = compare_monitors(frame(s, 3, lr={"lr": [0.1, 0.1, 0.2]}), frame(s, 3, lr={"lr": [0.1, 0.1, 0.0]})) \
        .first_divergence()
    assert fd.step == 2 and fd.name == "fc1.weight" and fd.norm_ratio == math.inf
    c = compare_monitors(frame(s, 3, lr={"lr": 0.1}), frame(s, 3))  # only one run records it
    assert c.lr.empty


def test_a_group_without_recorded_names_is_named_by_its_scalar():
    s = {("fc1.weight", "grad"): 1.0}
    a = frame(s, 2, lr={"lr/3": [0.1, 0.2]}, meta={"groups": []})
    b = frame(s, 2, lr={"lr/3": 0.1}, meta={"groups": []})
    assert compare_monitors(a, b).first_divergence().name == "lr/3"


# ------------------------------------------------------------------------------------- views of the table
def test_parting_rows_by_step_then_by_how_far_they_part():
    a = frame({("fc1.weight", "grad"): [1.0, 1.1, 1.0], ("fc2.weight", "grad"): [1.0, 3.0, 0.5]}, 3)
    b = frame({("fc1.weight", "grad"): 1.0, ("fc2.weight", "grad"): 1.0}, 3)
    p = compare_monitors(a, b).parting()
    assert list(zip(p["step"], p["name"])) == [(1, "fc2.weight"), (1, "fc1.weight"), (2, "fc2.weight")]
    assert p["score"].iloc[0] == pytest.approx(math.log(3.0))


def test_the_heat_map_is_in_model_order_per_kind_and_rank():
    a = frame({("fc2.weight", "grad"): 2.0, ("fc1.weight", "grad"): 1.0, ("zz", "grad"): 1.0,
               ("fc1.weight", "weight"): 5.0}, 3)
    b = frame({("fc2.weight", "grad"): 1.0, ("fc1.weight", "grad"): 1.0, ("zz", "grad"): 1.0,
               ("fc1.weight", "weight"): 1.0}, 3)
    c = compare_monitors(a, b)
    h = c.heatmap()
    assert list(h.index) == ["fc1.weight", "fc2.weight", "zz"] and list(h.columns) == [0, 1, 2]
    assert (h.loc["fc2.weight"] == 2.0).all()
    assert list(c.heatmap(kind="weight").index) == ["fc1.weight"]
    assert c.heatmap(rank=1).empty and not c.heatmap(rank=0).empty
    assert (c.heatmap(value="norm_a").loc["fc1.weight"] == 1.0).all()


def test_the_scalars_side_by_side():
    a = frame({("w", "grad"): 1.0}, 3, loss=[3.0, 2.0, 1.0])
    b = frame({("w", "grad"): 1.0}, 2, loss=[3.0, 2.5])
    s = compare_monitors(a, b).scalars
    assert list(s["step"]) == [0, 1, 2] and list(s["loss_a"]) == [3.0, 2.0, 1.0]
    assert s["loss_b"].iloc[1] == 2.5 and np.isnan(s["loss_b"].iloc[2])


def test_the_divergence_reads_as_a_sentence():
    d = MonitorDivergence(3, 1, "fc.weight", "fc", "grad", 1.5, 0.9, "why")
    assert str(d) == "step 3, rank 1: grad of fc.weight (layer fc): why"
    assert d.band == (1.0, 1.0) and d.mode == "bitwise"


# ------------------------------------------------------------------------------- edges the mutation run found
def _ranks(*frames: MonitorFrame) -> MonitorFrame:
    """One record of several ranks' frames."""
    return MonitorFrame("/nonexistent/run", pd.concat([f.stats for f in frames], ignore_index=True),
                        pd.concat([f.scalars for f in frames], ignore_index=True),
                        {k: v for f in frames for k, v in f.meta.items()}, list(NAMES),
                        {k: v for f in frames for k, v in f._signs.items()})


def test_a_rank_without_comparable_bitmaps_does_not_hide_the_next_ranks():
    a0 = frame({("w", "grad"): 1.0}, 1, signs=_signs({0: [0xFF]}, numel=8), rank=0)
    b0 = frame({("w", "grad"): 1.0}, 1, signs=_signs({0: [0x00]}, numel=7), rank=0)
    a1 = frame({("w", "grad"): 1.0}, 1, signs=_signs({0: [0xFF]}, numel=8), rank=1)
    b1 = frame({("w", "grad"): 1.0}, 1, signs=_signs({0: [0x0F]}, numel=8), rank=1)
    t = compare_monitors(_ranks(a0, a1), _ranks(b0, b1)).table.set_index("rank")["direction"]
    assert np.isnan(t[0]) and t[1] == 0.5


def test_multi_byte_bitmaps_at_different_offsets():
    """Bitmaps of three bytes, stored at other offsets in the two runs: byte k of one is compared with byte k
    of the other."""
    ta = pd.DataFrame({"step": [0, 0], "name": ["w", "v"], "numel": [24, 24], "start": [0, 3], "nbytes": [3, 3]})
    tb = pd.DataFrame({"step": [0, 0], "name": ["v", "w"], "numel": [24, 24], "start": [1, 4], "nbytes": [3, 3]})
    ba = np.array([0xFF, 0x00, 0xF0, 0x01, 0x02, 0x03], np.uint8)
    bb = np.array([0x99, 0x01, 0x02, 0x03, 0xFF, 0x00, 0x00], np.uint8)  # a leading byte, then v, then w
    a = frame({("w", "grad"): 1.0, ("v", "grad"): 1.0}, 1, signs=(ta, ba))
    b = frame({("w", "grad"): 1.0, ("v", "grad"): 1.0}, 1, signs=(tb, bb))
    t = compare_monitors(a, b).table.set_index("name")["direction"]
    assert t["v"] == 1.0 and t["w"] == 1 - 4 / 24  # w's last byte: 0xF0 against 0x00


def test_the_scalars_table_has_only_its_columns():
    a = frame({("w", "grad"): 1.0}, 3, loss=1.0)
    s = compare_monitors(a, a).scalars
    assert list(s.columns) == ["step", "rank", "loss_a", "loss_b"] and list(s.index) == [0, 1, 2]


def test_a_first_step_whose_directions_differ_is_not_bitwise_equal():
    """Norms equal everywhere but the sign histograms differ a little from the first step on: the runs
    differ from the start (band mode), and a direction that stays above direction_min never parts."""
    ha = {("w", "grad"): {"hist_0": [5] * 30, "hist_1": [5] * 30}}
    hb = {("w", "grad"): {"hist_0": [6] * 30, "hist_1": [5] * 30}}
    a = frame({("w", "grad"): walk(30)}, 30, extra=ha)
    b = frame({("w", "grad"): walk(30)}, 30, extra=hb)
    c = compare_monitors(a, b)
    assert (c.table["direction"] < 1).all() and (c.table["direction"] > DIRECTION_MIN).all()
    assert c.first_divergence() is None


def test_a_loss_that_differs_after_a_norm_does_not_move_the_step():
    s = {("fc1.weight", "grad"): walk(20)}
    s2 = {("fc1.weight", "grad"): np.r_[walk(20)[:9], walk(20)[9:] * 1.5]}
    loss = walk(20, seed=3)
    late = loss.copy()
    late[12:] += 1.0
    fd = compare_monitors(frame(s2, 20, loss=late), frame(s, 20, loss=loss)).first_divergence()
    assert (fd.step, fd.kind) == (9, "grad")


def test_a_nan_loss_on_one_side_is_a_difference():
    s = {("fc1.weight", "grad"): walk(20)}
    loss = walk(20, seed=3)
    nan_at_5 = loss.copy()
    nan_at_5[5] = np.nan
    fd = compare_monitors(frame(s, 20, loss=nan_at_5), frame(s, 20, loss=loss)).first_divergence()
    assert (fd.step, fd.kind) == (5, "scalar")


def test_fewer_steps_than_the_band_needs():
    a, b, _ = _two_devices(10, 5)
    assert compare_monitors(a, b).first_divergence() is None


def test_of_several_series_leaving_their_bands_in_one_step_the_farthest_is_named():
    """Constant early ratios (1.5 for fc1, 1 for fc2): each band is its ratio times exp(+-log1p(band_rtol)),
    half-width w; at step 30 fc1's ratio moves 2.3 w from its band's middle and fc2's 2.8 w: fc2, the
    farther in its own band's widths, is named, though fc1's ratio is farther from 1."""
    n = 40
    w = math.log1p(BAND_RTOL)
    base = {("fc1.weight", "grad"): walk(n, seed=1), ("fc2.weight", "grad"): walk(n, seed=2)}
    # fc1's early ratios alternate 1.5 and 1.5 * 1.01: a band ten times as wide as fc2's, centred on
    # 1.5 * sqrt(1.01); each late ratio is set by how many of its own band's widths it lies from the centre
    w1 = math.log(1.01)
    r1, r2 = np.where(np.arange(n) % 2 == 0, 1.5, 1.5 * 1.01), np.ones(n)
    r1[30:], r2[30:] = 1.5 * math.exp(w1 / 2 + 2.3 * w1), math.exp(2.8 * w)
    w = w1
    out = {("fc1.weight", "grad"): base[("fc1.weight", "grad")] * r1, ("fc2.weight", "grad"): base[
        ("fc2.weight", "grad")] * r2}
    fd = compare_monitors(frame(out, n), frame(base, n)).first_divergence()
    assert (fd.step, fd.name, fd.mode) == (30, "fc2.weight", "band")
    out[("fc1.weight", "grad")][30:] *= math.exp(w)  # now fc1 is the farther one: 3.3 of its widths
    assert compare_monitors(frame(out, n), frame(base, n)).first_divergence().name == "fc1.weight"


def test_a_ratio_exactly_on_its_bands_edge_stays_inside():
    """band_rtol 0 and a ratio of exactly 2 at every step: the band is [2, 2] and every later ratio sits on
    both its edges: inside."""
    n = 30
    base = {("fc1.weight", "grad"): walk(n)}
    twice = {k: v * 2.0 for k, v in base.items()}
    assert compare_monitors(frame(twice, n), frame(base, n), band_rtol=0.0).first_divergence() is None
    half = {k: v * 0.5 for k, v in base.items()}
    assert compare_monitors(frame(half, n), frame(base, n), band_rtol=0.0).first_divergence() is None


def test_the_divergence_is_frozen():
    import dataclasses

    d = MonitorDivergence(3, 1, "fc.weight", "fc", "grad", 1.5, 0.9, "why")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.step = 4  # type: ignore[misc]


def test_a_learning_rate_group_past_the_recorded_groups_is_named_by_its_scalar():
    s = {("fc1.weight", "grad"): 1.0}
    groups = {"groups": [["a.w"], ["b.w"], ["c.w"]]}
    a = frame(s, 2, lr={"lr/3": [0.1, 0.2], "lr/2": [0.1, 0.1]}, meta=groups)
    b = frame(s, 2, lr={"lr/3": 0.1, "lr/2": [0.1, 0.3]}, meta=groups)
    assert list(compare_monitors(a, b).lr["name"]) == ["lr/3", "c.w"]


def test_a_loss_lower_or_nan_at_the_first_step_makes_the_runs_differ_from_the_start():
    s = {("fc1.weight", "grad"): walk(40)}
    loss = walk(40, seed=4)
    assert compare_monitors(frame(s, 40, loss=loss * (1 - 1e-6)), frame(s, 40, loss=loss)).first_divergence() is None
    nan0 = loss.copy()
    nan0[0] = np.nan
    assert compare_monitors(frame(s, 40, loss=nan0), frame(s, 40, loss=loss)).first_divergence() is None


def test_the_heat_map_holds_one_kind_only():
    a = frame({("fc1.weight", "grad"): 2.0, ("fc2.weight", "exp_avg"): 3.0, ("fc1.weight", "weight"): 4.0}, 2)
    b = frame({("fc1.weight", "grad"): 1.0, ("fc2.weight", "exp_avg"): 1.0, ("fc1.weight", "weight"): 1.0}, 2)
    c = compare_monitors(a, b)
    assert list(c.heatmap(kind="exp_avg").index) == ["fc2.weight"]
    assert (c.heatmap(kind="grad").loc["fc1.weight"] == 2.0).all()


def test_a_direction_far_below_half_scores_its_whole_fall():
    ha = {("fc1.weight", "grad"): {"hist_0": [10, 0], "hist_1": [10, 8], "hist_2": [0, 12]}}
    hb = {("fc1.weight", "grad"): {"hist_0": [10, 10], "hist_1": [10, 10], "hist_2": [0, 0]}}
    a = frame({("fc1.weight", "grad"): 1.0}, 2, extra=ha)
    b = frame({("fc1.weight", "grad"): 1.0}, 2, extra=hb)
    p = compare_monitors(a, b).parting()
    assert p["direction"].tolist() == pytest.approx([0.4]) and p["score"].tolist() == pytest.approx([0.6])


def test_a_zero_norm_tolerance_is_allowed_and_no_setup_line_without_setup_records(capsys):
    a, b = frame({("w", "grad"): 1.0}, 2), frame({("w", "grad"): 1.0}, 2)
    c = compare_monitors(a, b, norm_tolerance=0.0)
    assert c.norm_tolerance == 0.0 and c.setup_note is None
    assert capsys.readouterr().out == ""


def test_a_direction_drop_scores_by_how_far_it_fell():
    """parting() orders one step's rows by how far they part: a norm ratio of 1.2 (|log| 0.18) before a
    direction of 0.85 (0.15 below full agreement)."""
    ha = {("fc2.weight", "grad"): {"hist_0": [10, 13], "hist_1": [10, 7]}}
    hb = {("fc2.weight", "grad"): {"hist_0": [10, 10], "hist_1": [10, 10]}}
    a = frame({("fc1.weight", "grad"): [1.0, 1.2], ("fc2.weight", "grad"): 1.0}, 2, extra={
        **ha, ("fc1.weight", "grad"): {"hist_0": [1, 1], "hist_1": [1, 1]}})
    b = frame({("fc1.weight", "grad"): 1.0, ("fc2.weight", "grad"): 1.0}, 2, extra={
        **hb, ("fc1.weight", "grad"): {"hist_0": [1, 1], "hist_1": [1, 1]}})
    p = compare_monitors(a, b).parting()
    assert list(p["name"]) == ["fc1.weight", "fc2.weight"]
    assert p["score"].tolist() == pytest.approx([math.log(1.2), 0.15])


def test_bitmaps_of_fewer_values_on_either_side_are_not_compared():
    sa, sb = _signs({0: [0xFF]}, numel=7), _signs({0: [0x00]}, numel=8)
    a, b = frame({("w", "grad"): 1.0}, 1, signs=sa), frame({("w", "grad"): 1.0}, 1, signs=sb)
    assert compare_monitors(a, b).table["direction"].isna().all()


def test_rank_zeros_parameter_groups_name_the_learning_rates():
    s = {("fc1.weight", "grad"): 1.0}
    a1 = frame(s, 2, lr={"lr/1": 0.1}, rank=1, meta={"groups": [["r1.a"], ["r1.b"]]})
    a0 = frame(s, 2, lr={"lr/1": [0.1, 0.2]}, rank=0, meta={"groups": [["r0.a"], ["r0.b"]]})
    b1 = frame(s, 2, lr={"lr/1": 0.1}, rank=1, meta={"groups": [["r1.a"], ["r1.b"]]})
    b0 = frame(s, 2, lr={"lr/1": 0.1}, rank=0, meta={"groups": [["r0.a"], ["r0.b"]]})
    c = compare_monitors(_ranks(a1, a0), _ranks(b1, b0))  # rank 1's record comes first
    assert list(c.lr["name"]) == ["r0.b"] and list(c.lr["rank"]) == [0]


def test_parting_rows_have_only_the_tables_columns_and_a_score():
    a = frame({("fc1.weight", "grad"): [1.0, 2.0]}, 2)
    b = frame({("fc1.weight", "grad"): 1.0}, 2)
    c = compare_monitors(a, b)
    p = c.parting()
    assert list(p.columns) == [*c.table.columns, "score"] and list(p.index) == [0]


def test_a_learning_rate_divergence_gives_the_rates_ratio():
    s = {("fc1.weight", "grad"): 1.0}
    fd = compare_monitors(frame(s, 2, lr={"lr": [0.02, 0.03]}), frame(s, 2, lr={"lr": 0.02})).first_divergence()
    assert fd.step == 1 and fd.norm_ratio == pytest.approx(1.5)


def test_the_last_early_step_is_part_of_the_band():
    n = 40
    base = {("fc1.weight", "grad"): walk(n)}
    r = np.full(n, 1.002)
    r[BAND_STEPS - 1] = 1.004  # the band's widest point, at its last step
    r[BAND_STEPS:] = 1.0035
    a = frame({k: v * r for k, v in base.items()}, n)
    assert compare_monitors(a, frame(base, n)).first_divergence() is None


def test_nan_learning_rates_on_both_sides_agree():
    s = {("fc1.weight", "grad"): 1.0}
    c = compare_monitors(frame(s, 3, lr={"lr": np.nan}), frame(s, 3, lr={"lr": np.nan}))
    assert c.lr.empty


def test_a_direction_exactly_at_its_minimum_does_not_part():
    """direction_min 0.75 and histograms that overlap by exactly 0.75: not below it, in the table and in
    the band mode; one count more and it is."""
    n = 30
    hb = {("w", "grad"): {"hist_0": [1] * n, "hist_1": [1] * n}}
    ha = {("w", "grad"): {"hist_0": [1] * 25 + [3] * 5, "hist_1": [1] * n}}  # (3/4, 1/4) against (1/2, 1/2)
    a = frame({("w", "grad"): walk(n) * 1.005}, n, extra=ha)
    b = frame({("w", "grad"): walk(n)}, n, extra=hb)
    c = compare_monitors(a, b, direction_min=0.75)
    assert c.table["direction"].min() == 0.75 and not c.table["parts"].any()
    assert c.first_divergence() is None
    ha[("w", "grad")]["hist_0"] = [1] * 25 + [4] * 5  # overlap 0.7
    fd = compare_monitors(frame({("w", "grad"): walk(n) * 1.005}, n, extra=ha), b, direction_min=0.75) \
        .first_divergence()
    assert fd.step == 25 and "direction similarity 0.700 (below 0.75)" in fd.reason
    assert compare_monitors(a, b, direction_min=1.0).direction_min == 1.0  # the top of the range is allowed


def test_a_norm_off_and_a_direction_low_in_one_row_parts():
    ha = {("w", "grad"): {"hist_0": [1, 3], "hist_1": [1, 1]}}
    hb = {("w", "grad"): {"hist_0": [1, 1], "hist_1": [1, 1]}}
    c = compare_monitors(frame({("w", "grad"): [1.0, 2.0]}, 2, extra=ha), frame({("w", "grad"): 1.0}, 2, extra=hb))
    assert list(c.table["parts"]) == [False, True]


def test_a_learning_rate_change_before_a_norm_parts_first():
    s = {("fc1.weight", "grad"): walk(10)}
    s6 = {("fc1.weight", "grad"): np.r_[walk(10)[:6], walk(10)[6:] * 2]}
    fd = compare_monitors(frame(s6, 10, lr={"lr": [0.1] * 4 + [0.2] * 6}), frame(s, 10, lr={"lr": 0.1})) \
        .first_divergence()
    assert (fd.step, fd.kind) == (4, "lr")


def test_of_two_groups_the_one_that_changed_first_is_named():
    s = {("fc1.weight", "grad"): 1.0}
    lr_b = {"lr": 0.1, "lr/1": 0.01}
    later_first_col = {"lr": [0.1] * 6 + [0.2] * 4, "lr/1": [0.01] * 4 + [0.02] * 6}
    fd = compare_monitors(frame(s, 10, lr=later_first_col), frame(s, 10, lr=lr_b)).first_divergence()
    assert (fd.step, fd.name) == (4, "fc2.weight")
    same_step = {"lr": [0.1] * 4 + [0.2] * 6, "lr/1": [0.01] * 4 + [0.02] * 6}
    fd = compare_monitors(frame(s, 10, lr=same_step), frame(s, 10, lr=lr_b)).first_divergence()
    assert (fd.step, fd.name) == (4, "fc1.weight")  # the first group of the step


def test_a_norm_turning_nan_on_one_side_is_a_difference():
    n = 10
    v = walk(n)
    w = v.copy()
    w[5] = np.nan
    fd = compare_monitors(frame({("fc1.weight", "grad"): w}, n), frame({("fc1.weight", "grad"): v}, n)) \
        .first_divergence()
    assert (fd.step, fd.mode) == (5, "bitwise")


def test_a_loss_divergence_is_rank_zeros_and_a_lower_loss_differs_too():
    s = {("fc1.weight", "grad"): walk(20)}
    loss = walk(20, seed=3)
    lower = loss.copy()
    lower[7:] -= 1e-9
    fd = compare_monitors(frame(s, 20, loss=lower), frame(s, 20, loss=loss)).first_divergence()
    assert (fd.step, fd.rank, fd.kind) == (7, 0, "scalar")


def test_a_nan_loss_on_both_sides_at_the_first_step_is_equal():
    s = {("fc1.weight", "grad"): walk(20)}
    s5 = {("fc1.weight", "grad"): np.r_[walk(20)[:5], walk(20)[5:] * 1.5]}
    loss = walk(20, seed=3)
    loss[0] = np.nan
    fd = compare_monitors(frame(s5, 20, loss=loss), frame(s, 20, loss=loss.copy())).first_divergence()
    assert (fd.step, fd.mode) == (5, "bitwise")


def test_what_happens_within_the_early_steps_makes_no_divergence():
    """A side turning non-finite, or a direction drop, at the last early step: the band mode looks only
    past the early steps."""
    a, b, _ = _two_devices(40, None)
    a.stats.loc[(a.stats["step"] == BAND_STEPS - 1) & (a.stats["name"] == "fc1.weight"), "norm"] = np.inf
    assert compare_monitors(a, b).first_divergence() is None


def test_in_band_mode_the_bench_side_turning_non_finite_parts_too():
    a, b, _ = _two_devices(40, None)
    b.stats.loc[(b.stats["step"] == 30) & (b.stats["name"] == "fc2.weight"), "norm"] = np.inf
    fd = compare_monitors(a, b).first_divergence()
    assert (fd.step, fd.name) == (30, "fc2.weight") and "(one side not finite)" in fd.reason


def test_the_heat_map_of_one_rank_and_a_step_of_nan_ratios():
    r1 = frame({("fc1.weight", "grad"): [5.0, np.nan]}, 2, rank=1)
    r0 = frame({("fc1.weight", "grad"): [2.0, np.nan]}, 2, rank=0)
    ones1, ones0 = frame({("fc1.weight", "grad"): 1.0}, 2, rank=1), frame({("fc1.weight", "grad"): 1.0}, 2, rank=0)
    c = compare_monitors(_ranks(r1, r0), _ranks(ones1, ones0))  # rank 1's rows first
    h = c.heatmap(rank=0)
    assert list(h.columns) == [0, 1] and h.loc["fc1.weight", 0] == 2.0 and np.isnan(h.loc["fc1.weight", 1])
    assert c.heatmap(rank=1).loc["fc1.weight", 0] == 5.0


def test_a_row_that_differs_in_value_and_direction_at_once_is_the_divergence():
    n = 10
    ha = {("w", "grad"): {"hist_0": [1] * 5 + [3] * 5, "hist_1": [1] * n}}
    hb = {("w", "grad"): {"hist_0": [1] * n, "hist_1": [1] * n}}
    v = walk(n)
    a = frame({("w", "grad"): np.r_[v[:5], v[5:] * 1.5]}, n, extra=ha)
    fd = compare_monitors(a, frame({("w", "grad"): v}, n, extra=hb)).first_divergence()
    assert (fd.step, fd.mode) == (5, "bitwise")


def test_a_row_finite_on_the_npu_side_only_parts():
    c = compare_monitors(frame({("w", "grad"): [1.0, 1.0]}, 2), frame({("w", "grad"): [1.0, np.inf]}, 2))
    assert list(c.table["parts"]) == [False, True]


def test_a_non_finite_value_inside_the_early_steps_is_no_divergence():
    a, b, _ = _two_devices(40, None)
    a.stats.loc[(a.stats["step"] == 10) & (a.stats["name"] == "fc1.weight"), "norm"] = np.nan
    assert compare_monitors(a, b).first_divergence() is None


def test_a_learning_rate_group_is_named_by_its_first_parameter():
    s = {("fc1.weight", "grad"): 1.0}
    groups = {"groups": [["a.w", "a.b"]]}
    c = compare_monitors(frame(s, 2, lr={"lr": [0.1, 0.2]}, meta=groups), frame(s, 2, lr={"lr": 0.1}, meta=groups))
    assert list(c.lr["name"]) == ["a.w"]
