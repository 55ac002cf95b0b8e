"""Planted causes: the first divergence names the exact call that changed, at every level.

Each test records two runs of a small model that differ in one planted way (a LayerNorm eps, a dropout
seed, an fp16 matmul, a GELU approximation, a permutation drawn from another seed...) and checks the root:
the innermost call whose inputs agree and whose outputs diverge (L0: the module; L1, mix, L2: the API).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from msprobe_nb.analysis.compare import compare
from msprobe_nb.analysis.provenance import trace_randomness
from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load

# compare must not leak numpy's warnings (inf / inf in the grading) to the user
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


def record(path, model_fn, step_fn, *, level, task="statistics", seed=0, **cfg):
    torch.manual_seed(0)
    model = model_fn()
    torch.manual_seed(seed)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    dbg = Debugger(dump_path=str(path), level=level, task=task, **cfg)
    dbg.start(model)
    loss = step_fn(model, x)
    loss.backward()
    dbg.stop()
    return load(str(path))


def nested_ln(eps):
    return lambda: nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8, eps=eps), nn.Linear(8, 8)))


def plain_step(model, x):
    return model(x).square().mean()


EXPECTED_LN = {"L0": "Module.0.1.LayerNorm.forward.0", "L1": "Functional.layer_norm.0.forward",
               "mix": "Functional.layer_norm.0.forward", "L2": "Aten.native_layer_norm.0.forward"}


@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_layernorm_eps_is_named_at_every_level(tmp_path, level):
    npu = record(tmp_path / "npu", nested_ln(1e-2), plain_step, level=level)
    bench = record(tmp_path / "bench", nested_ln(1e-5), plain_step, level=level)
    d = compare(npu, bench).first_divergence()
    assert d is not None and d.call == EXPECTED_LN[level], d
    if level == "L0":  # the module's inputs agree and its outputs do not
        assert d.kind == "call"
    else:  # the API is called with another eps: its own argument differs
        assert d.kind == "argument" and "0.01" in d.message and "1e-05" in d.message


@pytest.mark.parametrize("level", ["L0", "L1", "mix", "L2"])
def test_identical_runs_never_diverge(tmp_path, level):
    a = record(tmp_path / "a", nested_ln(1e-5), plain_step, level=level)
    b = record(tmp_path / "b", nested_ln(1e-5), plain_step, level=level)
    assert compare(a, b).first_divergence() is None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.fc(x))


def dropout_step(seed):
    def step(model, x):
        torch.manual_seed(seed)  # the device generator right before the draw: two machines, two sequences
        return model(x).square().mean()
    return step


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_dropout_seed_is_traced_at_mix_too(tmp_path, level):
    npu = record(tmp_path / "npu", lambda: nn.Sequential(Block()), dropout_step(1), level=level)
    bench = record(tmp_path / "bench", lambda: nn.Sequential(Block()), dropout_step(2), level=level)
    result = compare(npu, bench)
    d = result.first_divergence()
    assert d.call == "Functional.dropout.0.forward"
    trace = trace_randomness(result)
    assert list(trace.sources.call) == ["Functional.dropout.0.forward"]
    assert any("dropout_off" in a for a in trace.advice)
    assert d.modules[0] == "Module.0.drop.Dropout.forward.0"


def test_layernorm_after_a_dropout_that_did_not_differ_is_not_blamed_on_it(tmp_path):
    def model_fn(eps):
        return lambda: nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.LayerNorm(8, eps=eps))
    npu = record(tmp_path / "npu", model_fn(1e-2), dropout_step(3), level="L1")
    bench = record(tmp_path / "bench", model_fn(1e-5), dropout_step(3), level="L1")
    result = compare(npu, bench)
    assert result.first_divergence().call == "Functional.layer_norm.0.forward"
    trace = trace_randomness(result)
    assert not trace.found and "not randomness" in trace.message, trace.message


def test_own_non_tensor_argument_is_the_root(tmp_path):
    def gelu(approx):
        return lambda m, x: F.gelu(m(x), approximate=approx).square().mean()
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    npu = record(tmp_path / "npu", model, gelu("tanh"), level="mix")
    bench = record(tmp_path / "bench", model, gelu("none"), level="mix")
    d = compare(npu, bench).first_divergence()
    assert d.call == "Functional.gelu.0.forward" and d.kind == "argument"
    assert "'tanh'" in d.message and "'none'" in d.message and "outside" not in d.message


def test_output_dtype_that_differs_with_agreeing_inputs_is_the_root(tmp_path):
    """Autocast makes the NPU side's matmul give bf16 from the same fp32 inputs; small integers keep the
    values exact, so only the dtype tells the runs apart."""
    def mm(autocast):
        def step(m, x):
            h = (m(x) * 4).round()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                y = torch.matmul(h, h.t())
            return y.float().square().mean()
        return step
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    npu = record(tmp_path / "npu", model, mm(True), level="L1")
    bench = record(tmp_path / "bench", model, mm(False), level="L1")
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.matmul.0.forward" and d.kind == "call", d


def permuted(seed):
    """A step that reorders the batch by a permutation drawn after reseeding with ``seed``."""
    def run(m, x):
        torch.manual_seed(seed)
        perm = torch.randperm(4)
        return m(x[perm]).cumsum(0).square().mean()
    return run


def linear8():
    return nn.Sequential(nn.Linear(8, 8))


def test_randperm_from_another_generator_state_is_the_root_in_statistics_mode(tmp_path):
    npu = record(tmp_path / "npu", linear8, permuted(1), level="L1")
    bench = record(tmp_path / "bench", linear8, permuted(2), level="L1")
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.randperm.0.forward", d


def test_md5_hashes_decide_in_auto_mode(tmp_path):
    npu = record(tmp_path / "npu", linear8, permuted(1), level="L1", summary_mode="md5")
    bench = record(tmp_path / "bench", linear8, permuted(2), level="L1", summary_mode="md5")
    result = compare(npu, bench)
    row = result[result["name"] == "Torch.randperm.0.forward.output.0"].iloc[0]
    assert bool(row["diverges"])
    assert result.first_divergence().call == "Torch.randperm.0.forward"


def test_uninitialised_memory_is_never_compared(tmp_path):
    def step(m, x):
        idx = torch.randperm(4, generator=torch.Generator().manual_seed(0))
        inv = torch.empty_like(idx)
        inv[idx] = torch.arange(4)
        noise = x.new_empty(x.shape).uniform_(-0.05, 0.05, generator=torch.Generator().manual_seed(3))
        return m((x + noise)[inv]).square().mean()
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    # garbage in the allocator's free lists differs between the two runs
    torch.empty(4096).fill_(7.0)
    a = record(tmp_path / "a", model, step, level="L1")
    torch.empty(4096).fill_(-3.0)
    b = record(tmp_path / "b", model, step, level="L1")
    result = compare(a, b)
    assert result.first_divergence() is None
    uninit = result[result["uninitialised"]]
    assert set(uninit["name"]) >= {"Torch.empty_like.0.forward.output.0", "Tensor.__setitem__.0.forward.input.0"}
    # once __setitem__ has written it, the tensor is its product and is compared again
    filled = result[result["name"] == "Tensor.__getitem__.0.forward.input.1"].iloc[0]
    assert filled["producer"] == "Tensor.__setitem__.0.forward" and not filled["uninitialised"]


def test_a_diverging_input_that_is_uninitialised_memory_is_not_a_root(tmp_path):
    """Tensor.uniform_ fills memory new_empty left uninitialised: with the same draw it agrees."""
    def step(m, x):
        noise = x.new_empty(x.shape).uniform_(-0.05, 0.05)
        return m(x + noise).square().mean()
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    torch.empty(64).fill_(1.0)
    a = record(tmp_path / "a", model, step, level="L1", seed=5)
    torch.empty(64).fill_(2.0)
    b = record(tmp_path / "b", model, step, level="L1", seed=5)
    assert compare(a, b).first_divergence() is None


def test_check_determinism_counts_a_backward_whose_forward_inputs_differ_as_inherited(tmp_path):
    from msprobe_nb.analysis.determinism import check_determinism

    def step(target):
        return lambda m, x: F.mse_loss(m(x), target)
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    a = record(tmp_path / "a", model, step(torch.zeros(4, 8)), level="L1")
    b = record(tmp_path / "b", model, step(torch.ones(4, 8)), level="L1")
    res = check_determinism(a, b)
    kinds = dict(zip(res["call"], res["kind"]))
    assert kinds["Functional.mse_loss.0.forward"] == "inherited"
    assert kinds["Functional.mse_loss.0.backward"] == "inherited"
    assert "nondeterministic" not in set(kinds.values())


def test_a_threshold_of_the_wrong_type_is_a_clear_error():
    from msprobe_nb.analysis.compare import CompareError
    with pytest.raises(CompareError, match="diverge_rtol must be a number"):
        compare(pd_table(), pd_table(), thresholds={"diverge_rtol": "x"})


def pd_table():
    import pandas as pd

    from msprobe_nb.store.schema import coerce_calls
    return coerce_calls(pd.DataFrame([dict(step=0, rank=0, call_index=0, call="Torch.add.0.forward",
                                           name="Torch.add.0.forward.output.0", io="output", arg="0", kind="tensor",
                                           dtype="torch.float32", shape=(2,), max=1.0, min=0.0, mean=0.5, norm=1.0)]))


def test_an_argument_with_a_default_repr_does_not_tell_identical_runs_apart(tmp_path):
    class Config:  # its default repr names its address, which changes from run to run
        scale = 2.0

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cfg):
            ctx.scale = cfg.scale
            return torch.mul(x, cfg.scale)

        @staticmethod
        def backward(ctx, g):
            return g * ctx.scale, None

    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    step = lambda m, x: Scaled.apply(m(x), Config()).sum()  # noqa: E731
    a = record(tmp_path / "a", model, step, level="L1")
    b = record(tmp_path / "b", model, step, level="L1")
    assert a.calls.loc[a.calls["name"] == "Function.Scaled.0.forward.input.1", "value"].iloc[0].count("0x") == 0
    assert compare(a, b).first_divergence() is None


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_an_argument_passed_on_one_side_only_is_the_root(tmp_path, level):
    """GELU's tanh swap is 1.5e-4 relative, under the default tolerance: the argument itself tells."""
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    npu = record(tmp_path / "npu", model, lambda m, x: F.gelu(m(x), approximate="tanh").sum(), level=level)
    bench = record(tmp_path / "bench", model, lambda m, x: F.gelu(m(x)).sum(), level=level)
    d = compare(npu, bench).first_divergence()
    assert d.call == {"L1": "Functional.gelu.0.forward", "L2": "Aten.gelu.0.forward"}[level], d
    assert d.kind == "argument" and "'tanh'" in d.message and "(not passed)" in d.message


