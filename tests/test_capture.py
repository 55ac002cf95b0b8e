"""Recording: non-interference (bit for bit), what the modes see, msprobe-compatible names, statistics."""
from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import msprobe_nb
from msprobe_nb.store.hdf5_reader import read_hdf5

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOY = SHARED / "interop" / "msprobe-cpu-toy-L1"


# ---------------------------------------------------------------- models
class Net(nn.Module):
    """The seed FAQ's model: a BatchNorm branch beside a Linear, summed."""

    def __init__(self):
        super().__init__()
        self.ln1 = nn.Linear(32, 32)
        self.bn1 = nn.BatchNorm1d(32)
        self.ln2 = nn.Linear(32, 32)

    def forward(self, x):
        return self.ln1(x) + self.ln2(self.bn1(x))


class BigNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = Net()
        self.net2 = Net()

    def forward(self, x):
        out1 = self.net1(x)
        return out1, self.net2(out1)


def _faq_backward_hook(module, grad_input, grad_output):
    pass


def make_bignet():
    model = BigNet()
    model.net2.register_full_backward_hook(_faq_backward_hook)
    return model


def bignet_step(record_kwargs=None):
    """The seed FAQ's script: loss = out1.sum() + out2.sum(), with the user's full backward hook on net2."""
    return generic_step(make_bignet, (3, 32), record_kwargs, seed=1234, loss_of=lambda out: out[0].sum() + out[1].sum())


Pair = collections.namedtuple("Pair", "a b")


class InplaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 6)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(6, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class PairBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return Pair(y.relu(), y.tanh())


class PairNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = PairBlock()

    def forward(self, x):
        p = self.block(x)
        assert isinstance(p, Pair), type(p)
        return p.a.sum() + p.b.sum()


def generic_step(make_model, shape, record_kwargs=None, *, seed=7, loss_of=lambda out: out.sum()):
    """Loss and every parameter gradient of one step, with recording (``record_kwargs``) or without."""
    torch.manual_seed(seed)
    model = make_model()
    x = torch.randn(*shape)

    def run():
        loss = loss_of(model(x))
        loss.backward()
        return loss

    if record_kwargs is None:
        loss = run()
    else:
        with msprobe_nb.record(model=model, **record_kwargs) as dbg:
            loss = run()
        assert dbg.errors == []
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.dim() else a, b.view(
        torch.uint8) if b.dim() else b)


def _torch_namespace_snapshot():
    spaces = {"torch": torch, "F": F, "Tensor": torch.Tensor, "init": nn.init, "nn.Module": nn.Module}
    return {(k, n): getattr(ns, n) for k, ns in spaces.items() for n in dir(ns) if not n.startswith("__")}


LEVELS = ["L0", "L1", "mix", "L2"]


# ---------------------------------------------------------------- non-interference
@pytest.fixture(params=["c", "python"])
def fast_paths(request, monkeypatch):
    """Both ways the kit reads tensors: the optional C kernel, stack walk, row builder, handler, API backward and
    module hooks where built, and the torch / Python fallbacks (the batch staging of small tensors runs only
    without the kernel)."""
    if request.param == "python":
        import msprobe_nb.capture.api_mode as api_mode_mod
        import msprobe_nb.capture.grad_hooks as grad_hooks_mod
        import msprobe_nb.capture.module_hooks as module_hooks_mod
        import msprobe_nb.capture.recorder as recorder_mod
        import msprobe_nb.capture.stacks as stacks_mod
        import msprobe_nb.capture.stats as stats_mod
        monkeypatch.setattr(stats_mod, "_fused_at", None)
        monkeypatch.setattr(stacks_mod, "_stack_key", None)
        monkeypatch.setattr(recorder_mod, "_build_rows", None)
        monkeypatch.setattr(api_mode_mod, "_api_handler", None)
        monkeypatch.setattr(grad_hooks_mod, "_api_backward", None)
        monkeypatch.setattr(module_hooks_mod, "_module_hooks", None)
    return request.param


@pytest.mark.parametrize("level", LEVELS)
def test_bignet_bitwise_identical_with_recording(level, tmp_path, fast_paths):
    loss0, grads0 = bignet_step()
    loss1, grads1 = bignet_step({"level": level, "dump_path": tmp_path / "d"})
    assert _bitwise_equal(loss0, loss1)
    assert grads0.keys() == grads1.keys()
    for name in grads0:
        assert _bitwise_equal(grads0[name], grads1[name]), name
    calls = read_hdf5(tmp_path / "d").calls
    assert len(calls) > 0
    if level == "L0":
        assert set(calls.family) == {"Module"}
    if level in ("L0", "mix"):
        assert "Module.net2.bn1.BatchNorm1d.forward.0" in set(calls.call)
        assert any(c.startswith("Module.net2.Net.backward") for c in calls.call)
        assert any(".parameters_grad." in c for c in calls.call)
    if level in ("L1", "mix"):
        assert "Functional.batch_norm.0.forward" in set(calls.call)
        assert "Functional.linear.0.backward" in set(calls.call)
    if level == "L2":
        assert (calls.family == "Aten").all()
        assert set(calls.direction) == {"forward", "backward"}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("make_model,shape", [(InplaceNet, (5, 6)), (PairNet, (3, 4))], ids=["inplace", "namedtuple"])
def test_inplace_and_namedtuple_models_bitwise_identical(level, make_model, shape, tmp_path, fast_paths):
    loss0, grads0 = generic_step(make_model, shape)
    loss1, grads1 = generic_step(make_model, shape, {"level": level, "dump_path": tmp_path / "d"})
    assert _bitwise_equal(loss0, loss1)
    for name in grads0:
        assert _bitwise_equal(grads0[name], grads1[name]), name


def test_no_torch_function_object_is_replaced(tmp_path):
    before = _torch_namespace_snapshot()
    gelu = F.gelu
    with msprobe_nb.record(dump_path=tmp_path / "d", level="mix", dropout_off=True, host_random=True):
        during = _torch_namespace_snapshot()
        assert F.gelu is gelu
        F.gelu(torch.randn(3))
    after = _torch_namespace_snapshot()
    changed = [k for k in before if during.get(k) is not before[k] and not isinstance(before[k], (int, float, str))]
    assert changed == []
    assert [k for k in before if after.get(k) is not before[k] and not isinstance(before[k], (int, float, str))] == []


# ---------------------------------------------------------------- what is seen
def test_detached_import_custom_op_and_operators_are_recorded(tmp_path):
    from torch import relu

    lib = torch.library.Library("msprobe_nb_test", "FRAGMENT")
    lib.define("fused_scale(Tensor x, float s) -> Tensor")
    lib.impl("fused_scale", lambda x, s: x * s, "CompositeExplicitAutograd")
    x = torch.randn(4, 3)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        y = relu(x)
        z = torch.ops.msprobe_nb_test.fused_scale(y, 2.0)
        w = (z + 1) * z
        w[0] = 3.0
        _ = w[1:] @ w[1:].T
        _ = -w
    calls = set(read_hdf5(tmp_path / "d").calls.call)
    for name in ("Torch.relu.0.forward", "msprobe_nb_test.fused_scale.0.forward", "Tensor.__add__.0.forward",
                 "Tensor.__mul__.0.forward", "Tensor.__setitem__.0.forward", "Tensor.__getitem__.0.forward",
                 "Tensor.__matmul__.0.forward", "Tensor.__neg__.0.forward"):
        assert name in calls, (name, sorted(calls))


