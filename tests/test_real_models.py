"""Real models nobody here wrote (Hugging Face configs, random weights, built offline): identical seeded runs
never diverge, recording changes no bit, and a planted norm eps is named exactly, at every level.

Optional: skipped, saying why, where transformers is not installed.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from msprobe_nb.analysis.compare import compare
from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load

tf = pytest.importorskip("transformers", reason="transformers is not installed (optional real-model tests)")


def gpt2(eps):
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                            layer_norm_epsilon=eps, bos_token_id=0, eos_token_id=0))


def llama(eps):
    return tf.LlamaForCausalLM(tf.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                              num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                              max_position_embeddings=16, rms_norm_eps=eps, use_cache=False))


def mixtral(eps):
    return tf.MixtralForCausalLM(tf.MixtralConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=32,
                                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=64,
                                                  num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=eps,
                                                  max_position_embeddings=16, use_cache=False))


MODELS = {"gpt2": (gpt2, 1e-5), "llama": (llama, 1e-6), "mixtral": (mixtral, 1e-5)}
IDS = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(0))


def train(name, eps=None, path=None, level="mix"):
    build, default = MODELS[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own notes about configs
        model = build(default if eps is None else eps)
    model.train()
    torch.manual_seed(1)  # dropout draws
    dbg = Debugger(dump_path=str(path), level=level, task="statistics") if path else None
    if dbg:
        dbg.start(model)
    loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    if dbg:
        dbg.stop()
    return [loss.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


# the call that takes the changed eps: GPT-2's layer_norm, the RMS norms' "variance + eps"
PLANTED = {("gpt2", "L0"): "Module.transformer.h.0.ln_1.LayerNorm.forward.0",
           ("gpt2", "L1"): "Functional.layer_norm.0.forward", ("gpt2", "mix"): "Functional.layer_norm.0.forward",
           ("gpt2", "L2"): "Aten.native_layer_norm.0.forward",
           ("llama", "mix"): "Tensor.__add__.1.forward", ("mixtral", "mix"): "Tensor.__add__.1.forward"}


@pytest.mark.parametrize("name,level", list(PLANTED))
def test_identical_runs_agree_bitwise_and_a_planted_eps_is_named(tmp_path, name, level):
    plain = train(name)
    a = train(name, path=tmp_path / "a", level=level)
    for u, v in zip(plain, a):
        assert torch.equal(u, v)
    train(name, path=tmp_path / "b", level=level)
    bench = load(str(tmp_path / "b"))
    assert compare(load(str(tmp_path / "a")), bench).first_divergence() is None
    train(name, eps=1e-2, path=tmp_path / "c", level=level)
    d = compare(load(str(tmp_path / "c")), bench).first_divergence()
    assert d is not None and d.call == PLANTED[name, level], d