def _one_output(dtype, value):
    import pandas as pd

    from msprobe_nb.store.schema import coerce_calls
    rows = [dict(step=0, rank=0, call_index=0, call="Torch.add.0.forward", name=f"Torch.add.0.forward.{io}.0", io=io,
                 arg="0", kind="tensor", dtype=dtype, shape=(2,), max=v, min=0.0, mean=v / 2, norm=v)
            for io, v in (("input", 1.0), ("output", value))]
    return coerce_calls(pd.DataFrame(rows))


def test_the_tolerance_follows_the_dtype():
    # 5e-3 relative is under bf16's resolution (2**-7), well over fp32's
    assert compare(_one_output("torch.bfloat16", 1.005), _one_output("torch.bfloat16", 1.0)).first_divergence() \
        is None
    assert compare(_one_output("torch.float32", 1.005), _one_output("torch.float32", 1.0)).first_divergence() \
        is not None
    # a GELU tanh swap (1.5e-4) is found in fp32 by asking for a tighter fp32 tolerance
    a, b = _one_output("torch.float32", 1.00015), _one_output("torch.float32", 1.0)
    assert compare(a, b).first_divergence() is None
    tight = {"diverge_rtol_by_dtype": {"torch.float32": 1e-5, "torch.bfloat16": 1e-2}}
    assert compare(a, b, thresholds=tight).first_divergence().call == "Torch.add.0.forward"