def test_torch_compile_runs_without_recompiling_per_call(tmp_path):
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps the frames earlier tests compiled in this process

    def f(x):
        return torch.sin(x) * 2 + 1

    cf = torch.compile(f, backend="eager")
    x = torch.randn(8)
    expected = f(x)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        outs = [cf(x) for _ in range(6)]
    for o in outs:
        assert torch.equal(o, expected)
    frames = torch._dynamo.utils.counters["frames"]
    assert frames["ok"] <= 2, dict(frames)
    torch._dynamo.reset()


def test_inputs_of_inplace_ops_are_recorded_before_mutation(tmp_path):
    x = torch.zeros(3)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        x.add_(5)
    calls = read_hdf5(tmp_path / "d").calls.set_index("name")
    assert calls.loc["Tensor.add_.0.forward.input.0", "max"] == 0.0
    assert calls.loc["Tensor.add_.0.forward.output.0", "max"] == 5.0


@pytest.mark.parametrize("split", ["c", "python"])
def test_keyword_arguments_are_marked_as_such(split, tmp_path, fast_paths, monkeypatch):
    """is_kwarg (msprobe's input_kwargs) holds for the keyword arguments' rows and no other, whichever way
    the rows were built and split into columns."""
    import msprobe_nb.capture.recorder as recorder_mod
    if split == "python":
        monkeypatch.setattr(recorder_mod, "_split_rows", None)
    x, w, b = torch.randn(2, 3), torch.randn(4, 3), torch.randn(4)
    with msprobe_nb.record(dump_path=tmp_path / "d", level="L1"):
        F.linear(x, w, bias=b)
        torch.add(x, x, alpha=2)
    calls = read_hdf5(tmp_path / "d").calls
    kw = set(calls.name[calls.is_kwarg.astype(bool)])
    assert kw == {"Functional.linear.0.forward.input.bias", "Torch.add.0.forward.input.alpha"}
    assert {"Functional.linear.0.forward.input.0", "Functional.linear.0.forward.input.1",
            "Functional.linear.0.forward.output.0", "Torch.add.0.forward.input.1"} <= set(calls.name) - kw


# ---------------------------------------------------------------- statistics
def test_statistics_for_every_kind_of_tensor(tmp_path):
    cases = {
        "bool": torch.tensor([True, False, True, True]),
        "int": torch.tensor([[1, -7], [3, 4]], dtype=torch.int32),
        "f64": torch.tensor([1e100, -2.0, 3.0], dtype=torch.float64),
        "cplx": torch.tensor([3 + 4j, 0 + 0j], dtype=torch.complex64),
        "zero_d": torch.tensor(-2.5),
        "empty": torch.zeros(0, 3),
        "bf16": torch.tensor([1.5, -0.25, 8.0], dtype=torch.bfloat16),
        "nonfinite": torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), float("nan")]),
    }
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        for t in cases.values():
            torch.clone(t)
    calls = read_hdf5(tmp_path / "d").calls
    rows = calls[calls.name.str.endswith("forward.input.0")].reset_index(drop=True)
    got = {k: rows.iloc[i] for i, k in enumerate(cases)}

    def check(k, mx, mn, mean, norm, nans=0, pinf=0, ninf=0):
        r = got[k]
        for col, want in (("max", mx), ("min", mn), ("mean", mean), ("norm", norm)):
            v = r[col]
            assert (v != v and want != want) or v == pytest.approx(want, rel=1e-6), (k, col, v, want)
        assert (r.nan_count, r.posinf_count, r.neginf_count) == (nans, pinf, ninf), k

    check("bool", 1.0, 0.0, 0.75, 3 ** 0.5)
    check("int", 4, -7, 0.25, (1 + 49 + 9 + 16) ** 0.5)
    check("f64", 1e100, -2.0, 1e100 / 3, 1e100)
    check("cplx", 5.0, 0.0, 2.5, 5.0)
    check("zero_d", -2.5, -2.5, -2.5, 2.5)
    check("empty", float("nan"), float("nan"), float("nan"), float("nan"))
    check("bf16", 8.0, -0.25, (1.5 - 0.25 + 8.0) / 3, (1.5 ** 2 + 0.0625 + 64) ** 0.5)
    r = got["nonfinite"]
    assert (r.nan_count, r.posinf_count, r.neginf_count) == (2, 1, 1)
    assert got["zero_d"]["shape"] == ()
    assert got["bool"]["dtype"] == "torch.bool"


def test_md5_and_tensor_tasks(tmp_path):
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    with msprobe_nb.record(dump_path=tmp_path / "h", summary_mode="md5"):
        torch.relu(x)
    calls = read_hdf5(tmp_path / "h").calls
    import zlib
    assert calls.hash.iloc[0] == f"{zlib.crc32(x.numpy().tobytes()):08x}"
    with msprobe_nb.record(dump_path=tmp_path / "t", task="tensor"):
        y = torch.relu(x - 2)
        y.add_(1)
    parts = read_hdf5(tmp_path / "t")
    c = parts.calls.set_index("name")
    pre = parts.tensor_loader(c.loc["Tensor.add_.0.forward.input.0", "data_name"])
    post = parts.tensor_loader(c.loc["Tensor.add_.0.forward.output.0", "data_name"])
    assert torch.equal(pre, torch.relu(x - 2)) and torch.equal(post, torch.relu(x - 2) + 1)


def test_the_tensor_task_keeps_every_kind_of_input_exactly(tmp_path):
    """Saved inputs read back with their dtype, shape and bits, whichever way the copy was made: numpy for the
    dtypes numpy holds (a 0-d tensor and a transposed view too), a torch clone for bfloat16, complex, a
    negative view and a tensor over NUMPY_COPY_MAX_BYTES."""
    inputs = {"scalar": torch.tensor(1.5), "transposed": torch.arange(6.0).reshape(2, 3).t(),
              "ints": torch.arange(4), "flags": torch.tensor([True, False]), "half": torch.ones(3, dtype=torch.float16),
              "bf16": torch.ones(3, dtype=torch.bfloat16) / 3, "complex": torch.tensor([1 + 2j, -3j]),
              "negative view": torch._neg_view(torch.tensor([1.0, -2.0])), "large": torch.randn(100, 200)}
    with msprobe_nb.record(dump_path=tmp_path / "t", task="tensor"):
        for t in inputs.values():
            torch.clone(t)
    parts = read_hdf5(tmp_path / "t")
    c = parts.calls.set_index("name")
    for i, (what, t) in enumerate(inputs.items()):
        got = parts.tensor_loader(c.loc[f"Torch.clone.{i}.forward.input.0", "data_name"])
        assert got.dtype == t.dtype and got.shape == t.shape, what
        want = t.resolve_neg().contiguous()
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), what


