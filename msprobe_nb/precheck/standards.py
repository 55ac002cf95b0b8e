"""The grading rules of the pre-check: one function per standard, numpy only, every reason kept.

Each takes the device's output and the bench's (float64 arrays of one shape; the bench ran in higher
precision) and returns a :class:`Grade`: the standard's name, a verdict (pass, warning, error), its metrics
and the reasons behind the verdict. Thresholds depend on the output's dtype (``DTYPES``) and, for the
benchmark method, on the op's level (``BENCHMARK_LIMITS``). docs/precheck.md states every rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BENCHMARK_LIMITS", "DTYPES", "DtypeInfo", "Grade", "absolute", "benchmark", "binary", "dropout",
           "dtype_info", "thousandths", "ulp", "worst"]


@dataclass(frozen=True)
class DtypeInfo:
    """What the rules need of a floating dtype: its epsilon, mantissa bits, smallest normal exponent, the
    small-value threshold below which errors are absolute, the ULP limit, the share of elements allowed over
    it, the relative tolerance of the absolute-threshold rule and the thousandths rule's (tolerance, share)."""

    eps: float
    mantissa: int
    emin: int
    small: float
    ulp_limit: float
    ulp_share: float
    rtol: float
    thousandths: tuple[float, float]
    max: float

    @property
    def small_atol(self) -> float:
        """Absolute error allowed on a small value: the small-value threshold times the relative tolerance,
        so that the two rules meet at the threshold."""
        return self.small * self.rtol


DTYPES = {
    "torch.float32": DtypeInfo(2.0 ** -23, 23, -126, 2.0 ** -14, 32.0, 0.0005, 2.0 ** -20, (1e-4, 0.9999),
                               3.4028234663852886e38),
    "torch.float16": DtypeInfo(2.0 ** -10, 10, -14, 2.0 ** -11, 1.0, 0.001, 2.0 ** -10, (1e-3, 0.999), 65504.0),
    "torch.bfloat16": DtypeInfo(2.0 ** -7, 7, -126, 2.0 ** -8, 1.0, 0.001, 2.0 ** -7, (4e-3, 0.996),
                                3.3895313892515355e38),
    "torch.float64": DtypeInfo(2.0 ** -52, 52, -1022, 2.0 ** -30, 32.0, 0.0005, 2.0 ** -46, (1e-8, 0.9999),
                               1.7976931348623157e308),
}

#: benchmark method: (warning above, error above) for the ratio device metric / reference metric, by level;
#: the maximum relative error, a single element, has its own wider limits
BENCHMARK_LIMITS = {"tight": (1.2, 2.0), "normal": (1.5, 2.0), "loose": (2.0, 5.0)}
MAX_REL_LIMITS = (2.0, 10.0)

_ORDER = {"pass": 0, "warning": 1, "error": 2}


def worst(*verdicts: str) -> str:
    """The worst of pass / warning / error."""
    return max(verdicts, key=lambda v: _ORDER.get(v, -1)) if verdicts else "pass"


