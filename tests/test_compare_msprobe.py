"""compare() against msprobe's own compare outputs, plus the matching and grading rules on synthetic dumps."""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from msprobe_nb.analysis.compare import MSPROBE_HEADERS, CompareError, compare
from msprobe_nb.analysis.grading import Thresholds
from msprobe_nb.analysis.matching import Mapping
from msprobe_nb.store.schema import coerce_calls

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOY = SHARED / "interop" / "msprobe-cpu-toy-L1"
needs_toy = pytest.mark.skipif(not (TOY / "compare_stat_L1.csv").is_file(),
                               reason=f"msprobe interop data not found under {TOY}")

STAT_METRICS = {"Max diff": "max_diff", "Min diff": "min_diff", "Mean diff": "mean_diff", "L2norm diff": "norm_diff",
                "MaxRelativeErr": "max_rel", "MinRelativeErr": "min_rel", "MeanRelativeErr": "mean_rel",
                "NormRelativeErr": "norm_rel"}
TENSOR_METRICS = {"Cosine": "cosine", "EucDist": "euc_dist", "MaxAbsErr": "max_abs_err",
                  "MaxRelativeErr": "max_rel_err", "One Thousandth Err Ratio": "one_thousandth",
                  "Five Thousandths Err Ratio": "five_thousandths"}
#: rows where we grade differently from msprobe on purpose (docs/compare.md, "Differences from msprobe"):
#: msprobe puts the NormRelativeErr growth warning on a call's first output row; we put it on the output
#: row that breaks the rule (output.1 has the largest NormRelativeErr of Functional.layer_norm.3.backward).
DELIBERATE = {"Functional.layer_norm.3.backward.output.0": ("warning", "pass"),
              "Functional.layer_norm.3.backward.output.1": ("pass", "warning")}


def msprobe_number(text: str) -> float:
    """A metric cell of msprobe's CSV as a number (relative errors as fractions, NaN for non-numbers)."""
    t = text.strip()
    if t.endswith("%"):
        return float(t[:-1]) / 100
    try:
        return float(t)
    except ValueError:
        return math.nan  # N/A, Nan, Diff, None, unsupported


def read_msprobe_csv(name: str) -> pd.DataFrame:
    return pd.read_csv(TOY / name, dtype=str, keep_default_na=False)


def same_cell(ours: str, theirs: str) -> bool:
    if ours == theirs:
        return True
    a, b = msprobe_number(ours), msprobe_number(theirs)
    return not math.isnan(b) and math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-15) and ours.endswith("%") == \
        theirs.endswith("%")


@pytest.fixture(scope="module")
def stat_result():
    from msprobe_nb.store.dump import load
    return compare(load(TOY / "stat_L1_npu"), load(TOY / "stat_L1_bench"))


# ------------------------------------------------------------------------------- msprobe parity (MUST HOLD)
@needs_toy
def test_same_rows_as_msprobe(stat_result):
    ref = read_msprobe_csv("compare_stat_L1.csv")
    assert list(stat_result["name"]) == list(ref["NPU Name"])
    assert list(stat_result["bench_name"]) == list(ref["Bench Name"])
    assert (stat_result["match"] == "matched").all() and stat_result.unmatched.empty


@needs_toy
def test_statistics_metrics_equal_msprobe(stat_result):
    ref = read_msprobe_csv("compare_stat_L1.csv")
    checked = 0
    for col, ours_col in STAT_METRICS.items():
        ours = stat_result[ours_col].to_numpy(dtype=float)
        for i, cell in enumerate(ref[col]):
            want = msprobe_number(cell)
            got = ours[i]
            where = f"{ref['NPU Name'][i]} {col}: msprobe {cell!r}, ours {got!r}"
            if math.isnan(want):
                assert math.isnan(got), where
            elif math.isinf(want):
                assert got == want, where
            else:
                assert math.isclose(got, want, rel_tol=1e-6, abs_tol=0.0), where
            checked += 1
    assert checked == 8 * len(ref)
    assert (ref["MeanRelativeErr"] == "inf").any()  # the data does exercise msprobe's special cells


