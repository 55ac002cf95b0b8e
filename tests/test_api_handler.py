"""The L1 mode's C handler and API backward (capture/_api_handler.c, _api_backward.c) record exactly what the
Python handler and api_backward.py record.

Each workload is recorded twice from the same seed, once per handler, and everything the dump holds is
compared: every column of the calls table (names, counters, parents, stack ids, rows, statistics, backward
rows), the stacks' text and the module tree. The workloads cover what the handler decides on: operators
read from the caller's instruction, keywords and nested arguments, in-place writes, views sharing their
input's statistics, calls without gradients, custom Functions, reentrant checkpointing (the Python
continuation), the randomness policy, msprobe's scope, list and data_mode filters, and real models.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint
from helpers import handlers, real_model

import msprobe_nb
from msprobe_nb.capture import api_mode, c_contract, grad_hooks
from msprobe_nb.capture.random_apis import LEFT_AS_DRAWN

pytestmark = pytest.mark.skipif(api_mode._api_handler is None or grad_hooks._api_backward is None,
                                reason="msprobe_nb.capture._api_handler / _api_backward are not built (no C "
                                       "compiler, or not CPython 3.11+)")


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, g):
        return g * ctx.k, None


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.norm(self.lin(x))
        h = h.transpose(0, 1).contiguous().transpose(0, 1)  # views: their input's statistics
        h = -h + x * 2 - (h > 0).float() @ torch.eye(16)  # operators, from the caller's instruction
        h = torch.cat([h, _Scale.apply(x, 0.5)], dim=-1)  # a nested argument, a custom Function's output
        h = F.gelu(h, approximate="tanh")  # a keyword
        with torch.no_grad():
            mask = torch.ones_like(h).bernoulli_(0.9)  # in place, no gradient, a random draw
        buf = torch.zeros(h.shape[0], 4)
        buf[:, 1] = h[:, 0].detach()  # written in place through an API that returns something else
        return self.drop(h * mask)[:, :16] + buf.sum()


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Block()

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=True)


def _own(ckpt: bool = False):
    def make():
        model = nn.Sequential(_Checkpointed() if ckpt else _Block(), _Block(), nn.Linear(16, 4))
        x = torch.randn(8, 16, requires_grad=ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        return model, step
    return make


def _gpt2():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the models extra)")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
    return model, step


def _record(tmp, make, c: bool, steps: int = 2, **options):
    """The dump of ``steps`` recorded steps of ``make()``, with the C handler or (``c`` False) the Python one;
    the model's loss-free state after it (its parameters) too, for the non-interference check."""
    torch.manual_seed(0)
    model, step = make()
    with handlers(c):
        options.setdefault("level", "L1")
        dbg = msprobe_nb.Debugger(dump_path=tmp, **options)
        for _ in range(steps):
            dbg.start(model)
            step()
            dbg.stop()
            dbg.step()
        assert (dbg._api_mode is None or (dbg._api_mode._handle is not None) == c)
        errors = list(dbg.errors)
        dbg.close()
    return msprobe_nb.load(tmp), [p.detach().clone() for p in model.parameters()], errors


def _assert_same(tmp_path, make, **options):
    (c, pc, ec), (py, ppy, epy) = (_record(tmp_path / name, make, name == "c", **options) for name in ("c", "py"))
    a, b = c.calls, py.calls
    assert len(a) == len(b) > 10
    assert list(a.columns) == list(b.columns)
    # torch.empty's memory is whatever was there (Mixtral's routing makes one, and at L2 so does dropout's
    # aten.empty_like): its statistics differ by run, with either handler
    garbage = a.op.str.startswith("empty") | a.producer.str.match(r"(Torch|Aten)\.empty")
    assert (garbage == (b.op.str.startswith("empty") | b.producer.str.match(r"(Torch|Aten)\.empty"))).all()
    for col in a.columns:
        x, y = a[col], b[col]
        if col in ("max", "min", "mean", "norm", "nan_count", "posinf_count", "neginf_count", "hash"):
            x, y = x[~garbage], y[~garbage]
        same = (x == y).fillna(False) | (x.isna() & y.isna())
        assert same.all(), (col, list(a.loc[same[~same].index, "name"][:3]), list(x[~same][:3]), list(y[~same][:3]))
    assert c.stack_frames == py.stack_frames and c.tree == py.tree
    assert c._parts.construct == py._parts.construct  # as stored: a top-level call's parent is missing, not ""
    assert all(torch.equal(u, v) for u, v in zip(pc, ppy))  # the model trained the same, bit for bit
    assert ec == epy
    return a


def test_our_model_records_the_same_with_either_handler(tmp_path):
    calls = _assert_same(tmp_path, _own())
    ops = set(calls.op)
    assert {"__neg__", "__mul__", "__sub__", "__gt__", "__matmul__", "cat", "gelu", "bernoulli_",
            "__setitem__"} <= ops
    assert calls.is_kwarg.any() and (calls.direction == "backward").any() and calls.parent.str.len().gt(0).any()
    assert "_Scale" in ops  # a custom Function, opened from inside its forward


