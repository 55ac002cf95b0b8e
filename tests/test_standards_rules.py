"""The pre-check's grading rules (precheck/standards.py) at their thresholds, dtype by dtype: each limit the
docs state (docs/precheck.md) is met exactly at its edge and broken one step past it. numpy only, so the
mutation run (tools/mutation.py) can judge a mutant of the rules in well under a second."""
from __future__ import annotations

import math

import numpy as np
import pytest

from msprobe_nb.precheck import standards as S

DTYPES = list(S.DTYPES)
#: what docs/precheck.md states per dtype: (ULP limit, share over it, relative tolerance, small-value threshold,
#: thousandths tolerance and share)
DOCUMENTED = {
    "torch.float32": (32.0, 0.0005, 2.0 ** -20, 2.0 ** -14, 1e-4, 0.9999),
    "torch.float16": (1.0, 0.001, 2.0 ** -10, 2.0 ** -11, 1e-3, 0.999),
    "torch.bfloat16": (1.0, 0.001, 2.0 ** -7, 2.0 ** -8, 4e-3, 0.996),
    "torch.float64": (32.0, 0.0005, 2.0 ** -46, 2.0 ** -30, 1e-8, 0.9999),
}


def verdict(g: S.Grade) -> str:
    return g.verdict


# --------------------------------------------------------------------------------------------- verdicts
def test_the_worst_verdict_wins_and_nothing_is_a_pass():
    assert S.worst() == "pass"
    assert S.worst("pass", "error", "warning") == "error"
    assert S.worst("warning", "pass") == "warning"
    assert S.worst("pass", "pass") == "pass"
    g = S.Grade("x")
    g.flag("warning", "a")
    g.flag("pass", "b")  # a milder flag never lowers the verdict
    assert g.verdict == "warning" and g.reasons == ["warning: a", "pass: b"]
    g.flag("error", "c")
    assert g.verdict == "error"


def test_an_unknown_verdict_never_outranks_a_pass():
    assert S.worst("bogus", "pass") == "pass" and S.worst("pass", "bogus") == "pass"
    assert S.worst("bogus", "warning") == "warning"


def test_an_unknown_dtype_is_graded_as_float32():
    assert S.dtype_info("torch.int64") is S.DTYPES["torch.float32"]
    assert S.dtype_info("torch.float16") is S.DTYPES["torch.float16"]


def test_metrics_rows_leave_out_the_internal_counters():
    g = S.benchmark(np.ones(4) * 1.5, np.ones(4), np.ones(4), "torch.float32")
    row = S.metrics_row(g)
    assert "rmse" in row and not any(k.startswith("_") for k in row)
    assert set(row) == {k for k in g.metrics if not k.startswith("_")}


# ------------------------------------------------------------------------------------ NaN, inf, shapes
@pytest.mark.parametrize("rule", [S.ulp, S.absolute, S.thousandths])
def test_nan_and_inf_must_sit_where_the_bench_has_them(rule):
    b = np.array([1.0, np.nan, np.inf, -np.inf, 2.0])
    same = rule(b.copy(), b, "torch.float32")
    assert same.verdict == "pass" and same.metrics["special_mismatch"] == 0
    for i, v in [(0, np.nan), (2, -np.inf), (3, 5.0), (1, 1.0), (4, np.inf)]:
        d = b.copy()
        d[i] = v
        g = rule(d, b, "torch.float32")
        assert g.verdict == "error" and g.metrics["special_mismatch"] == 1, (i, v)
        assert "NaN/inf" in g.reasons[0]
    d = b.copy()
    d[[0, 4]] = [np.nan, np.inf]
    assert rule(d, b, "torch.float32").metrics["special_mismatch"] == 2
    d = b.copy()
    d[1] = np.inf  # an inf where the bench has a NaN: one mismatch, not two, and no number compared
    g = rule(d, b, "torch.float32")
    assert g.metrics["special_mismatch"] == 1
    assert all(np.isfinite(v) for v in g.metrics.values()), g.metrics
    # a bench without NaN or inf: the device's own are still mismatches
    f = np.array([1.0, 2.0, 3.0])
    assert rule(f.copy(), f, "torch.float32").metrics["special_mismatch"] == 0
    for v in (np.nan, np.inf):
        g = rule(np.array([1.0, v, 3.0]), f, "torch.float32")
        assert g.verdict == "error" and g.metrics["special_mismatch"] == 1
    # the special positions are left out of the numbers: only they differ, so no numeric error
    for i, v in [(0, np.inf), (4, -np.inf), (0, np.nan)]:
        d = b.copy()
        d[i] = v
        g = rule(d, b, "torch.float32")
        assert g.metrics["max_abs_err"] == 0.0 if "max_abs_err" in g.metrics else g.metrics["max_rel_err"] == 0.0
    # finite elements are still graded around the special ones
    d = b.copy()
    d[0] = 1.5
    assert rule(d, b, "torch.float32").verdict == "error"