@pytest.mark.parametrize("compress", [False, True])
def test_compress_tensors_compresses_the_buffers_with_the_tables_codec_and_keeps_every_bit(tmp_path, compress):
    """docs/config.md, compress_tensors: the tensor buffers take the tables' bitshuffle + LZ4, else none."""
    import h5py

    inputs = [torch.randn(300, 7), torch.randn(50, dtype=torch.float64), torch.ones(9, dtype=torch.bfloat16) / 3]
    with msprobe_nb.record(dump_path=tmp_path / "t", task="tensor", compress_tensors=compress):
        for t in inputs:
            torch.clone(t)
    with h5py.File(tmp_path / "t" / "rank0.h5", "r") as h:
        for w in (2, 4, 8):
            plist = h[f"tensors/u{w}"].id.get_create_plist()
            ids = [plist.get_filter(i)[0] for i in range(plist.get_nfilters())]
            assert ids == ([32008] if compress else []), (w, ids)
    parts = read_hdf5(tmp_path / "t")
    c = parts.calls.set_index("name")
    for i, t in enumerate(inputs):
        got = parts.tensor_loader(c.loc[f"Torch.clone.{i}.forward.input.0", "data_name"])
        assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), i


# ---------------------------------------------------------------- names as msprobe writes them
def test_a_torch_function_is_named_by_its_own_name_not_an_equal_aliass():
    """torch's index names torch.mm "torch.spmm" (equal builtins share one entry); msprobe wraps torch.mm by name
    and records Torch.mm, so the kit names it so (and the alias, which is the same function, alike)."""
    from msprobe_nb.capture.naming import resolve_api
    assert resolve_api(torch.mm) == ("Torch", "mm") and resolve_api(torch.spmm) == ("Torch", "mm")
    assert resolve_api(torch.hsmm) == ("Torch", "hsmm") and resolve_api(torch.add) == ("Torch", "add")
    assert resolve_api(torch.linalg.cholesky) == ("Torch", "linalg.cholesky")
    assert resolve_api(torch.nn.functional.logsigmoid) == ("Functional", "logsigmoid")


@pytest.mark.skipif(not TOY.exists(), reason=f"msprobe interop data not found at {TOY}")
def test_names_and_statistics_line_up_with_msprobe_dump(tmp_path):
    import argparse
    sys.path.insert(0, str(TOY))
    try:
        import model as toy
    finally:
        sys.path.remove(str(TOY))
    args = toy.add_model_args(argparse.ArgumentParser()).parse_args(["--variant", "bench"])
    model, opt, make_batch = toy.build(args)
    tokens, labels = make_batch()
    with msprobe_nb.record(dump_path=tmp_path / "d", level="L1"):
        toy.train_step(model, opt, tokens, labels)
    ours = read_hdf5(tmp_path / "d").calls
    ref = json.loads((TOY / "stat_L1_bench" / "dump.json").read_text())["data"]
    order = [c for c in dict.fromkeys(ours.call) if c in ref]
    # msprobe's default risk_level drops view-like APIs; everything it recorded we record, in its order
    assert order == list(ref)
    # and the forward statistics agree with msprobe's own numbers
    by_name = ours.set_index("name")
    checked = 0
    for call, rec in ref.items():
        if not call.endswith("forward"):
            continue
        for i, leaf in enumerate(rec["output"]):
            if isinstance(leaf, dict) and leaf.get("type") == "torch.Tensor" and leaf.get("Mean") is not None:
                row = by_name.loc[f"{call}.output.{i}"]
                for key in ("Max", "Min", "Mean", "Norm"):
                    assert row[key.lower()] == pytest.approx(leaf[key], rel=1e-5, abs=1e-6), (call, key)
                checked += 1
    assert checked > 40