class _Arguments(nn.Module):
    """Gradient inputs in every argument shape the C handler reads itself (``grad_inputs``): tensors among
    positional and keyword arguments, in lists and tuples one level deep, next to shapes, Sizes, dicts and
    lists of scalars, inputs without gradients; and a deeper one it leaves to the Python walk."""

    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = x * 2
        h = F.layer_norm(x, (16,), weight=self.w, bias=self.b, eps=1e-5)  # keyword tensors next to a shape
        h = torch.cat([h, y.detach(), x], dim=0)  # a list of tensors, one without gradients
        h = h + torch.stack((y, x)).sum(0).repeat(3, 1)  # a tuple of tensors
        h = h.reshape(torch.Size([3, 8, 16])).sum(0)  # a Size
        h = torch.cat(tensors=[h, y], dim=-1)  # a keyword list of tensors
        h = torch.where(h > 0, h, torch.zeros_like(h))
        h = F.pad(h, [1, 1], mode="constant", value=0.0)  # a list of ints
        h = h * torch.as_tensor([[0.5]])  # a list of lists: deeper, the Python walk
        return torch.stack([torch.cat([h, h], 0)], 0).sum() + torch.cat(((h, h)[0],), 0).sum()


def _arguments():
    def make():
        model = _Arguments()
        x = torch.randn(8, 16, requires_grad=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            model(x).backward()
            opt.step()
        return model, step
    return make


def test_gradient_inputs_of_every_argument_shape_record_the_same_with_either_handler(tmp_path):
    calls = _assert_same(tmp_path, _arguments())
    grads = calls[(calls.direction == "backward") & (calls.io == "output")]
    names = set(grads.name)
    # the gradients of keyword and listed inputs, at their forward inputs' paths
    assert {"Functional.layer_norm.0.backward.output.weight", "Functional.layer_norm.0.backward.output.bias",
            "Torch.cat.0.backward.output.0.0", "Torch.cat.0.backward.output.0.2", "Torch.stack.0.backward.output.0.1",
            "Torch.cat.1.backward.output.tensors.1"} <= names, sorted(names)[:40]
    assert "Torch.cat.0.backward.output.0.1" not in names  # detached: no gradient input


@pytest.mark.parametrize("level", ["mix", "L2"])
def test_the_other_levels_record_the_same_with_either_handler(tmp_path, level):
    _assert_same(tmp_path, _own(), level=level)


def test_a_reentrant_checkpoint_records_the_same_with_either_handler(tmp_path):
    """Its recompute runs under the mode while it replays: the C handler hands those calls to Python."""
    calls = _assert_same(tmp_path, _own(ckpt=True))
    assert (calls.direction == "recompute").any()


@pytest.mark.parametrize("options", [
    {"scope": ["Tensor.__mul__.0.forward", "Functional.gelu.1.forward"]},  # the selection, call by call
    {"list": ["gelu", "Linear"]},
    {"data_mode": ["forward", "input"]},  # rows through Recorder.add_rows' own filter
    {"seed": 7, "dropout_off": True, "host_random": True},  # the randomness policy, called from either handler
    {"summary_mode": "md5"},
    {"stack": False},
], ids=["scope", "list", "data_mode", "randomness", "md5", "no-stacks"])
def test_the_options_record_the_same_with_either_handler(tmp_path, options):
    _assert_same(tmp_path, _own(), **options)


class _Draws(nn.Module):
    """Every way a call draws: a functional and a module dropout, attention's in-kernel dropout, factories on the
    default and on a user's generator, in-place draws and ``*_like``, with and without gradients."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2)
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x):
        h = self.drop(self.lin(x))
        h = F.dropout(h, p=0.3, training=True) + torch.rand(h.shape, generator=self.gen)
        q = h.view(2, 1, -1, 8)
        h = F.scaled_dot_product_attention(q, q, q, dropout_p=0.25).reshape(-1, 8)
        h = h + F.scaled_dot_product_attention(q, q, q, None, 0.25).reshape(-1, 8)  # dropout_p by position
        h = h + torch.randn_like(h) * 0.1 + torch.randint(0, 3, h.shape).float()
        with torch.no_grad():
            noise = torch.empty_like(h).uniform_(-1, 1, generator=self.gen)
        return F.dropout(h, p=0.0) * noise.sign() + torch.sigmoid(h).bernoulli()


def _draws(checkpointed: bool = False):
    """``checkpointed``: the draws inside a non-reentrant activation checkpoint, which replays them in the
    backward with the generator's state restored (unrecorded: autograd runs without the mode)."""
    def make():
        model = _Draws()
        x = torch.randn(6, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            out = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False) if checkpointed else model(x)
            out.square().mean().backward()
            opt.step()
        return model, step
    return make


@pytest.mark.parametrize("options", [
    {}, {"seed": 5}, {"dropout_off": True}, {"host_random": True},
    {"seed": 5, "dropout_off": True, "host_random": True},
], ids=["default", "seed", "dropout-off", "host-random", "all"])
@pytest.mark.parametrize("checkpointed", [False, True], ids=["plain", "checkpointed"])
@pytest.mark.filterwarnings("ignore:msprobe_nb. dropout_off and host_random cannot reach")
def test_calls_that_draw_record_the_same_with_either_handler(tmp_path, options, checkpointed):
    """The C handler calls the randomness policy itself: the rng columns, dropout turned off (arguments
    changed before the input rows), host draws (another callable run) and the trained weights match Python's;
    inside a non-reentrant checkpoint both leave the draws as drawn (tests/test_randomness_checkpoint.py)."""
    calls = _assert_same(tmp_path, _draws(checkpointed), **options)
    drawn = calls[calls.io == "input"].drop_duplicates("call")
    assert set(drawn.rng) > {""} and drawn.rng_state.str.len().gt(0).any()
    if checkpointed and (options.get("dropout_off") or options.get("host_random")):  # recomputed outside the mode
        assert drawn.rng.str.endswith(LEFT_AS_DRAWN).any()
        return
    if options.get("dropout_off"):
        assert "dropout-off" in set(drawn.rng)
    if options.get("host_random"):
        assert drawn.rng.str.startswith("host").any()


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.filterwarnings("ignore:msprobe_nb. no call was recorded")
def test_a_randomness_policy_that_fails_leaves_the_draw_to_run_unrecorded(tmp_path, monkeypatch, c):
    """The policy raises before a draw: the draw runs as the user wrote it, unrecorded, the failure is noted
    with the call's name, and the draw's result is bitwise what it is without the kit."""
    from msprobe_nb.capture import randomness
    torch.manual_seed(0)
    want = F.dropout(torch.ones(64), p=0.5)
    if not c:
        monkeypatch.setattr(api_mode, "_api_handler", None)
        monkeypatch.setattr(grad_hooks, "_api_backward", None)

    def broken(self, call, func, args, kwargs):
        raise ValueError("policy broke")
    monkeypatch.setattr(randomness.RandomPolicy, "before", broken)
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d")
    torch.manual_seed(0)
    with pytest.warns(RuntimeWarning, match="inputs of Functional.dropout: ValueError: policy broke"):
        dbg.start()
        got = F.dropout(torch.ones(64), p=0.5)
        assert (dbg._api_mode._handle is not None) == c
        dbg.stop()
    assert torch.equal(got, want)
    dbg.close()


def test_gpt2_records_the_same_with_either_handler(tmp_path):
    _assert_same(tmp_path, _gpt2)


def test_the_tensor_task_records_the_same_with_either_handler(tmp_path):
    _assert_same(tmp_path, _gpt2, task="tensor")


@pytest.mark.parametrize("name", ["llama", "bert", "t5", "mixtral", "vit", "resnet", "unet"])
def test_real_models_record_the_same_with_either_handler(tmp_path, name):
    """Llama's activation checkpointing, BERT's bfloat16 autocast, T5, Mixtral's routing, ViT, ResNet's
    BatchNorm, the diffusers UNet: statistics L1, two steps each way."""
    _assert_same(tmp_path, real_model(name))


def _recorder_of(tmp, c: bool, monkeypatch):
    """A Debugger whose recorder exists (one empty start and stop), on the C or the Python handler."""
    if not c:
        monkeypatch.setattr(api_mode, "_api_handler", None)
        monkeypatch.setattr(grad_hooks, "_api_backward", None)
    dbg = msprobe_nb.Debugger(dump_path=tmp)
    dbg.start()
    dbg.stop()
    return dbg, dbg._recorder


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.filterwarnings("ignore:msprobe_nb. no call was recorded")
def test_a_failure_inside_the_handler_is_noted_and_the_model_runs_on(tmp_path, monkeypatch, c):
    """A part the handler calls back fails: the call runs unrecorded, the failure is noted with the call's
    name, and the model's results are bitwise what they are without the kit, on both handlers."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(2, 4)
    want = lin(x).detach()
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)

    def broken(frame):
        raise ValueError("stack walk broke")
    rec.stack_id = broken  # the handler binds it when the mode is made, at start
    with pytest.warns(RuntimeWarning, match="inputs of Functional.linear: ValueError: stack walk broke"):
        dbg.start(lin)
        got = lin(x)
        dbg.stop()
    assert (dbg._api_mode is None or dbg._api_mode._handle is not None) == c or not c
    assert torch.equal(got, want)
    assert any("stack walk broke" in e for e in dbg.errors)
    assert rec.busy == 0 and rec.lock.acquire(blocking=False)
    rec.lock.release()
    dbg.close()


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_an_interrupt_is_not_swallowed(tmp_path, monkeypatch, c):
    """Only Exceptions are noted and passed over: KeyboardInterrupt reaches the user, and the recorder is left
    unlocked and idle."""
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)

    def interrupted(*a):
        raise KeyboardInterrupt
    rec._select_all, rec.selected = False, interrupted
    dbg.start()
    with pytest.raises(KeyboardInterrupt):
        torch.ones(2).add(1)
    assert rec.busy == 0 and rec.lock.acquire(blocking=False)
    rec.lock.release()
    dbg.stop()
    dbg.close()


def test_unrecorded_calls_are_left_alone(tmp_path):
    """Attribute reads and metadata calls are not recorded; the handler's name cache keeps each function once."""
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d")
    x = torch.randn(3, 4)
    dbg.start()
    for _ in range(5):
        x.size()
        x.dim()
        torch.relu(x)
    dbg.stop()
    dbg.step()
    dbg.close()
    calls = msprobe_nb.load(tmp_path / "d").calls
    assert list(calls.drop_duplicates("call").op) == ["relu"] * 5


def test_a_backward_context_of_the_wrong_shape_is_refused():
    mod = grad_hooks._api_backward
    with pytest.raises(ValueError, match="fields"):
        mod.Attacher(())
    with pytest.raises(TypeError, match="same_elements must be a set"):
        mod.Attacher((None,) * len(mod.CONTEXT_FIELDS))
    a = mod.Attacher(tuple(frozenset() if n == "same_elements" else 256 if n == "max_nodes" else None
                           for n in mod.CONTEXT_FIELDS))
    with pytest.raises(TypeError, match="attach"):
        a.attach(None)
    with pytest.raises(TypeError, match="inputs must be a list"):
        a.attach(None, torch.ones(1), (), 0, "x", "")


def test_a_context_of_the_wrong_shape_is_refused():
    mod = api_mode._api_handler
    with pytest.raises(ValueError, match="fields"):
        mod.Handler(())
    with pytest.raises(TypeError):
        mod.Handler([None] * len(mod.CONTEXT_FIELDS))
    with pytest.raises(TypeError, match="dicts"):
        mod.Handler((None,) * len(mod.CONTEXT_FIELDS))
    h = mod.Handler(tuple({} if n in ("operators", "operator_methods", "compiler_globals") else frozenset() if n in (
        "drawing", "same_elements") else () if n == "positions" else None for n in mod.CONTEXT_FIELDS))
    with pytest.raises(TypeError, match="handle"):
        h.handle(torch.add)
    with pytest.raises(TypeError, match="tuple"):
        h.handle(torch.add, [1], None)
    with pytest.raises(TypeError, match="positional"):  # called as the mode's __torch_function__
        h(torch.add)
    with pytest.raises(TypeError, match="positional"):
        h(torch.add, (), (), None, None)
    with pytest.raises(TypeError, match="tuple"):
        h(torch.add, (), [1], None)


@pytest.mark.parametrize("name,abi,fields,load", [
    ("_api_handler", "API_HANDLER_ABI", "HANDLER_FIELDS", "api_handler"),
    ("_api_backward", "API_BACKWARD_ABI", "BACKWARD_FIELDS", "api_backward"),
    ("_module_hooks", "MODULE_HOOKS_ABI", "MODULE_HOOKS_FIELDS", "module_hooks")])
def test_the_built_halves_export_the_layout_python_expects(monkeypatch, name, abi, fields, load):
    """Each exports its ABI and context fields; a stale build (other fields, another ABI) is refused with a
    warning, and recording takes the Python path."""
    import importlib
    import types
    mod = importlib.import_module(f"msprobe_nb.capture.{name}")
    assert mod.ABI == getattr(c_contract, abi) and mod.CONTEXT_FIELDS == getattr(c_contract, fields)
    stale = types.SimpleNamespace(ABI=mod.ABI, CONTEXT_FIELDS=mod.CONTEXT_FIELDS[:-1])
    monkeypatch.setattr(c_contract, "_load", lambda _: stale)
    with pytest.warns(RuntimeWarning, match=f"{name} does not match.*context fields"):
        assert getattr(c_contract, load)() is None
    stale.ABI = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning, match="ABI 0"):
            getattr(c_contract, load)()


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_each_call_is_one_entry_of_the_steps_calls(tmp_path, monkeypatch, c):
    """A call's input and output rows point at one slot of the step's calls, which holds it once."""
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)
    x = torch.randn(3, 4, requires_grad=True)
    dbg.start()
    try:
        torch.relu(x).sum(dim=0, keepdim=True) * 2
        names = [k.call for k in rec.calls]
        slots = [r[0] for r in rec.rows]
    finally:
        dbg.stop()
        dbg.close()
    assert names == ["Torch.relu.0.forward", "Tensor.sum.0.forward", "Tensor.__mul__.0.forward"]
    assert slots == [0, 0, 1, 1, 1, 1, 2, 2, 2]