@needs_toy
def test_statistics_csv_export_equals_msprobe(stat_result, tmp_path):
    ref = read_msprobe_csv("compare_stat_L1.csv")
    path = stat_result.to_msprobe_csv(tmp_path / "out.csv")
    ours = pd.read_csv(path, dtype=str, keep_default_na=False)
    assert list(ours.columns[: len(ref.columns)]) == list(ref.columns) == MSPROBE_HEADERS["statistics"]
    assert list(ours.columns[len(ref.columns):]) == ["step", "rank", "match", "near_zero", "err", "diverges"]
    for col in ref.columns:
        if col in ("Result", "Err_message"):
            continue
        bad = [(n, a, b) for n, a, b in zip(ref["NPU Name"], ours[col], ref[col]) if not same_cell(a, b)]
        assert not bad, f"{col}: {bad[:3]}"
    assert all(json.loads(x) == [] or isinstance(json.loads(x), list) for x in ours["Err_message"])


@needs_toy
def test_statistics_results_equal_msprobe_except_where_documented(stat_result):
    ref = read_msprobe_csv("compare_stat_L1.csv")
    # msprobe's grading is kept in msprobe_result (result adds the divergence verdict: see test below)
    differ = {n: (a, b) for n, a, b in zip(ref["NPU Name"], ref["Result"], stat_result["msprobe_result"])
              if a != b}
    assert differ == DELIBERATE
    # per call, the grades agree exactly
    worst = lambda s: max(s, key=["pass", "warning", "error"].index)  # noqa: E731
    ref_call = ref.assign(call=stat_result["call"].to_numpy()).groupby("call", sort=False)["Result"].agg(worst)
    ours = pd.DataFrame(stat_result).groupby("call", sort=False)["msprobe_result"].agg(worst)
    assert ours.loc[ref_call.index].tolist() == ref_call.tolist()
    row = stat_result.set_index("name").loc["Functional.layer_norm.3.backward.output.1"]
    assert any("15.5x" in r for r in row["reasons"])


@needs_toy
def test_msprobe_levels_give_the_same_results_here():
    from msprobe_nb.store.dump import load
    r = compare(load(TOY / "stat_L1_npu"), load(TOY / "stat_L1_bench"), thresholds=Thresholds.msprobe())
    graded = pd.Series(r["msprobe_result"]).value_counts()
    assert graded.get("warning", 0) == 2 and graded.get("error", 0) == 0


def _toy_softmax_tensors(variant: str) -> dict[str, torch.Tensor]:
    """Input and output of the first softmax of model.py's training step, recomputed (CPU, 1 thread)."""
    sys.path.insert(0, str(TOY))
    try:
        import model as toy  # the interop's own model, imported in place
    finally:
        sys.path.remove(str(TOY))
    args = toy.add_model_args(argparse.ArgumentParser()).parse_args(["--variant", variant])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cap: dict[str, torch.Tensor] = {}
    orig = torch.softmax

    def softmax(x, *a, **k):
        out = orig(x, *a, **k)
        if not cap:
            cap["Torch.softmax.0.forward.input.0.pt"] = x.detach().clone()
            cap["Torch.softmax.0.forward.output.0.pt"] = out.detach().clone()
        return out

    try:
        model, _, make_batch = toy.build(args)
        tokens, _ = make_batch()
        torch.softmax = softmax
        with torch.no_grad():
            model(tokens)
    finally:
        torch.softmax = orig
        torch.set_num_threads(threads)
    return cap


class _TensorDump:
    """A Dump stand-in: a calls table and tensors by data_name (missing ones raise KeyError)."""

    task = "tensor"

    def __init__(self, calls: pd.DataFrame, tensors: dict):
        # a consistent stand-in: each row's recorded shape, max and min are its tensor's (compare checks
        # that a tensor file is the tensor its dump describes)
        calls = calls.copy()
        for i, dn in calls["data_name"].items():
            t = tensors.get(dn) if isinstance(dn, str) else None
            if isinstance(t, torch.Tensor) and t.numel() and not t.is_complex():
                calls.at[i, "shape"] = tuple(t.shape)
                calls.at[i, "max"], calls.at[i, "min"] = float(t.float().max()), float(t.float().min())
        self.calls, self._tensors = calls, tensors

    def tensor(self, key, step=None, rank=None):
        return self._tensors[key]


