"""A call's own error measured by replay: each run's recorded inputs replayed in fp64 (issue 30, item 2).

Tensor dumps of the noise harness (tests/noise_harness.py): the NPU run carries about one bf16 ulp of noise on
every compute call; a planted wrong kernel's own error is far beyond its bound on its side, its neighbours'
and every call of a clean pair stay within it, and a wrong kernel on the bench side is blamed on the bench.
"""
from __future__ import annotations

import warnings

import pytest

from msprobe_nb.analysis.compare import compare
from msprobe_nb.analysis.precision_model import ANOMALOUS, WITHIN

pytest.importorskip("transformers", reason="transformers is not installed")
import noise_harness as H  # noqa: E402

from msprobe_nb.precheck.own_error import own_errors  # noqa: E402

_CACHE: dict = {}
SOFTMAX = "Functional.softmax.1.forward"


def pair(tmp_path_factory, name="gpt2", plant=None, bench_plant=None, fp32_bench=False):
    """(npu, bench) tensor dumps at L1, each recorded once per session."""
    base = tmp_path_factory.getbasetemp()
    key = (name, plant, bench_plant, fp32_bench)
    if key not in _CACHE:
        tag = "_".join(str(x).replace(" ", "").replace("'", "") for x in key)
        npu = H.record(base / f"oe_npu_{tag}", name, level="L1", task="tensor", noise=H.DeviceNoise(plant=plant))
        bench = H.record(base / f"oe_bench_{tag}", name, level="L1", task="tensor", autocast=not fp32_bench,
                         noise=H.DeviceNoise(amp=0, plant=bench_plant) if bench_plant else None)
        _CACHE[key] = npu, bench
    return _CACHE[key]


def run(npu, bench):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compare(npu, bench)


def ratio(m, call, side):
    return float(m[(m["call"] == call) & (m["side"] == side)]["own_ratio"].max())


@pytest.mark.parametrize("name,plant,call", [
    ("gpt2", ("softmax", 1), SOFTMAX),  # a tiled softmax over 7/8 of its keys
    ("bert", ("layer_norm", 2), "Functional.layer_norm.2.forward"),  # eps 0.1
    ("llama", ("linear", 3), "Functional.linear.3.forward"),  # a matmul dropping an eighth of its reduction
])
def test_a_wrong_kernel_has_an_own_error_far_beyond_its_bound(tmp_path_factory, name, plant, call):
    r = run(*pair(tmp_path_factory, name, plant))
    m = own_errors(r)
    assert ratio(m, call, "npu") > 3 and ratio(m, call, "bench") < 1, m
    others = m[(m["call"] != call) & m["own_ratio"].notna()]
    assert len(others) and (others["own_ratio"] < 3).all(), others  # its neighbours are within bound
    d = r.first_divergence()
    assert d is not None and d.call == call
    assert "measured by replay, the NPU side" in d.message and "not precision noise" in d.message
    rows = r[(r["call"] == call) & (r["verdict"] != "")]
    assert (rows["verdict"] == ANOMALOUS).all() and (rows["verdict_by"] == "replay:npu").all()
    assert rows["npu_own_err"].notna().all() and rows["bench_own_err"].notna().all()


def test_a_clean_pair_stays_within_precision(tmp_path_factory):
    r = run(*pair(tmp_path_factory))
    m = own_errors(r, n=12)
    ok = m[m["own_ratio"].notna()]
    assert len(ok) >= 24 and set(ok["side"]) == {"npu", "bench"}
    assert (ok["own_ratio"] < 3).all(), ok.sort_values("own_ratio").tail()
    assert (ok[ok["side"] == "npu"]["own_err"] > 0).any()  # the noise is measured, not missed
    assert r.first_divergence() is None and (r["result"] != "error").all()
    assert (r.loc[r["verdict_by"] != "", "verdict"] == WITHIN).all()


def test_a_wrong_kernel_on_the_bench_side_is_the_benchs(tmp_path_factory):
    r = run(*pair(tmp_path_factory, bench_plant=("softmax", 1)))
    m = own_errors(r)
    assert ratio(m, SOFTMAX, "bench") > 10 and ratio(m, SOFTMAX, "npu") < 1
    d = r.first_divergence()
    assert d is not None and d.call == SOFTMAX and "the bench's kernel is wrong" in d.message


def test_the_replay_clears_a_statistical_suspect(tmp_path_factory):
    """A call the statistics wrongly call anomalous (set here by hand on a clean pair) is cleared once its
    measured own errors are within its bound: the measurement decides, and the first divergence goes."""
    r = run(*pair(tmp_path_factory))
    call = "Torch.addmm.3.forward"
    rows = (r["call"] == call) & (r["verdict"] != "")
    r.loc[rows, "verdict"] = ANOMALOUS
    r.loc[rows, "diverges"] = True
    assert r.first_divergence().call == call
    m = own_errors(r, calls=[call], around=0)
    assert set(m["call"]) == {call} and (m["own_ratio"] < 3).all()
    assert (r.loc[rows, "verdict"] == WITHIN).all() and r.first_divergence() is None


def test_an_fp32_bench_is_held_to_fp32(tmp_path_factory):
    r = run(*pair(tmp_path_factory, plant=("softmax", 1), fp32_bench=True))
    m = own_errors(r, calls=[SOFTMAX], refine_verdicts=False)
    assert set(m.loc[m["side"] == "bench", "precision"]) == {"fp32"}
    assert set(m.loc[m["side"] == "npu", "precision"]) == {"bf16"}
    assert ratio(m, SOFTMAX, "npu") > 10 and ratio(m, SOFTMAX, "bench") < 1
    assert "verdict_by" not in r.columns  # refine_verdicts=False leaves the result alone


def test_a_statistics_compare_is_refused(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    a = H.record(base / "oe_stat_a", "cnn", level="L1")
    b = H.record(base / "oe_stat_b", "cnn", level="L1")
    with pytest.raises(ValueError, match="tensor-mode compare"):
        own_errors(run(a, b))