class _Twice(nn.Module):
    """An input reached by two edges of one call, a graph run twice (retain_graph), a view's gradient."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        h = self.lin(x)
        return torch.mul(h, h).view(-1), torch.addcmul(h, h, h).t()


def _twice():
    model = _Twice()
    x = torch.randn(4, 6, requires_grad=True)

    def step():
        a, b = model(x)
        loss = a.sum() + b.square().sum()
        loss.backward(retain_graph=True)
        loss.backward()  # the same nodes run again: each call's backward is a new call
    return model, step


@pytest.mark.parametrize("max_nodes", [256, 1], ids=["walked", "cut-short"])
def test_shared_edges_a_rerun_graph_and_a_cut_walk_record_the_same_with_either_backward(tmp_path, monkeypatch,
                                                                                        max_nodes):
    """Gradients summed over edges, a second run of the graph, and a walk cut short past the node limit (the
    output gradients only) give the Python classes' rows."""
    from msprobe_nb.capture import api_backward
    monkeypatch.setattr(api_backward, "MAX_NODES", max_nodes)
    monkeypatch.setattr(grad_hooks, "MAX_NODES", max_nodes)
    calls = _assert_same(tmp_path, _twice)
    backward = calls[calls.direction == "backward"]
    mul = backward[backward.call == "Torch.mul.0.backward"]
    assert (mul.groupby("step").call_index.nunique() == 2).all()  # the graph's second run: a second call
    linear = backward[backward.call.str.startswith("Functional.linear.")]  # addmm and the weight's transpose
    assert len(linear) and (linear.io == "output").any() == (max_nodes > 1)


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_a_graph_kept_past_its_step_records_no_backward_in_the_next(tmp_path, c):
    """A step's node hooks retire at its end: a graph kept past it (``retain_graph``) and run again in the
    next recorded step adds no backward rows there, and its gradients are bitwise those of a plain run."""
    def run(dbg):
        torch.manual_seed(0)
        lin = nn.Linear(4, 4)
        x = torch.randn(3, 4, requires_grad=True)
        if dbg is not None:
            dbg.start(lin)
        loss = F.linear(x, lin.weight, lin.bias).square().sum()
        loss.backward(retain_graph=True)
        if dbg is not None:
            dbg.stop()
            dbg.step()
            dbg.start(lin)
        loss.backward()  # the first step's graph, in the second step
        torch.tanh(x).sum().backward()  # the second step's own call
        if dbg is not None:
            dbg.stop()
            dbg.close()
        return [t.grad.clone() for t in (x, *lin.parameters())]

    want = run(None)
    with handlers(c):
        got = run(msprobe_nb.Debugger(dump_path=tmp_path, level="L1"))
    assert all(torch.equal(g, w) for g, w in zip(got, want))  # bitwise
    calls = msprobe_nb.load(tmp_path).calls
    backward = calls[calls.direction == "backward"]
    assert set(backward[backward.step == 0].call) >= {"Functional.linear.0.backward", "Tensor.square.0.backward"}
    assert set(backward[backward.step == 1].call) == {"Torch.tanh.0.backward", "Tensor.sum.0.backward"}


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_a_failure_in_a_node_hook_is_noted_and_the_backward_runs_on(tmp_path, monkeypatch, c):
    """The rows of a backward fail in its node hook: noted once, and autograd's gradients are bitwise the same."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    x = torch.randn(3, 4)
    lin(x).square().sum().backward()
    want = [p.grad.clone() for p in lin.parameters()]
    lin.zero_grad()
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)
    build = rec.build_rows

    def failing(rows, value, prefix, k, base, *rest):
        if ".backward." in base:
            raise ValueError("backward rows broke")
        return build(rows, value, prefix, k, base, *rest)
    if build is None:
        pytest.skip("the C row builder is not built: the failure is planted in its call")
    rec.build_rows = failing
    with pytest.warns(RuntimeWarning, match="an API backward: ValueError: backward rows broke"):
        dbg.start(lin)
        lin(x).square().sum().backward()
        dbg.stop()
    assert all(torch.equal(p.grad, w) for p, w in zip(lin.parameters(), want))  # bitwise
    assert rec.busy == 0 and rec.lock.acquire(blocking=False)
    rec.lock.release()
    dbg.close()


class _Shapes(nn.Module):
    """Outputs of every shape a call gives: tuples, lists, a named tuple, a bare number, None, an input
    returned in place, a call whose func raises (caught by the model)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        h = self.lin(x)
        top = torch.topk(h, 3, dim=-1)  # a named tuple (values, indices)
        parts = torch.split(h, 4, dim=-1)  # a tuple of views
        chunks = list(h.chunk(2, dim=0))
        n = h.numel() + int(h.argmax())  # a number out of a recorded call
        h = h.clone().add_(1.0).mul_(top.values.mean())  # in place: the input is the output
        try:
            torch.mm(h, torch.ones(3, 3))  # raises inside torch: the error is the user's
        except RuntimeError:
            pass
        return (h + parts[0].sum() + chunks[1].sum() + n * 1e-3).unsqueeze(0), torch.where(h > 0)