# ---------------------------------------------------------------- crash safety
CRASH_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch, msprobe_nb
    dump = sys.argv[1]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = msprobe_nb.Debugger(dump_path=dump, level="mix")
    dbg.start(model)
    for step in range(5):
        if step == 3:
            model(torch.randn(2, 4)).sum()          # half of step 3 is recorded, then the process dies
            os.kill(os.getpid(), signal.SIGKILL)
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.step()
""")


def test_sigkill_during_step_3_leaves_steps_0_to_2_readable(tmp_path):
    dump = tmp_path / "run killed"
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(dump)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    calls = read_hdf5(dump).calls
    assert sorted(calls.step.unique()) == [0, 1, 2]
    for step in range(3):
        names = set(calls[calls.step == step].call)
        assert "Module.0.Linear.forward.0" in names and "Module.2.Linear.parameters_grad.0" in names
        assert "Tensor.add_.0.forward" in names  # the optimizer step
    assert os.path.getsize(dump / "rank0.h5") > 0


def test_steps_counters_restart_and_step_filter(tmp_path):
    lin = nn.Linear(3, 3)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1", step=[1, 2])
    dbg.start(lin)
    for _ in range(4):
        lin(torch.randn(2, 3)).sum().backward()
        dbg.step()
    dbg.close()
    calls = read_hdf5(tmp_path / "d").calls
    assert sorted(calls.step.unique()) == [1, 2]
    for step in (1, 2):
        assert "Functional.linear.0.forward" in set(calls[calls.step == step].call)
        assert "Functional.linear.1.forward" not in set(calls[calls.step == step].call)


def test_dumping_twice_to_one_path_never_overwrites(tmp_path):
    path = tmp_path / "runs" / "npu 运行"
    with msprobe_nb.record(dump_path=path) as d1:
        torch.relu(torch.ones(2))
    with pytest.warns(UserWarning), msprobe_nb.record(dump_path=path) as d2:
        torch.relu(torch.ones(3))
    assert d1.dump_dir != d2.dump_dir
    first, second = read_hdf5(d1.dump_dir).calls, read_hdf5(d2.dump_dir).calls
    assert first.set_index("name").loc["Torch.relu.0.forward.output.0", "shape"] == (2,)
    assert second.set_index("name").loc["Torch.relu.0.forward.output.0", "shape"] == (3,)


# ---------------------------------------------------------------- filters
def _filtered(tmp_path, name, **kw):
    torch.manual_seed(0)
    model = InplaceNet()
    x = torch.randn(5, 6)
    with msprobe_nb.record(dump_path=tmp_path / name, model=model, **kw):
        model(x).sum().backward()
    return read_hdf5(tmp_path / name).calls


def test_list_filter_keeps_named_calls_and_everything_inside_named_modules(tmp_path):
    calls = set(_filtered(tmp_path, "l", level="L1", list=["relu"]).call)
    assert calls == {"Functional.relu.0.forward", "Functional.relu.0.backward"}
    inside = set(_filtered(tmp_path, "m", level="mix", list=["Module.fc2"]).call)
    assert "Module.fc2.Linear.forward.0" in inside and "Functional.linear.1.forward" in inside
    assert "Functional.linear.0.forward" not in inside and "Functional.relu.0.forward" not in inside


def test_scope_filter_records_from_first_to_last_name(tmp_path):
    calls = list(dict.fromkeys(_filtered(tmp_path, "s", level="L1",
                                         scope=["Functional.relu.0.forward", "Functional.linear.1.forward"]).call))
    assert calls[:2] == ["Functional.relu.0.forward", "Functional.linear.1.forward"]
    assert "Functional.linear.0.forward" not in calls and "Tensor.sum.0.forward" not in calls


def test_data_mode_filter(tmp_path):
    fwd_in = _filtered(tmp_path, "f", level="L1", data_mode=["forward", "input"])
    assert set(fwd_in.direction) == {"forward"} and set(fwd_in.io) == {"input"}
    bwd = _filtered(tmp_path, "b", level="mix", data_mode=["backward"])
    assert set(bwd.direction) <= {"backward", "parameters_grad"} and len(bwd) > 0


def test_rank_filter_leaves_other_ranks_untouched(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "r", rank=[0])
    dbg.start()
    torch.relu(torch.ones(2))
    dbg.close()
    assert dbg.dump_dir is None  # rank 1 is not dumped: nothing written


@pytest.mark.parametrize("task", ["statistics", "tensor"])
def test_the_kits_own_writes_are_never_recorded(task, tmp_path):
    """Writing a step (tensor copies, byte views) happens while recording: none of it may be seen as a call."""
    lin = nn.Linear(3, 3)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", task=task)
    dbg.start(lin)
    lin(torch.randn(2, 3)).sum().backward()
    dbg.step()  # opens the writer
    rec, writer = dbg._recorder, dbg._writer
    seen = []
    original = writer.write_step

    def write_step(*args, **kwargs):
        before = rec.call_index
        original(*args, **kwargs)
        seen.append(rec.call_index - before)

    writer.write_step = write_step
    for _ in range(2):
        lin(torch.randn(2, 3)).sum().backward()
        dbg.step()
    dbg.close()
    assert seen == [0, 0]
    calls = read_hdf5(tmp_path / "d").calls
    per_step = [list(dict.fromkeys(calls[calls.step == s].call)) for s in range(3)]
    assert per_step[0] == per_step[1] == per_step[2]


def test_reshaped_outputs_reuse_their_inputs_statistics_correctly(tmp_path):
    x = torch.randn(6, 5)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        y = x.t().contiguous()
        z = y.reshape(-1)
        z.mul_(2)  # in place after the reuse: its statistics must be computed anew
        torch.relu(z)
    c = read_hdf5(tmp_path / "d").calls.set_index("name")
    for name in ("Tensor.t.0.forward.output.0", "Tensor.contiguous.0.forward.output.0",
                 "Tensor.reshape.0.forward.output.0"):
        for col, want in (("max", x.max()), ("min", x.min()), ("mean", x.mean()), ("norm", x.norm())):
            assert c.loc[name, col] == pytest.approx(float(want), rel=1e-6), (name, col)
    assert c.loc["Torch.relu.0.forward.input.0", "max"] == pytest.approx(float(2 * x.max()), rel=1e-6)


def test_gradients_through_reshapes_reuse_statistics_correctly(tmp_path):
    x = torch.randn(6, 5, requires_grad=True)
    w = torch.randn(30)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        h = x * 3
        y = h.t().reshape(-1)
        (y * w).sum().backward()
    c = read_hdf5(tmp_path / "d").calls.set_index("name")
    g = w.reshape(5, 6)  # the gradient arriving at the reshape's output, in the transposed layout
    for name in ("Tensor.reshape.0.backward.input.0", "Tensor.reshape.0.backward.output.0",
                 "Tensor.t.0.backward.input.0", "Tensor.t.0.backward.output.0"):
        for col, want in (("max", g.max()), ("min", g.min()), ("mean", g.mean()), ("norm", g.norm())):
            assert c.loc[name, col] == pytest.approx(float(want), rel=1e-6), (name, col)
    assert c.loc["Tensor.__mul__.0.backward.output.0", "max"] == pytest.approx(float((3 * g).max()), rel=1e-6)


def _fresh_interpreter(code: str) -> str:
    """What ``code`` prints, run in a new interpreter (what it imports is then its own); it must succeed."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_recording_does_not_import_pandas_or_widgets(tmp_path):
    """A training process that only records pays for neither pandas nor ipywidgets (memory, start-up)."""
    code = ("import sys, torch, msprobe_nb\n"
            f"with msprobe_nb.record(dump_path={str(tmp_path / 'd')!r}, level='mix'):\n"
            "    torch.nn.Linear(2, 2)(torch.ones(1, 2)).sum().backward()\n"
            "print(sorted(m for m in ('pandas', 'ipywidgets', 'matplotlib') if m in sys.modules))\n")
    assert _fresh_interpreter(code) == "[]"


def test_recording_an_uncompiled_model_does_not_load_dynamo(tmp_path):
    """The module hooks ask whether a module is torch.compile's wrapper at every call: without a compiled model
    that costs neither torch._dynamo's import (most of a second, and its memory, where no torch optimizer has
    loaded it) nor an import statement a call. A compiled model loads dynamo itself, and is then recognised
    (tests/test_compile.py)."""
    code = ("import sys, torch, msprobe_nb\n"
            "m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())\n"
            "for level in ('L0', 'L1', 'mix'):\n"
            f"    with msprobe_nb.record(dump_path={str(tmp_path)!r} + '/' + level, level=level, model=m):\n"
            "        m(torch.ones(1, 2)).sum().backward()\n"
            "print('torch._dynamo' in sys.modules)\n")
    assert _fresh_interpreter(code) == "False"


def test_device_statistics_path_agrees_with_the_cpu_path():
    """Accelerators use _device_stats (no .item() per call, one read-back per step); run that code on the CPU."""
    from msprobe_nb.capture.stats import Summarizer, _cpu_stats, _device_stats
    cases = [torch.randn(4, 5), torch.tensor([True, False, True]), torch.tensor([[1, -7], [3, 4]]),
             torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]), torch.tensor(-2.5),
             torch.zeros(0, 3), torch.randn(6, dtype=torch.bfloat16), torch.tensor([3 + 4j, 1j])]
    for t in cases:
        dev = _device_stats(t)
        assert isinstance(dev, torch.Tensor) and dev.dtype == torch.float64 and dev.shape == (7,)
        for got, want in zip(dev.tolist(), _cpu_stats(t)):
            assert (got != got and want != want) or got == pytest.approx(want, rel=1e-5, abs=1e-6), (t, got, want)
    s = Summarizer()
    s._values = [_cpu_stats(cases[0]), _device_stats(cases[1]), _cpu_stats(cases[2])]  # mixed, as on a GPU run
    s._hashes = []
    out, _ = s.materialize()
    assert out.shape == (3, 7) and out[1, 0] == 1.0 and out[2, 1] == -7.0