@dataclass
class Grade:
    """The outcome of one standard on one output."""

    standard: str
    verdict: str = "pass"
    metrics: dict[str, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def flag(self, verdict: str, reason: str) -> None:
        self.verdict = worst(self.verdict, verdict)
        self.reasons.append(f"{verdict}: {reason}")


def dtype_info(dtype: str) -> DtypeInfo:
    """The rules' constants for ``dtype`` (torch.float32 for a dtype that has none)."""
    return DTYPES.get(dtype, DTYPES["torch.float32"])


def saturate(bench: np.ndarray, dtype: str) -> np.ndarray:
    """The bench's values as the device's dtype can hold them: beyond its largest finite value (plus half an
    ULP, where rounding goes to infinity) a correct device result is infinite."""
    info = DTYPES.get(dtype)
    if info is None or bench.dtype.kind != "f":
        return bench
    limit = info.max * (1 + info.eps / 4)
    over = np.abs(bench) > limit
    return np.where(over, np.copysign(np.inf, bench), bench) if over.any() else bench


def _specials(dev: np.ndarray, bench: np.ndarray, g: Grade) -> Any:
    """The finite positions to compare (``...``: all of them); NaN and inf must sit at the same places with
    the same sign."""
    if np.isfinite(dev).all() and np.isfinite(bench).all():  # the common case, checked in one pass each
        g.metrics["special_mismatch"] = 0.0
        return ...
    dn, bn = np.isnan(dev), np.isnan(bench)
    di, bi = np.isinf(dev), np.isinf(bench)
    bad = int(np.count_nonzero(dn != bn)) + int(np.count_nonzero((di | bi) & ~(dn | bn) & (dev != bench)))
    g.metrics["special_mismatch"] = float(bad)
    if bad:
        g.flag("error", f"{bad} NaN/inf elements where the bench has none, or the other way round")
    return ~(dn | bn | di | bi)


def _shape_ok(dev: np.ndarray, bench: np.ndarray, g: Grade) -> bool:
    if dev.shape != bench.shape:
        g.flag("error", f"shape {tuple(dev.shape)} on the device, {tuple(bench.shape)} on the bench")
        return False
    return True


def _finite_pairs(dev: np.ndarray, bench: np.ndarray, dtype: str, g: Grade,
                  ) -> tuple[np.ndarray, np.ndarray, DtypeInfo] | None:
    """What a numeric standard grades: the elements that are finite on both sides (NaN/inf positions are
    checked on their own, into ``g``), and the dtype's limits; None when the shapes differ or nothing is left."""
    if not _shape_ok(dev, bench, g):
        return None
    ok = _specials(dev, bench, g)
    d, b = dev[ok], bench[ok]
    return (d, b, dtype_info(dtype)) if d.size else None


def binary(dev: np.ndarray, bench: np.ndarray, dtype: str = "") -> Grade:
    """Binary consistency: every element equal (NaN equals NaN)."""
    g = Grade("binary")
    if not _shape_ok(dev, bench, g):
        return g
    same = (dev == bench) | (np.isnan(dev) & np.isnan(bench))
    n = int(dev.size - np.count_nonzero(same))
    g.metrics["mismatch"] = float(n)
    g.metrics["mismatch_ratio"] = n / dev.size if dev.size else 0.0
    if n:
        g.flag("error", f"{n} of {dev.size} elements differ; this op must reproduce its values exactly")
    return g


def _ulp_of(x: np.ndarray, info: DtypeInfo) -> np.ndarray:
    """One unit in the last place of ``x`` in the device's dtype (subnormals: the smallest normal's)."""
    _, exp = np.frexp(np.abs(x))  # |x| = m * 2**exp, m in [0.5, 1)
    exp = np.maximum(exp - 1, info.emin)
    return np.ldexp(1.0, exp - info.mantissa)


def ulp(dev: np.ndarray, bench: np.ndarray, dtype: str) -> Grade:
    """ULP error: elements over the dtype's limit (fp32 32 ULP, fp16/bf16 1 ULP) may be at most a small share
    (fp32 0.05 %, fp16/bf16 0.1 %)."""
    g = Grade("ulp")
    got = _finite_pairs(dev, bench, dtype, g)
    if got is None:
        return g
    d, b, info = got
    err = np.abs(d - b) / _ulp_of(b, info)
    over = float(np.count_nonzero(err > info.ulp_limit)) / d.size
    g.metrics.update(max_ulp_err=float(err.max()), mean_ulp_err=float(err.mean()), ulp_err_ratio=over,
                     max_abs_err=float(np.abs(d - b).max()))
    if over > info.ulp_share:
        g.flag("error", f"{over:.2%} of elements are more than {info.ulp_limit:g} ULP from the bench "
                        f"(allowed {info.ulp_share:.2%} for {dtype or 'this dtype'}); max {err.max():.3g} ULP")
    return g


def absolute(dev: np.ndarray, bench: np.ndarray, dtype: str) -> Grade:
    """Absolute threshold: where |bench| is below the small-value threshold the absolute error must stay under
    ``small_atol``, elsewhere the relative error under ``rtol``; no element may exceed either."""
    g = Grade("absolute")
    got = _finite_pairs(dev, bench, dtype, g)
    if got is None:
        return g
    d, b, info = got
    err = np.abs(d - b)
    small = np.abs(b) < info.small
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(small, 0.0, err / np.abs(b))
    n_small, n_big = int(np.count_nonzero(small)), int(d.size - np.count_nonzero(small))
    bad_small = int(np.count_nonzero(small & (err > info.small_atol)))
    bad_rel = int(np.count_nonzero(rel > info.rtol))
    g.metrics.update(max_abs_err=float(err.max()), max_rel_err=float(rel.max()),
                     small_value_err_ratio=bad_small / n_small if n_small else 0.0,
                     rel_err_ratio=bad_rel / n_big if n_big else 0.0)
    if bad_rel:
        g.flag("error", f"{bad_rel} of {n_big} elements have a relative error over {info.rtol:.3g}")
    if bad_small:
        g.flag("error", f"{bad_small} of {n_small} small values (|x| < {info.small:.3g}) have an absolute error "
                        f"over {info.small_atol:.3g}")
    return g


def thousandths(dev: np.ndarray, bench: np.ndarray, dtype: str) -> Grade:
    """Thousandths ratios: the share of elements within the dtype's relative tolerance (fp16 0.1 %, bf16 0.4 %,
    fp32 0.01 %; small values measured against the small-value threshold) must reach the dtype's share."""
    g = Grade("thousandths")
    got = _finite_pairs(dev, bench, dtype, g)
    if got is None:
        return g
    d, b, info = got
    tol, share = info.thousandths
    rel = np.abs(d - b) / np.maximum(np.abs(b), info.small)
    within = float(np.count_nonzero(rel <= tol)) / d.size
    g.metrics.update(within_tolerance=within, max_rel_err=float(rel.max()))
    if within < share:
        g.flag("error", f"only {within:.3%} of elements are within {tol:g} relative error of the bench "
                        f"(needed {share:.2%} for {dtype or 'this dtype'})")
    return g


def _error_metrics(x: np.ndarray, bench: np.ndarray, small: np.ndarray, abs_big: np.ndarray,
                   info: DtypeInfo) -> dict[str, float]:
    """The benchmark method's five metrics of one output against the bench (``small``: where |bench| is
    below the small-value threshold; ``abs_big``: |bench| elsewhere)."""
    err = x - bench
    abs_err = np.abs(err)
    n_small = int(np.count_nonzero(small))
    rel = abs_err[~small] / abs_big if abs_big.size else np.zeros(1)
    n_pos, n_neg = int(np.count_nonzero(err > 0)), int(np.count_nonzero(err < 0))
    return {
        "small_value_err_ratio": float(np.count_nonzero(abs_err[small] > info.small_atol)) / n_small
        if n_small else 0.0,
        "rmse": float(math.sqrt(np.dot(err, err) / err.size)) if err.size else 0.0,
        "max_rel_err": float(rel.max()),
        "mean_rel_err": float(rel.mean()),
        # the bias of the error: 1 when every error has the same sign, 0 when they are balanced
        "err_balance": abs(n_pos - n_neg) / (n_pos + n_neg) if n_pos + n_neg else 0.0,
        "_n_err": float(n_pos + n_neg), "_n_small": float(n_small),
    }


def benchmark(dev: np.ndarray, bench: np.ndarray, ref: np.ndarray, dtype: str, level: str = "normal") -> Grade:
    """Benchmark method: the device's error against the bench, metric by metric, divided by the error the
    reference kernel (same dtype, on the bench device) makes. Each reference metric is floored at what a
    correctly rounded result could show (so a reference that happens to be exact does not make every device
    fail): half an epsilon for relative errors, half an epsilon of the bench's RMS for the RMSE, the noise of
    a random sign for the error balance; the small-value share is measured against the reference's plus three
    standard deviations of its sampling noise (at least one element in a thousand)."""
    g = Grade("benchmark")
    if not _shape_ok(dev, bench, g) or not _shape_ok(ref, bench, g):
        return g
    info = dtype_info(dtype)
    ok = _specials(dev, bench, g)
    d, b, r = dev[ok].ravel(), bench[ok].ravel(), ref[ok].ravel()
    if not d.size:
        return g
    abs_b = np.abs(b)
    small = abs_b < info.small
    abs_big = abs_b[~small]
    md, mr = _error_metrics(d, b, small, abs_big, info), _error_metrics(r, b, small, abs_big, info)
    rms = float(math.sqrt(np.dot(b, b) / b.size))
    n_small = max(md["_n_small"], 1.0)
    share = mr["small_value_err_ratio"]  # its sampling noise: few small values make a share of little meaning
    noise = 3.0 * math.sqrt(max(share * (1 - share), 1.0 / n_small) / n_small)
    floors = {"small_value_err_ratio": max(share + noise, 1e-3), "rmse": max(rms, info.small) * info.eps / 2,
              "max_rel_err": info.eps / 2, "mean_rel_err": info.eps / 4,
              "err_balance": 3.0 / math.sqrt(max(md["_n_err"], mr["_n_err"], 1.0))}
    warn_at, error_at = BENCHMARK_LIMITS.get(level, BENCHMARK_LIMITS["normal"])
    for name, floor in floors.items():
        ratio = md[name] / max(mr[name], floor)
        g.metrics[name] = md[name]
        g.metrics[f"ref_{name}"] = mr[name]
        g.metrics[f"{name}_ratio"] = ratio
        w, e = MAX_REL_LIMITS if name == "max_rel_err" else (warn_at, error_at)
        if ratio > e:
            g.flag("error", f"{name} {md[name]:.3g} is {ratio:.3g}x the reference kernel's "
                            f"{mr[name]:.3g} (limit {e:g}x, {level} op)")
        elif ratio > w:
            g.flag("warning", f"{name} {md[name]:.3g} is {ratio:.3g}x the reference kernel's "
                              f"{mr[name]:.3g} (warning above {w:g}x)")
    g.metrics["max_abs_err"] = float(np.abs(d - b).max())
    return g


def dropout(out: np.ndarray, inp: np.ndarray, p: float, dtype: str) -> Grade:
    """Dropout is not replayed (its mask is random): the share of zeros among the non-zero inputs must be p,
    within four binomial standard deviations, and every kept element must be its input scaled by 1/(1-p)."""
    g = Grade("dropout")
    if not _shape_ok(out, inp, g):
        return g
    live = (inp != 0) & np.isfinite(inp)
    n = int(np.count_nonzero(live))
    g.metrics["expected_zero_ratio"] = p
    if not n:
        return g
    dropped = live & (out == 0)
    ratio = float(np.count_nonzero(dropped)) / n
    tol = 4.0 * math.sqrt(max(p * (1 - p), 0.0) / n) + 1.0 / n
    g.metrics["zero_ratio"] = ratio
    if abs(ratio - p) > tol:
        g.flag("error", f"{ratio:.4f} of the elements are dropped, p is {p:g} (allowed ±{tol:.4f} for {n} elements)")
    kept = live & ~dropped
    if p < 1 and np.any(kept):
        want = inp[kept] / (1.0 - p)
        rel = np.abs(out[kept] - want) / np.maximum(np.abs(want), dtype_info(dtype).small)
        g.metrics["max_rel_err"] = float(rel.max())
        if rel.max() > 4 * dtype_info(dtype).eps:
            g.flag("error", f"kept elements are not the input scaled by 1/(1-p): max relative error {rel.max():.3g}")
    return g


def metrics_row(g: Grade) -> dict[str, Any]:
    """The grade's public metrics (internal counters start with an underscore)."""
    return {k: v for k, v in g.metrics.items() if not k.startswith("_")}