def _shapes():
    model = _Shapes()
    x = torch.randn(4, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        opt.zero_grad()
        out, _ = model(x)
        out.square().mean().backward()
        opt.step()
    return model, step


def test_outputs_of_every_shape_and_a_raising_call_record_the_same_with_either_handler(tmp_path):
    calls = _assert_same(tmp_path, _shapes)
    assert {"topk", "chunk", "argmax", "add_", "mul_", "where"} <= set(calls.op)
    assert any("split" in op for op in calls.op)
    assert not calls.op.eq("mm").any() or calls[calls.op == "mm"].io.eq("input").all()  # no output: it raised


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_an_error_of_the_users_call_propagates_and_recording_goes_on(tmp_path, monkeypatch, c):
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)
    dbg.start()
    try:
        with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
            torch.mm(torch.ones(2, 3), torch.ones(2, 3))
        assert rec.busy == 0 and rec.lock.acquire(blocking=False)
        rec.lock.release()
        torch.relu(torch.ones(2))
    finally:
        dbg.stop()
    dbg.step()
    dbg.close()
    calls = msprobe_nb.load(tmp_path / "d").calls
    assert list(calls.drop_duplicates("call").call) == ["Torch.ones.0.forward", "Torch.ones.1.forward",
                                                        "Torch.mm.0.forward", "Torch.ones.2.forward",
                                                        "Torch.relu.0.forward"]
    assert set(calls[calls.op == "mm"].io) == {"input"}
    assert not dbg.errors


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_a_node_hook_that_fires_once_recording_is_off_records_nothing(tmp_path, monkeypatch, c):
    """stop() switches the recorder off before it removes the step's hooks; a backward in that window (another
    thread's) must add no rows."""
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)
    lin = nn.Linear(4, 4)
    dbg.start(lin)
    loss = lin(torch.randn(3, 4)).square().sum()
    n = len(rec.rows)
    rec.active = False  # what stop() does first
    try:
        loss.backward()
        assert len(rec.rows) == n and lin.weight.grad is not None
    finally:
        rec.active = True
        dbg.stop()
        dbg.close()


