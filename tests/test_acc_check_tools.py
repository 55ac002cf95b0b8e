"""The pre-check's parts: grading rules by dtype, rebuilding calls from rows, fused-op references,
comparing two pre-checks, the CLI, the online task, the viewer, and the torch-free result side."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from planted_kernels import planted_kernels

import msprobe_nb as mp
from msprobe_nb.cli import main as cli_main
from msprobe_nb.precheck import references
from msprobe_nb.precheck import standards as S
from msprobe_nb.precheck.api_classes import classify
from msprobe_nb.precheck.api_resolver import Unresolvable, build_arguments, decode_value, resolve
from msprobe_nb.precheck.rows import Row

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------- standards
def test_binary_catches_one_differing_element_and_equates_nans():
    a = np.array([1.0, np.nan, 3.0])
    assert S.binary(a, a.copy()).verdict == "pass"
    b = a.copy()
    b[2] = np.nextafter(3.0, 4.0)
    g = S.binary(b, a)
    assert g.verdict == "error" and g.metrics["mismatch"] == 1 and "1 of 3" in g.reasons[0]


def test_ulp_limits_follow_the_dtype():
    rng = np.random.default_rng(0)
    bench = rng.normal(size=10_000)
    f32 = bench.astype(np.float32).astype(np.float64)  # correctly rounded: half an ULP at most
    assert S.ulp(f32, bench, "torch.float32").verdict == "pass"
    off = f32 * (1 + 64 * 2.0 ** -23)  # 64 ULP: over fp32's 32
    g = S.ulp(off, bench, "torch.float32")
    assert g.verdict == "error" and "32 ULP" in g.reasons[0]
    bf = torch.tensor(bench).to(torch.bfloat16).double().numpy()
    assert S.ulp(bf, bench, "torch.bfloat16").verdict == "pass"
    assert S.ulp(bf, bench, "torch.float16").verdict == "error"  # fp16 has 3 more bits: bf16 rounding fails it


def test_saturate_makes_overflow_to_inf_correct_for_the_dtype():
    bench = np.array([1.0, 70000.0])
    dev = np.array([1.0, np.inf])
    assert S.ulp(dev, bench, "torch.float16").verdict == "error"
    assert S.ulp(dev, S.saturate(bench, "torch.float16"), "torch.float16").verdict == "pass"
    assert S.ulp(np.array([1.0, 70000.0]), S.saturate(bench, "torch.float32"), "torch.float32").verdict == "pass"


def test_absolute_threshold_splits_small_and_normal_values():
    info = S.DTYPES["torch.float32"]
    bench = np.array([1.0, 1e-6])
    ok = bench + np.array([0.5 * info.rtol, 0.5 * info.small_atol])
    assert S.absolute(ok, bench, "torch.float32").verdict == "pass"
    small_bad = bench + np.array([0.0, 2 * info.small_atol])
    g = S.absolute(small_bad, bench, "torch.float32")
    assert g.verdict == "error" and "small values" in g.reasons[0]


def test_benchmark_compares_against_the_reference_kernel_with_floors():
    rng = np.random.default_rng(1)
    bench = rng.normal(size=5000)
    ref = bench.astype(np.float32).astype(np.float64)
    assert S.benchmark(ref, bench, ref, "torch.float32").verdict == "pass"
    exact = S.benchmark(ref, bench, bench.copy(), "torch.float32")  # an exact reference: floors, not zeros
    assert exact.verdict == "pass", exact.reasons
    worse = S.benchmark(bench + 3e-6 * np.abs(bench), bench, ref, "torch.float32")  # every error upwards
    assert worse.verdict == "error" and any("err_balance" in r for r in worse.reasons)
    assert worse.metrics["mean_rel_err_ratio"] > 2


def test_thousandths_share_by_dtype():
    bench = np.linspace(1, 2, 1000)
    assert S.thousandths(bench * (1 + 5e-4), bench, "torch.float16").verdict == "pass"
    assert S.thousandths(bench * (1 + 5e-4), bench, "torch.float32").verdict == "error"


def test_dropout_zero_ratio_against_p():
    rng = np.random.default_rng(2)
    x = rng.normal(size=20_000)
    keep = rng.random(x.size) >= 0.3
    out = np.where(keep, x / 0.7, 0.0)
    assert S.dropout(out, x, 0.3, "torch.float64").verdict == "pass"
    g = S.dropout(out, x, 0.1, "torch.float64")
    assert g.verdict == "error" and "p is 0.1" in g.reasons[0]
    assert S.dropout(np.where(keep, x, 0.0), x, 0.3, "torch.float64").verdict == "error"  # not rescaled


def test_classes():
    assert classify("Functional", "dropout").standard == "dropout"
    assert classify("Torch", "randn").standard == "random"
    assert classify("Tensor", "type_as").standard == "cast"
    assert classify("Tensor", "__getitem__").standard == "binary"
    assert classify("Torch", "argmax", "torch.int64").standard == "binary"
    assert classify("Tensor", "__add__").standard == "ulp"
    assert classify("Torch", "sin").standard == "absolute"
    assert classify("Torch", "matmul").level == "tight"
    assert classify("mylib", "fused_thing").standard == "benchmark"


# ------------------------------------------------------------------------------------------- resolver
def _row(arg, kind="value", value_type="", value="", is_kwarg=False, dtype=""):
    return Row(0, 0, 0, "c", f"c.input.{arg}", "Torch", "op", "forward", "input", arg, is_kwarg, kind, dtype, None,
               value_type, value, "", math.nan, math.nan, math.nan)


def test_resolve_names_and_reasons():
    assert resolve("Functional", "linear")[0] is F.linear
    assert resolve("Tensor", "__add__") == (torch.Tensor.__add__, True)
    assert resolve("Torch", "matmul")[0] is torch.matmul
    assert resolve("NPU", "npu_rms_norm")[0] is references.npu_rms_norm
    with pytest.raises(Unresolvable, match="torch_npu is absent"):
        resolve("NPU", "npu_no_such_op")
    with pytest.raises(Unresolvable, match="collective"):
        resolve("Distributed", "all_reduce")
    with pytest.raises(Unresolvable, match="no torch.ops.nolib.op"):
        resolve("nolib", "op")


def test_arguments_are_rebuilt_from_rows():
    rows = [_row("0", kind="tensor", dtype="torch.float32"), _row("1.0", value_type="slice", value="[null, 2, null]"),
            _row("1.1", value_type="ellipsis", value='"..."'),
            _row("dtype", value_type="torch.dtype", value='"torch.float16"', is_kwarg=True),
            _row("eps", value_type="float", value='"nan"', is_kwarg=True)]
    t = torch.zeros(2)
    args, kwargs = build_arguments(rows, lambda r: t, "__getitem__")
    assert args[0] is t and args[1] == (slice(None, 2, None), Ellipsis)
    assert kwargs["dtype"] is torch.float16 and math.isnan(kwargs["eps"])
    with pytest.raises(Unresolvable, match="no row"):  # argument 1 missing: an empty tuple leaves no leaf
        build_arguments([_row("0", value_type="int", value="1"), _row("2", value_type="int", value="3")], None)
    with pytest.raises(Unresolvable, match="description"):
        decode_value("MyConfig", '"MyConfig(a=1)"')


def test_generated_inputs_match_the_recorded_range_and_mean():
    from msprobe_nb.precheck.generated_inputs import generate
    row = Row(0, 0, 0, "c", "c.input.0", "Torch", "op", "forward", "input", "0", False, "tensor", "torch.float32",
              (100, 50), "", "", "", -2.0, 6.0, 0.0)
    notes: list[str] = []
    t = generate(row, notes)
    assert t.dtype == torch.float32 and t.shape == (100, 50) and not notes
    assert t.min().item() == -2.0 and t.max().item() == 6.0
    assert abs(t.mean().item()) < 0.1  # the recorded mean, not the range's middle (2.0)
    assert torch.equal(t, generate(row, []))  # seeded by the row's name
    ints = generate(row._replace(dtype="torch.int64", min=3.0, max=5.0), notes)
    assert set(ints.unique().tolist()) == {3, 4, 5}
    generate(row._replace(min=math.nan), notes)
    assert notes and "standard normal" in notes[0]


def test_tensor_properties_resolve_to_a_getter():
    fn, is_method = resolve("Tensor", "mT")
    x = torch.randn(2, 3)
    assert is_method and torch.equal(fn(x), x.mT)


def test_references_match_their_definitions():
    torch.manual_seed(0)
    x, g = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    y, rstd = references.npu_rms_norm(x, g, 1e-6)
    assert torch.allclose(y, x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g)
    assert torch.allclose(references.npu_swiglu(x), F.silu(x[..., :4]) * x[..., 4:])
    q, k, v = (torch.randn(2, 5, 16, dtype=torch.float64) for _ in range(3))  # BSH, 2 heads of 8
    out = references.npu_fusion_attention(q, k, v, 2, "BSH", scale=8 ** -0.5)[0]
    want = F.scaled_dot_product_attention(*(t.reshape(2, 5, 2, 8).transpose(1, 2) for t in (q, k, v)))
    assert torch.allclose(out, want.transpose(1, 2).reshape(2, 5, 16))
    mask = torch.zeros(5, 5, dtype=torch.bool).triu(1)
    soft = references.npu_scaled_masked_softmax(x[..., :5].reshape(2, 1, 3, 5), mask[:3], 2.0)
    assert torch.allclose(soft.sum(-1), torch.ones(2, 1, 3, dtype=torch.float64))
    with pytest.raises(NotImplementedError, match="keep_prob"):
        references.npu_fusion_attention(q, k, v, 2, "BSH", keep_prob=0.9)


def test_register_reference_replays_a_user_library_op(tmp_path):
    lib = torch.library.Library("accchk_test", "DEF")
    try:
        lib.define("scaled(Tensor x) -> Tensor")
        lib.impl("scaled", lambda x: (x.to(torch.bfloat16) * 3).to(x.dtype), "CompositeExplicitAutograd")
        x = torch.randn(64, 32)
        with mp.record(dump_path=str(tmp_path / "d"), task="tensor", level="L1") as dbg:
            torch.ops.accchk_test.scaled(x)
        mp.register_reference("accchk_test.scaled", lambda x: x * 3)
        try:
            pre = mp.acc_check(dbg.dump_dir)
        finally:
            references.unregister_reference("accchk_test.scaled")
        row = pre[pre["op"] == "scaled"]
        assert list(row["verdict"]) == ["error"], row[["api", "reasons"]]  # the op rounds to bf16 inside
        assert references.lookup("accchk_test", "scaled") is None
    finally:
        lib._destroy()


# ------------------------------------------------------------------------------------------- end to end
def _mlp_dump(tmp_path, name="d", task="tensor", bad_softmax=False):
    torch.manual_seed(0)
    w = torch.randn(16, 8, requires_grad=True)
    x = torch.randn(6, 8)
    with planted_kernels(("_softmax",) if bad_softmax else ()), \
            mp.record(dump_path=str(tmp_path / name), task=task, level="L1") as dbg:
        s = torch.softmax(F.linear(x, w), -1)
        (s * 2.0).sum().backward()
    return dbg.dump_dir


def test_compare_prechecks_names_the_apis_the_first_device_does_worse(tmp_path):
    npu = mp.acc_check(_mlp_dump(tmp_path, "npu", bad_softmax=True), backward=False)
    gpu = mp.acc_check(_mlp_dump(tmp_path, "gpu"), backward=False)
    t = mp.compare_prechecks(npu, gpu)
    worse = t[t["verdict"] == "error"]
    assert list(worse["api"]) == ["Torch.softmax.0.forward"], t[["api", "verdict", "reasons"]]
    assert "npu fails" in worse["reasons"].iloc[0]
    same = mp.compare_prechecks(gpu, gpu)
    assert (same["verdict"] == "pass").all()
    npu.to_csv(tmp_path / "npu.csv")
    gpu.to_csv(tmp_path / "gpu.csv")
    assert list(mp.compare_prechecks(tmp_path / "npu.csv", tmp_path / "gpu.csv")["verdict"]) == list(t["verdict"])


def test_cli_acc_check_writes_the_csv_and_fails_on_error(tmp_path, capsys):
    path = _mlp_dump(tmp_path, bad_softmax=True)
    out = tmp_path / "pre.csv"
    assert cli_main(["acc-check", str(path), "-o", str(out), "--fail-on", "error"]) == 1
    text = capsys.readouterr().out
    assert "error Torch.softmax.0.forward" in text and out.is_file()
    back = mp.AccCheckResult.read_csv(out)
    assert back.failed_apis() == ["Torch.softmax.0.forward", "Torch.softmax.0.backward"]
    assert cli_main(["acc-check", str(_mlp_dump(tmp_path, "ok")), "-q", "--fail-on", "error"]) == 0
    assert cli_main(["acc-check", str(tmp_path / "missing")]) == 2
    assert cli_main(["acc-compare", str(out), str(out)]) == 0


def test_statistics_dump_is_approximate_and_says_so(tmp_path):
    pre = mp.acc_check(_mlp_dump(tmp_path, task="statistics"))
    assert pre["approximate"].all() and pre.failures().empty
    assert any("generated" in n for n in pre.notes)
    assert pre["reasons"].str.contains("approximate").all()


def test_unreplayable_calls_are_listed_with_why(tmp_path):
    with mp.record(dump_path=str(tmp_path / "d"), task="tensor", level="L1") as dbg:
        x = torch.randn(4, 4)
        torch.randn(3)
        x[0] = 1.0
        F.dropout(x, 0.5, training=True)
    pre = mp.acc_check(dbg.dump_dir)
    by_op = dict(zip(pre["op"], pre["verdict"], strict=False))
    assert by_op["randn"] == "unchecked" and by_op["__setitem__"] == "unchecked"
    assert by_op["dropout"] in ("pass", "error")  # graded by its zero ratio, not skipped
    assert pre.unchecked()["reasons"].str.len().min() > 10


def test_online_task_writes_verdicts_and_no_tensors(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.LayerNorm(8))
    x = torch.randn(4, 8)
    dbg = mp.Debugger(dump_path=str(tmp_path / "on"), task="acc_check", level="L1", model=model)
    dbg.start()
    for _ in range(2):
        model(x).sum().backward()
        dbg.step()
    dbg.close()
    files = sorted(p.name for p in dbg.dump_dir.iterdir())
    assert files == ["acc_check_rank0.csv"]  # no dump file, no tensors
    pre = dbg.acc_check_result
    assert sorted(pre["step"].unique()) == [0, 1] and pre.failures().empty and pre.counts()["pass"] > 5
    back = mp.AccCheckResult.read_csv(dbg.dump_dir / "acc_check_rank0.csv")
    assert len(back) == len(pre) and list(back["verdict"]) == list(pre["verdict"])


def test_online_task_grades_the_white_list_only(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))
    cfg = {"task": "acc_check", "level": "L1", "dump_path": str(tmp_path / "wl"),
           "acc_check": {"white_list": ["linear", "gelu"], "black_list": ["gelu"]}}
    with mp.record(cfg, model=model) as dbg:
        model(torch.randn(4, 8)).sum().backward()
    pre = dbg.acc_check_result
    assert set(pre["op"]) == {"linear"} and any("left out" in n for n in pre.notes)


def test_online_task_fails_a_kernel_wrong_while_the_step_runs(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Sigmoid(), torch.nn.Linear(8, 2))
    x = torch.randn(16, 8)
    with planted_kernels(("sigmoid",)):  # wrong in float32, right in the float64 bench
        with mp.record(dump_path=str(tmp_path / "on"), task="acc_check", level="L1", model=model) as dbg:
            model(x).sum().backward()
    pre = dbg.acc_check_result
    assert set(pre.failures()["api"]) == {"Torch.sigmoid.0.forward"}, pre[["api", "verdict", "reasons"]]
    assert "ULP" in pre.failures()["reasons"].iloc[0]


def test_viewer_filters_and_details(tmp_path):
    pre = mp.acc_check(_mlp_dump(tmp_path, bad_softmax=True))
    v = mp.AccCheckViewer(pre)
    v.set_state(verdict="error")
    assert list(v.rows["call"]) == ["Torch.softmax.0.forward", "Torch.softmax.0.backward"]
    v.select("Torch.softmax.0.forward", 0, 0)
    d = v.selected
    assert d.reasons and all(r.startswith("error") for r in d.reasons) and "benchmark" in d.html
    with pytest.raises(TypeError, match="acc_check"):
        mp.AccCheckViewer(pd.DataFrame({"x": [1]}))


def test_result_side_loads_no_torch(tmp_path):
    pre = mp.acc_check(_mlp_dump(tmp_path))
    pre.to_csv(tmp_path / "pre.csv")
    code = f"""