@needs_toy
def test_tensor_mode_metrics_equal_msprobe():
    from msprobe_nb.store.dump import load
    npu = load(TOY / "tensor_L1_npu")
    bench_t = _toy_softmax_tensors("bench")
    for key, t in _toy_softmax_tensors("npu").items():  # the dump's .pt files are this very computation
        assert torch.equal(npu.tensor(key), t)
    r = compare(npu, _TensorDump(npu.calls, bench_t), mode="tensor")
    assert r.mode == "tensor"
    ref = read_msprobe_csv("compare_tensor_L1.csv")
    frame = r.to_msprobe_frame()
    assert list(frame.columns[: len(ref.columns)]) == list(ref.columns) == MSPROBE_HEADERS["tensor"]
    for row in ("Torch.softmax.0.forward.input.0", "Torch.softmax.0.forward.output.0"):
        i = int(np.flatnonzero(ref["NPU Name"] == row)[0])
        for col, ours_col in TENSOR_METRICS.items():
            want, got = msprobe_number(ref[col][i]), float(r[ours_col].iat[i])
            tol = 5e-7 if col == "Cosine" else 0.0  # msprobe rounds Cosine > 0.9999 to 6 digits
            assert math.isclose(got, want, rel_tol=1e-6, abs_tol=max(tol, 5e-13)), (row, col, got, want)
            assert frame[col].iat[i] == ref[col][i], (row, col)
        assert frame["Data_name"].iat[i] == ref["Data_name"][i]
        assert r["msprobe_result"].iat[i] == ref["Result"][i] == "pass"
    # rows msprobe could not compare (None leaves, non-tensor values) read the same
    kinds = r["kind"].to_numpy()
    for col in TENSOR_METRICS:
        assert (frame[col][kinds != "tensor"] == ref[col][kinds != "tensor"]).all()
    # tensors without data on one side are reported, not silently passed
    nodata = r[(r["kind"] == "tensor") & (r["tensor_status"] == "nodata")]
    assert len(nodata) > 0 and (nodata["result"] == "warning").all()
    assert r.first_divergence().call == "Torch.softmax.0.forward"


@needs_toy
def test_tensor_dump_against_itself():
    from msprobe_nb.store.dump import load
    d = load(TOY / "tensor_L1_npu")
    r = compare(d, d)
    assert r.mode == "tensor"
    rows = r.set_index("name")
    assert rows.loc["Torch.softmax.0.forward.input.0", "cosine"] == 1.0
    assert rows.loc["Torch.softmax.0.forward.output.0", "max_abs_err"] == 0.0
    assert r.first_divergence() is None


@needs_toy
def test_mismatched_tasks_and_modes():
    from msprobe_nb.store.dump import load
    stat, tens = load(TOY / "stat_L1_npu"), load(TOY / "tensor_L1_npu")
    r = compare(stat, tens)
    assert r.mode == "statistics" and any("statistics mode" in n for n in r.notes)
    with pytest.raises(CompareError, match="tensor mode needs tensor dumps"):
        compare(stat, tens, mode="tensor")
    with pytest.raises(CompareError, match="unknown mode"):
        compare(stat, tens, mode="bogus")


# ------------------------------------------------------------------------------- synthetic dumps
def build(calls, *, step=0, rank=0, **defaults) -> pd.DataFrame:
    """calls: [(call, {"input.0": v | dict, ...}), ...]: a tensor with max v, min -v, mean v/10, norm 2v.

    A dict overrides columns (its "max" sets v); ``defaults`` override columns of every row.
    """
    rows = []
    for ci, (call, leaves) in enumerate(calls):
        for suffix, v in leaves.items():
            io, arg = suffix.split(".", 1)
            row = dict(step=step, rank=rank, call_index=ci, call=call, name=f"{call}.{suffix}", io=io, arg=arg,
                       kind="tensor", dtype="torch.float32", shape=(4, 4), requires_grad=True)
            row.update(defaults)
            x = v.get("max", 1.0) if isinstance(v, dict) else v
            row.update({k: w for k, w in dict(max=x, min=-x, mean=x / 10, norm=2 * x).items() if k not in defaults})
            if isinstance(v, dict):
                row.update(v)
            rows.append(row)
    return coerce_calls(pd.DataFrame(rows))


def linear(k: int, v: float = 1.0, out: float | None = None, direction: str = "forward"):
    return (f"Functional.linear.{k}.{direction}", {"input.0": v, "input.1": 0.5, "output.0": v if out is None else out})


def test_identical_tables_all_pass():
    t = build([linear(0), linear(1, 2.0)])
    r = compare(t, t.copy())
    assert r.counts() == {"rows": 6, "pass": 6, "warning": 0, "error": 0, "unmatched": 0, "diverging": 0}
    assert r.first_divergence() is None
    assert (r["max_rel"] == 0).all()