class _Seen(torch.Tensor):
    """A user's tensor subclass that counts what its __torch_function__ sees."""

    calls = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _Seen.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
def test_a_node_hook_reads_a_subclass_gradient_without_its_torch_function(tmp_path, monkeypatch, c):
    """The kit's own reads of a gradient (its rows, its statistics) go through no __torch_function__: a user's
    subclass sees exactly the calls of the backward it sees without the kit."""
    lin = nn.Linear(4, 4)
    loss = lin(torch.randn(3, 4)).square().sum()
    seed = torch.ones(()).as_subclass(_Seen)
    _Seen.calls = 0
    loss.backward(seed)
    plain = _Seen.calls
    dbg, rec = _recorder_of(tmp_path / "d", c, monkeypatch)
    dbg.start(lin)  # the forward recorded: its nodes are hooked; then the backward, seeded by a subclass
    loss = lin(torch.randn(3, 4)).square().sum()
    seed = torch.ones(()).as_subclass(_Seen)
    _Seen.calls = 0
    loss.backward(seed)
    dbg.stop()
    dbg.close()
    assert _Seen.calls == plain > 0
    assert msprobe_nb.load(tmp_path / "d").calls.name.str.startswith("Tensor.sum.0.backward.input").any()


_W = nn.Parameter(torch.randn(6, 6, generator=torch.Generator().manual_seed(3)))