import json, sys
import msprobe_nb as mp
from msprobe_nb.precheck import api_classes, standards
pre = mp.AccCheckResult.read_csv({str(tmp_path / "pre.csv")!r})
t = mp.compare_prechecks(pre, pre)
v = mp.AccCheckViewer(pre)
print(json.dumps({{"rows": len(t), "torch": "torch" in sys.modules}}))
"""
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"rows": len(pre), "torch": False}


def test_an_msprobe_statistics_dump_is_pre_checked(toy):
    """msprobe's dump of the toy step: graded without errors; its backward gradients are matched to the
    forward's floating inputs in order, and one that is an internal node's (linear) is unchecked, saying so."""
    pre = mp.acc_check(toy / "stat_L1_npu")
    assert pre.failures().empty and pre.counts()["pass"] > 80
    by_api = dict(zip(pre["api"] + "/" + pre["output"], pre["verdict"], strict=True))
    assert by_api["Functional.embedding.0.backward/0"] == "pass"  # output.0 is the weight's gradient
    assert by_api["Functional.layer_norm.0.backward/2"] == "pass"  # ... and here the bias's
    linear = pre[pre["api"] == "Functional.linear.0.backward"]
    assert list(linear["verdict"]) == ["unchecked"] and "internal node" in linear["reasons"].iloc[0]


def _train(tmp_path, online: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.GELU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(6, 8)
    dbg = mp.Debugger(dump_path=str(tmp_path / "on"), task="acc_check", level="L1", model=model) if online else None
    if dbg:
        dbg.start()
    for _ in range(2):
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        if dbg:
            dbg.step()
    if dbg:
        dbg.close()
    return [p.detach().clone() for p in model.parameters()], torch.rand(3)


def test_online_task_leaves_the_run_bit_for_bit_the_same(tmp_path):
    """The replay at each step's end draws no random number of the run and changes none of its tensors."""
    plain, plain_next = _train(tmp_path, online=False)
    checked, checked_next = _train(tmp_path, online=True)
    assert all(torch.equal(a, b) for a, b in zip(plain, checked, strict=True))
    assert torch.equal(plain_next, checked_next)  # the generator is where the plain run left it


