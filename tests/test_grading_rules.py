"""The grading rules one by one on small compare tables (issue 36: tests that fail when a rule breaks): each
row's verdict and reasons, the call-level rules at their thresholds, the per-call summary, the thresholds'
checks."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from msprobe_nb.analysis.grading import Thresholds, grade, near_zero_bits, summarize_calls

TH = Thresholds()
CALL = "Torch.f.0.forward"


def _row(**kw) -> dict:
    """A matched, comparable float32 tensor row that passes every rule; ``kw`` overrides columns."""
    io, arg = kw.pop("io", "output"), kw.pop("arg", "0")
    call = kw.pop("call", CALL)
    r = dict(step=0, rank=0, call_index=0, pair=0, call=call, name=f"{call}.{io}.{arg}", io=io, op="f",
             match="matched", kind="tensor", npu_kind="tensor", bench_kind="tensor", comparable=True,
             npu_dtype="torch.float32", bench_dtype="torch.float32", npu_shape=(4,), bench_shape=(4,),
             npu_max=1.0, npu_min=-1.0, bench_max=1.0, bench_min=-1.0, norm_rel=0.0, err=0.0)
    r.update(kw)
    return r


def _grade(rows: list[dict], mode: str = "statistics", th: Thresholds = TH) -> tuple[list[str], list[list[str]]]:
    res, reasons = grade(pd.DataFrame(rows), mode, th)
    return list(res), reasons


def _one(mode: str = "statistics", th: Thresholds = TH, **kw) -> tuple[str, list[str]]:
    res, reasons = _grade([_row(**kw)], mode, th)
    return res[0], reasons[0]


# ------------------------------------------------------------------------------------------ row rules
def test_a_clean_row_passes_without_reasons():
    assert _one() == ("pass", [])


def test_rows_without_a_partner_take_the_unmatched_level_and_say_why():
    assert _one(match="npu_only") == ("warning", ["warning: no bench row matched"])
    assert _one(match="npu_only", match_note="renamed") == ("warning", ["warning: renamed"])
    assert _one(match="bench_only") == ("warning", ["warning: bench row without an NPU counterpart"])
    assert _one(match="bench_only", th=Thresholds(unmatched_level="error"))[0] == "error"
    assert _one(match="npu_only", th=Thresholds(unmatched_level="pass")) == ("pass", ["note: no bench row matched"])


def test_kinds_that_differ_are_an_error_and_nothing_else_is_judged():
    assert _one(npu_kind="tensor", bench_kind="value", comparable=False) == (
        "error", ["error: kind differs: NPU tensor, bench value (not compared)"])


def test_dtypes_not_comparable_are_an_error_and_comparable_ones_take_their_level():
    assert _one(bench_dtype="torch.int64", comparable=False) == (
        "error", ["error: dtype differs: torch.float32 vs torch.int64 (not compared, bench shown as N/A)"])
    soft = ["warning: dtype differs: torch.float32 vs torch.float16 (compared anyway)"]
    assert _one(bench_dtype="torch.float16") == ("warning", soft)
    assert _one(bench_dtype="torch.float16", th=Thresholds.msprobe())[0] == "error"


def test_shapes_that_differ_are_an_error_naming_both():
    assert _one(bench_shape=(2, 2)) == ("error", ["error: shape differs: [4] vs [2, 2]"])
    assert _one(npu_shape=(2, 2), bench_shape=(2, 2)) == ("pass", [])
    assert _one(npu_shape=(), bench_shape=(1,)) == ("error", ["error: shape differs: [] vs [1]"])


def test_requires_grad_differs_only_when_both_sides_say_it():
    assert _one(npu_requires_grad=True, bench_requires_grad=False) == (
        "error", ["error: requires_grad differs: NPU True, bench False"])
    assert _one(npu_requires_grad=True, bench_requires_grad=None) == ("pass", [])
    assert _one(npu_requires_grad=None, bench_requires_grad=False) == ("pass", [])
    assert _one(npu_requires_grad=True, bench_requires_grad=1) == ("pass", [])
    assert _one(npu_requires_grad=True, bench_requires_grad=False,
                th=Thresholds(requires_grad_level="warning"))[0] == "warning"


def test_nan_or_inf_on_one_side_npu_is_an_error_bench_a_warning():
    res, why = _one(npu_max=math.nan)
    assert res == "error" and why == ["error: NaN/inf in the NPU tensor (max nan, min -1), not in the bench one"]
    res, why = _one(bench_min=-math.inf)
    assert res == "warning" and why == ["warning: NaN/inf in the bench tensor (max 1, min -inf), not in the NPU one"]
    assert _one(npu_max=math.inf, bench_max=math.inf) == ("pass", [])  # on both sides
    nan = math.nan
    assert _one(npu_max=nan, npu_min=nan, bench_max=nan, bench_min=nan) == ("pass", [])  # not recorded


def test_recorded_nan_and_inf_counts_that_differ_are_an_error():
    counts = dict(npu_nan_count=0.0, bench_nan_count=0.0, npu_inf_count=0.0, bench_inf_count=0.0)
    assert _one(**counts) == ("pass", [])
    res, why = _one(**{**counts, "npu_nan_count": 2.0, "npu_max": math.nan, "bench_max": math.nan})
    assert res == "error" and why == ["error: NaN/inf counts differ: NPU 2 NaN 0 inf, bench 0 NaN 0 inf"]
    assert _one(**{**counts, "bench_inf_count": 1.0, "npu_max": math.inf, "bench_max": math.inf})[0] == "error"
    assert _one(**{**counts, "npu_nan_count": math.nan, "bench_nan_count": 3.0}) == ("pass", [])  # unknown
    assert _one(**{**counts, "npu_inf_count": 1.0, "bench_inf_count": math.nan}) == ("pass", [])
    # already judged as NaN/inf on one side: not said twice
    res, why = _one(**{**counts, "npu_nan_count": 1.0, "npu_max": math.nan})
    assert len(why) == 1 and "NPU tensor" in why[0]


def test_nan_inf_positions_that_differ_are_an_error():
    assert _one(mode="tensor", nan_inf_match=False) == (
        "error", ["error: NaN/inf positions (or signs) differ between NPU and bench"])
    assert _one(mode="tensor", nan_inf_match=True) == ("pass", [])
    assert _one(mode="tensor", nan_inf_match=None) == ("pass", [])


def test_values_that_differ_are_an_error():
    kw = dict(kind="value", npu_kind="value", bench_kind="value")
    assert _one(npu_value="3", bench_value="4", **kw) == ("error", ["error: value differs: 3 vs 4"])
    assert _one(npu_value="3", bench_value="3", **kw) == ("pass", [])
    assert _one(npu_value="3", bench_value="4", **{**kw, "comparable": False})[0] == "error"  # by the dtype rule


def test_md5_hashes():
    assert _one(mode="md5", npu_hash="ab", bench_hash="cd") == ("error", ["error: content hash differs: ab vs cd"])
    assert _one(mode="md5", npu_hash="ab", bench_hash="ab") == ("pass", [])
    assert _one(mode="md5", npu_hash="ab", bench_hash="") == (
        "warning", ["warning: content hash recorded on one side only"])
    assert _one(mode="md5", npu_hash="", bench_hash="") == ("pass", [])
    assert _one(mode="statistics", npu_hash="ab", bench_hash="cd") == ("pass", [])  # hashes judged in md5 only


def test_skipped_ops_and_uninitialised_memory_are_not_graded():
    assert _one(op="empty", npu_max=math.nan) == ("pass", [])
    assert _one(uninitialised=True, npu_max=math.nan) == ("pass", [])
    assert _one(op="empty", match="npu_only")[0] == "warning"  # unmatched is still said


def test_near_zero_notes_explain_a_large_relative_error_only():
    kw = dict(near_zero="mean", mean_rel=0.5, mean_diff=-2e-3, bench_mean=1e-3, bench_max=2.0, bench_min=-4.0)
    res, why = _one(**kw)
    assert res == "pass" and why == ["note: MeanRelativeErr 50% is not meaningful: bench mean 0.001 is ~0 next to "
                                     "the tensor's largest magnitude 4; |mean diff| = 0.002"]
    assert _one(**{**kw, "mean_rel": 0.01}) == ("pass", [])  # not above near_zero_note_min
    assert _one(**{**kw, "near_zero": "max"}) == ("pass", [])  # another statistic near zero
    assert "inf is not meaningful" in _one(**{**kw, "mean_rel": math.inf})[1][0]
    assert _one(**{**kw, "bench_shape": (2,)})[1] == ["error: shape differs: [4] vs [2]"]


def test_near_zero_labels_read_back_as_bits():
    t = pd.DataFrame({"near_zero": ["", "max", "min,norm", "max,min,mean,norm", "mean"]})
    assert list(near_zero_bits(t)) == [0, 1, 10, 15, 4]
    assert list(near_zero_bits(pd.DataFrame({"x": [1, 2]}))) == [0, 0]


def test_tensor_status_nodata_and_file_and_messages():
    assert _one(mode="tensor", tensor_status="nodata", tensor_messages=["no file"]) == (
        "warning", ["warning: not compared: no file"])
    assert _one(mode="tensor", tensor_status="nodata", tensor_messages=None) == (
        "warning", ["warning: not compared: no tensor data"])
    assert _one(mode="tensor", tensor_status="file", tensor_messages=["shape [2]", "max 3"]) == (
        "error", ["error: tensor file contradicts the dump (shape [2]; max 3)"])
    assert _one(mode="tensor", tensor_status="", tensor_messages=["a", "b"]) == ("pass", ["note: a", "note: b"])


def test_a_row_keeps_its_worst_level_whatever_the_order_of_its_reasons():
    res, why = _one(bench_dtype="torch.float16", bench_shape=(2,))  # warning (dtype) then error (shape)
    assert res == "error" and [w.split(":")[0] for w in why] == ["warning", "error"]


# ------------------------------------------------------------------------------------------ call rules
def _stats_call(in_rel: float, out_rel: float, th: Thresholds = TH, **out) -> tuple[str, list[str]]:
    res, why = _grade([_row(io="input", norm_rel=in_rel), _row(io="output", norm_rel=out_rel, **out)], th=th)
    assert res[0] == "pass"
    return res[1], why[1]


def test_an_output_far_off_while_the_inputs_agree_is_an_error_at_strict_thresholds():
    res, why = _stats_call(0.01, 0.6)
    assert res == "error" and why[0] == ("error: NormRelativeErr of this output 60% > 50% while the inputs agree "
                                         "(largest input NormRelativeErr 1%)")
    assert _stats_call(0.01, 0.5)[0] != "error"  # exactly the threshold: not above it
    assert _stats_call(0.1, 0.6) == ("pass", [])  # inputs exactly at "agree": they do not (and 6x is no growth)
    assert _stats_call(0.099, 0.6)[0] == "error"


def test_an_output_that_grows_the_inputs_error_tenfold_warns():
    res, why = _stats_call(0.02, 0.25)
    assert res == "warning" and why == ["warning: NormRelativeErr of this output (25%) is 12.5x the largest "
                                        "input's (2%)"]
    assert _stats_call(0.02, 0.2) == ("pass", [])  # exactly 10x: not above it
    assert _stats_call(0.02, 0.2, th=Thresholds(norm_rel_growth_warning=9.99))[0] == "warning"


def test_an_output_off_while_the_inputs_are_identical_warns():
    res, why = _stats_call(0.0, 0.2)
    assert res == "warning" and why == ["warning: NormRelativeErr of this output (20%) is above 10% while the "
                                        "inputs are identical"]
    assert _stats_call(0.0, 0.1) == ("pass", [])  # exactly the threshold


def test_call_rules_need_inputs_and_look_at_the_worst_output_only():
    res, why = _grade([_row(io="output", norm_rel=0.9)])
    assert res == ["pass"]  # no inputs: nothing to compare the output with
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", arg="0", norm_rel=0.3),
            _row(io="output", arg="1", norm_rel=0.2)]
    res, why = _grade(rows)
    assert res == ["pass", "warning", "pass"]  # the warning marks the output that is worst


def test_inputs_of_collectives_that_carry_other_data_are_not_the_reference():
    rows = [_row(io="input", op="all_gather_into_tensor", norm_rel=0.0),
            _row(io="output", op="all_gather_into_tensor", norm_rel=0.9)]
    assert _grade(rows)[0] == ["pass", "pass"]


def test_an_all_zero_bench_norm_is_judged_against_the_npu_norm():
    rows = [_row(io="input", norm_rel=0.0),
            _row(io="output", norm_rel=math.inf, near_zero="norm", norm_diff=0.05, npu_norm=1.0)]
    res, why = _grade(rows)
    assert res[1] == "pass"  # 5 % of the NPU norm: neither inf nor above the warning
    rows[1].update(norm_diff=0.2)
    assert _grade(rows)[0][1] == "warning"


def _tensor_call(in_ratio: float, out_ratio: float, in_cos: float = 1.0, out_cos: float = 1.0,
                 th: Thresholds = TH) -> tuple[str, list[str]]:
    res, why = _grade([_row(io="input", one_thousandth=in_ratio, cosine=in_cos),
                       _row(io="output", one_thousandth=out_ratio, cosine=out_cos)], mode="tensor", th=th)
    assert res[0] == "pass"
    return res[1], why[1]


def test_the_tensor_rules_at_their_thresholds():
    res, why = _tensor_call(0.95, 0.05)
    assert res == "error" and why == ["error: One Thousandth Err Ratio of this output 0.05 < 0.1 while the inputs "
                                      "agree (smallest input ratio 0.95)"]
    assert _tensor_call(0.95, 0.1)[0] == "pass"
    assert _tensor_call(0.9, 0.05)[0] == "pass"  # inputs exactly at "agree": they do not
    res, why = _tensor_call(1.0, 1.0, in_cos=0.99, out_cos=0.8)
    assert res == "warning" and why == ["warning: Cosine drops from 0.99 (inputs) to 0.8 (this output)"]
    assert _tensor_call(1.0, 1.0, in_cos=0.9, out_cos=0.5)[0] == "pass"  # inputs not above cosine_input_ok
    assert _tensor_call(1.0, 1.0, in_cos=0.95, out_cos=0.9)[0] == "pass"  # a drop of 0.05
    assert _tensor_call(1.0, 1.0, in_cos=0.99, out_cos=0.8, th=Thresholds(cosine_drop_warning=0.2))[0] == "pass"


def test_the_cosine_warning_marks_the_output_with_the_lowest_cosine():
    rows = [_row(io="input", cosine=1.0, one_thousandth=1.0), _row(io="output", arg="0", cosine=0.85),
            _row(io="output", arg="1", cosine=0.6), _row(io="output", arg="2", cosine=0.7)]
    assert _grade(rows, mode="tensor")[0] == ["pass", "pass", "warning", "pass"]


def test_call_rules_group_rows_by_call_and_pair():
    rows = [_row(io="input", norm_rel=0.0, call="Torch.a.0.forward"), _row(io="output", norm_rel=0.9,
            call="Torch.b.0.forward"), _row(io="input", norm_rel=0.0, pair=1), _row(io="output", norm_rel=0.9, pair=2)]
    assert _grade(rows)[0] == ["pass"] * 4  # no output shares its call (and pair) with an input


# ------------------------------------------------------------------------------------------ the summary
def test_the_call_summary_keeps_the_worst_row_and_every_reason_once():
    rows = [_row(io="input", arg="0", call_index=0), _row(io="output", arg="0", call_index=0),
            _row(io="output", arg="1", call_index=0), _row(call="Torch.g.0.forward", call_index=1, io="output")]
    t = pd.DataFrame(rows)
    t["result"] = ["pass", "warning", "error", "pass"]
    t["reasons"] = [[], ["warning: a", "warning: a"], ["error: b"], []]
    t["err"] = [0.0, 0.5, 0.2, np.nan]
    t.loc[2, "match"] = "npu_only"
    s = summarize_calls(t)
    assert list(s["call"]) == [CALL, "Torch.g.0.forward"]
    first = s.iloc[0]
    assert first["result"] == "error" and first["worst_row"] == f"{CALL}.output.1"  # level first, then error
    assert first["reasons"] == ["output.0: warning: a", "output.1: error: b"]
    assert first["rows"] == 3 and first["unmatched"] == 1
    assert first["err"] == 0.5 and first["input_err"] == 0.0 and first["output_err"] == 0.5
    second = s.iloc[1]
    assert second["result"] == "pass" and second["reasons"] == [] and math.isnan(second["err"])
    assert math.isnan(second["input_err"])


def test_the_summary_is_in_execution_order_and_ties_go_to_the_first_row():
    rows = [_row(call="Torch.b.0.forward", call_index=1), _row(call=CALL, call_index=0, arg="0"),
            _row(call=CALL, call_index=0, arg="1")]
    t = pd.DataFrame(rows).assign(result="warning", reasons=[[], [], []], err=0.1)
    s = summarize_calls(t)
    assert list(s["call"]) == ["Torch.b.0.forward", CALL]  # the table's order
    assert s.iloc[1]["worst_row"] == f"{CALL}.output.0"
    assert summarize_calls(t.iloc[:0]).empty


def test_a_reason_tag_is_the_rows_own_part_of_its_name():
    t = pd.DataFrame([_row(name="other", call=CALL)]).assign(result="warning", reasons=[["warning: x"]], err=0.0)
    assert summarize_calls(t).iloc[0]["reasons"] == ["other: warning: x"]


# ------------------------------------------------------------------------------------------ thresholds
@pytest.mark.parametrize("kw,match", [
    (dict(norm_rel_output_error="0.5"), "norm_rel_output_error must be a number"),
    (dict(cosine_input_ok=math.nan), "cosine_input_ok must be a number"),
    (dict(diverge_rtol=True), "diverge_rtol must be a number"),
    (dict(diverge_rtol_by_dtype=(("torch.float16", "x"),)), "must map dtype names to numbers"),
    (dict(diverge_rtol_by_dtype=(("torch.float16", True),)), "must map dtype names to numbers"),
    (dict(diverge_rtol_by_dtype=(("torch.float16", 1.0, 2.0),)), "must map dtype names to numbers"),
    (dict(diverge_rtol_by_dtype=((1, 1.0),)), "must map dtype names to numbers"),
    (dict(diverge_rtol_by_dtype="torch.float16"), "must map dtype names to numbers"),
    (dict(buffer_args=(("a", "input"),)), "must be a tuple of \\(op, io, arg\\) names"),
    (dict(buffer_args=(("a", "input", 0),)), "must be a tuple of \\(op, io, arg\\) names"),
    (dict(buffer_args="a"), "must be a tuple of \\(op, io, arg\\) names"),
    (dict(skip_ops=("empty", 3)), "skip_ops must be a tuple of op names"),
    (dict(view_ops="view"), "view_ops must be a tuple of op names"),
    (dict(unmatched_level="fatal"), "unmatched_level must be one of"),
])
def test_bad_thresholds_are_refused_naming_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        Thresholds(**kw)


def test_good_thresholds_are_normalised():
    th = Thresholds(diverge_rtol_by_dtype={"torch.float16": 1}, buffer_args=[["a", "input", "0"]],
                    skip_ops=["empty"], norm_rel_output_error=1)
    assert th.diverge_rtol_by_dtype == (("torch.float16", 1.0),)
    assert th.buffer_args == (("a", "input", "0"),)
    assert Thresholds(diverge_rtol_by_dtype=[("torch.float16", 3e-3)]).diverge_rtol_by_dtype == (
        ("torch.float16", 3e-3),)
    assert Thresholds.msprobe().dtype_mismatch_level == "error"
    assert Thresholds.msprobe(unmatched_level="error").unmatched_level == "error"
    assert "diverge_rtol" in Thresholds.fields() and len(Thresholds.fields()) == len(set(Thresholds.fields()))


def test_a_rows_tolerance_is_the_larger_of_its_two_dtypes():
    got = TH.rtol_of(["torch.float32", "torch.bfloat16", "torch.float16", "torch.float16", None],
                     ["torch.float32", "torch.float32", "torch.bfloat16", "torch.float16", "torch.float16"])
    assert list(got) == [1e-3, 1e-2, 1e-2, 2e-3, 2e-3]


# ------------------------------------------------------------------------------------------ inputs and state
def test_a_dict_of_arrays_is_graded_as_the_same_table():
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", arg="0", norm_rel=0.6, bench_dtype="torch.float16"),
            _row(io="output", arg="1", match="npu_only", npu_max=math.nan)]
    t = pd.DataFrame(rows)
    res, why = grade({c: t[c].to_numpy() for c in t.columns}, "statistics", TH)
    assert (list(res), why) == _grade(rows)
    assert list(res) == ["pass", "error", "warning"]


def test_a_shape_missing_on_one_side_differs():
    assert _one(npu_shape=None, bench_shape=(4,)) == ("error", ["error: shape differs: [] vs [4]"])


def test_shapes_that_differ_either_way_round_are_both_found():
    res, why = _grade([_row(npu_shape=(2,), bench_shape=(4,)), _row(arg="1", npu_shape=(4,), bench_shape=(2,))])
    assert res == ["error", "error"] and why[1] == ["error: shape differs: [4] vs [2]"]


def test_a_hash_on_the_bench_side_only_is_said_too():
    assert _one(mode="md5", npu_hash="", bench_hash="cd") == (
        "warning", ["warning: content hash recorded on one side only"])


def test_ties_for_the_worst_output_mark_the_first_one():
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", arg="0", norm_rel=0.3),
            _row(io="output", arg="1", norm_rel=0.3)]
    assert _grade(rows)[0] == ["pass", "warning", "pass"]


def test_grading_leaves_the_garbage_collector_as_it_found_it():
    import gc
    t = pd.DataFrame([_row(match="npu_only")])
    assert gc.isenabled()
    grade(t, "statistics", TH)
    assert gc.isenabled()
    gc.disable()
    try:
        grade(t, "statistics", TH)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_worst_row_of_a_call_prefers_a_known_error_to_an_unknown_one():
    t = pd.DataFrame([_row(arg="0"), _row(arg="1")]).assign(result="warning", reasons=[[], []], err=[math.nan, 0.0])
    assert summarize_calls(t).iloc[0]["worst_row"] == f"{CALL}.output.1"


def test_a_mode_read_from_a_file_is_the_same_mode():
    mode = "".join(["ten", "sor"])  # not the interned literal, as from a config file or the command line
    assert _tensor_call(0.95, 0.05)[0] == "error"
    res, _ = _grade([_row(io="input", one_thousandth=0.95, cosine=1.0),
                     _row(io="output", one_thousandth=0.05, cosine=1.0)], mode=mode)
    assert res == ["pass", "error"]


def test_inputs_that_disagree_in_tensor_mode_are_no_reference():
    assert _tensor_call(0.5, 0.05) == ("pass", [])
    assert _tensor_call(1.0, 1.0, in_cos=0.5, out_cos=0.1) == ("pass", [])


def test_only_an_all_zero_bench_norm_changes_the_norm_rule():
    # near zero on the mean only: the output's NormRelativeErr is judged as it is
    rows = [_row(io="input", norm_rel=0.0),
            _row(io="output", norm_rel=0.6, near_zero="mean", norm_diff=0.05, npu_norm=1.0)]
    assert _grade(rows)[0][1] == "error"


def test_calls_of_different_pairs_never_share_their_call_rules():
    # the output of call Y in pair 1 and the input of call X in pair 0 are in different calls
    rows = [_row(io="output", call="Torch.y.0.forward", pair=1, norm_rel=0.9),
            _row(io="output", call="Torch.z.0.forward", pair=0),
            _row(io="input", call="Torch.x.0.forward", pair=0, norm_rel=0.0)]
    assert _grade(rows)[0] == ["pass", "pass", "pass"]


def test_rows_already_wrong_in_shape_or_dtype_are_left_out_of_the_call_rules():
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", norm_rel=0.9, bench_shape=(2,))]
    assert _grade(rows)[1][1] == ["error: shape differs: [4] vs [2]"]
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", norm_rel=0.9, bench_dtype="torch.int8",
                                                 comparable=False)]
    assert len(_grade(rows)[1][1]) == 1


def test_md5_mode_has_no_call_rules():
    rows = [_row(io="input", norm_rel=0.0, one_thousandth=1.0), _row(io="output", norm_rel=0.9, one_thousandth=0.0)]
    assert _grade(rows, mode="md5")[0] == ["pass", "pass"]


def test_one_call_name_in_two_pairs_is_two_calls():
    rows = [_row(io="input", pair=0, norm_rel=0.0), _row(io="output", pair=1, norm_rel=0.9)]
    assert _grade(rows)[0] == ["pass", "pass"]


# ------------------------------------------------------------------- mutation survivors (issue 36, group GD)
def test_kinds_that_differ_either_way_round_are_both_found():
    assert _one(npu_kind="value", bench_kind="tensor", comparable=False) == (
        "error", ["error: kind differs: NPU value, bench tensor (not compared)"])


def test_a_bench_tensor_full_of_nan_against_a_finite_npu_one_warns():
    nan = math.nan
    assert _one(bench_max=nan, bench_min=nan) == (
        "warning", ["warning: NaN/inf in the bench tensor (max nan, min nan), not in the NPU one"])
    assert _one(npu_max=nan, npu_min=nan)[0] == "error"


def test_an_output_against_an_all_zero_bench_is_wholly_off_when_the_inputs_agree():
    # bench output all zeros: |norm diff| is the NPU norm itself, 100 % of it
    res, why = _stats_call(0.0, math.inf, near_zero="norm", norm_diff=2.0, npu_norm=2.0, bench_norm=0.0)
    assert res == "error" and "error: NormRelativeErr of this output 100% > 50% while the inputs agree " \
        "(largest input NormRelativeErr 0%)" in why


def test_inputs_that_disagree_in_statistics_mode_are_no_reference():
    assert _stats_call(0.5, 0.9) == ("pass", [])  # 1.8x the inputs' error: no growth warning either


def test_the_cosine_warning_holds_for_an_output_in_the_tables_first_row():
    rows = [_row(io="output", cosine=0.5), _row(io="input", cosine=1.0, one_thousandth=1.0)]
    assert _grade(rows, mode="tensor") == (["warning", "pass"], [
        ["warning: Cosine drops from 1 (inputs) to 0.5 (this output)"], []])


def test_md5_mode_read_from_a_file_judges_the_hashes():
    mode = "".join(["md", "5"])  # not the interned literal
    assert _one(mode=mode, npu_hash="ab", bench_hash="cd") == ("error", ["error: content hash differs: ab vs cd"])


def test_an_output_without_a_norm_error_is_never_the_worst_one():
    rows = [_row(io="input", norm_rel=0.0), _row(io="output", arg="0", norm_rel=0.3),
            _row(io="output", arg="1", norm_rel=math.nan)]
    assert _grade(rows)[0] == ["pass", "warning", "pass"]


def test_requires_grad_that_differs_either_way_round_is_found():
    assert _one(npu_requires_grad=False, bench_requires_grad=True) == (
        "error", ["error: requires_grad differs: NPU False, bench True"])


def test_a_value_not_comparable_is_said_once_by_the_dtype_rule():
    kw = dict(kind="value", npu_kind="value", bench_kind="value", npu_dtype="int", bench_dtype="str")
    assert _one(npu_value="3", bench_value="'3'", comparable=False, **kw) == (
        "error", ["error: dtype differs: int vs str (not compared, bench shown as N/A)"])


def test_a_dtype_softer_on_either_side_takes_its_level():
    assert _one(npu_dtype="torch.float16") == (
        "warning", ["warning: dtype differs: torch.float16 vs torch.float32 (compared anyway)"])


def test_hashes_that_differ_either_way_round_are_an_error():
    assert _one(mode="md5", npu_hash="cd", bench_hash="ab") == ("error", ["error: content hash differs: cd vs ab"])


def test_statistics_mode_read_from_a_file_has_its_call_rules():
    mode = "".join(["statis", "tics"])  # not the interned literal
    assert _grade([_row(io="input", norm_rel=0.01), _row(io="output", norm_rel=0.6)], mode=mode)[0] == [
        "pass", "error"]


def test_two_calls_in_two_pairs_are_four_calls():
    rows = [_row(io="input", call="Torch.a.0.forward", pair=0, norm_rel=0.0),
            _row(io="output", call="Torch.b.0.forward", pair=0),
            _row(io="output", call="Torch.a.0.forward", pair=1, norm_rel=0.9)]
    assert _grade(rows)[0] == ["pass", "pass", "pass"]


def test_tensor_call_rules_leave_out_outputs_already_wrong_in_shape():
    rows = [_row(io="input", one_thousandth=0.95, cosine=1.0),
            _row(io="output", one_thousandth=0.05, cosine=0.5, bench_shape=(2,))]
    assert _grade(rows, mode="tensor")[1][1] == ["error: shape differs: [4] vs [2]"]


def test_the_worst_row_of_a_call_at_one_level_is_the_one_with_the_largest_error():
    t = pd.DataFrame([_row(arg="0"), _row(arg="1"), _row(arg="2")]).assign(result="pass", reasons=[[], [], []],
                                                                          err=[0.1, 0.3, 0.2])
    assert summarize_calls(t).iloc[0]["worst_row"] == f"{CALL}.output.1"


def test_the_summary_counts_bench_only_rows_as_unmatched():
    t = pd.DataFrame([_row(arg="0"), _row(arg="1", match="bench_only"), _row(arg="2", match="npu_only")]).assign(
        result="pass", reasons=[[], [], []], err=0.0)
    assert summarize_calls(t).iloc[0]["unmatched"] == 2


def test_a_tolerance_entry_that_is_not_a_pair_is_refused_naming_the_field():
    for bad in ((("torch.float16",),), ((),)):
        with pytest.raises(ValueError, match="diverge_rtol_by_dtype must map dtype names to numbers"):
            Thresholds(diverge_rtol_by_dtype=bad)


def test_three_calls_in_two_pairs_keep_their_call_rules_apart():
    rows = [_row(io="output", call="Torch.c.0.forward", pair=0),
            _row(io="input", call="Torch.a.0.forward", pair=1, norm_rel=0.0),
            _row(io="output", call="Torch.b.0.forward", pair=1, norm_rel=0.9)]
    assert _grade(rows)[0] == ["pass", "pass", "pass"]


def test_an_empty_table_is_graded_in_every_mode():
    for mode in ("statistics", "tensor", "md5"):
        res, reasons = grade(pd.DataFrame([_row()]).iloc[:0], mode, TH)
        assert len(res) == 0 and reasons == []


def test_a_near_zero_max_leaves_the_norm_rule_as_it_is():
    rows = [_row(io="input", norm_rel=0.0),
            _row(io="output", norm_rel=0.6, near_zero="max", norm_diff=0.05, npu_norm=1.0)]
    assert _grade(rows)[0][1] == "error"


def test_a_value_row_is_judged_by_its_value_not_by_the_tensor_rules():
    kw = dict(kind="value", npu_kind="value", bench_kind="value", npu_max=math.inf, npu_min=math.inf)
    assert _one(npu_value="inf", bench_value="1.0", **kw) == ("error", ["error: value differs: inf vs 1.0"])


def test_nan_and_inf_counts_that_both_differ_are_an_error():
    counts = dict(npu_nan_count=2.0, bench_nan_count=1.0, npu_inf_count=1.0, bench_inf_count=2.0)
    assert _one(npu_max=math.nan, bench_max=math.nan, **counts)[0] == "error"


def test_a_higher_level_outranks_any_error_for_the_worst_row():
    t = pd.DataFrame([_row(arg="0"), _row(arg="1")]).assign(result=["pass", "warning"], reasons=[[], []],
                                                            err=[1e6, 0.0])
    assert summarize_calls(t).iloc[0]["worst_row"] == f"{CALL}.output.1"


def test_growth_just_over_ten_times_warns_by_default():
    assert _stats_call(0.02, 0.21)[0] == "warning"  # 10.5x


def test_nan_counts_that_differ_either_way_round_are_an_error():
    counts = dict(npu_nan_count=1.0, bench_nan_count=2.0, npu_inf_count=0.0, bench_inf_count=0.0)
    assert _one(npu_max=math.nan, bench_max=math.nan, **counts)[0] == "error"


def test_a_scalar_or_shape_status_is_compared_and_keeps_its_notes():
    for status in ("scalar", "shape", "length1"):
        assert _one(mode="tensor", tensor_status=status, tensor_messages=["x"]) == ("pass", ["note: x"]), status


def test_a_row_without_data_says_its_first_message():
    assert _one(mode="tensor", tensor_status="nodata", tensor_messages=["no file", "other"]) == (
        "warning", ["warning: not compared: no file"])


def test_near_zero_notes_for_the_max_and_only_for_the_flagged_statistic():
    kw = dict(max_rel=0.5, max_diff=1e-3, bench_max=1e-3, bench_min=-4.0, mean_rel=0.5, mean_diff=1.0, bench_mean=1.0)
    assert _one(near_zero="max", **kw) == ("pass", [
        "note: MaxRelativeErr 50% is not meaningful: bench max 0.001 is ~0 next to the tensor's largest magnitude 4; "
        "|max diff| = 0.001"])
    assert [w.split(" ")[1] for w in _one(near_zero="mean", **kw)[1]] == ["MeanRelativeErr"]


def test_calls_of_three_pairs_never_share_their_call_rules():
    rows = [_row(io="input", call="Torch.a.0.forward", pair=2, norm_rel=0.0),
            _row(io="output", call="Torch.b.0.forward", pair=0, norm_rel=0.9)]
    assert _grade(rows)[0] == ["pass", "pass"]


def test_the_summary_has_its_columns_and_no_other():
    t = pd.DataFrame([_row()]).assign(result="pass", reasons=[[]], err=0.0)
    assert list(summarize_calls(t).columns) == list(summarize_calls(t.iloc[:0]).columns) == [
        "step", "rank", "call_index", "call", "result", "reasons", "rows", "unmatched", "worst_row", "err",
        "input_err", "output_err"]


def test_the_growth_warning_holds_for_an_output_in_the_tables_first_row():
    rows = [_row(io="output", norm_rel=0.2), _row(io="input", norm_rel=0.0)]
    assert _grade(rows)[0] == ["warning", "pass"]


def test_a_buffer_entry_of_four_names_is_refused():
    with pytest.raises(ValueError, match="buffer_args must be a tuple of \\(op, io, arg\\) names"):
        Thresholds(buffer_args=(("a", "input", "0", "x"),))


def test_skipped_ops_and_uninitialised_memory_are_not_judged_by_their_shape():
    assert _one(op="empty", bench_shape=(2,)) == ("pass", [])
    assert _one(uninitialised=True, bench_shape=(2,)) == ("pass", [])


def test_inf_counts_that_differ_either_way_round_are_an_error():
    counts = dict(npu_nan_count=0.0, bench_nan_count=0.0, npu_inf_count=2.0, bench_inf_count=1.0)
    assert _one(npu_max=math.inf, bench_max=math.inf, **counts)[0] == "error"


def test_a_cosine_drop_exactly_at_the_threshold_does_not_warn():
    th = Thresholds(cosine_drop_warning=0.25)
    assert _tensor_call(1.0, 1.0, in_cos=1.0, out_cos=0.75, th=th) == ("pass", [])
    assert _tensor_call(1.0, 1.0, in_cos=1.0, out_cos=0.5, th=th)[0] == "warning"


def test_the_smallest_input_ratio_is_the_tensor_rules_reference():
    rows = [_row(io="input", arg="0", one_thousandth=0.95, cosine=1.0),
            _row(io="input", arg="1", one_thousandth=0.5, cosine=1.0),
            _row(io="output", one_thousandth=0.05, cosine=1.0)]
    assert _grade(rows, mode="tensor")[0] == ["pass", "pass", "pass"]


def test_nan_in_a_skipped_or_unmatched_bench_row_is_not_judged():
    assert _one(op="empty", bench_max=math.nan) == ("pass", [])
    assert _one(match="bench_only", bench_max=math.nan) == (
        "warning", ["warning: bench row without an NPU counterpart"])


def test_thresholds_cannot_be_changed_after_their_checks():
    import dataclasses
    th = Thresholds()
    with pytest.raises(dataclasses.FrozenInstanceError):
        th.diverge_rtol = "x"
    assert hash(th) == hash(Thresholds())  # usable as a key


def test_an_input_and_an_output_of_two_calls_in_two_pairs_stay_apart():
    rows = [_row(io="output", call="Torch.a.0.forward", pair=1, norm_rel=0.9),
            _row(io="input", call="Torch.b.0.forward", pair=0, norm_rel=0.0)]
    assert _grade(rows)[0] == ["pass", "pass"]


def test_a_value_of_a_skipped_op_is_not_judged():
    kw = dict(kind="value", npu_kind="value", bench_kind="value", op="to")
    assert _one(npu_value="torch.float16", bench_value="torch.float32", **kw) == ("pass", [])