def test_batched_statistics_agree_with_one_tensor_at_a_time(monkeypatch):
    """Small float32 CPU tensors are copied into per-size buffers and reduced in batches: the values must be
    those of _cpu_stats, a later in-place change must not leak in, and a full buffer must reduce mid-step."""
    from msprobe_nb.capture import stats
    from msprobe_nb.capture.stats import Summarizer, _cpu_stats
    monkeypatch.setattr(stats, "_fused_at", None)  # the torch path, as without the C kernel
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(8, 16, 64, generator=g) * 100, torch.randn(3, generator=g), torch.tensor(-2.5),
             torch.randn(64, 8, generator=g).t(),  # not contiguous
             torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), float("nan")]),
             torch.tensor([float("inf"), 2.0]), torch.full((5,), 3e38),
             torch.randn(4, 6, generator=g).requires_grad_(),  # viewed through numpy(force=True)
             torch.randn(6, 4, generator=g).requires_grad_().t()]  # ...and copied: not contiguous
    # 8192 elements: a buffer of 2 rows, then 4, 8 and 16: it fills and grows three times, 5 rows stay staged
    cases += [torch.randn(8, 16, 64, generator=g) for _ in range(19)]
    monkeypatch.setattr(stats, "STAGE_FIRST_BYTES", 4 * 8192)
    monkeypatch.setattr(stats, "STAGE_BYTES", 16 * 4 * 8192)
    s = Summarizer()
    want = [_cpu_stats(t) for t in cases]
    idx = [s.summarize(t) for t in cases]
    assert s._values[idx[1]] is None  # staged, not yet reduced
    assert s._values[idx[0]] is not None  # the first full buffer was reduced during the step
    assert s._batches._groups[8192][0].shape == (16, 8192)  # doubled each time it filled, up to STAGE_BYTES
    with torch.no_grad():
        for t in cases:
            t.mul_(-7)  # after staging: must not change what was recorded
    out, _ = s.materialize()
    for i, w in zip(idx, want):
        for got, exp in zip(out[i], w):
            assert (got != got and exp != exp) or got == pytest.approx(exp, rel=1e-5, abs=1e-6), (i, got, exp)
    s.summarize(torch.randn(4))
    s.reset()  # a discarded step's staged tensors are dropped
    assert s.summarize(torch.ones(4)) == 0
    out, _ = s.materialize()
    assert out.tolist() == [[1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0]]


def test_modules_added_between_steps_get_their_paths(tmp_path):
    """start(model) skips re-walking an unchanged model; changed models and deeper additions are still named."""
    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU()))
    x = torch.randn(2, 3)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L0")
    dbg.start(model)
    model(x)
    dbg.stop()
    dbg.step()
    model[1].append(nn.Tanh())  # deeper: same top-level children
    model.append(nn.Linear(3, 1))  # top level: the model is walked again
    dbg.start(model)
    model(x)
    dbg.stop()
    dbg.close()
    calls = read_hdf5(tmp_path / "d").calls
    step1 = set(calls[calls.step == 1].call)
    assert "Module.1.1.Tanh.forward.0" in step1 and "Module.2.Linear.forward.0" in step1


def _torch_stats(t):
    """max, min, mean, norm and the NaN / +inf / -inf counts of ``t`` with torch's own reductions."""
    t = t.detach().to(torch.float32)
    return [t.amax().item(), t.amin().item(), t.mean().item(), torch.linalg.vector_norm(t).item(),
            float(t.isnan().sum()), float(t.isposinf().sum()), float(t.isneginf().sum())]


def _agree(got, want):
    for g, w in zip(got, want):
        assert (g != g and w != w) or g == pytest.approx(w, rel=1e-6, abs=1e-7), (got, want)


FUSED_SIZES = [1, 7, 31, 32, 33, 255, 511, 512, 513, 1000, 8192, 24576, 32768, 100_003]


@pytest.mark.parametrize("n", FUSED_SIZES)
def test_the_c_kernel_gives_torchs_statistics(n):
    """The optional one-pass C kernel (setup.py) against torch's reductions, for sizes around its vector
    blocks and fold points, with NaN or inf at the start, inside the vector blocks or in the tail."""
    from msprobe_nb.capture import stats
    if stats._fused_at is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install); "
                    "statistics use torch's reductions")
    g = torch.Generator().manual_seed(n)
    base = [torch.randn(n, generator=g) * 3, torch.rand(n, generator=g) - 7.5, torch.full((n,), 2.5),
            torch.randn(n, generator=g) * 1e30]  # 1e30: squares beyond float32, the norm is inf as in torch
    for t in base:
        _agree(stats._fused_stats(t, n), _torch_stats(t))
        mx, mn, s, norm = stats._fused_at(t.data_ptr(), n)
        assert (mx, mn) == (t.amax().item(), t.amin().item())
    for pos in {0, n // 2, n - 1}:
        for bad in (float("nan"), float("inf"), -float("inf")):
            t = torch.randn(n, generator=g)
            t[pos] = bad
            # not finite: read once more, for torch's statistics of it and its counts
            _agree(stats._fused_stats(t, n), _torch_stats(t))
            mx = stats._fused_at(t.data_ptr(), n)[0]
            assert (mx != mx) if bad != bad else mx == max(bad, t[t.isfinite()].max().item() if n > 1 else bad)
            _agree(stats._cpu_stats(t), _torch_stats(t))


def _strided_views():
    """Float32 views that are not contiguous, as models make them: attention heads, a split projection, a
    class token, strided and expanded views, channels-last, a large transpose; (name, view)."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 17, 2, 16, generator=g)
    return [("heads", base.transpose(1, 2)), ("permute", base.permute(3, 1, 0, 2)), ("token", base[:, 0]),
            ("column", base[..., 3]), ("every other", base[:, ::2]), ("step 3, inner", base[..., ::3]),
            ("expand", torch.randn(4, 1, 32, generator=g).expand(4, 5, 32)),
            ("expand inner", torch.randn(3, 1, generator=g).expand(3, 7)),
            ("split projection", torch.randn(4, 16, 96, generator=g)[..., 32:64]),
            ("channels last", torch.randn(2, 3, 5, 5, generator=g).to(memory_format=torch.channels_last)),
            ("offset slice", torch.randn(10, 10, generator=g)[3:, 4:]),
            ("large transpose", torch.randn(600, 700, generator=g).t()),
            ("unit dims", torch.randn(1, 6, 1, 4, generator=g).transpose(1, 3)),
            ("grad view", torch.randn(8, 6, generator=g, requires_grad=True).t())]


@pytest.mark.parametrize("name", [n for n, _ in _strided_views()])
def test_the_c_kernel_reads_views_along_their_strides(name):
    """A view that is not contiguous gets the kernel's statistics of its own elements (a repeated element of
    an expanded view counted as often as it shows), as torch's reductions give them; with a NaN or an inf
    in it, torch's statistics and counts of it."""
    from msprobe_nb.capture import stats
    if stats._strided_at is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install)")
    view = dict(_strided_views())[name]
    assert not view.is_contiguous()
    dense = view.detach().contiguous()
    exact = dense.double()  # float64 sums: torch's float32 norm of the large transpose is 4e-6 off, the kernel's not
    _agree(stats._fused_stats(view, view.numel()),
           [exact.max().item(), exact.min().item(), exact.mean().item(), exact.norm().item(), 0.0, 0.0, 0.0])
    mx, mn, _, _ = stats._strided_at(view.data_ptr(), view.shape, view.stride())
    assert (mx, mn) == (dense.amax().item(), dense.amin().item())
    if 0 in view.stride():  # an expanded view cannot be written through
        return
    for bad in (float("nan"), float("inf"), -float("inf")):  # in its first and in its last element
        for at in (0, -1):
            spoilt = dict(_strided_views())[name].detach()
            spoilt[(at,) * spoilt.dim()] = bad
            _agree(stats._fused_stats(spoilt, spoilt.numel()), _torch_stats(spoilt))
            _agree(stats._cpu_stats(spoilt), _torch_stats(spoilt))
    spoilt = dict(_strided_views())[name].detach()  # both infinities: the sum and mean are NaN
    spoilt[(0,) * spoilt.dim()], spoilt[(-1,) * spoilt.dim()] = float("inf"), -float("inf")
    _agree(stats._fused_stats(spoilt, spoilt.numel()), _torch_stats(spoilt))