def _scaled(x):
    """A user's function that torch function modes see (handle_torch_function), using a parameter it is not
    given: its call's graph reaches a leaf that is not one of its inputs."""
    if torch.overrides.has_torch_function((x,)):
        return torch.overrides.handle_torch_function(_scaled, (x,), x)
    return (x @ _W).relu()


def _closure():
    lin = nn.Linear(6, 6)
    x = torch.randn(4, 6)

    def step():
        _scaled(lin(x)).sum().backward()
    return lin, step


def test_a_call_using_a_parameter_it_was_not_given_walks_the_same(tmp_path, monkeypatch):
    """The walk never enters a leaf's accumulator that is not an input (it counts toward the node limit): with
    the limit at the call's two nodes, its input's gradient is still read."""
    from msprobe_nb.capture import api_backward
    monkeypatch.setattr(api_backward, "MAX_NODES", 2)
    monkeypatch.setattr(grad_hooks, "MAX_NODES", 2)
    calls = _assert_same(tmp_path, _closure)
    mine = calls[calls.op == "_scaled"]
    assert set(mine.direction) == {"forward", "backward"}
    assert (mine[mine.direction == "backward"].io == "output").any()  # the gradient of its input x


def test_lookups_by_a_c_string_find_what_getattr_finds():
    """torch finds a mode's ``__torch_function__`` by a C string (``PyObject_GetAttrString``) on every call it
    dispatches; ApiMode answers those through one interned name (``string_lookups``). Every lookup finds what
    ``getattr`` finds: the bound handler, an instance attribute, a subclass's own handler, and an
    AttributeError for a name that is not there."""
    import ctypes

    get = ctypes.pythonapi.PyObject_GetAttrString
    get.restype, get.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.c_char_p]
    assert api_mode._api_handler.string_lookups(api_mode.ApiMode) is True  # given at import; asking again is a no-op
    mode = api_mode.ApiMode.__new__(api_mode.ApiMode)
    mode.extra = 5
    assert get(mode, b"__torch_function__") == mode.__torch_function__
    assert get(mode, b"__torch_function__").__func__ is api_mode.ApiMode.__torch_function__
    assert get(mode, b"extra") == 5 and get(mode, b"__class__") is api_mode.ApiMode
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        get(mode, b"missing")

    class Sub(api_mode.ApiMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return "sub"
    sub = Sub.__new__(Sub)
    assert get(sub, b"__torch_function__").__func__ is Sub.__torch_function__
    mode.__torch_function__ = "an instance's own"  # the instance dict wins over the class, as getattr has it
    assert get(mode, b"__torch_function__") == "an instance's own"
    with pytest.raises(TypeError, match="defined in Python"):
        api_mode._api_handler.string_lookups(int)


def _c_string_lookup(obj, name: bytes):
    import ctypes
    get = ctypes.pythonapi.PyObject_GetAttrString
    get.restype, get.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.c_char_p]
    return get(obj, name)


