"""Activation checkpointing: the recompute and its backward are recorded, named as msprobe names them.

Reentrant checkpointing recomputes the forward inside autograd's backward, where no function mode is
active; the kit pushes its mode for that node's backward only. The recomputed calls take the next call
counters (``Functional.linear.3.forward``), as msprobe's hooks would give them, with direction
``recompute``; their backward rows are the checkpointed layers' API backward.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint as cp
from helpers import enable_checkpointing

from msprobe_nb.analysis.compare import compare
from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Dropout(0.3), nn.Linear(8, 8))
        self.b = nn.Linear(8, 2)

    def forward(self, x, mode):
        h = self.a(x) if mode == "none" else cp.checkpoint(self.a, x, use_reentrant=mode == "reentrant")
        return self.b(h).square().mean()


def train(path, mode, level, record=True):
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(4, 8, requires_grad=True)
    dbg = Debugger(dump_path=str(path), level=level, task="statistics") if record else None
    if dbg:
        dbg.start(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = net(x, mode)
        loss.backward()
    if dbg:
        dbg.stop()
    return [loss.detach(), x.grad] + [p.grad for p in net.parameters()]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_reentrant_recompute_and_backward_are_recorded(tmp_path, level):
    train(tmp_path / "plain", "none", level)
    train(tmp_path / "ckpt", "reentrant", level)
    plain, ckpt = load(str(tmp_path / "plain")).calls, load(str(tmp_path / "ckpt")).calls
    api = lambda c, d: sorted({k for k, f in zip(c["call"], c["family"]) if k.endswith(d) and f != "Module"})  # noqa: E731
    # every API backward of the plain run has a counterpart: the checkpointed layers' through the recompute
    assert len(api(ckpt, ".backward")) == len(api(plain, ".backward"))
    recomputed = ckpt[ckpt["direction"] == "recompute"]
    assert set(recomputed["call"]) >= {"Functional.linear.3.forward", "Functional.gelu.1.forward",
                                       "Functional.dropout.1.forward", "Functional.linear.4.forward"}
    assert {"Functional.linear.3.backward", "Functional.linear.4.backward"} <= set(ckpt["call"])
    assert not any("autograd.backward" in k or "detach" in k for k in ckpt["call"])  # checkpoint's plumbing


@pytest.mark.parametrize("mode", ["reentrant", "non-reentrant"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_checkpointed_training_is_bitwise_unchanged_and_self_consistent(tmp_path, mode, level):
    plain = train(tmp_path / "x", mode, level, record=False)
    a = train(tmp_path / "a", mode, level)
    train(tmp_path / "b", mode, level)
    for u, v in zip(plain, a):
        assert torch.equal(u, v)
    assert compare(load(str(tmp_path / "a")), load(str(tmp_path / "b"))).first_divergence() is None


def test_non_reentrant_recompute_adds_no_backward_rows_of_its_own(tmp_path):
    train(tmp_path / "plain", "none", "mix")
    train(tmp_path / "ckpt", "non-reentrant", "mix")
    plain, ckpt = load(str(tmp_path / "plain")).calls, load(str(tmp_path / "ckpt")).calls
    back = lambda c: sorted(set(c.loc[c["direction"] == "backward", "call"]))  # noqa: E731
    assert back(ckpt) == back(plain)


def test_llama_with_reentrant_checkpointing_records_the_layers_backward(tmp_path):
    tf = pytest.importorskip("transformers", reason="transformers is not installed (optional real-model test)")
    cfg = tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64, max_position_embeddings=32, use_cache=False)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))

    def run(path, ckpt):
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(cfg)
        model.train()
        if ckpt:
            enable_checkpointing(model, reentrant=True)
        dbg = Debugger(dump_path=str(path), level="L1", task="statistics")
        dbg.start(model)
        model(input_ids=ids, labels=ids).loss.backward()
        dbg.stop()
        c = load(str(path)).calls
        return {k for k in c["call"] if k.endswith(".backward")}, int((c["direction"] == "recompute").sum())

    (plain, none), (ckpt, recomputed) = run(tmp_path / "plain", False), run(tmp_path / "ckpt", True)
    assert none == 0 and recomputed > 0  # the layers really were checkpointed, and their recompute recorded
    assert len(ckpt) == len(plain) > 50  # without the recompute, the checkpointed layers had none
