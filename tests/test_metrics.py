"""Metric functions against hand-computed numpy values (msprobe's definitions, docs/compare.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from msprobe_nb.analysis import metrics as M


def _stats(**cols):
    return {k: np.asarray(v, dtype=float) for k, v in cols.items()}


def _ref(n: np.ndarray, b: np.ndarray) -> dict:
    """msprobe's tensor metrics written out longhand."""
    dt = np.result_type(n, b)
    eps = np.finfo(dt).eps
    bz = np.where(b == 0, b + eps, b)
    nz = np.where(b == 0, n + eps, n)
    rel = np.abs((nz - bz) / bz)
    nf, bf = n.ravel().astype(np.float64), b.ravel().astype(np.float64)
    d = nf - bf
    return {
        "cosine": nf @ bf / (np.linalg.norm(nf) * np.linalg.norm(bf)),
        "euc_dist": np.linalg.norm(d),
        "max_abs_err": np.abs(d).max(),
        "max_rel_err": rel.max(),
        "one_thousandth": np.mean(rel < 0.001),
        "five_thousandths": np.mean(rel < 0.005),
        "rmse": np.sqrt(np.mean(d ** 2)),
        "mean_abs_err": np.abs(d).mean(),
        "rel_l2_err": np.linalg.norm(d) / np.linalg.norm(bf),
    }


# ----------------------------------------------------------------------------------- statistics mode
def test_stats_diff_and_relative_error():
    npu = _stats(max=[2.0, 1.0, 0.5], min=[-1.0, 0.0, 0.0], mean=[0.5, 0.0, 1e-9], norm=[4.0, 1.0, 3.0])
    bench = _stats(max=[1.0, 1.0, 0.5], min=[-2.0, 0.0, 1e-3], mean=[0.25, 0.0, 0.0], norm=[5.0, 1.0, 3.0])
    out = M.stats_metrics(npu, bench)
    np.testing.assert_allclose(out["max_diff"], [1.0, 0.0, 0.0])
    np.testing.assert_allclose(out["max_rel"], [1.0, 0.0, 0.0])  # fractions: 1.0 == 100 %
    np.testing.assert_allclose(out["min_rel"][:2], [0.5, 0.0])
    np.testing.assert_allclose(out["min_rel"][2], 1.0)  # |0 - 1e-3| / 1e-3
    np.testing.assert_allclose(out["mean_rel"][:2], [1.0, 0.0])
    assert out["mean_rel"][2] == math.inf  # bench 0, npu not: msprobe's inf
    np.testing.assert_allclose(out["norm_rel"], [0.2, 0.0, 0.0])


def test_stats_equal_as_recorded_nan_and_inf():
    nan, inf = math.nan, math.inf
    npu = _stats(max=[nan, nan, inf, 3.0, inf], min=[0, 1, 0, 0, 0], mean=[nan, 1, 0, 0, 0], norm=[1, 1, 1, 1, 1])
    bench = _stats(max=[nan, 2.0, inf, inf, 1.0], min=[0, 1, 0, 0, 0], mean=[nan, 1, 0, 0, 0],
                   norm=[1, 1, 1, 1, 1])
    out = M.stats_metrics(npu, bench)
    assert out["max_diff"][0] == 0 and out["max_rel"][0] == 0  # both unrecorded / both NaN: equal
    assert math.isnan(out["max_diff"][1]) and math.isnan(out["max_rel"][1])  # NaN on one side
    assert out["err"][1] == math.inf  # ... is a full disagreement
    assert out["max_diff"][2] == 0  # inf == inf
    assert out["max_diff"][3] == -inf and out["max_rel"][3] == inf
    assert out["max_diff"][4] == inf and out["max_rel"][4] == inf


def test_stats_same_and_differ_masks_for_values():
    nan = math.nan
    npu = _stats(max=[nan, nan], min=[nan, nan], mean=[nan, nan], norm=[nan, nan])
    out = M.stats_metrics(npu, npu, same=np.array([True, False]), differ=np.array([False, True]))
    assert out["max_diff"][0] == 0
    assert math.isnan(out["max_diff"][1]) and out["err"][1] == math.inf