def test_torch_calls_the_c_handler_itself_and_dynamo_still_finds_the_python_one(tmp_path):
    """A mode with its C handler answers torch's lookup by C string with the handler itself: torch checks its
    ``__self__`` (the mode) and calls it with __torch_function__'s arguments, and no Python __torch_function__
    runs. ``getattr``, which dynamo uses to inline the handler, still finds the Python method."""
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1")
    x, y = torch.ones(3), torch.full((3,), 2.0)
    dbg.start()
    mode = dbg._api_mode
    try:
        found = _c_string_lookup(mode, b"__torch_function__")
        assert found is mode._handler and _c_string_lookup(found, b"__self__") is mode and found.__self__ is mode
        assert mode.__torch_function__.__func__ is api_mode.ApiMode.__torch_function__  # getattr: dynamo's view
        seen = []
        real = api_mode.ApiMode.__torch_function__
        api_mode.ApiMode.__torch_function__ = lambda *a, **k: seen.append(a[1]) or real(*a, **k)
        try:
            out = torch.add(x, y)
        finally:
            api_mode.ApiMode.__torch_function__ = real
        # the patched class function is another function than the one string_lookups saw: torch got the bound
        # Python one, so nothing is hidden from a changed class
        assert seen == [torch.add]
        out2 = torch.mul(x, y)  # the class as it was: torch calls the C handler, no Python handler runs
    finally:
        dbg.stop()
        dbg.step()
        dbg.close()
    assert torch.equal(out, x + y) and torch.equal(out2, x * y)
    assert list(msprobe_nb.load(tmp_path / "d").calls.op.drop_duplicates()) == ["add", "mul"]


def test_the_c_handler_torch_calls_steps_aside_while_compiling(tmp_path, monkeypatch):
    """torch.compiler.is_compiling() is what the Python handler checks first; the handler torch calls directly
    reads the same flag, so a call made while it is set (dynamo tracing, export) is not recorded by either."""
    rows = {}
    for c in (True, False):
        with handlers(c):
            dbg = msprobe_nb.Debugger(dump_path=tmp_path / str(c), level="L1")
            x = torch.ones(3)
            dbg.start()
            torch.sin(x)
            monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
            assert torch.compiler.is_compiling()
            torch.cos(x)
            monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
            torch.tan(x)
            dbg.stop()
            dbg.step()
            dbg.close()
        rows[c] = list(msprobe_nb.load(tmp_path / str(c)).calls.op.drop_duplicates())
    assert rows[True] == rows[False] == ["sin", "tan"]


