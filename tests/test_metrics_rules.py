"""The metrics' rules at their edges (issue 36: tests that fail when a rule breaks): when a tensor file
contradicts its dump, and the statistics and tensor metrics at their boundaries."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from msprobe_nb.analysis import metrics as M


# ----------------------------------------------------------------------------- a tensor file against its dump
def test_a_file_that_matches_its_dump_contradicts_nothing():
    x = np.array([[-2.0, 0.5], [1.0, 3.0]])
    assert M.file_contradiction(x, (2, 2), 3.0, -2.0) is None
    assert M.file_contradiction(x, [2, 2], 3.0, -2.0) is None  # a shape read back as a list
    assert M.file_contradiction(x, None, 3.0, -2.0) is None  # shape not recorded: not checked


def test_a_file_of_another_shape_names_both_shapes():
    assert M.file_contradiction(np.zeros((2, 3)), (3, 2), 0.0, 0.0) == (
        "the tensor file holds shape [2, 3], the dump records [3, 2]")


def test_a_max_or_min_that_is_not_the_recorded_one_is_named():
    x = np.array([-2.0, 0.5, 3.0])
    assert M.file_contradiction(x, (3,), 4.0, -2.0) == "the tensor file's max is 3, the dump records 4"
    assert M.file_contradiction(x, (3,), 3.0, -1.0) == "the tensor file's min is -2, the dump records -1"
    assert M.file_contradiction(-x, (3,), 2.0, -2.0) == "the tensor file's min is -3, the dump records -2"


def test_the_recorders_float32_rounding_is_not_a_contradiction_but_a_larger_change_is():
    x = np.array([0.1, 1 / 3, 2.0 / 3.0])  # float64 file, statistics recorded in float32
    vmax, vmin = float(np.float32(x.max())), float(np.float32(x.min()))
    assert M.file_contradiction(x, (3,), vmax, vmin) is None
    assert M.file_contradiction(x, (3,), x.max() * (1 + 1e-5), vmin) is not None
    assert M.file_contradiction(x, (3,), x.max() * (1 - 1e-5), vmin) is not None
    assert M.file_contradiction(np.zeros(3), (3,), 0.0, 0.0) is None  # an exact zero against zero
    assert M.file_contradiction(np.zeros(3), (3,), 1e-20, 0.0) is not None


def test_statistics_not_recorded_or_not_finite_are_not_checked():
    x = np.array([1.0, 2.0])
    assert M.file_contradiction(x, (2,), None, None) is None
    assert M.file_contradiction(x, (2,), math.nan, math.inf) is None
    assert M.file_contradiction(x, (2,), math.inf, 5.0) == "the tensor file's min is 1, the dump records 5"


def test_nan_and_inf_elements_are_left_out_of_the_files_max_and_min():
    x = np.array([math.nan, 1.0, math.inf, -1.0, -math.inf])
    assert M.file_contradiction(x, (5,), 1.0, -1.0) is None
    assert M.file_contradiction(np.array([math.nan, math.inf]), (2,), 1.0, -1.0) is None  # nothing finite


def test_files_without_a_max_are_not_checked_but_ints_bools_and_torch_tensors_are():
    assert M.file_contradiction(np.zeros((0, 3)), (0, 3), 1.0, -1.0) is None  # empty
    assert M.file_contradiction(np.array([1 + 2j]), (1,), 9.0, 9.0) is None  # complex
    assert M.file_contradiction(torch.tensor([1 + 2j]), (1,), 9.0, 9.0) is None
    assert M.file_contradiction(np.array(["a", "b"]), (2,), 9.0, 9.0) is None  # not numbers
    assert M.file_contradiction(np.array([1, 5], dtype=np.int64), (2,), 5.0, 1.0) is None
    assert M.file_contradiction(np.array([1, 5], dtype=np.int64), (2,), 6.0, 1.0) is not None
    assert M.file_contradiction(np.array([True, False]), (2,), 1.0, 0.0) is None
    assert M.file_contradiction(np.array([True, True]), (2,), 1.0, 0.0) is not None
    t = torch.tensor([0.5, 2.0], dtype=torch.bfloat16)
    assert M.file_contradiction(t, (2,), 2.0, 0.5) is None
    assert M.file_contradiction(t, (2,), 2.0, 0.25) == "the tensor file's min is 0.5, the dump records 0.25"


# ----------------------------------------------------------------------------- statistics at their edges
def test_a_statistic_missing_on_one_side_is_not_flagged_near_zero():
    nan = math.nan
    npu = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([nan]), "norm": np.array([2.0])}
    bench = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([0.0]), "norm": np.array([2.0])}
    out = M.stats_metrics(npu, bench)
    assert list(M.near_zero_labels(out["near_zero"])) == [""]
    assert out["err"][0] == 0.0  # mean may simply not have been recorded on one side


# ----------------------------------------------------------------------------- tensor metrics at their edges
def test_an_empty_bench_tensor_is_empty_not_a_shape_difference():
    for n, b in ((np.ones(3), np.zeros(0)), (np.zeros(0), np.ones(3))):
        got = M.tensor_metrics(n, b)
        assert got["status"] == M.ST_EMPTY and got["messages"] == ["empty tensor: nothing to compare"]


def test_nan_inf_positions_that_differ_are_counted_per_element():
    got = M.tensor_metrics(np.array([math.nan, 1.0, math.inf]), np.array([math.inf, math.nan, 1.0]))
    assert got["status"] == M.ST_NANINF
    assert got["messages"][0].startswith("NaN/inf positions differ at 3 element(s)")


def test_a_complex_scalar_is_compared_as_its_real_and_imaginary_parts():
    for x in (np.array(1 + 2j), torch.tensor(1 + 2j)):
        got = M.tensor_metrics(x, x)
        assert got["status"] == M.ST_OK and got["cosine"] == pytest.approx(1.0) and got["max_abs_err"] == 0.0
    off = M.tensor_metrics(np.array(1 + 2j), np.array(1 + 1j))
    assert off["max_abs_err"] == 1.0 and off["max_rel_err"] == 1.0


def test_a_relative_error_below_one_from_a_near_zero_bench_element_is_still_flagged():
    got = M.tensor_metrics(np.array([1.5e-4, 1.0]), np.array([1e-4, 1.0]))
    assert got["max_rel_err"] == pytest.approx(0.5) and got["rel_near_zero"] is True
    assert M.tensor_metrics(np.array([1.0, 2.0]), np.array([1.0, 2.0]))["rel_near_zero"] is False


def test_a_norm_of_exactly_eps_counts_as_all_zeros():
    eps = np.finfo(np.float32).eps
    tiny, zero = np.array([eps, 0.0], np.float32), np.zeros(2, np.float32)
    assert M.tensor_metrics(tiny, zero)["cosine"] == 1.0  # both "all zeros": identical
    assert M.tensor_metrics(zero, tiny)["cosine"] == 1.0
    one = M.tensor_metrics(np.array([2 * eps, 0.0], np.float32), zero)
    assert math.isnan(one["cosine"]) and any("bench tensor is all zeros" in m for m in one["messages"])


def test_a_one_element_file_is_checked_too():
    assert M.file_contradiction(np.array([2.0]), (1,), 2.0, 2.0) is None
    assert M.file_contradiction(np.array([2.0]), (1,), 3.0, 2.0) == "the tensor file's max is 2, the dump records 3"


def test_an_all_zero_bench_tensor_gives_an_error_of_one_whatever_the_npu_size():
    zero = {s: np.array([0.0]) for s in M.STATS}
    for k in (1e-3, 1.0, 1e3):
        npu = {"max": np.array([2.0 * k]), "min": np.array([0.0]), "mean": np.array([k]), "norm": np.array([3.0 * k])}
        assert M.stats_metrics(npu, zero)["err"][0] == pytest.approx(1.0)


@pytest.mark.parametrize("n,b", [([math.inf, 1.0], [1.0, 1.0]), ([1.0, 1.0], [math.inf, 1.0]),
                                 ([math.nan, 1.0], [1.0, 1.0]), ([1.0, 1.0], [1.0, math.nan])])
def test_nan_or_inf_on_one_side_only_is_never_compared(n, b):
    got = M.tensor_metrics(np.array(n), np.array(b))
    assert got["status"] == M.ST_NANINF and got["nan_inf_match"] is False and math.isnan(got["cosine"])


def test_the_relative_l2_error_of_a_small_bench_tensor_is_finite():
    got = M.tensor_metrics(np.array([0.3, 0.4001]), np.array([0.3, 0.4]))
    assert got["rel_l2_err"] == pytest.approx(1e-4 / 0.5, rel=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_an_overflowing_cosine_is_explained_and_a_finite_one_is_not():
    assert M.tensor_metrics(np.array([1.0, 2.0]), np.array([1.0, 2.5]))["messages"] == []
    big = M.tensor_metrics(np.array([1e200, 1e200]), np.array([1e200, 1e200]))
    assert math.isnan(big["cosine"]) and big["messages"] == ["Cosine undefined: overflow in the dot product"]


def test_inf_against_an_all_zero_bench_tensor_is_a_full_disagreement_and_the_first_divergence():
    inf = math.inf
    npu = {"max": np.array([inf]), "min": np.array([0.0]), "mean": np.array([inf]), "norm": np.array([inf])}
    assert M.stats_metrics(npu, {s: np.array([0.0]) for s in M.STATS})["err"][0] == inf
    from helpers import f, table

    from msprobe_nb import compare
    d = compare(table({0: [f(0, 1.0), f(1, 0.0, inf), f(2, inf)]}),
                table({0: [f(0, 1.0), f(1, 0.0, 0.0), f(2, 0.0)]})).first_divergence()
    assert d is not None and d.call == "Functional.f.1.forward"


def test_a_norm_that_differs_on_a_nonzero_bench_is_its_relative_error_not_near_zero():
    npu = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([0.1]), "norm": np.array([4.0])}
    bench = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([0.1]), "norm": np.array([5.0])}
    out = M.stats_metrics(npu, bench)
    assert out["err"][0] == pytest.approx(0.2) and list(M.near_zero_labels(out["near_zero"])) == [""]


def test_only_exact_bench_zeros_are_shifted_by_eps_in_the_relative_error():
    b = np.array([-1e-7, 4.0], np.float32)
    got = M.tensor_metrics(np.array([-2e-7, 4.0], np.float32), b)
    assert got["max_rel_err"] == pytest.approx(1.0, rel=1e-6)


def test_the_near_zero_flag_scales_with_the_bench_tensors_largest_magnitude():
    got = M.tensor_metrics(np.array([1.5e-3, 4.0]), np.array([1e-3, 4.0]))  # 1e-3 <= 1 % of 4
    assert got["max_rel_err"] == pytest.approx(0.5) and got["rel_near_zero"] is True
    got = M.tensor_metrics(np.array([0.15, 4.0]), np.array([0.1, 4.0]))  # 0.1 > 1 % of 4
    assert got["rel_near_zero"] is False


def test_nan_in_the_bench_max_alone_is_a_full_disagreement():
    npu = {"max": np.array([2.0]), "min": np.array([-1.0]), "mean": np.array([0.1]), "norm": np.array([2.0])}
    assert M.stats_metrics(npu, {**npu, "max": np.array([math.nan])})["err"][0] == math.inf
    assert M.stats_metrics({**npu, "min": np.array([math.nan])}, npu)["err"][0] == math.inf


def test_float64_tensors_keep_their_precision_and_fp8_ones_are_compared_as_float32():
    a = torch.tensor([1.0, 2.0], dtype=torch.float64)
    assert M.tensor_metrics(a + 1e-9, a)["max_abs_err"] == pytest.approx(1e-9, rel=1e-3, abs=0)  # not float32's 0
    x = torch.tensor([1.0, 2.0, 0.5])
    got = M.tensor_metrics(x.to(torch.float8_e4m3fn), x)
    assert got["status"] == M.ST_OK and got["max_abs_err"] == 0.0 and got["cosine"] == pytest.approx(1.0)


def test_inf_in_the_bench_tensor_alone_is_counted():
    got = M.tensor_metrics(np.array([1.0, 1.0]), np.array([math.inf, 1.0]))
    assert got["messages"][0].startswith("NaN/inf positions differ at 1 element(s)")


def test_identical_tensors_with_zeros_have_no_near_zero_relative_error():
    for x in (np.array([0.0, 1.0, 2.0]), np.zeros(3)):
        got = M.tensor_metrics(x, x.copy())
        assert got["max_rel_err"] == 0.0 and got["rel_near_zero"] is False and got["messages"] == []


# ----------------------------------------------------------------------------- more edges the mutants found
def test_a_difference_exactly_at_the_files_tolerance_is_not_a_contradiction():
    at = 1.0000010000010001e-30  # |0 - at| == 1e-6 * at + 1e-30 exactly
    assert abs(0.0 - at) == 1e-6 * at + 1e-30
    assert M.file_contradiction(np.zeros(2), (2,), at, 0.0) is None


def test_a_file_larger_in_its_first_dimension_is_a_shape_contradiction_too():
    assert M.file_contradiction(np.zeros((3, 2)), (2, 3), 0.0, 0.0) == (
        "the tensor file holds shape [3, 2], the dump records [2, 3]")


def test_an_inf_in_a_file_is_not_its_max():
    x = np.array([1.0, math.inf, -1.0])
    assert M.file_contradiction(x, (3,), 1.0, -1.0) is None
    assert M.file_contradiction(x, (3,), 5.0, -1.0) == "the tensor file's max is 1, the dump records 5"


def test_the_near_zero_floor_is_a_fraction_of_the_bench_tensors_scale():
    npu = {"max": np.array([100.0]), "min": np.array([-100.0]), "mean": np.array([0.8]), "norm": np.array([500.0])}
    bench = {**npu, "mean": np.array([0.5])}  # 0.5 <= 1 % of 100
    out = M.stats_metrics(npu, bench)
    assert list(M.near_zero_labels(out["near_zero"])) == ["mean"] and out["err"][0] == pytest.approx(0.3)


def test_stats_missing_or_equal_against_an_all_zero_or_infinite_bench_are_not_near_zero():
    zero = {s: np.array([0.0]) for s in M.STATS}
    out = M.stats_metrics({**zero, "norm": np.array([math.nan])}, zero)
    assert list(M.near_zero_labels(out["near_zero"])) == [""]
    out = M.stats_metrics(zero, zero)
    assert list(M.near_zero_labels(out["near_zero"])) == [""] and out["err"][0] == 0.0
    npu = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([1.0]), "norm": np.array([2.0])}
    out = M.stats_metrics(npu, {**npu, "max": np.array([math.inf]), "mean": np.array([math.inf])})
    assert list(M.near_zero_labels(out["near_zero"])) == [""] and out["err"][0] == math.inf


def test_rows_settled_equal_stay_equal_with_nan_on_one_side():
    npu = {"max": np.array([math.nan]), "min": np.array([math.nan]), "mean": np.array([1.0]), "norm": np.array([1.0])}
    bench = {"max": np.array([1.0]), "min": np.array([1.0]), "mean": np.array([1.0]), "norm": np.array([1.0])}
    assert M.stats_metrics(npu, bench, same=np.array([True]))["err"][0] == 0.0


def test_a_bench_value_of_minus_one_is_an_ordinary_denominator():
    npu = {"max": np.array([1.0]), "min": np.array([-1.5]), "mean": np.array([0.1]), "norm": np.array([2.0])}
    out = M.stats_metrics(npu, {**npu, "min": np.array([-1.0])})
    assert out["min_rel"][0] == pytest.approx(0.5)


def test_which_side_is_all_zeros_at_exactly_eps():
    eps = np.finfo(np.float32).eps
    got = M.tensor_metrics(np.array([eps, 0.0], np.float32), np.ones(2, np.float32))
    assert math.isnan(got["cosine"]) and any("the NPU tensor is all zeros" in m for m in got["messages"])
    got = M.tensor_metrics(np.ones(2, np.float32), np.array([eps, 0.0], np.float32))
    assert math.isnan(got["cosine"]) and any("the bench tensor is all zeros" in m for m in got["messages"])


def test_the_callers_arrays_are_left_unchanged():
    n = np.array([1.0, math.nan, 2.0])
    b = np.array([1.5, math.nan, 2.0])
    M.tensor_metrics(n, b)
    assert math.isnan(n[1]) and math.isnan(b[1])


def test_shapes_that_differ_either_way_round_are_not_compared():
    for n, b in ((np.zeros(3), np.zeros(2)), (np.zeros(2), np.zeros(3)), (np.zeros((3, 1)), np.zeros((1, 3)))):
        assert M.tensor_metrics(n, b)["status"] == M.ST_SHAPE


def test_a_statistic_that_differs_far_from_zero_is_not_flagged_near_zero():
    npu = {"max": np.array([1.0]), "min": np.array([-1.0]), "mean": np.array([0.6]), "norm": np.array([2.0])}
    out = M.stats_metrics(npu, {**npu, "mean": np.array([0.5])})
    assert list(M.near_zero_labels(out["near_zero"])) == [""] and out["err"][0] == pytest.approx(0.2)