def test_near_zero_flag_and_scale_aware_error():
    # bench mean is ~0 next to the tensor's range: the relative error is inflated, err uses the range
    npu = _stats(max=[1.0], min=[-1.0], mean=[3e-9], norm=[10.0])
    bench = _stats(max=[1.0], min=[-1.0], mean=[1e-9], norm=[10.0])
    out = M.stats_metrics(npu, bench, near_zero_rtol=1e-2)
    assert out["mean_rel"][0] == pytest.approx(2.0)
    assert M.near_zero_labels(out["near_zero"])[0] == "mean"
    assert out["err"][0] == pytest.approx(2e-9 / 1e-2)
    # an all-zero bench tensor: norm relative error is inf, err compares with the NPU's size instead
    z = M.stats_metrics(_stats(max=[1e-3], min=[0.0], mean=[1e-4], norm=[1e-3]),
                        _stats(max=[0.0], min=[0.0], mean=[0.0], norm=[0.0]))
    assert z["norm_rel"][0] == math.inf
    assert set(M.near_zero_labels(z["near_zero"])[0].split(",")) == {"max", "mean", "norm"}
    assert z["err"][0] == pytest.approx(1.0)


def test_near_zero_labels_table():
    assert list(M.near_zero_labels(np.array([0, 1, 5, 15]))) == ["", "max", "max,mean", "max,min,mean,norm"]


def test_dtype_compatibility_rule():
    n = np.array(["torch.float16", "torch.bfloat16", "torch.int32", "torch.int64", "torch.float64"], dtype=object)
    b = np.array(["torch.float32", "torch.float32", "torch.int64", "torch.int64", "torch.float32"], dtype=object)
    assert list(M.tensor_dtype_ok(n, b)) == [True, True, False, True, False]


# ----------------------------------------------------------------------------------- tensor mode
@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 4)])
def test_tensor_metrics_match_hand_computation(shape):
    rng = np.random.default_rng(1)
    b = rng.normal(size=shape).astype(np.float32)
    b.flat[0] = 0.0  # a bench zero exercises the eps shift of the relative error
    n = (b * (1 + rng.normal(0, 2e-3, size=shape))).astype(np.float32)
    n.flat[0] = 1e-6
    got = M.tensor_metrics(torch.from_numpy(n), torch.from_numpy(b))
    ref = _ref(n, b)
    for k, v in ref.items():
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k
    assert got["status"] == M.ST_OK and got["nan_inf_match"] is True


def test_tensor_metrics_identical():
    x = torch.randn(10, 3)
    got = M.tensor_metrics(x, x.clone())
    assert got["cosine"] == pytest.approx(1.0)
    assert got["euc_dist"] == 0 and got["max_abs_err"] == 0 and got["max_rel_err"] == 0
    assert got["one_thousandth"] == 1.0 and got["five_thousandths"] == 1.0
    assert got["rmse"] == 0 and got["rel_l2_err"] == 0


def test_zero_dim_tensor():
    got = M.tensor_metrics(torch.tensor(2.0), torch.tensor(4.0))
    assert got["status"] == M.ST_SCALAR
    for k in ("cosine", "euc_dist", "one_thousandth", "five_thousandths"):
        assert math.isnan(got[k]), k
    assert got["max_abs_err"] == 2.0 and got["max_rel_err"] == 0.5
    assert any("0-d" in m for m in got["messages"])


def test_length_one_tensor():
    got = M.tensor_metrics(torch.tensor([2.0]), torch.tensor([4.0]))
    assert got["status"] == M.ST_LEN1
    assert math.isnan(got["cosine"])
    assert got["euc_dist"] == 2.0 and got["max_rel_err"] == 0.5
    assert got["one_thousandth"] == 0.0