def test_the_strided_kernel_refuses_layouts_it_does_not_read():
    """A negative stride or more dimensions than it takes: None (torch's path); a shape and strides of
    different lengths or not ints: an error, never a read."""
    from msprobe_nb.capture import stats
    if stats._strided_at is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install)")
    t = torch.randn(4, 4)
    assert stats._strided_at(t.data_ptr(), (4,), (-1,)) is None
    assert stats._strided_at(t.data_ptr(), (1,) * 30, (1,) * 30) is None
    with pytest.raises(ValueError, match="different lengths"):
        stats._strided_at(t.data_ptr(), (2, 2), (1,))
    with pytest.raises(TypeError):
        stats._strided_at(t.data_ptr(), (2, "a"), (1, 2))


class _Sub(torch.Tensor):
    """A tensor subclass (some wrap other tensors or have no storage of their own)."""


def test_the_summarizer_uses_the_c_kernel_where_it_applies(monkeypatch):
    """Float32 CPU tensors of any size and layout go through the kernel at once (nothing is staged: a transpose
    and a tensor with NaN neither); negative views and other dtypes take torch's path; without the kernel the
    values are the same."""
    from msprobe_nb.capture import stats
    from msprobe_nb.capture.stats import Summarizer
    if stats._fused_at is None:
        pytest.skip("msprobe_nb.capture._fused_stats is not built (no C compiler at install)")
    g = torch.Generator().manual_seed(1)
    cases = [torch.randn(8, 16, 64, generator=g), torch.randn(40_000, generator=g),
             torch.randn(6, 4, generator=g).requires_grad_(), torch.randn(64, 8, generator=g).t(),
             torch.tensor(3.0), torch.randn(5, dtype=torch.float64, generator=g),
             torch.tensor([1.0, float("nan")]), torch.nn.Parameter(torch.randn(3, 3, generator=g)),
             torch._neg_view(torch.randn(5, generator=g))]  # same memory as its base, read negated
    # a subclass's data_ptr() is not trusted (some wrap other tensors; the summarizer gives them no statistics)
    assert not stats.kernel_readable(torch.randn(7).as_subclass(_Sub)) and stats.kernel_readable(cases[0])
    fused = stats._fused_at
    for kinds in ({}, {"hashes": True}, {"keep_tensors": True}):  # statistics, md5 and tensor tasks
        s = Summarizer(**kinds)
        idx = [s.summarize(t) for t in cases]
        staged = [i for i in idx if s._values[i] is None]
        # the transpose is read along its strides, the tensor with a NaN counted by the kernel (the negative
        # view, which has no numpy view, gets torch's reductions at once)
        assert staged == []
        out, _ = s.materialize()
        monkeypatch.setattr(stats, "_fused_at", None)
        s2 = Summarizer(**kinds)
        idx2 = [s2.summarize(t) for t in cases]
        out2, _ = s2.materialize()
        monkeypatch.setattr(stats, "_fused_at", fused)
        for t, i, j in zip(cases, idx, idx2):
            _agree(out[i].tolist(), _torch_stats(t))
            _agree(out2[j].tolist(), out[i].tolist())


def test_sizes_beyond_the_staging_budget_are_summarised_directly(monkeypatch):
    from msprobe_nb.capture import stats
    from msprobe_nb.capture.stats import Summarizer, _cpu_stats
    monkeypatch.setattr(stats, "_fused_at", None)  # the torch path, as without the C kernel
    monkeypatch.setattr(stats, "STAGE_FIRST_BYTES", 2 * 4 * 1024)  # buffers of two rows of 1024 elements
    monkeypatch.setattr(stats, "STAGE_BUDGET", 2 * 4 * 1024)  # room for one such buffer, which cannot grow
    s = Summarizer()
    a, b = torch.randn(1024), torch.randn(1000)
    ia, ib = s.summarize(a), s.summarize(b)
    assert s._values[ia] is None and s._values[ib] is not None  # a staged, b computed at once
    out, _ = s.materialize()
    for i, t in ((ia, a), (ib, b)):
        assert out[i].tolist() == pytest.approx(list(_cpu_stats(t)), rel=1e-5)


@pytest.mark.parametrize("level", ["L1", "L0"])
def test_a_recording_failure_in_backward_never_breaks_the_backward(level, tmp_path, monkeypatch):
    from msprobe_nb.capture.recorder import Recorder
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    model(x).sum().backward()
    want = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    orig = Recorder.add_rows

    def failing(self, c, direction, *a, **k):
        if direction in ("backward", "parameters_grad"):
            raise ValueError("injected")
        return orig(self, c, direction, *a, **k)

    monkeypatch.setattr(Recorder, "add_rows", failing)
    import msprobe_nb.capture.recorder as recorder_mod
    build = recorder_mod._build_rows
    if build is not None:  # the C API backward calls the row builder itself, not add_rows

        def failing_build(rows, value, prefix, k, base, *rest):
            if ".backward." in base:
                raise ValueError("injected")
            return build(rows, value, prefix, k, base, *rest)
        monkeypatch.setattr(recorder_mod, "_build_rows", failing_build)
    with pytest.warns(RuntimeWarning, match="injected"):
        with msprobe_nb.record(dump_path=tmp_path / "d", level=level, model=model) as dbg:
            model(x).sum().backward()
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), want))  # bitwise
    assert any("injected" in e for e in dbg.errors)


def test_gc_settings_are_relaxed_only_while_recording(tmp_path):
    import gc
    before = gc.get_threshold()
    gc.set_threshold(500, 7, 9)
    try:
        dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d")
        dbg.start()
        assert gc.get_threshold() == (50_000, 7, 9) and gc.get_freeze_count() > 0
        torch.ones(2).sum()
        dbg.stop()
        assert gc.get_threshold() == (500, 7, 9) and gc.get_freeze_count() == 0
        dbg.step()  # a filtered-out or finished step installs nothing
        assert gc.get_threshold() == (500, 7, 9)
        dbg.close()
    finally:
        gc.set_threshold(*before)


def test_stacks_name_the_right_lines_for_calls_from_one_frame_and_from_generators(tmp_path):
    def gen(x):
        while True:
            yield torch.neg(x)  # recorded inside a generator frame, resumed from two places

    x = torch.ones(2)
    g = gen(x)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        torch.abs(x)
        torch.abs(x)  # same frame, another line
        next(g)  # caller line A
        next(g)  # caller line B
    parts = read_hdf5(tmp_path / "d")
    rows = parts.calls.drop_duplicates("call").set_index("call")

    def user_lines(call):
        frames = parts.stacks[int(rows.loc[call, "stack_id"])]
        return [int(f.split(", line ")[1].split(",")[0]) for f in frames if "test_capture.py" in f]

    a0, a1 = user_lines("Torch.abs.0.forward"), user_lines("Torch.abs.1.forward")
    assert a1[0] == a0[0] + 1 and a1[1:] == a0[1:]
    n0, n1 = user_lines("Torch.neg.0.forward"), user_lines("Torch.neg.1.forward")
    assert n0[0] == n1[0]  # the yield line
    assert n1[1] == n0[1] + 1  # resumed from the next line of the test


