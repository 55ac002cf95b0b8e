"""The global module hooks in C (``capture/_module_hooks.c``) against their Python bodies (``ModuleHooks``).

L0 and mix record each module call through the hooks: its inputs, outputs and parameters, the tensor hooks of
its backward, and the module stack L1's parents come from. With or without the C hooks, the same model records
the same rows, names, counters, parents, stacks and backward rows, and trains bit for bit the same; a failure
inside a hook is noted and the model runs on, and an interrupt reaches the user.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from helpers import handlers, real_model
from test_api_handler import _assert_same, _gpt2, _own

import msprobe_nb
from msprobe_nb.capture import module_hooks

pytestmark = pytest.mark.skipif(module_hooks._module_hooks is None,
                                reason="msprobe_nb.capture._module_hooks is not built (no C compiler)")


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_our_model_records_the_same_with_either_hooks(tmp_path, level):
    calls = _assert_same(tmp_path, _own(), level=level)
    modules = calls[calls.family == "Module"]
    assert set(modules.direction) >= {"forward", "backward", "parameters_grad"}
    assert set(modules.io) >= {"input", "output", "parameters", "parameters_grad"}
    assert modules.parent.str.len().gt(0).any()


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_gpt2_records_the_same_with_either_hooks(tmp_path, level):
    """Hugging Face's keyword arguments and ModelOutput (a dict), weight tying, and a module (the dropout)
    whose input gradient comes before any of its outputs' in a backward."""
    calls = _assert_same(tmp_path, _gpt2, level=level)
    assert (calls.is_kwarg & (calls.family == "Module")).any()


@pytest.mark.parametrize("name", ["llama", "bert", "t5", "mixtral", "vit", "resnet", "unet"])
def test_real_models_record_the_same_with_either_hooks(tmp_path, name):
    """Llama's non-reentrant activation checkpointing (modules recomputed in the backward), BERT's bfloat16
    autocast, T5, Mixtral's routing, ViT, ResNet's BatchNorm, the diffusers UNet: L0, two steps each way."""
    _assert_same(tmp_path, real_model(name), level="L0")


@pytest.mark.parametrize("options", [
    {"scope": ["Module.0.lin.Linear.forward.0", "Module.1.lin.Linear.forward.0"]},
    {"list": ["lin"]},
    {"data_mode": ["backward", "output"]},  # rows through Recorder.add_rows' own filter
    {"stack": False},
    {"task": "tensor"},
], ids=["scope", "list", "data_mode", "no-stacks", "tensor"])
def test_the_options_record_the_same_with_either_hooks(tmp_path, options):
    _assert_same(tmp_path, _own(), level="L0", **options)