def test_attention_dropout_is_a_draw_and_dropout_off_removes_it(tmp_path):
    def step(seed):
        def run(m, x):
            torch.manual_seed(seed)
            q = m(x).reshape(1, 2, 4, 4)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).square().mean()
        return run
    model = lambda: nn.Sequential(nn.Linear(8, 8))  # noqa: E731
    result = compare(record(tmp_path / "npu", model, step(1), level="L1"),
                     record(tmp_path / "bench", model, step(2), level="L1"))
    assert result.first_divergence().call == "Functional.scaled_dot_product_attention.0.forward"
    trace = trace_randomness(result)
    assert list(trace.sources.call) == ["Functional.scaled_dot_product_attention.0.forward"]
    assert "dropout_p=0" in trace.advice[0]
    off = compare(record(tmp_path / "npu2", model, step(1), level="L1", dropout_off=True),
                  record(tmp_path / "bench2", model, step(2), level="L1", dropout_off=True))
    assert off.first_divergence() is None


def test_a_filtered_sorted_or_copied_result_keeps_its_methods(tmp_path):
    from msprobe_nb.analysis.compare import CompareError, CompareResult
    npu = record(tmp_path / "npu", nested_ln(1e-2), plain_step, level="mix")
    bench = record(tmp_path / "bench", nested_ln(1e-5), plain_step, level="mix")
    r = compare(npu, bench)
    want = r.first_divergence().call
    for derived in (r[r["io"] != "parameters"], r.copy(), r.sort_values("err"), r.query("step == 0"), r.head(10_000)):
        assert isinstance(derived, CompareResult) and derived.mode == r.mode
        assert derived.first_divergence().call == want
        assert derived.first_divergence().frame == r.first_divergence().frame  # stacks come along too
    forward = r[r["call"].str.endswith(".forward") | r["call"].str.contains(r"\.forward\.")]
    assert forward.counts()["rows"] == len(forward)
    assert r[r["call"] == "nothing"].first_divergence() is None
    with pytest.raises(CompareError, match="select rows"):
        r[["name", "err"]].first_divergence()


def test_compare_itself_says_when_the_dumps_cannot_tell_anything(tmp_path):
    """A dump against itself, or an MLP against a CNN: compare() says so at once, not only in the viewer."""
    mlp = record(tmp_path / "mlp", nested_ln(1e-5), plain_step, level="mix")
    with pytest.warns(UserWarning, match="same dump"):
        r = compare(mlp, mlp)
    assert any("same dump" in n for n in r.notes)
    cnn = record(tmp_path / "cnn", lambda: nn.Sequential(nn.Unflatten(1, (2, 4)), nn.Conv1d(2, 2, 3), nn.Flatten()),
                 lambda m, x: m(x).square().mean(), level="mix")
    with pytest.warns(UserWarning, match="same model"):
        compare(mlp, cnn, fuzzy=True)
