"""The API pre-check finds planted bad CPU kernels, and only them, and passes correct models in both tasks.

Bad kernels are planted through ``torch.library`` (the CPU kernel of aten::_softmax computing in bf16,
aten::gelu with the tanh formula, aten::native_layer_norm with a wrong eps) while one step is recorded in
tensor mode; the overrides are removed before the pre-check runs, so the bench computes correctly, as a
bench machine would.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from planted_kernels import planted_kernels

import msprobe_nb as mp
from msprobe_nb.precheck.acc_check import acc_check


class Block(nn.Module):
    """Embedding, attention written out, layer norm, GELU MLP, dropout: the ops the planted kernels touch
    and many they do not."""

    def __init__(self, d=16, heads=2, vocab=30):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(d, 5)

    def forward(self, tokens):
        x = self.emb(tokens)
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        w = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads), dim=-1)
        x = x + torch.matmul(w, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.down(F.gelu(self.up(self.norm(x)))))
        return self.head(x.mean(dim=1))


def _block_step():
    torch.manual_seed(0)
    m = Block()
    tokens, labels = torch.randint(0, 30, (4, 8)), torch.randint(0, 5, (4,))
    return m, lambda: F.cross_entropy(m(tokens), labels).backward()


def _record(tmp_path, name, make, task):
    model, run = make()
    with mp.record(dump_path=str(tmp_path / name), task=task, level="L1", model=model) as dbg:
        run()
    return dbg.dump_dir


def _failing_ops(pre):
    return {op for op in pre.failures()["op"]}


def test_planted_kernels_fail_exactly_their_apis(tmp_path):
    with planted_kernels():
        path = _record(tmp_path, "bad", _block_step, "tensor")
    pre = acc_check(path)
    assert _failing_ops(pre) == {"softmax", "gelu", "layer_norm"}
    forward = pre[pre["direction"] == "forward"]
    for op in ("softmax", "gelu", "layer_norm"):  # every forward call of a planted op fails, with its reason
        rows = forward[forward["op"] == op]
        assert len(rows) and (rows["verdict"] == "error").all(), rows[["api", "verdict", "reasons"]]
        assert rows["reasons"].str.contains("error: ").all()
    assert pre.unchecked().empty, pre.unchecked()[["api", "reasons"]]
    assert "Torch.softmax.0.forward" in pre.failed_apis()


@pytest.mark.parametrize("name", ["softmax", "gelu", "layer_norm"])
def test_each_planted_kernel_alone_fails_only_its_api(tmp_path, name):
    aten = {"softmax": "_softmax", "gelu": "gelu", "layer_norm": "native_layer_norm"}[name]
    with planted_kernels((aten,)):
        path = _record(tmp_path, name, _block_step, "tensor")
    assert _failing_ops(acc_check(path, backward=False)) == {name}


def test_level_l2_replays_each_aten_op_alone(tmp_path):
    """At L2 the planted kernels' aten ops fail (not the backward ops autograd ran after them), uninitialised
    memory is unchecked, and the correct step fails nothing."""
    def check(plant):
        torch.manual_seed(0)
        model, run = _block_step()
        with planted_kernels(plant), mp.record(dump_path=str(tmp_path / f"l2{len(plant)}"), task="tensor",
                                               level="L2", model=model) as dbg:
            run()
        return acc_check(dbg.dump_dir)

    bad = check(("_softmax", "gelu", "native_layer_norm"))
    assert set(bad.failures()["op"]) == {"_softmax", "gelu", "native_layer_norm"}
    assert (bad.failures()["direction"] == "forward").all()
    good = check(())
    assert good.failures().empty, good[good["verdict"] != "pass"]
    # a dump keeps a tensor's values, not its strides: the replayed GEMM may take another path than the recorded
    # one (F.linear's transposed weight) and round in another order. On some CPUs (AMD EPYC here) that puts a
    # small addmm's max relative error a few ULPs above the reference kernel's, over the 2x warning line;
    # anything else warned about, or any other metric, is a fault
    warned = good[good["verdict"] == "warning"]
    assert set(warned["op"]) <= {"addmm", "mm", "bmm"}, warned
    assert all(r.startswith("warning: max_rel_err") and " | " not in r for r in warned["reasons"]), warned["reasons"]
    assert (warned["max_rel_err"] < 32 * torch.finfo(torch.float32).eps).all()
    assert set(good.unchecked()["op"]) <= {"empty_like", "empty"}


def test_override_is_removed_even_when_the_block_raises():
    x = torch.randn(3, 5)
    want = torch.softmax(x, -1)
    with pytest.raises(RuntimeError, match="inside"), planted_kernels():
        assert not torch.equal(torch.softmax(x, -1), want)
        raise RuntimeError("inside")
    assert torch.equal(torch.softmax(x, -1), want)


# ------------------------------------------------------------------------------------ no false positives
def _cnn_step():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 8, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    x, y = torch.randn(4, 3, 12, 12), torch.randint(0, 5, (4,))
    return m, lambda: F.cross_entropy(m(x), y).backward()


class _LSTMNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.head = nn.Linear(16, 3)

    def forward(self, t):
        h, _ = self.lstm(self.emb(t))
        return self.head(h[:, -1])


def _lstm_step():
    torch.manual_seed(0)
    m = _LSTMNet()
    t, y = torch.randint(0, 20, (4, 7)), torch.randint(0, 3, (4,))
    return m, lambda: F.cross_entropy(m(t), y).backward()


def _gpt2_step():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=32, n_head=4, n_layer=1, n_positions=16, attn_pdrop=0.1, resid_pdrop=0.1)
    cfg._attn_implementation = "eager"
    m = GPT2Block(cfg).train()
    x = torch.randn(2, 8, 32)
    return m, lambda: m(x)[0].pow(2).mean().backward()


@pytest.mark.parametrize("task", ["tensor", "statistics"])
@pytest.mark.parametrize("make", [_block_step, _cnn_step, _lstm_step, _gpt2_step],
                         ids=["block", "cnn", "lstm", "gpt2_block"])
def test_correct_kernels_fail_nothing(tmp_path, make, task):
    pre = acc_check(_record(tmp_path, "ok", make, task))
    assert pre.counts()["pass"] > 10
    assert pre.failures().empty, pre.failures()[["api", "output", "standard", "reasons"]].to_string()
    assert (pre["verdict"] != "warning").all()
    if task == "statistics":
        assert pre["approximate"].all() and any("approximate" in n for n in pre.notes)
        # dropout masks are in no statistic: listed with why, not passed
        drop = pre[pre["api_class"] == "dropout"]
        assert (drop["verdict"] == "unchecked").all() and drop["reasons"].str.contains("mask").all()
    else:
        assert not pre["approximate"].any()
        assert pre.unchecked().empty, pre.unchecked()[["api", "reasons"]].to_string()