@pytest.mark.parametrize("walk", ["c", "python"])
def test_stacks_of_sibling_nested_and_deep_calls(tmp_path, monkeypatch, walk):
    """Every call gets its own exact stack (Recorder.stack_id's shortcuts must not blur them): calls from
    sibling frames, a frame called again from another line, and stacks deeper than MAX_STACK_DEPTH; with the
    C stack key where it is built, and with the Python walk."""
    from msprobe_nb.capture import stacks
    if walk == "python":
        monkeypatch.setattr(stacks, "_stack_key", None)
    elif stacks._stack_key is None:
        pytest.skip("msprobe_nb.capture._stack_keys is not built (no C compiler at install, or Python < 3.11)")
    lines = {}
    here = sys._getframe

    def leaf(x):
        lines["leaf"] = here().f_lineno; return torch.sin(x)  # noqa: E702

    def mid(x, tag):
        lines[tag + "1"] = here().f_lineno; a = leaf(x)  # noqa: E702
        lines[tag + "2"] = here().f_lineno; b = leaf(x)  # noqa: E702
        return a + b

    def deep(x, n):
        return deep(x, n - 1) if n else torch.cos(x)

    x = torch.ones(2)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        for i in range(2):
            lines[f"loop{i}"] = here().f_lineno; mid(x, f"m{i}")  # noqa: E702
        lines["direct"] = here().f_lineno; leaf(x)  # noqa: E702
        deep(x, stacks.MAX_STACK_DEPTH + 5)
        deep(x, stacks.MAX_STACK_DEPTH + 5)
    parts = read_hdf5(tmp_path / "d")
    rows = parts.calls.drop_duplicates("call").set_index("call")

    def user_lines(call):
        frames = parts.stacks[int(rows.loc[call, "stack_id"])]
        return [int(f.split(", line ")[1].split(",")[0]) for f in frames if "test_capture.py" in f]

    want = [[lines["leaf"], lines["m01"], lines["loop0"]], [lines["leaf"], lines["m02"], lines["loop0"]],
            [lines["leaf"], lines["m11"], lines["loop1"]], [lines["leaf"], lines["m12"], lines["loop1"]],
            [lines["leaf"], lines["direct"]]]
    for i, w in enumerate(want):
        assert user_lines(f"Torch.sin.{i}.forward")[:len(w)] == w, i
    assert lines["loop0"] == lines["loop1"]
    assert rows.loc["Torch.sin.0.forward", "stack_id"] == rows.loc["Torch.sin.2.forward", "stack_id"]
    deep_lines = user_lines("Torch.cos.0.forward")
    assert len(deep_lines) == stacks.MAX_STACK_DEPTH and len(set(deep_lines)) == 1  # the one line of deep()
    assert rows.loc["Torch.cos.0.forward", "stack_id"] == rows.loc["Torch.cos.1.forward", "stack_id"]


def test_the_c_stack_key_equals_the_python_walk():
    """The optional C walk (setup.py) must build exactly the key of the Python walk: for a shallow stack, one
    deeper than MAX_STACK_DEPTH (cut there), a generator frame and a short depth."""
    from msprobe_nb.capture import stacks
    if stacks._stack_key is None:
        pytest.skip("msprobe_nb.capture._stack_keys is not built (no C compiler at install, or Python < 3.11)")
    seen = []

    def probe():
        f = sys._getframe(1)  # a caller suspended at its call, as recorded calls' frames are
        seen.append((stacks._stack_key(f, stacks.MAX_STACK_DEPTH), stacks._walk_key(f),
                     stacks._stack_key(f, 2)))

    def deep(n):
        return deep(n - 1) if n else probe()

    def gen():
        yield probe()

    probe()
    deep(stacks.MAX_STACK_DEPTH + 10)
    next(gen())
    assert len(seen) == 3
    for c_key, py_key, short in seen:
        assert c_key == py_key and short == py_key[:2 * stacks.KEY_BYTES_PER_FRAME]
    assert len(seen[1][0]) == stacks.KEY_BYTES_PER_FRAME * stacks.MAX_STACK_DEPTH


def test_the_c_stack_ids_equal_the_python_methods(monkeypatch):
    """StackTable's stack_id and walked_id in C (``_stack_keys.Ids``) give the ids, new stacks and last-frame
    state of its Python methods, call after call: repeated calls from one frame and line, another line, a
    generator frame (no shortcut), deep stacks, walked ids, None, and a table with stacks off."""
    from msprobe_nb.capture import stacks
    if stacks._Ids is None or stacks._stack_key is None:
        pytest.skip("msprobe_nb.capture._stack_keys is not built (no C compiler at install, or Python < 3.11)")
    tables, off = {"c": stacks.StackTable(True)}, [stacks.StackTable(False)]
    monkeypatch.setattr(stacks, "_Ids", None)
    tables["python"] = stacks.StackTable(True)
    off.append(stacks.StackTable(False))
    assert type(tables["c"].stack_id) is not type(tables["python"].stack_id)
    got: dict[str, list] = {"c": [], "python": []}

    def record(how="stack_id"):
        f = sys._getframe(1)
        for name, t in tables.items():
            got[name].append(getattr(t, how)(f))

    def deep(n):
        return deep(n - 1) if n else record()

    def gen():
        for _ in range(2):  # one line of a generator, resumed from two places: two stacks
            record()
            yield

    for _ in range(2):
        record(); record()  # noqa: E702
        record()
        deep(stacks.MAX_STACK_DEPTH + 3)
        g = gen()
        next(g)
        next(g)
        record("walked_id")
    for name, t in tables.items():
        got[name] += [t.stack_id(None), t.walked_id(None)]
        got[name].append((sorted(t._stack_ids.values()), {k: len(v) for k, v in t._new_stacks.items()},
                          t._last_frame is not None, sorted(t._last_frame_sids.values())))
    assert got["c"] == got["python"]
    assert got["c"][-3:-1] == [-1, -1] and len(set(got["c"][:-3])) >= 5
    assert all(t.stack_id(sys._getframe()) == t.walked_id(sys._getframe()) == -1 for t in off)