def test_fused_npu_ops_are_graded_against_their_references(tmp_path):
    """Ops in the ``npu`` namespace (torch_npu's, stood in for by torch.library here) replay through the
    built-in references: a rms_norm that works in bfloat16 fails, a correct swiglu passes."""
    lib = torch.library.Library("npu", "DEF")
    try:
        lib.define("npu_rms_norm(Tensor x, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
        lib.define("npu_swiglu(Tensor x, int dim=-1) -> Tensor")

        def rough_rms_norm(x, gamma, epsilon=1e-6):
            xb = x.to(torch.bfloat16)
            rstd = torch.rsqrt(xb.pow(2).mean(-1, keepdim=True) + epsilon)
            return (xb * rstd * gamma.to(torch.bfloat16)).to(x.dtype), rstd.to(x.dtype)

        lib.impl("npu_rms_norm", rough_rms_norm, "CompositeExplicitAutograd")
        lib.impl("npu_swiglu", references.npu_swiglu, "CompositeExplicitAutograd")
        torch.manual_seed(0)
        x, g = torch.randn(4, 6, 32), torch.randn(32)
        with mp.record(dump_path=str(tmp_path / "d"), task="tensor", level="L1") as dbg:
            torch.ops.npu.npu_rms_norm(x, g, 1e-6)
            torch.ops.npu.npu_swiglu(x)
        pre = mp.acc_check(dbg.dump_dir)
    finally:
        lib._destroy()
    assert set(pre["family"]) == {"NPU"}
    verdicts = pre.groupby("op")["verdict"].apply(set).to_dict()
    assert verdicts == {"npu_rms_norm": {"error"}, "npu_swiglu": {"pass"}}, pre[["api", "output", "reasons"]]


def _graded(api, verdict, **metrics):
    return {"step": 0, "rank": 0, "call_index": 0, "api": api, "name": api, "family": "Torch", "op": "mm",
            "direction": "forward", "output": "0", "dtype": "torch.float32", "standard": "benchmark",
            "verdict": verdict, "reasons": "", **metrics}


def test_compare_prechecks_flags_a_metric_well_above_the_other_devices():
    npu = mp.AccCheckResult.from_rows([_graded("Torch.mm.0.forward", "pass", rmse=3e-6, ref_rmse=1e-7),
                                       _graded("Torch.mm.1.forward", "pass", max_rel_err=1e-9),
                                       _graded("Torch.mm.2.forward", "pass", mean_rel_err=1.6e-7)])
    gpu = mp.AccCheckResult.from_rows([_graded("Torch.mm.0.forward", "pass", rmse=1e-6, ref_rmse=1e-7),
                                       _graded("Torch.mm.1.forward", "pass", max_rel_err=0.0),
                                       _graded("Torch.mm.2.forward", "pass", mean_rel_err=1e-7)])
    t = mp.compare_prechecks(npu, gpu).set_index("api")
    assert t.loc["Torch.mm.0.forward", "verdict"] == "error"  # 3x the GPU's RMSE
    assert "rmse" in t.loc["Torch.mm.0.forward", "reasons"]
    assert t.loc["Torch.mm.1.forward", "verdict"] == "pass"  # an exact GPU is floored at eps/2, not zero
    assert t.loc["Torch.mm.2.forward", "verdict"] == "warning"  # 1.6x: over 1.5, under 2
    only = mp.compare_prechecks(npu, gpu.iloc[:2])
    assert only.set_index("api").loc["Torch.mm.2.forward", "verdict"] == "unmatched"


def test_apis_summary_keeps_the_worst_verdict_and_every_reason():
    pre = mp.AccCheckResult.from_rows([
        {**_graded("Torch.mm.0.forward", "pass"), "output": "0"},
        {**_graded("Torch.mm.0.forward", "error"), "output": "1", "reasons": "error: rmse too big"},
        {**_graded("Torch.randn.0.forward", "unchecked"), "call_index": 1, "reasons": "a random draw"}])
    s = pre.apis().set_index("api")
    assert s.loc["Torch.mm.0.forward", "verdict"] == "error" and s.loc["Torch.mm.0.forward", "outputs"] == 2
    assert s.loc["Torch.mm.0.forward", "reasons"] == "error: rmse too big"
    assert s.loc["Torch.randn.0.forward", "verdict"] == "unchecked"
    assert pre.failed_apis() == ["Torch.mm.0.forward"] and len(pre.unchecked()) == 1
