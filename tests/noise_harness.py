"""Two runs that differ only by device-like precision noise, optionally with one planted wrong kernel.

:class:`DeviceNoise` is a ``TorchFunctionMode`` entered *before* the kit records, so the kit records what it
returns: every compute call (linear/addmm/matmul/conv, softmax, layer_norm, rsqrt, activations) has its
output scaled elementwise by ``1 + u * amp`` (``u`` uniform in [-1, 1] from a seeded generator), and the
gradient flowing back into its backward by another such factor (a tensor hook: noise on the backward
kernels). The bench run uses ``amp = 0``: no mode effect at all. A planted kernel
replaces one call, named by its op and its occurrence: ``("softmax", 1)`` is the second softmax.
"""
from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load

AMP = 2.0 ** -8

_OPS = {F.linear: "linear", torch.addmm: "addmm", torch.matmul: "matmul", torch.Tensor.matmul: "matmul",
        torch.Tensor.__matmul__: "matmul", torch.bmm: "bmm", F.conv2d: "conv2d",
        F.softmax: "softmax", torch.softmax: "softmax", torch.Tensor.softmax: "softmax",
        F.layer_norm: "layer_norm", torch.rsqrt: "rsqrt", F.gelu: "gelu", F.silu: "silu", F.relu: "relu",
        torch.tanh: "tanh"}


def _planted(name, func, args, kwargs):
    """The wrong kernel for op ``name``: computed from the same inputs, differently."""
    if name == "softmax":  # a tiled softmax whose sum misses a tile: 1/8 of its keys (from the second on)
        x = args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
        n = x.shape[dim]
        e = (x.float() - x.float().amax(dim, keepdim=True)).exp()
        s = e.sum(dim, keepdim=True) - e.narrow(dim, 1, max(1, n // 8)).sum(dim, keepdim=True)
        return (e / s).to(func(*args, **kwargs).dtype)
    if name in ("gelu", "silu", "relu", "tanh"):  # an activation 3 % off
        return func(*args, **kwargs) * 1.03
    if name == "layer_norm":  # eps 0.1
        x, shape = args[0], args[1]
        w = kwargs.get("weight", args[2] if len(args) > 2 else None)
        b = kwargs.get("bias", args[3] if len(args) > 3 else None)
        return F.layer_norm(x, shape, w, b, 0.1)
    if name == "rsqrt":  # an RMS norm with eps 0.1
        return torch.rsqrt(args[0] + 0.1)
    if name in ("linear", "addmm", "matmul"):  # a matmul dropping the last eighth of its reduction
        if name == "linear":
            x, w = args[0], args[1]
            b = kwargs.get("bias", args[2] if len(args) > 2 else None)
            k = x.shape[-1] - x.shape[-1] // 8
            return F.linear(x[..., :k], w[:, :k], b)
        a, bm = (args[1], args[2]) if name == "addmm" else (args[0], args[1])
        k = a.shape[-1] - a.shape[-1] // 8
        out = a[..., :k] @ bm[..., :k, :]
        return out + args[0] if name == "addmm" else out
    raise ValueError(f"no planted kernel for {name}")


class DeviceNoise(TorchFunctionMode):
    """Noise on every compute call's output and gradient; ``plant=(op, n)`` swaps the n-th ``op`` call for a
    wrong kernel, ``plant_backward=(op, n)`` makes only its gradient wrong (8 % off)."""

    def __init__(self, amp=AMP, seed=0, plant=None, plant_backward=None):
        super().__init__()
        self.amp = amp
        self.gen = torch.Generator().manual_seed(seed)
        self.bgen = torch.Generator().manual_seed(seed + 1)
        self.plant, self.plant_backward = plant, plant_backward
        self.seen: dict[str, int] = {}

    def _factor(self, t, gen):
        if not self.amp:
            return None
        return 1 + (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1) * self.amp

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _OPS.get(func)
        if name is None:
            return func(*args, **kwargs)
        n = self.seen.get(name, 0)
        self.seen[name] = n + 1
        out = _planted(name, func, args, kwargs) if self.plant == (name, n) else func(*args, **kwargs)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        wrong = self.plant_backward == (name, n)
        if out.requires_grad and (self.amp or wrong):
            def bwd(g, wrong=wrong):  # a tensor hook: the gradient into this call's own backward kernel
                f = self._factor(g, self.bgen)
                f = torch.ones((), dtype=torch.float64) if f is None else f
                return (g.double() * (f * 1.08 if wrong else f)).to(g.dtype)
            out.register_hook(bwd)
        f = self._factor(out, self.gen)
        return out if f is None else (out.double() * f).to(out.dtype)


# ----------------------------------------------------------------------------------------------- models
V, T = 64, 8


def gpt2():
    import transformers as tf
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=V, n_positions=16,
                                            activation_function="gelu", attn_implementation="eager",
                                            bos_token_id=0, eos_token_id=0))


def llama():
    import transformers as tf
    return tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                              num_attention_heads=2, num_key_value_heads=1, vocab_size=V,
                                              max_position_embeddings=16, use_cache=False,
                                              attn_implementation="eager"))


def bert():
    import transformers as tf
    return tf.BertForMaskedLM(tf.BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                            num_attention_heads=2, vocab_size=V, max_position_embeddings=16,
                                            attn_implementation="eager"))


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        return self.fc(x.flatten(1))


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "cnn": SmallCNN}


def _loss(name, model):
    if name == "cnn":
        x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        return F.cross_entropy(model(x).float(), torch.tensor([1, 3]))
    ids = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(0))
    return model(input_ids=ids, labels=ids).loss


def record(path, name, *, level="mix", task="statistics", autocast=True, noise=None):
    """Record one training step of model ``name`` under ``noise`` (a DeviceNoise, or None: no mode)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MODELS[name]()
    model.eval()  # no dropout draws: the runs differ by the noise alone
    mode = noise if noise is not None else DeviceNoise(amp=0)
    with mode:
        dbg = Debugger(dump_path=str(path), level=level, task=task)
        dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = _loss(name, model)
        loss.backward()
        dbg.stop()
    return load(str(path))


def pair(tmp, name, *, level="mix", task="statistics", plant=None, plant_backward=None, fp32_bench=False,
         seed=0):
    """(npu, bench) dumps: the NPU run noisy (and planted), the bench clean (fp32 when ``fp32_bench``)."""
    npu = record(tmp / f"npu_{name}_{level}", name, level=level, task=task,
                 noise=DeviceNoise(seed=seed, plant=plant, plant_backward=plant_backward))
    bench = record(tmp / f"bench_{name}_{level}_{int(fp32_bench)}", name, level=level, task=task,
                   autocast=not fp32_bench)
    return npu, bench