def test_backward_renumbering_lines_up_recomputation():
    npu = build([linear(0), linear(1), linear(2), linear(2, direction="backward"), linear(0, direction="backward")])
    bench = build([linear(0), linear(1), linear(1, direction="backward"), linear(0, direction="backward")])
    r = compare(npu, bench)
    m = r[r["match"] == "matched"]
    pairs = dict(zip(m["name"], m["bench_name"]))
    assert pairs["Functional.linear.2.backward.input.0"] == "Functional.linear.1.backward.input.0"
    assert pairs["Functional.linear.0.backward.output.0"] == "Functional.linear.0.backward.output.0"
    assert set(r.unmatched["name"]) == {f"Functional.linear.2.forward.{s}" for s in ("input.0", "input.1", "output.0")}
    assert (r.unmatched["match"] == "npu_only").all()


def test_fuzzy_ignores_counters():
    npu = build([linear(3), linear(4, 2.0)])
    bench = build([linear(0), linear(1, 2.0)])
    with pytest.raises(CompareError, match="no row of the NPU dump matches"):
        compare(npu, bench)
    r = compare(npu, bench, fuzzy=True)
    assert r.counts()["unmatched"] == 0
    assert r.set_index("name").loc["Functional.linear.4.forward.output.0", "bench_name"] == \
        "Functional.linear.1.forward.output.0"
    assert any("fuzzy" in n for n in r.notes)


def test_mapping_dict_json_yaml_and_module_prefixes(tmp_path):
    npu = build([("Functional.matmul.0.forward", {"input.0": 1.0, "output.0": 1.0}),
                 ("Module.encoder.layers.0.Linear.forward.0", {"input.0": 1.0, "output.0": 1.0}),
                 ("Torch.add.0.forward", {"input.0": 1.0, "output.0": 1.0})])
    bench = build([("Functional.linear.0.forward", {"input.0": 1.0, "output.0": 1.0}),
                   ("Module.model.layers.0.Linear.forward.0", {"input.0": 1.0, "output.0": 1.0}),
                   ("Torch.add.0.forward", {"input.0": 1.0, "output.1": 1.0})])
    spec = {"names": {"Functional.matmul.0.forward": "Functional.linear.0.forward",
                      "Torch.add.0.forward.output.0": "Torch.add.0.forward.output.1"},
            "modules": {"encoder": "model"}}
    (tmp_path / "m.json").write_text(json.dumps(spec))
    (tmp_path / "m.yaml").write_text(
        "# mapping\nnames:\n  Functional.matmul.0.forward: Functional.linear.0.forward\n"
        "  'Torch.add.0.forward.output.0': \"Torch.add.0.forward.output.1\"\nmodules:\n  encoder: model\n")
    for mapping in (spec, tmp_path / "m.json", str(tmp_path / "m.yaml"), Mapping.load(spec)):
        r = compare(npu, bench, mapping=mapping)
        assert r.counts()["unmatched"] == 0, mapping
        assert "mapping" in r.set_index("name").loc["Functional.matmul.0.forward.input.0", "match_note"]
    # a flat dict is msprobe's data_mapping layout: full row names
    flat = {"Torch.add.0.forward.output.0": "Torch.add.0.forward.output.1"}
    r = compare(npu, bench, mapping=flat)
    assert "Torch.add.0.forward.output.0" not in set(r.unmatched["name"])
    r = compare(npu, bench, mapping={"Torch.add.0.forward.output.0": "Torch.add.0.forward.output.9"})
    note = r.set_index("name").loc["Torch.add.0.forward.output.0", "match_note"]
    assert "not in the bench dump" in note
    with pytest.raises(CompareError, match="mapping file not found"):
        compare(npu, bench, mapping=tmp_path / "missing.yaml")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(CompareError, match="invalid JSON"):
        compare(npu, bench, mapping=tmp_path / "bad.json")
    with pytest.raises(CompareError, match="must be a string"):
        compare(npu, bench, mapping={"names": {"a": 1}})