@pytest.mark.parametrize("rule", [S.ulp, S.absolute, S.thousandths, S.binary])
def test_a_shape_mismatch_is_an_error_naming_both_shapes(rule):
    g = rule(np.zeros((2, 3)), np.zeros((3, 2)), "torch.float32")
    assert g.verdict == "error" and g.reasons == ["error: shape (2, 3) on the device, (3, 2) on the bench"]
    g = S.benchmark(np.zeros(3), np.zeros(3), np.zeros(4), "torch.float32")  # the reference's shape too
    assert g.verdict == "error" and "(4,)" in g.reasons[0]


@pytest.mark.parametrize("rule", [S.ulp, S.absolute, S.thousandths])
def test_nothing_finite_to_compare_passes_with_the_specials_checked(rule):
    b = np.array([np.nan, np.inf])
    g = rule(b.copy(), b, "torch.float32")
    assert g.verdict == "pass" and g.reasons == []
    g = S.benchmark(b.copy(), b, b.copy(), "torch.float32")
    assert g.verdict == "pass" and "rmse" not in g.metrics


# ---------------------------------------------------------------------------------------------- binary
def test_binary_counts_every_difference_and_equates_nans():
    a = np.array([1.0, np.nan, 3.0, -0.0, 5.0])
    g = S.binary(a.copy(), a)
    assert g.verdict == "pass" and g.metrics == {"mismatch": 0.0, "mismatch_ratio": 0.0}
    b = a.copy()
    b[[0, 2]] = [2.0, np.nan]  # a NaN where the bench has a number is a difference
    g = S.binary(b, a)
    assert g.verdict == "error" and g.metrics["mismatch"] == 2 and g.metrics["mismatch_ratio"] == 2 / 5
    assert g.reasons == ["error: 2 of 5 elements differ; this op must reproduce its values exactly"]
    assert S.binary(np.zeros(0), np.zeros(0)).metrics["mismatch_ratio"] == 0.0
    c = np.arange(10.0)
    d = c.copy()
    d[:6] += 1
    assert S.binary(d, c).metrics["mismatch"] == 6
    assert S.binary(c - 1, c).metrics["mismatch"] == 10  # below the bench counts as well


# ------------------------------------------------------------------------------------------------- ULP
def test_the_documented_constants():
    for dtype, (ulp_limit, share, rtol, small, tol, within) in DOCUMENTED.items():
        info = S.DTYPES[dtype]
        assert (info.ulp_limit, info.ulp_share, info.rtol, info.small, info.thousandths) == \
            (ulp_limit, share, rtol, small, (tol, within)), dtype
        assert info.small_atol == small * rtol
    # the formats themselves: epsilon, mantissa bits, smallest normal exponent, largest finite value
    formats = {"torch.float32": (23, -126, np.float32), "torch.float16": (10, -14, np.float16),
               "torch.float64": (52, -1022, np.float64)}
    for dtype, (mantissa, emin, np_type) in formats.items():
        info, fi = S.DTYPES[dtype], np.finfo(np_type)
        assert (info.eps, info.mantissa, info.emin, info.max) == (float(fi.eps), mantissa, emin, float(fi.max))
        assert 2.0 ** info.emin == float(fi.smallest_normal)
    bf = S.DTYPES["torch.bfloat16"]
    assert (bf.eps, bf.mantissa, bf.emin, bf.max) == (2.0 ** -7, 7, -126, (2 - 2.0 ** -7) * 2.0 ** 127)