def test_without_torchs_compiling_flag_torch_gets_the_python_handler():
    """The handler torch calls directly reads torch.compiler's compiling flag; a torch without that bool flag
    keeps the Python __torch_function__ (and its is_compiling() check) for every call, and records as before."""
    import subprocess
    import sys
    code = ("import ctypes, tempfile, torch, msprobe_nb\n"
            "torch.compiler._is_compiling_flag = 0\n"  # not the bool flag the C handler reads: as if absent
            "from msprobe_nb.capture import api_mode\n"
            "get = ctypes.pythonapi.PyObject_GetAttrString\n"
            "get.restype, get.argtypes = ctypes.py_object, [ctypes.py_object, ctypes.c_char_p]\n"
            "d = tempfile.mkdtemp()\n"
            "dbg = msprobe_nb.Debugger(dump_path=d, level='L1')\n"
            "x = torch.ones(2)\n"
            "dbg.start()\n"
            "mode = dbg._api_mode\n"
            "found = get(mode, b'__torch_function__')\n"
            "torch.sin(x)\n"
            "dbg.stop(); dbg.step(); dbg.close()\n"
            "print(mode._handler is not None, found.__func__ is api_mode.ApiMode.__torch_function__,\n"
            "      list(msprobe_nb.load(d).calls.op.drop_duplicates()) == ['sin'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "True"]


def test_a_subclass_or_an_instance_attribute_keeps_its_own_handler(tmp_path):
    """Where getattr would not give ApiMode's own __torch_function__ bound to the mode, torch's lookup gives what
    getattr gives, even for a mode that has its C handler."""
    class Sub(api_mode.ApiMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return "sub"

    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1")
    dbg.start()
    rec = dbg._recorder
    dbg.stop()
    sub = Sub(rec)
    assert sub._handler is not None
    assert _c_string_lookup(sub, b"__torch_function__").__func__ is Sub.__torch_function__
    t = torch.ones(1)
    with sub:
        assert torch.add(t, 1) == "sub"
    mode = api_mode.ApiMode(rec)
    mode.__torch_function__ = "an instance's own"
    assert _c_string_lookup(mode, b"__torch_function__") == "an instance's own"
    other = api_mode.ApiMode(rec)
    mode.__torch_function__ = other.__torch_function__  # ApiMode's function, bound to another mode
    assert _c_string_lookup(mode, b"__torch_function__").__self__ is other
    mode.__dict__.pop("__torch_function__")
    mode._handler = other._handler  # another mode's handler records for that mode, not this one
    assert _c_string_lookup(mode, b"__torch_function__").__func__ is api_mode.ApiMode.__torch_function__
    dbg.close()


def test_the_lookup_read_from_the_instance_dict_keeps_getattrs_rules(tmp_path, monkeypatch):
    """torch's lookup reads the mode's handler from its instance dict only where getattr would give the same
    answer. A data descriptor named ``_handler`` put on the class wins over the instance dict, as getattr has
    it; a ``__getattribute__`` put on the class takes the lookup away from the C string path altogether."""
    dbg = msprobe_nb.Debugger(dump_path=tmp_path / "d", level="L1")
    dbg.start()
    mode = dbg._api_mode
    try:
        assert _c_string_lookup(mode, b"__torch_function__") is mode._handler
        monkeypatch.setattr(api_mode.ApiMode, "_handler", property(lambda self: None), raising=False)
        assert "_handler" in mode.__dict__ and mode._handler is None
        found = _c_string_lookup(mode, b"__torch_function__")
        assert found.__func__ is api_mode.ApiMode.__torch_function__ and found.__self__ is mode
        monkeypatch.undo()
        assert _c_string_lookup(mode, b"__torch_function__") is mode._handler
        monkeypatch.setattr(api_mode.ApiMode, "__getattribute__", lambda self, name: "its own way"
                            if name == "__torch_function__" else object.__getattribute__(self, name), raising=False)
        assert _c_string_lookup(mode, b"__torch_function__") == "its own way"
        monkeypatch.undo()
    finally:
        api_mode._api_handler.string_lookups(api_mode.ApiMode)  # a __getattribute__ set on the class cleared it
        dbg.stop()
        dbg.close()
    assert _c_string_lookup(mode, b"__torch_function__") is mode._handler


def test_the_c_paths_make_calls_as_the_class_says(tmp_path, monkeypatch):
    """The C paths store a Call's fields at its slots without its Python __init__ only while Call is the plain
    dataclass: with __init__ replaced (same signature, another function) every Call goes through it, and the
    dump is the one the class's own __init__ gives."""
    from msprobe_nb.capture import calls

    original = calls.Call.__init__
    made = []

    def __init__(self, call, family, op, counter, direction, module_path="", parent="", stack_id=-1, index=-1,
                 rng="", rng_state="", dump=True, slot=-1):
        made.append(call)
        original(self, call, family, op, counter, direction, module_path, parent, stack_id, index, rng, rng_state,
                 dump, slot)

    def run(name):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        x = torch.randn(2, 4, requires_grad=True)
        dbg = msprobe_nb.Debugger(dump_path=tmp_path / name, level="mix")
        dbg.start(model)
        model(x).sum().backward()
        dbg.stop()
        dbg.step()
        dbg.close()
        return msprobe_nb.load(tmp_path / name).calls

    plain = run("plain")
    assert made == []
    monkeypatch.setattr(calls.Call, "__init__", __init__)
    patched = run("patched")
    # module forwards and backwards, API forwards and backwards: every kind of Call went through __init__
    assert {"forward", "backward"} <= {c.rsplit(".", 1)[-1] for c in made if not c.startswith("Module.")}
    assert any(c.startswith("Module.") and ".forward." in c for c in made)
    assert any(c.startswith("Module.") and ".backward." in c for c in made)
    assert plain.equals(patched)