def test_dtype_rules():
    npu = build([("Torch.a.0.forward", {"input.0": {"max": 1.0, "dtype": "torch.bfloat16"}, "output.0": 1.0}),
                 ("Torch.b.0.forward", {"input.0": {"max": 1.0, "dtype": "torch.int32"}, "output.0": 1.0})])
    bench = build([("Torch.a.0.forward", {"input.0": 1.0, "output.0": 1.0}),
                   ("Torch.b.0.forward", {"input.0": {"max": 1.0, "dtype": "torch.int64"}, "output.0": 1.0})])
    r = compare(npu, bench).set_index("name")
    a, b = r.loc["Torch.a.0.forward.input.0"], r.loc["Torch.b.0.forward.input.0"]
    assert a["msprobe_result"] == "warning" and a["comparable"] and "compared anyway" in a["reasons"][0]
    assert a["result"] == "error"  # its dtype differs while nothing before it does: the first divergence
    assert b["result"] == "error" and not b["comparable"] and math.isnan(b["max_diff"])
    assert compare(npu, bench, thresholds=Thresholds.msprobe()).set_index("name").loc[
        "Torch.a.0.forward.input.0", "msprobe_result"] == "error"
    csv = compare(npu, bench).to_msprobe_frame().set_index("NPU Name")
    assert csv.loc["Torch.b.0.forward.input.0", "Bench Name"] == "N/A"
    assert csv.loc["Torch.b.0.forward.input.0", "Bench Dtype"] == "N/A"
    assert csv.loc["Torch.b.0.forward.input.0", "Max diff"] == "N/A"
    assert csv.loc["Torch.a.0.forward.input.0", "Bench Dtype"] == "torch.float32"


def test_ranks_pair_by_number_not_position():
    npu = pd.concat([build([linear(0)], rank=0), build([linear(0, 3.0)], rank=2)])
    bench = pd.concat([build([linear(0)], rank=r) for r in (0, 1)] + [build([linear(0, 3.0)], rank=2)])
    with pytest.warns(UserWarning, match="bench groups without a counterpart"):
        r = compare(npu, bench)
    assert list(zip(r.pairs["rank"], r.pairs["bench_rank"])) == [(0, 0), (2, 2)]
    assert r.counts()["error"] == 0 and r.first_divergence() is None
    assert r.unpaired.to_dict("records") == [{"side": "bench", "step": 0, "rank": 1, "rows": 3}]
    with pytest.raises(CompareError, match="rank_map"):
        compare(build([linear(0)], rank=5), build([linear(0)], rank=0))
    r = compare(build([linear(0)], rank=5), build([linear(0)], rank=0), rank_map={5: 0})
    assert r.counts()["unmatched"] == 0 and set(r["rank"]) == {5} and set(r["bench_rank"]) == {0}


def test_single_steps_with_different_numbers_pair_with_a_note():
    r = compare(build([linear(0)], step=3), build([linear(0)], step=7))
    assert r.counts()["unmatched"] == 0 and any("step 3" in n and "step 7" in n for n in r.notes)