def test_all_zero_tensors():
    z = torch.zeros(6)
    both = M.tensor_metrics(z, z)
    assert both["cosine"] == 1.0 and both["max_rel_err"] == 0 and both["rel_l2_err"] == 0
    one = M.tensor_metrics(z, torch.ones(6))
    assert math.isnan(one["cosine"]) and any("NPU tensor is all zeros" in m for m in one["messages"])
    other = M.tensor_metrics(torch.ones(6), z)
    assert math.isnan(other["cosine"]) and any("bench tensor is all zeros" in m for m in other["messages"])
    # bench all zero: relative error uses eps: |(1+eps) - eps| / eps
    assert other["max_rel_err"] == pytest.approx(1 / np.finfo(np.float32).eps, rel=1e-6)
    assert other["rel_near_zero"] is True  # a relative error against an all-zero bench means nothing
    assert other["rel_l2_err"] == math.inf


def test_nan_inf_same_positions_are_zeroed():
    n = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    b = torch.tensor([1.5, float("nan"), float("inf"), 2.0])
    got = M.tensor_metrics(n, b)
    ref = _ref(np.array([1.0, 0, 0, 2.0], np.float32), np.array([1.5, 0, 0, 2.0], np.float32))
    assert got["nan_inf_match"] is True and got["status"] == M.ST_OK
    assert got["euc_dist"] == pytest.approx(ref["euc_dist"]) and got["cosine"] == pytest.approx(ref["cosine"])
    assert got["max_rel_err"] == pytest.approx(1 / 3)


def test_nan_inf_positions_differ():
    n = torch.tensor([1.0, float("nan"), 3.0])
    b = torch.tensor([1.0, 2.0, float("nan")])
    got = M.tensor_metrics(n, b)
    assert got["status"] == M.ST_NANINF and got["nan_inf_match"] is False
    assert all(math.isnan(got[k]) for k in M.TENSOR_COLUMNS)
    assert "2 element(s)" in got["messages"][0]


def test_inf_sign_mismatch_is_reported():
    got = M.tensor_metrics(torch.tensor([float("inf"), 1.0]), torch.tensor([float("-inf"), 1.0]))
    assert got["nan_inf_match"] is False and got["status"] == M.ST_OK  # msprobe would call it a match
    assert any("opposite signs" in m for m in got["messages"])


def test_empty_and_shape_mismatch():
    e = M.tensor_metrics(torch.zeros(0), torch.zeros(0))
    assert e["status"] == M.ST_EMPTY and math.isnan(e["cosine"])
    s = M.tensor_metrics(torch.zeros(2, 3), torch.zeros(3, 2))
    assert s["status"] == M.ST_SHAPE and "[2, 3] vs [3, 2]" in s["messages"][0]


def test_bf16_and_bool_inputs():
    x = torch.randn(16)
    got = M.tensor_metrics(x.to(torch.bfloat16), x)
    assert 0 < got["max_rel_err"] < 2 ** -8 and got["cosine"] > 0.9999
    flags = M.tensor_metrics(torch.tensor([True, False, True]), torch.tensor([True, True, True]))
    assert flags["max_abs_err"] == 1.0


def test_relative_error_near_zero_is_flagged():
    b = torch.tensor([1e-7, 1.0, -2.0, 3.0])
    n = b + torch.tensor([1e-6, 1e-6, 0.0, 0.0])
    got = M.tensor_metrics(n, b)
    assert got["max_rel_err"] > 5  # 1e-6 / 1e-7: a meaningless "1000 %"
    assert got["rel_near_zero"] is True and any("bench is ~0" in m for m in got["messages"])
    assert got["rel_l2_err"] < 1e-6  # the scale-free error stays tiny


def test_an_error_of_exactly_one_thousandth_is_not_within_one_thousandth():
    # msprobe: One Thousandth Err Ratio = mean(RE < 0.001), strictly; the same for five thousandths
    b = np.array([1000.0, 1000.0, 200.0, 1.0])
    n = np.array([1001.0, 1000.5, 201.0, 1.0])  # relative errors 0.001, 0.0005, 0.005, 0 (exact in float64)
    m = M.tensor_metrics(n, b)
    assert m["one_thousandth"] == 0.5 and m["five_thousandths"] == 0.75