def _started(tmp, c: bool):
    """A model and its input, and a Debugger at L0 whose recorder exists, on the C or the Python hooks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    dbg = msprobe_nb.Debugger(dump_path=tmp, level="L0")
    dbg.start(model)
    dbg.stop()
    return model, x, dbg


def _step(model, x):
    model.zero_grad()
    out = model(x)
    out.square().sum().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.parametrize("part,where", [
    ("walk", "pre-hook of Linear"),
    ("hook", "forward hook of Linear"),
    ("construct", "a module backward"),
    ("selection", r"the gradient of \d\.(weight|bias)"),
])
def test_a_failure_inside_a_hook_is_noted_and_the_model_runs_on(tmp_path, c, part, where):
    """A part the hooks call back fails (the stack walk in the pre-hook, hooking a tensor in the forward hook,
    a module backward's construct entry in a tensor's gradient hook, the selection in a parameter's): the
    failure is noted with where it happened, the recorder is left unlocked and idle, and the model's results are
    bitwise those without the kit."""
    with handlers(c):
        model, x, dbg = _started(tmp_path / "d", c)
        want = _step(model, x)
        rec = dbg._recorder

        def broken(*a):
            raise ValueError(f"{part} broke")
        if part == "walk":
            rec.stacks.walked_id = broken
        elif part == "hook":
            rec.grads._hook_tensor = broken
        elif part == "selection":
            def selected(name, family, op):
                if "parameters_grad" in name:
                    raise ValueError("selection broke")
                return True
            rec.selected = selected
            rec._select_all = False  # else no hook asks: without a scope or list filter every call is selected
        dbg.start(model)
        assert (dbg._hooks._c is not None) == c
        if part == "construct":
            class Refusing(dict):
                def __setitem__(self, key, value):
                    if ".backward." in key:
                        raise ValueError("construct broke")
                    super().__setitem__(key, value)
            rec.construct = Refusing()
        with pytest.warns(RuntimeWarning, match=f"{where}: ValueError: {part} broke"):
            got = _step(model, x)
        dbg.stop()
        assert torch.equal(got[0], want[0]) and all(torch.equal(u, v) for u, v in zip(got[1], want[1]))
        assert any(f"{part} broke" in e for e in dbg.errors)
        assert rec.busy == 0 and rec.lock.acquire(blocking=False)
        rec.lock.release()
        dbg.close()


@pytest.mark.parametrize("c", [True, False], ids=["c", "python"])
@pytest.mark.filterwarnings("ignore:msprobe_nb. no call was recorded")
def test_an_interrupt_in_a_hook_is_not_swallowed(tmp_path, c):
    """Only Exceptions are noted and passed over: a KeyboardInterrupt raised inside the pre-hook reaches the
    user, and the recorder is left unlocked and idle."""
    with handlers(c):
        model, x, dbg = _started(tmp_path / "d", c)
        rec = dbg._recorder

        def interrupted(*a):
            raise KeyboardInterrupt
        rec._select_all, rec.selected = False, interrupted
        dbg.start(model)
        with pytest.raises(KeyboardInterrupt):
            model(x)
        dbg.stop()
        assert rec.busy == 0 and rec.lock.acquire(blocking=False)
        rec.lock.release()
        dbg.close()


def test_a_forward_that_raises_pops_its_module_and_records_no_output(tmp_path):
    """torch calls the always-call forward hook without kwargs when the forward raised: the module's stack
    entry is popped (with the entries its failed submodules left) and the caller's modules record on."""
    class Fails(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.lin(x)
            raise RuntimeError("planned")

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fails, self.after = Fails(), nn.Linear(4, 2)

        def forward(self, x):
            try:
                self.fails(x)
            except RuntimeError:
                pass
            return self.after(x)

    model, x = Outer(), torch.randn(3, 4)
    dumps = {}
    for c in (True, False):
        with handlers(c):
            dbg = msprobe_nb.Debugger(dump_path=tmp_path / str(c), level="L0")
            dbg.start(model)
            model(x).sum().backward()
            assert dbg._recorder.module_stack[1:] == []
            dbg.stop()
            dbg.step()
            dbg.close()
        dumps[c] = msprobe_nb.load(tmp_path / str(c)).calls
    a, b = dumps[True], dumps[False]
    assert list(a.name) == list(b.name)
    outs = set(a[a.io == "output"].name.str.split(".output").str[0])
    assert "Module.fails.Fails.forward.0" not in outs and "Module.after.Linear.forward.0" in outs
    assert (a[a.name.str.startswith("Module.after.")].parent == "").all()


def _no_grad_accessor():
    """A module called under ``torch.no_grad()`` that returns its parameter: the output requires grad even there,
    but a call made with gradients off has no backward (its hooks are not attached)."""
    class Table(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

        def forward(self):
            return self.w

    def make():
        model = nn.ModuleDict({"table": Table(), "lin": nn.Linear(4, 4)})
        x = torch.randn(3, 4)

        def step():
            model.zero_grad()
            with torch.no_grad():
                assert model["table"]().requires_grad
            (model["lin"](x) @ model["table"].w).sum().backward()
        return model, step
    return make


def test_a_call_made_without_gradients_has_no_backward_with_either_hooks(tmp_path):
    calls = _assert_same(tmp_path, _no_grad_accessor(), level="L0")
    assert "Module.table.Table.forward.0.output.0" in set(calls.name)
    assert not calls.name.str.startswith("Module.table.Table.backward").any()
    assert calls.name.str.startswith("Module.lin.Linear.backward").any()


def _accumulating():
    """Two micro-batches a step, each with its own backward: every parameter's gradient fires twice, as
    ``parameters_grad.0`` and ``.1`` of its module."""
    def make():
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
        xs = torch.randn(2, 3, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            for x in xs:
                model(x).square().mean().backward()
            opt.step()
        return model, step
    return make


def test_gradient_accumulation_counts_each_firing_with_either_hooks(tmp_path):
    calls = _assert_same(tmp_path, _accumulating(), level="L0")
    assert {"Module.0.Linear.parameters_grad.0", "Module.0.Linear.parameters_grad.1"} <= set(calls.call)


def _compiled():
    """A torch.compile'd model: its wrapper's hooks take the Python bodies, its modules (run eagerly under
    ``compile="eager"``) the C ones, on one module stack."""
    def make():
        model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4))
        cm = torch.compile(model)
        x = torch.randn(4, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)

        def step():
            opt.zero_grad()
            cm(x).pow(2).mean().backward()
            opt.step()
        return cm, step
    return make


@pytest.mark.parametrize("level", ["L0", "mix"])
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")
def test_a_compiled_model_run_eagerly_records_the_same_with_either_hooks(tmp_path, level):
    calls = _assert_same(tmp_path, _compiled(), level=level, compile="eager")
    assert {"Module.0.Linear.forward.0", "Module.3.Linear.backward.0"} <= set(calls.call)
    assert not calls.call.str.contains("_orig_mod").any()


class _Many(nn.Module):
    """A module past the 1,024 counter strings the C side makes once, under a path that is not ASCII."""

    def __init__(self):
        super().__init__()
        self.blöcke = nn.ModuleDict({"ü": nn.Linear(2, 2)})

    def forward(self, x):
        for _ in range(1100):
            x = torch.add(self.blöcke["ü"](x), 1.0)
        return x


def _many():
    def make():
        model = _Many()
        x = torch.randn(1, 2)

        def step():
            model(x).sum().backward()
        return model, step
    return make


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_names_past_the_counters_made_once_and_not_ascii_are_the_same_with_either_hooks(tmp_path, level):
    """Call names are joined in C (``_dotted_names.h``): counters past the strings made once, and a module path
    that is not ASCII, name the calls as Python's f-strings do."""
    calls = _assert_same(tmp_path, _many(), level=level)
    assert {"Module.blöcke.ü.Linear.forward.0", "Module.blöcke.ü.Linear.forward.1099"} <= set(calls.call)
    if level == "mix":
        assert {"Torch.add.1023.forward", "Torch.add.1024.forward", "Torch.add.1099.forward"} <= set(calls.call)