def test_unmatched_rows_are_kept_in_place():
    npu = build([linear(0), linear(1)])
    bench = build([linear(0), ("Torch.extra.0.forward", {"input.0": 1.0}), linear(1)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compare(npu, bench)
    assert list(r["name"]) == [
        "Functional.linear.0.forward.input.0", "Functional.linear.0.forward.input.1",
        "Functional.linear.0.forward.output.0", "Torch.extra.0.forward.input.0",
        "Functional.linear.1.forward.input.0", "Functional.linear.1.forward.input.1",
        "Functional.linear.1.forward.output.0"]
    assert r.unmatched[["name", "match"]].values.tolist() == [["Torch.extra.0.forward.input.0", "bench_only"]]
    assert r.set_index("name").loc["Torch.extra.0.forward.input.0", "result"] == "warning"
    assert "N/A" in r.to_msprobe_frame()["NPU Name"].tolist()
    assert "N/A" not in r.to_msprobe_frame(include_bench_only=False)["NPU Name"].tolist()


def test_duplicate_names_pair_in_order_without_cross_product():
    npu = build([linear(0), linear(0, 2.0)])
    bench = build([linear(0), linear(0, 2.0)])
    r = compare(npu, bench)
    assert len(r) == 6 and r.counts()["unmatched"] == 0 and (r["max_diff"] == 0).all()


def test_bad_inputs_raise_compare_error(tmp_path):
    t = build([linear(0)])
    with pytest.raises(CompareError, match="empty"):
        compare(t.iloc[:0], t)
    with pytest.raises(CompareError, match="missing columns"):
        compare(pd.DataFrame({"x": [1]}), t)
    with pytest.raises(CompareError, match="not found"):
        compare(tmp_path / "nope", t)
    with pytest.raises(CompareError, match="expected a dump path"):
        compare(42, t)
    with pytest.raises(CompareError, match="different models"):
        compare(build([("Torch.foo.0.forward", {"input.0": 1.0})]), t)
    assert issubclass(CompareError, ValueError)


def test_values_and_none_leaves():
    npu = build([("Torch.f.0.forward", {"input.0": 1.0, "input.dim": {"kind": "value", "value_type": "int",
                                                                      "value": "1", "dtype": ""},
                                        "input.p": {"kind": "value", "value_type": "str", "value": '"a"'},
                                        "input.2": {"kind": "none"}, "output.0": 1.0})])
    bench = build([("Torch.f.0.forward", {"input.0": 1.0, "input.dim": {"kind": "value", "value_type": "int",
                                                                        "value": "2", "dtype": ""},
                                          "input.p": {"kind": "value", "value_type": "str", "value": '"b"'},
                                          "input.2": {"kind": "none"}, "output.0": 1.0})])
    r = compare(npu, bench).set_index("name")
    dim, p, none = r.loc["Torch.f.0.forward.input.dim"], r.loc["Torch.f.0.forward.input.p"], \
        r.loc["Torch.f.0.forward.input.2"]
    assert dim["result"] == "error" and dim["max_diff"] == -1 and dim["max_rel"] == 0.5
    assert p["result"] == "error" and math.isnan(p["max_diff"]) and "value differs" in p["reasons"][0]
    assert none["result"] == "pass" and none["max_diff"] == 0
    csv = compare(npu, bench).to_msprobe_frame().set_index("NPU Name")
    assert csv.loc["Torch.f.0.forward.input.p", "Max diff"] == "Diff"
    assert csv.loc["Torch.f.0.forward.input.dim", "NPU Dtype"] == "<class 'int'>"
    assert csv.loc["Torch.f.0.forward.input.2", "NPU max"] == "None"


def test_nan_inf_rules():
    nan = float("nan")
    npu = build([("Torch.a.0.forward", {"input.0": 1.0, "output.0": {"max": nan, "min": nan, "mean": nan}}),
                 ("Torch.b.0.forward", {"input.0": 1.0, "output.0": 1.0})])
    bench = build([("Torch.a.0.forward", {"input.0": 1.0, "output.0": 1.0}),
                   ("Torch.b.0.forward", {"input.0": 1.0, "output.0": {"max": float("inf"), "min": -1.0,
                                                                        "mean": 0.1, "norm": 2.0}})])
    r = compare(npu, bench).set_index("name")
    assert r.loc["Torch.a.0.forward.output.0", "result"] == "error"
    assert r.loc["Torch.b.0.forward.output.0", "result"] == "warning"
    assert r.loc["Torch.a.0.forward.output.0", "err"] == math.inf


def test_call_rules_flag_the_bad_output_row():
    calls = [("Torch.split.0.forward", {"input.0": 1.0, "output.0": 1.0, "output.1": 1.0})]
    npu = build(calls)
    bench = build(calls)
    bench.loc[bench["name"] == "Torch.split.0.forward.output.1", "norm"] = 1.0  # 100 % NormRelativeErr
    r = compare(npu, bench).set_index("name")
    assert r.loc["Torch.split.0.forward.output.0", "result"] == "pass"
    out1 = r.loc["Torch.split.0.forward.output.1"]
    assert out1["result"] == "error"
    assert any("> 50%" in x for x in out1["reasons"]) and any("identical" in x for x in out1["reasons"])
    summary = compare(npu, bench).calls_summary()
    assert summary["result"].tolist() == ["error"]
    assert summary["worst_row"].tolist() == ["Torch.split.0.forward.output.1"]
    assert all(x.startswith("output.1: ") for x in summary["reasons"][0])


def test_growth_warning_uses_inputs():
    npu = build([("Torch.g.0.forward", {"input.0": {"norm": 1.001}, "output.0": {"norm": 1.2}})],
                max=1.0, min=-1.0, mean=0.1)
    bench = build([("Torch.g.0.forward", {"input.0": {"norm": 1.0}, "output.0": {"norm": 1.0}})],
                  max=1.0, min=-1.0, mean=0.1)
    r = compare(npu, bench).set_index("name")
    assert r.loc["Torch.g.0.forward.output.0", "msprobe_result"] == "warning"
    assert r.loc["Torch.g.0.forward.input.0", "result"] == "pass"


def test_skip_ops_are_not_graded():
    npu = build([("Torch.empty.0.forward", {"output.0": {"max": float("nan")}})])
    bench = build([("Torch.empty.0.forward", {"output.0": 5.0})])
    r = compare(npu, bench)
    assert r["result"].tolist() == ["pass"] and r.first_divergence() is None


def test_tensor_mode_call_rules():
    calls = [("Torch.f.0.forward", {"input.0": {"data_name": "i"}, "output.0": {"data_name": "o"},
                                    "output.1": {"data_name": "o2"}})]
    x = torch.linspace(1, 2, 100)
    npu = _TensorDump(build(calls), {"i": x, "o": x, "o2": -x})
    bench = _TensorDump(build(calls), {"i": x, "o": x, "o2": x})
    r = compare(npu, bench).set_index("name")
    assert r.loc["Torch.f.0.forward.output.0", "result"] == "pass"
    bad = r.loc["Torch.f.0.forward.output.1"]
    assert bad["result"] == "error" and bad["cosine"] == pytest.approx(-1.0)
    assert any("One Thousandth" in s for s in bad["reasons"]) and any("Cosine drops" in s for s in bad["reasons"])
    assert bad["rel_l2_err"] == pytest.approx(2.0)


def test_steps_pair_by_number():
    npu = pd.concat([build([linear(0)], step=0), build([linear(0, 2.0)], step=1)])
    bench = pd.concat([build([linear(0)], step=0), build([linear(0, 2.5)], step=1)])
    r = compare(npu, bench)
    assert list(r.pairs["step"]) == [0, 1] and r.first_divergence().step == 1
    with pytest.warns(UserWarning, match="npu groups without a counterpart"):
        r = compare(npu, bench[bench["step"] == 0])
    assert r.unpaired.to_dict("records") == [{"side": "npu", "step": 1, "rank": 0, "rows": 3}]
    assert set(r["step"]) == {0}


def test_md5_mode():
    calls = [("Torch.f.0.forward", {"input.0": {"hash": "aa"}, "output.0": {"hash": "bb"}})]
    npu = build(calls)
    bench = build(calls)
    bench.loc[bench["io"] == "output", "hash"] = "cc"
    r = compare(npu, bench)
    assert r.mode == "md5"
    assert r["result"].tolist() == ["pass", "error"] and "hash differs" in r["reasons"].iat[1][0]
    assert r.first_divergence().call == "Torch.f.0.forward"
    frame = r.to_msprobe_frame()
    assert list(frame.columns[:14]) == MSPROBE_HEADERS["md5"]
    assert frame["BENCH MD5"].tolist() == ["aa", "cc"]
    with pytest.raises(CompareError, match="md5 mode needs content hashes"):
        compare(build([linear(0)]), build([linear(0)]), mode="md5")


def test_tensor_export_cells():
    calls = [("Torch.f.0.forward", {"input.0": {"data_name": "s", "shape": ()}, "input.1": {"data_name": "one",
                                                                                        "shape": (1,)},
                                    "output.0": {"data_name": "nan"}, "output.1": {"data_name": "missing"}})]
    nan = float("nan")
    npu = _TensorDump(build(calls), {"s": torch.tensor(2.0), "one": torch.tensor([2.0]),
                                     "nan": torch.tensor([nan, 1.0])})
    bench = _TensorDump(build(calls), {"s": torch.tensor(4.0), "one": torch.tensor([4.0]),
                                       "nan": torch.tensor([1.0, nan])})
    r = compare(npu, bench)
    f = r.to_msprobe_frame().set_index("NPU Name")
    s = f.loc["Torch.f.0.forward.input.0"]
    assert (s["Cosine"], s["EucDist"], s["MaxAbsErr"], s["MaxRelativeErr"]) == ("unsupported", "unsupported",
                                                                                "2.0", "0.5")
    one = f.loc["Torch.f.0.forward.input.1"]
    assert (one["Cosine"], one["EucDist"]) == ("unsupported", "2.0")
    assert (f.loc["Torch.f.0.forward.output.0", ["Cosine", "MaxAbsErr"]] == "N/A").all()
    assert f.loc["Torch.f.0.forward.output.1", "Cosine"] == "unsupported"
    rows = r.set_index("name")
    assert rows.loc["Torch.f.0.forward.output.0", "result"] == "error"
    assert rows.loc["Torch.f.0.forward.output.1", "result"] == "warning"
    assert rows.loc["Torch.f.0.forward.output.0", "nan_inf_match"] is False


def test_recorded_nan_inf_counts_are_compared():
    nan = float("nan")
    npu = build([("Torch.f.0.forward", {"input.0": 1.0, "output.0": {"max": nan, "min": nan, "mean": nan,
                                                                     "nan_count": 3, "posinf_count": 0,
                                                                     "neginf_count": 0}})])
    bench = build([("Torch.f.0.forward", {"input.0": 1.0, "output.0": {"max": nan, "min": nan, "mean": nan,
                                                                       "nan_count": 5, "posinf_count": 0,
                                                                       "neginf_count": 0}})])
    r = compare(npu, bench).set_index("name").loc["Torch.f.0.forward.output.0"]
    assert r["result"] == "error" and "NaN/inf counts differ: NPU 3 NaN 0 inf, bench 5 NaN 0 inf" in r["reasons"][0]
    assert r["err"] == math.inf


def test_thresholds_as_dict():
    bench = build([linear(0)])
    npu = build([linear(0, 1.002)])
    assert compare(npu, bench, thresholds={"diverge_rtol": 0.01}).first_divergence() is None
    assert compare(npu, bench).first_divergence().call == "Functional.linear.0.forward"
    with pytest.raises(CompareError, match="unknown thresholds"):
        compare(npu, bench, thresholds={"nope": 1})
    with pytest.raises(CompareError, match="dtype_mismatch_level"):
        compare(npu, bench, thresholds={"dtype_mismatch_level": "fatal"})


@needs_toy
def test_the_first_divergence_is_never_graded_pass(stat_result):
    """One notion of bad: result raises msprobe's grade to warning on diverging rows and to error on the
    first divergence's, while the msprobe CSV keeps msprobe's own grade."""
    d = stat_result.first_divergence()
    root = stat_result[(stat_result["call"] == d.call) & stat_result["diverges"]]
    assert len(root) and set(root["result"]) == {"error"}
    assert all(any(r.startswith("error: first divergence") for r in rs) for rs in root["reasons"])
    diverging = stat_result[stat_result["diverges"]]
    assert "pass" not in set(diverging["result"])
    assert (stat_result["msprobe_result"] != stat_result["result"]).any()


def test_the_tensor_call_rules_are_strict_at_their_thresholds():
    """msprobe's checkers compare strictly: an output whose One Thousandth ratio is exactly 0.1 is not an error
    by that rule (0.09 is), and a cosine drop exactly at the threshold does not warn (just beyond it does)."""
    calls = [("Torch.f.0.forward", {"input.0": {"data_name": "i"}, "output.0": {"data_name": "o"}})]
    x = torch.linspace(1, 2, 100, dtype=torch.float64)

    def reasons(n_equal: int, thresholds=None) -> list[str]:
        o = x.clone()
        o[n_equal:] = -o[n_equal:]  # n_equal of the 100 elements within one thousandth, the others far off
        npu = _TensorDump(build(calls), {"i": x, "o": o})
        bench = _TensorDump(build(calls), {"i": x, "o": x})
        return list(compare(npu, bench, thresholds=thresholds).set_index("name")
                    .loc["Torch.f.0.forward.output.0", "reasons"])

    assert not any("One Thousandth" in s for s in reasons(10))  # ratio 0.1: not below 0.1
    assert any("One Thousandth" in s for s in reasons(9))
    npu = _TensorDump(build(calls), {"i": x, "o": x.flip(0)})
    bench = _TensorDump(build(calls), {"i": x, "o": x})
    drop = 1.0 - float(compare(npu, bench).set_index("name").loc["Torch.f.0.forward.output.0", "cosine"])
    assert 0 < drop < 0.5

    def warns(threshold: float) -> bool:
        r = compare(npu, bench, thresholds={"cosine_drop_warning": threshold}).set_index("name")
        return any("Cosine drops" in s for s in r.loc["Torch.f.0.forward.output.0", "reasons"])

    assert not warns(drop) and warns(math.nextafter(drop, 0.0))