def test_the_constants_cannot_be_changed_by_accident():
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        S.DTYPES["torch.float32"].rtol = 1.0  # type: ignore[misc]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 2.0 ** 5, 2.0 ** -3, -1.0])
def test_ulp_limit_and_share_at_their_edges(dtype, scale):
    """At most the dtype's share of elements over its ULP limit; an element exactly at the limit is not over;
    an ULP is the bench value's, in the device's dtype."""
    info = S.DTYPES[dtype]
    n = 20_000
    b = np.full(n, scale)
    one = abs(scale) * 2.0 ** -info.mantissa  # the ULP of |scale| (a power of two) in this dtype
    allowed = round(info.ulp_share * n)
    d = b.copy()
    d[: n // 2] += info.ulp_limit * one  # exactly at the limit: not over
    d[n // 2: n // 2 + allowed] += (info.ulp_limit + 1) * one
    g = S.ulp(d, b, dtype)
    assert g.verdict == "pass", g.reasons
    assert g.metrics["max_ulp_err"] == info.ulp_limit + 1
    assert g.metrics["ulp_err_ratio"] == allowed / n
    assert g.metrics["max_abs_err"] == (info.ulp_limit + 1) * one
    assert g.metrics["mean_ulp_err"] == pytest.approx((n // 2 * info.ulp_limit + allowed * (info.ulp_limit + 1)) / n)
    d[n // 2 + allowed] += (info.ulp_limit + 1) * one  # one more over the limit
    g = S.ulp(d, b, dtype)
    assert g.verdict == "error" and f"more than {info.ulp_limit:g} ULP" in g.reasons[0]
    assert dtype in g.reasons[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_an_ulp_below_the_smallest_normal_is_the_smallest_normals(dtype):
    info = S.DTYPES[dtype]
    tiny = 2.0 ** (info.emin - 4)  # subnormal in the dtype
    ulp_min = 2.0 ** (info.emin - info.mantissa)
    b = np.array([tiny, 2.0 ** info.emin])
    at = S.ulp(b + info.ulp_limit * ulp_min, b, dtype)
    assert at.metrics["max_ulp_err"] == info.ulp_limit
    over = S.ulp(b + np.array([(info.ulp_limit + 1) * ulp_min, 0.0]), b, dtype)
    assert over.verdict == "error" and over.metrics["max_ulp_err"] == info.ulp_limit + 1


def test_a_fraction_of_an_ulp_past_the_limit_is_over_it():
    info = S.DTYPES["torch.float32"]
    b = np.ones(4)
    d = b + np.array([32.5, 0, 0, 0]) * 2.0 ** -23
    g = S.ulp(d, b, "torch.float32")
    assert g.metrics["max_ulp_err"] == 32.5 and g.metrics["ulp_err_ratio"] == 0.25 and g.verdict == "error"
    assert g.metrics["mean_ulp_err"] == 32.5 / 4 and info.ulp_limit == 32


def test_ulp_of_values_is_their_own_binade():
    info = S.DTYPES["torch.float32"]
    x = np.array([1.0, 1.5, 2.0, 3.999, 0.75, -6.0])
    want = np.array([2.0 ** -23, 2.0 ** -23, 2.0 ** -22, 2.0 ** -22, 2.0 ** -24, 2.0 ** -21])
    assert np.array_equal(S._ulp_of(x, info), want)


def test_no_dtype_name_in_the_reason_says_this_dtype():
    b = np.ones(10)
    g = S.ulp(b + 1.0, b, "")
    assert g.verdict == "error" and "for this dtype" in g.reasons[0]
    g = S.thousandths(b + 1.0, b, "")
    assert g.verdict == "error" and "for this dtype" in g.reasons[0]


# -------------------------------------------------------------------------------------------- absolute
@pytest.mark.parametrize("dtype", DTYPES)
def test_absolute_threshold_at_its_edges(dtype):
    """Below the small-value threshold the absolute error may reach small_atol; from the threshold up the
    relative error may reach rtol; one element past either is an error."""
    info = S.DTYPES[dtype]
    small, rtol, atol = info.small, info.rtol, info.small_atol
    b = np.array([small / 2, -small / 4, small, 3 * small, 1.0])
    at = b + np.array([atol, -atol, small * rtol, -3 * small * rtol, rtol])
    g = S.absolute(at, b, dtype)
    assert g.verdict == "pass", g.reasons
    assert g.metrics["max_abs_err"] == atol if atol > rtol else g.metrics["max_abs_err"] == rtol
    assert g.metrics["max_rel_err"] == rtol
    assert g.metrics["small_value_err_ratio"] == 0 and g.metrics["rel_err_ratio"] == 0
    past_small = at + np.array([atol, 0, 0, 0, 0])
    g = S.absolute(past_small, b, dtype)
    assert g.verdict == "error" and g.metrics["small_value_err_ratio"] == 1 / 2
    assert g.reasons == [f"error: 1 of 2 small values (|x| < {small:.3g}) have an absolute error over {atol:.3g}"]
    past_rel = at + np.array([0, 0, small * rtol, 0, 0])
    g = S.absolute(past_rel, b, dtype)
    assert g.verdict == "error" and g.metrics["rel_err_ratio"] == 1 / 3
    assert g.reasons == [f"error: 1 of 3 elements have a relative error over {rtol:.3g}"]
    g = S.absolute(past_rel + np.array([2 * atol, 0, 0, 0, 0]), b, dtype)
    assert len(g.reasons) == 2


def test_absolute_without_small_or_without_large_values():
    b = np.ones(3)
    g = S.absolute(b.copy(), b, "torch.float32")
    assert g.metrics["small_value_err_ratio"] == 0.0 and g.metrics["rel_err_ratio"] == 0.0
    z = np.zeros(3)
    g = S.absolute(z.copy(), z, "torch.float32")
    assert g.verdict == "pass" and g.metrics["rel_err_ratio"] == 0.0 and g.metrics["max_rel_err"] == 0.0


# ----------------------------------------------------------------------------------------- thousandths
@pytest.mark.parametrize("dtype", DTYPES)
def test_thousandths_share_at_its_edge(dtype):
    """The share of elements within the tolerance must reach the dtype's share; an element exactly at the
    tolerance is within; small values are measured against the small-value threshold."""
    info = S.DTYPES[dtype]
    tol, share = info.thousandths
    n = 10_000
    outside = round((1 - share) * n)
    b = np.zeros(n)  # all small: the error is measured against the threshold
    d = np.full(n, tol * info.small)  # exactly at the tolerance
    d[:outside] = 2 * tol * info.small
    g = S.thousandths(d, b, dtype)
    assert g.verdict == "pass", g.reasons
    assert g.metrics["within_tolerance"] == (n - outside) / n and g.metrics["max_rel_err"] == 2 * tol
    d[outside] = 2 * tol * info.small
    g = S.thousandths(d, b, dtype)
    assert g.verdict == "error" and f"within {tol:g} relative error" in g.reasons[0] and dtype in g.reasons[0]


def test_thousandths_large_values_are_relative_to_themselves():
    tol, _ = S.DTYPES["torch.float16"].thousandths
    b = np.full(1000, 8.0)
    assert S.thousandths(b * (1 + tol / 2), b, "torch.float16").verdict == "pass"
    g = S.thousandths(b * (1 + 2 * tol), b, "torch.float16")
    assert g.verdict == "error" and g.metrics["max_rel_err"] == pytest.approx(2 * tol)


# ---------------------------------------------------------------------------------------------- saturate
@pytest.mark.parametrize("dtype", ["torch.float16", "torch.float32", "torch.bfloat16"])
def test_saturate_turns_what_the_dtype_cannot_hold_into_inf(dtype):
    info = S.DTYPES[dtype]
    edge = info.max * (1 + info.eps / 4)  # half an ULP past the largest finite value rounds to inf
    below, above = edge * (1 - 2.0 ** -40), edge * (1 + 2.0 ** -40)
    b = np.array([below, above, -above, -below, 1.0])
    got = S.saturate(b, dtype)
    assert np.array_equal(got, [below, np.inf, -np.inf, -below, 1.0])


@pytest.mark.parametrize("dtype", ["torch.float16", "torch.float32", "torch.bfloat16"])
def test_saturate_keeps_a_value_exactly_at_its_edge(dtype):
    info = S.DTYPES[dtype]
    edge = np.array([info.max * (1 + info.eps / 4)])
    assert np.array_equal(S.saturate(edge, dtype), edge)


def test_saturate_leaves_integers_unknown_dtypes_and_held_values_alone():
    huge = np.array([1e300 + 1e300j, 1.0])
    assert S.saturate(huge, "torch.float16") is huge
    big = np.array([1e300, 1.0])
    assert S.saturate(big, "torch.int64") is big
    ints = np.array([70000, 1])
    assert S.saturate(ints, "torch.float16") is ints
    held = np.array([1.0, 2.0])
    assert S.saturate(held, "torch.float16") is held


# --------------------------------------------------------------------------------------------- benchmark
def _bench_case(n: int = 4000, seed: int = 0, rel: float = 1e-5):
    rng = np.random.default_rng(seed)
    b = rng.uniform(1.0, 2.0, n) * rng.choice([-1.0, 1.0], n)
    ref = b * (1 + rel * rng.choice([-1.0, 1.0], n) * rng.uniform(0.5, 1.0, n))
    return b, ref


@pytest.mark.parametrize(("k", "want"), [(1.0, "pass"), (1.4, "pass"), (1.6, "warning"), (2.5, "error")])
def test_benchmark_ratios_against_the_reference_kernel(k, want):
    """The device's error is k times the reference's everywhere: normal-level limits 1.5x (warning) and 2x
    (error); the single-element max relative error has 2x and 10x."""
    b, ref = _bench_case()
    dev = b + k * (ref - b)
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.verdict == want, g.reasons
    for name in ("rmse", "mean_rel_err", "max_rel_err"):
        assert g.metrics[f"{name}_ratio"] == pytest.approx(k, rel=1e-6), name
        assert g.metrics[f"ref_{name}"] > 0
    assert g.metrics["err_balance_ratio"] <= 1.0
    if want == "warning":
        assert all(r.startswith("warning: ") and "warning above 1.5x" in r for r in g.reasons)
        assert {r.split()[1] for r in g.reasons} == {"rmse", "mean_rel_err"}
    if want == "error":
        assert any(r.startswith("error: rmse") and "limit 2x, normal op" in r for r in g.reasons)
        assert any(r.startswith("warning: max_rel_err") and "warning above 2x" in r for r in g.reasons)
    assert g.metrics["max_abs_err"] == pytest.approx(np.abs(dev - b).max())


@pytest.mark.parametrize(("level", "k", "want"), [("tight", 1.1, "pass"), ("tight", 1.3, "warning"),
                                                   ("tight", 2.2, "error"), ("loose", 4.5, "warning"),
                                                   ("loose", 5.5, "error"),
                                                   ("loose", 3.0, "warning"), ("loose", 1.9, "pass"),
                                                   ("loose", 6.0, "error"), ("unknown", 1.6, "warning"),
                                                   ("unknown", 2.5, "error")])
def test_benchmark_limits_by_op_level(level, k, want):
    b, ref = _bench_case(seed=1)
    g = S.benchmark(b + k * (ref - b), b, ref, "torch.float32", level=level)
    assert g.verdict == want, g.reasons


def test_benchmark_max_rel_err_limits_are_its_own():
    b, ref = _bench_case(seed=2)
    dev = ref.copy()
    i = int(np.argmax(np.abs(ref - b) / np.abs(b)))
    worst_ref = abs(ref[i] - b[i]) / abs(b[i])
    j = (i + 1) % len(b)
    for k, want in [(1.9, "pass"), (5.0, "warning"), (11.0, "error")]:
        dev[j] = b[j] * (1 + k * worst_ref)  # one element k times the reference's worst relative error
        g = S.benchmark(dev, b, ref, "torch.float32")
        assert g.metrics["max_rel_err_ratio"] == pytest.approx(k, rel=1e-6)
        assert g.verdict == want, (k, g.reasons)
        if want == "error":
            assert g.reasons == [f"error: max_rel_err {g.metrics['max_rel_err']:.3g} is {k:.3g}x the reference "
                                 f"kernel's {worst_ref:.3g} (limit 10x, normal op)"]


def test_benchmark_floors_keep_an_exact_reference_from_failing_a_correctly_rounded_device():
    """A reference that happens to be exact: the device's error is judged against what a correctly rounded
    result could show (half an epsilon relative, half an epsilon of the RMS, the noise of random signs)."""
    eps = S.DTYPES["torch.float32"].eps
    rng = np.random.default_rng(3)
    n = 4000
    b = rng.uniform(1.0, 2.0, n)
    signs = rng.choice([-1.0, 1.0], n)
    dev = b * (1 + signs * eps / 4)  # a quarter epsilon each, random signs
    g = S.benchmark(dev, b, b.copy(), "torch.float32")
    assert g.verdict == "pass", g.reasons
    rms = math.sqrt(np.dot(b, b) / n)
    assert g.metrics["rmse_ratio"] == pytest.approx(g.metrics["rmse"] / (rms * eps / 2))
    assert g.metrics["max_rel_err_ratio"] == pytest.approx(g.metrics["max_rel_err"] / (eps / 2))
    assert g.metrics["mean_rel_err_ratio"] == pytest.approx(g.metrics["mean_rel_err"] / (eps / 4))
    n_err = np.count_nonzero(dev != b)
    assert g.metrics["err_balance_ratio"] == pytest.approx(g.metrics["err_balance"] / (3 / math.sqrt(n_err)))
    assert S.benchmark(b * (1 + signs * eps * 1.5), b, b.copy(), "torch.float32").verdict == "error"


def test_benchmark_rmse_floor_for_a_bench_of_small_values():
    """The RMSE floor is half an epsilon of the bench's RMS, and at least of the small-value threshold."""
    info = S.DTYPES["torch.float32"]
    b = np.full(100, info.small / 8)
    dev = b + info.small * info.eps / 4
    g = S.benchmark(dev, b, b.copy(), "torch.float32")
    assert g.metrics["rmse_ratio"] == pytest.approx(0.5)


def test_benchmark_catches_a_one_sided_error_the_reference_does_not_have():
    b, ref = _bench_case(seed=4)
    dev = b + np.abs(ref - b)  # the reference's error sizes, all upwards
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.metrics["err_balance"] == 1.0 and g.verdict == "error"
    assert g.metrics["err_balance_ratio"] > 5
    assert g.metrics["rmse_ratio"] == pytest.approx(1.0)
    assert any(r.startswith("error: err_balance") for r in g.reasons)


def test_benchmark_small_values_share_against_the_reference_and_its_noise():
    """The share of small values over small_atol: against the reference's share plus three standard deviations
    of its sampling noise, and at least one in a thousand."""
    info = S.DTYPES["torch.float32"]
    n_small = 2000
    b = np.concatenate([np.full(n_small, info.small / 4), np.ones(10)])
    ref = b.copy()
    ref[:100] += 2 * info.small_atol  # 5 % of the small values over the limit
    share = 100 / n_small
    noise = 3 * math.sqrt(share * (1 - share) / n_small)
    for over, want in [(100, "pass"), (int(n_small * (share + noise)) - 1, "pass"), (250, "warning"),
                       (320, "error")]:
        dev = b.copy()
        dev[:over] += 2 * info.small_atol
        g = S.benchmark(dev, b, ref, "torch.float32")
        assert g.metrics["small_value_err_ratio"] == over / n_small
        assert g.metrics["small_value_err_ratio_ratio"] == pytest.approx((over / n_small) / (share + noise))
        assert g.verdict == want, (over, g.reasons)
    # an exact reference: the floor is one in a thousand
    g = S.benchmark(b + np.concatenate([np.full(n_small, 2 * info.small_atol), np.zeros(10)]), b, b.copy(),
                    "torch.float32")
    assert g.metrics["small_value_err_ratio_ratio"] == pytest.approx(1.0 / max(1e-3, 3 * math.sqrt(1 / n_small)
                                                                                / math.sqrt(n_small)))


def test_benchmark_small_value_errors_at_the_limit_do_not_count():
    info = S.DTYPES["torch.float32"]
    b = np.concatenate([np.full(100, info.small / 4), np.ones(10)])
    dev = b + np.concatenate([np.full(100, info.small_atol), np.zeros(10)])  # exactly small_atol
    g = S.benchmark(dev, b, b.copy(), "torch.float32")
    assert g.metrics["small_value_err_ratio"] == 0.0


@pytest.mark.parametrize(("up", "down", "want"), [(3, 1, 0.5), (5, 3, 0.25), (3, 5, 0.25), (0, 4, 1.0), (2, 2, 0.0)])
def test_benchmark_error_balance_counts_the_signs(up, down, want):
    n = up + down + 4  # and four exact elements
    b = np.ones(n)
    signs = np.r_[np.ones(up), -np.ones(down), np.zeros(4)]
    g = S.benchmark(b + 2.0 ** -10 * signs, b, b.copy(), "torch.float32")
    assert g.metrics["err_balance"] == want
    assert g.metrics["err_balance_ratio"] == pytest.approx(want / (3 / math.sqrt(up + down)))


def test_benchmark_error_balance_floor_for_a_single_error():
    b = np.ones(4)
    g = S.benchmark(b + np.array([2.0 ** -10, 0, 0, 0]), b, b.copy(), "torch.float32")
    assert g.metrics["err_balance"] == 1.0 and g.metrics["err_balance_ratio"] == 1 / 3


def test_benchmark_a_mild_error_bias_is_graded_by_the_op_level_limits():
    """70 % of 1,000 errors upwards against a balanced reference: a balance of 0.4, about 4x the floor of
    random signs (3 / sqrt(1000)): over the normal level's 2x, an error (the single-element limits, 2x and
    10x, are only the max relative error's)."""
    n = 1000
    b = np.ones(n)
    ref = b + 2.0 ** -12 * np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
    dev = b + 2.0 ** -12 * np.where(np.arange(n) < 700, 1.0, -1.0)
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.metrics["err_balance"] == pytest.approx(0.4) and 2 < g.metrics["err_balance_ratio"] < 10
    assert g.verdict == "error" and any(r.startswith("error: err_balance") for r in g.reasons)


def test_benchmark_a_ratio_exactly_at_the_error_limit_is_a_warning():
    b = np.r_[np.ones(50), np.full(50, 1.5)]
    ref = b + 2.0 ** -20
    dev = b + 2.0 ** -19  # exactly twice the reference's error, every metric
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.metrics["rmse_ratio"] == 2.0 and g.metrics["mean_rel_err_ratio"] == 2.0
    assert g.verdict == "warning", g.reasons


def test_benchmark_a_ratio_exactly_at_the_warning_limit_passes():
    b = np.ones(100)
    g = S.benchmark(b + 1.5 * 2.0 ** -20, b, b + 2.0 ** -20, "torch.float32")
    assert g.metrics["rmse_ratio"] == 1.5 and g.metrics["mean_rel_err_ratio"] == 1.5
    assert g.verdict == "pass", g.reasons


def test_benchmark_a_bench_value_at_the_small_threshold_is_not_small():
    info = S.DTYPES["torch.float32"]
    b = np.full(10, info.small)
    g = S.benchmark(b * (1 + 2.0 ** -10), b, b.copy(), "torch.float32")
    assert g.metrics["max_rel_err"] == 2.0 ** -10 and g.metrics["small_value_err_ratio"] == 0.0


def test_benchmark_loose_level_warns_above_2x():
    b, ref = _bench_case(seed=9)
    g = S.benchmark(b + 2.5 * (ref - b), b, ref, "torch.float32", level="loose")
    assert g.verdict == "warning" and any(r.startswith("warning: rmse") for r in g.reasons)


def test_benchmark_small_value_noise_with_a_single_small_value():
    """One small value, over the limit on the device only: its share 1 against a floor of three standard
    deviations of a share of one sample (3)."""
    info = S.DTYPES["torch.float32"]
    b = np.array([info.small / 4, 1.0, 1.0])
    dev = b + np.array([2 * info.small_atol, 0, 0])
    g = S.benchmark(dev, b, b.copy(), "torch.float32")
    assert g.metrics["small_value_err_ratio"] == 1.0 and g.metrics["small_value_err_ratio_ratio"] == 1 / 3


def test_benchmark_small_value_floor_is_one_in_a_thousand_for_many_small_values():
    """With many small values the sampling noise of an exact reference's share (3 / n) is under one in a
    thousand: the floor is then one in a thousand."""
    info = S.DTYPES["torch.float32"]
    n = 10_000
    b = np.full(n, info.small / 4)
    dev = b.copy()
    dev[:5] += 2 * info.small_atol  # five in ten thousand
    g = S.benchmark(dev, b, b.copy(), "torch.float32")
    assert g.metrics["small_value_err_ratio_ratio"] == pytest.approx(0.5) and g.verdict == "pass"


def test_benchmark_without_small_values_has_no_small_value_share():
    b, ref = _bench_case(seed=5)
    g = S.benchmark(ref.copy(), b, ref, "torch.float32")
    assert g.metrics["small_value_err_ratio"] == 0.0 and g.metrics["small_value_err_ratio_ratio"] == 0.0
    assert g.verdict == "pass"


def test_benchmark_with_only_small_values():
    info = S.DTYPES["torch.float32"]
    b = np.full(50, info.small / 4)
    g = S.benchmark(b.copy(), b, b.copy(), "torch.float32")
    assert g.verdict == "pass" and g.metrics["max_rel_err"] == 0.0 and g.metrics["mean_rel_err"] == 0.0
    assert g.metrics["err_balance"] == 0.0 and g.metrics["rmse"] == 0.0  # no error at all: no bias either


def test_benchmark_grades_around_nan_and_inf():
    b, ref = _bench_case(n=500, seed=6)
    b[3], ref[3] = np.nan, np.nan
    dev = b + 3 * (ref - b)
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.metrics["special_mismatch"] == 0 and g.verdict == "error"
    dev[3] = 1.0
    g = S.benchmark(dev, b, ref, "torch.float32")
    assert g.metrics["special_mismatch"] == 1 and "NaN/inf" in g.reasons[0]


# ----------------------------------------------------------------------------------------------- dropout
def test_dropout_zero_share_within_four_binomial_deviations():
    rng = np.random.default_rng(7)
    n, p = 10_000, 0.3
    x = rng.uniform(1.0, 2.0, n)
    tol = 4 * math.sqrt(p * (1 - p) / n) + 1 / n
    for dropped, want in [(int(n * p), "pass"), (int(n * (p + tol)) - 1, "pass"), (int(n * (p + tol)) + 2, "error"),
                          (int(math.ceil(n * (p - tol))) + 1, "pass"), (int(n * (p - tol)) - 2, "error")]:
        out = x / (1 - p)
        out[:dropped] = 0.0
        g = S.dropout(out, x, p, "torch.float64")
        assert g.metrics["zero_ratio"] == dropped / n and g.metrics["expected_zero_ratio"] == p
        assert g.verdict == want, (dropped, g.reasons)
        if want == "error":
            assert f"p is {p:g}" in g.reasons[0] and f"for {n} elements" in g.reasons[0]


def test_dropout_zero_share_exactly_at_its_band_passes():
    n, p = 64, 0.5
    tol = 4 * math.sqrt(p * (1 - p) / n) + 1 / n  # 0.265625, exact
    x = np.ones(n)
    out = np.full(n, 2.0)
    out[:49] = 0.0  # 49 / 64 = p + tol
    g = S.dropout(out, x, p, "torch.float32")
    assert g.metrics["zero_ratio"] - p == tol and g.verdict == "pass"
    out[49] = 0.0
    assert S.dropout(out, x, p, "torch.float32").verdict == "error"


def test_dropout_kept_elements_are_scaled_and_zero_inputs_do_not_count():
    rng = np.random.default_rng(8)
    n, p = 4000, 0.5
    x = rng.uniform(1.0, 2.0, n)
    x[:1000] = 0.0  # zero inputs: neither dropped nor kept
    x[1000] = np.inf
    out = x / (1 - p)
    out[2000:3500] = 0.0
    out[1000] = 7.0
    g = S.dropout(out, x, p, "torch.float64")
    assert g.metrics["zero_ratio"] == 1500 / 2999 and g.verdict == "pass", g.reasons
    assert g.metrics["max_rel_err"] == pytest.approx(0.0, abs=1e-15)
    eps = S.DTYPES["torch.float32"].eps
    out32 = out.copy()
    out32[3600] *= 1 + 3 * eps  # within 4 epsilon of the float32 scale
    assert S.dropout(out32, x, p, "torch.float32").verdict == "pass"
    out32[3601] *= 1 + 5 * eps
    g = S.dropout(out32, x, p, "torch.float32")
    assert g.verdict == "error" and "scaled by 1/(1-p)" in g.reasons[-1]


def test_dropout_counts_negative_inputs_and_checks_their_scale():
    n, p = 1000, 0.5
    x = -np.linspace(1.0, 2.0, n)  # negative inputs are live too
    out = x / (1 - p)
    out[: n // 2] = 0.0
    g = S.dropout(out, x, p, "torch.float64")
    assert g.verdict == "pass" and g.metrics["zero_ratio"] == 0.5
    out[n // 2] *= 1 + 1e-6
    assert S.dropout(out, x, p, "torch.float64").verdict == "error"


def test_dropout_scale_check_edges():
    eps = S.DTYPES["torch.float32"].eps
    x = np.ones(4)
    out = np.array([0.0, 0.0, 2.0, 2.0 * (1 + 4 * eps)])  # exactly four epsilon off: allowed
    assert S.dropout(out, x, 0.5, "torch.float32").verdict == "pass"
    out[3] = 2.0 * (1 - 3 * eps)  # below the scaled value, within four epsilon
    g = S.dropout(out, x, 0.5, "torch.float32")
    assert g.verdict == "pass" and g.metrics["max_rel_err"] == pytest.approx(3 * eps)
    g = S.dropout(np.ones(4), x, 1.0, "torch.float32")  # p = 1 and nothing dropped: no scale to check
    assert g.verdict == "error" and "max_rel_err" not in g.metrics and len(g.reasons) == 1


def test_dropout_edge_cases():
    x = np.zeros(10)
    g = S.dropout(x.copy(), x, 0.5, "torch.float32")
    assert g.verdict == "pass" and "zero_ratio" not in g.metrics
    y = np.ones(10)
    g = S.dropout(np.zeros(10), y, 1.0, "torch.float32")  # p = 1: everything dropped, nothing to scale
    assert g.verdict == "pass" and "max_rel_err" not in g.metrics
    g = S.dropout(np.zeros(3), np.ones(4), 0.5, "torch.float32")
    assert g.verdict == "error" and "shape" in g.reasons[0]
    g = S.dropout(np.ones(10), y, 0.0, "torch.float32")  # p = 0: nothing dropped, kept as is
    assert g.verdict == "pass" and g.metrics["max_rel_err"] == 0.0
    # small kept values are measured against the small-value threshold
    info = S.DTYPES["torch.float32"]
    tiny = np.full(10, info.small / 1024)
    g = S.dropout(tiny * 2 + info.small * info.eps, tiny, 0.5, "torch.float32")
    assert g.metrics["zero_ratio"] == 0.0 and g.metrics["max_rel_err"] == pytest.approx(info.eps)