def test_module_stacks_name_the_calling_line_of_their_parent(tmp_path):
    """A module hook's stack is looked up from the first frame above torch's module-call frames: siblings
    called from different lines, the same line in a loop, and a parent that is a generator resumed from two
    places must each get their own exact stack."""
    lines = {}
    here = sys._getframe

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.ReLU(), nn.Tanh()

        def forward(self, x):
            lines["a"] = here().f_lineno; x = self.a(x)  # noqa: E702
            lines["b"] = here().f_lineno; x = self.b(x)  # noqa: E702
            for _ in range(2):
                lines["loop"] = here().f_lineno; x = self.a(x)  # noqa: E702
            return x

    def gen(m, x):
        while True:
            lines["yield"] = here().f_lineno; yield m(x)  # noqa: E702

    model = Parent()
    x = torch.ones(2)
    g = gen(model.b, x)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L0")
    dbg.start(model)
    lines["top"] = here().f_lineno; model(x)  # noqa: E702
    lines["next0"] = here().f_lineno; next(g)  # noqa: E702
    lines["next1"] = here().f_lineno; next(g)  # noqa: E702
    dbg.stop()
    dbg.close()
    parts = read_hdf5(tmp_path / "d")
    rows = parts.calls.drop_duplicates("call").set_index("call")

    def user_lines(call):
        frames = parts.stacks[int(rows.loc[call, "stack_id"])]
        return [int(f.split(", line ")[1].split(",")[0]) for f in frames if "test_capture.py" in f]

    assert user_lines("Module.a.ReLU.forward.0") == [lines["a"], lines["top"]]
    assert user_lines("Module.b.Tanh.forward.0") == [lines["b"], lines["top"]]
    assert user_lines("Module.a.ReLU.forward.1") == [lines["loop"], lines["top"]]
    assert rows.loc["Module.a.ReLU.forward.1", "stack_id"] == rows.loc["Module.a.ReLU.forward.2", "stack_id"]
    assert user_lines("Module.b.Tanh.forward.1") == [lines["yield"], lines["next0"]]
    assert user_lines("Module.b.Tanh.forward.2") == [lines["yield"], lines["next1"]]


def test_a_module_call_does_not_keep_its_arguments_alive(tmp_path):
    """A module call's stack is looked up without holding torch's frame of the call: its arguments are freed
    when the caller drops them, not at the next recorded call (the same-frame shortcut of API calls holds the
    caller's frame; a module call's frame is new every time, so holding it would only keep its locals)."""
    import weakref
    model = nn.Sequential(nn.ReLU())
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L0")
    dbg.start(model)
    with torch.no_grad():
        x = torch.ones(3)
        model(x)
        ref = weakref.ref(x)
        del x
        alive = ref() is not None
    dbg.stop()
    dbg.close()
    assert not alive
    assert "Module.0.ReLU.forward.0" in set(read_hdf5(tmp_path / "d").calls["call"])


def test_module_backward_hooks_share_a_tensor_with_the_users_hooks(tmp_path):
    """The kit's module-backward hook on an output tensor (registered like Tensor.register_hook, without its
    handle) and a user's hook registered after it on the same tensor both fire; at the step's end only the
    kit's is gone, and the user's handle still removes the user's."""
    fired = []

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return torch.relu(self.lin(x))

    model = Block()
    kept = {}

    def user_forward_hook(module, args, out):  # runs after the kit's global forward hook
        kept["out"] = out
        kept["handle"] = out.register_hook(lambda g: fired.append(g.clone()))

    model.lin.register_forward_hook(user_forward_hook)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L0")
    dbg.start(model)
    for _ in range(2):  # the second step registers no parameter hooks between the kit's hook and the user's
        fired.clear()
        x = torch.ones(2, 3, requires_grad=True)  # a leaf: its hook goes on the tensor, not on a node
        model(x).sum().backward()
        dbg.step()
        assert not x._backward_hooks
        hooks = kept["out"]._backward_hooks
        assert len(fired) == 1 and list(hooks) == [kept["handle"].id]
        kept["handle"].remove()
        assert not hooks
    dbg.close()
    calls = read_hdf5(tmp_path / "d").calls
    for step in (0, 1):
        grads = calls[(calls["call"] == "Module.lin.Linear.backward.0") & (calls["step"] == step)]
        assert set(grads["io"]) == {"input", "output"}


def test_leaves_fast_paths_agree_with_the_general_walk():
    """leaves() has fast paths for flat tuples/lists and keyword dicts: same (path, leaf) pairs as walk()."""
    from msprobe_nb.capture.leaves import leaves, walk
    nt = collections.namedtuple("NT", "a b")
    t = torch.ones(1)
    cases = [{"a": t, "b": None, "c": [t, (1, 2)], "d": {"x": t}, "e": torch.Size([2, 3]), "f": nt(t, 3), 1: "v"},
             {}, (t, [t, {"k": None}], 2.5, torch.Size([1])), [t], (), nt(t, None)]
    for case in cases:
        for prefix in ("", "p.0"):
            assert leaves(case, prefix) == list(walk(case, prefix)), (case, prefix)


def test_stack_sources_are_read_without_filling_linecache(tmp_path, monkeypatch):
    """Stack text comes from the source files (coding declaration honoured), read at the step's end, and
    the files are not left in linecache (whole torch sources there held ~4 MB of peak memory)."""
    import importlib
    import linecache
    src = tmp_path / "helper_mod_for_stacks.py"
    src.write_text("# -*- coding: latin-1 -*-\nimport torch\n\n\ndef f(x):\n    return torch.sin(x)  # caf\xe9\n",
                   encoding="latin-1")
    monkeypatch.syspath_prepend(str(tmp_path))
    helper = importlib.import_module("helper_mod_for_stacks")
    linecache.cache.pop(str(src), None)
    with msprobe_nb.record(dump_path=tmp_path / "d"):
        helper.f(torch.ones(2))
    parts = read_hdf5(tmp_path / "d")
    sid = int(parts.calls.loc[parts.calls.call == "Torch.sin.0.forward", "stack_id"].iloc[0])
    assert parts.stacks[sid][0] == f"File {src}, line 6, in f, \n return torch.sin(x)  # caf\xe9"
    assert str(src) not in linecache.cache


def test_stop_and_start_within_a_step_summarises_seen_tensors_again(tmp_path):
    """stop() writes the rows so far and resets the statistics buffers; when the same step goes on
    (start() without step()), a tensor seen before must be summarised again, not pointed at a stale index,
    and it keeps its tensor id and producer."""
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1")
    x = torch.arange(6.0)
    dbg.start()
    y = torch.relu(x)
    dbg.stop()
    dbg.start()
    torch.neg(y)
    torch.sin(torch.ones(3))
    dbg.stop()
    dbg.close()
    calls = read_hdf5(tmp_path / "d").calls.set_index("name")
    row = calls.loc["Torch.neg.0.forward.input.0"]
    assert (row["max"], row["min"], row["mean"]) == (5.0, 0.0, 2.5)
    assert row["producer"] == "Torch.relu.0.forward"
    assert row["tensor_id"] == calls.loc["Torch.relu.0.forward.output.0", "tensor_id"]


def test_scalar_descriptions_are_cached_without_mixing_equal_values():
    """describe_value caches plain scalars by (type, value): values equal across types or signs still render
    apart, in any order (-0.0 == 0.0, True == 1 == 1.0)."""
    from msprobe_nb.capture.leaves import describe_value

    for _ in range(2):  # the second pass reads the cache
        for v, want in [(0.0, ("float", "0.0")), (-0.0, ("float", "-0.0")), (1, ("int", "1")),
                        (True, ("bool", "true")), (1.0, ("float", "1.0")), (False, ("bool", "false")),
                        (0, ("int", "0")), (float("nan"), ("float", '"nan"')), (float("-inf"), ("float", '"-inf"')),
                        ("1", ("str", '"1"'))]:
            assert describe_value(v) == want, v
