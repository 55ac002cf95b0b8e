"""Diagnosis defects of issue 30 (item 5), each reproduced on a small real model and fixed.

* a dropout with ``p=0`` draws nothing: never the root, even when the two runs' seeds differ;
* a drop-path drawn with ``torch.bernoulli``: the first advice is the one that removes it (host_random);
* at L2, an in-place draw's ``self`` input is overwritten memory (``empty_like``): never compared;
* a call made by the bench run only is a root, like one made by the NPU run only;
* two unrelated dumps: a warning whenever either side is mostly unmatched, and the CLI exits non-zero.
"""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from msprobe_nb.analysis.compare import compare
from msprobe_nb.analysis.provenance import trace_randomness
from msprobe_nb.debugger import Debugger
from msprobe_nb.store.dump import load

transformers = pytest.importorskip("transformers")


@contextlib.contextmanager
def gelu_three_percent_off():
    """The NPU run's GELU kernel returns 1.03 times the exact GELU (a planted wrong kernel)."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            lib.impl("gelu", lambda x, approximate="none": x * 0.5 * (1 + torch.erf(x * 0.7071067811865476)) * 1.03,
                     "CPU")
        yield
    finally:
        lib._destroy()


def gpt2(**over):
    cfg = dict(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=64, activation_function="gelu",
               attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    cfg.update(over)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**cfg, attn_implementation="eager"))
    return model.train()


def record(path, model, step, *, level, task="statistics", seed=0, **cfg):
    """One recorded training step; ``seed`` reseeds the default generator right before it."""
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dbg = Debugger(dump_path=str(path), level=level, task=task, **cfg)
        dbg.start(model)
        step(model).backward()
        dbg.stop()
    return load(str(path))


def lm_step(model):
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    return model(ids, labels=ids).loss


def quiet_compare(a, b, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compare(a, b, **kw)


# ------------------------------------------------------------------------------- dropout with p=0
@pytest.mark.parametrize("level,task", [("L1", "statistics"), ("mix", "statistics"), ("L1", "tensor"),
                                        ("mix", "tensor")])
def test_a_dropout_with_p_zero_is_never_the_root_when_the_seeds_differ(tmp_path, level, task):
    """GPT-2 with every dropout at p=0 (F.dropout(a, 0.0, training=True)), seeds 1 and 2, and a GELU 3 % off
    on the NPU side: the GELU is the root, not a dropout that drew nothing."""
    def planted(model):
        with gelu_three_percent_off():
            return lm_step(model)
    npu = record(tmp_path / "npu", gpt2(), planted, level=level, task=task, seed=1)
    bench = record(tmp_path / "bench", gpt2(), lm_step, level=level, task=task, seed=2)
    result = quiet_compare(npu, bench)
    d = result.first_divergence()
    assert d is not None and d.call == "Functional.gelu.0.forward" and d.kind == "call", d
    assert not trace_randomness(result).found
    drops = npu.calls[npu.calls["op"] == "dropout"]
    assert len(drops) and (drops["rng"] == "no draw").all() and (drops["rng_state"] == "").all()


# ------------------------------------------------------------------------------- drop-path advice
class DropPath(torch.nn.Module):
    """Stochastic depth as timm writes it by hand: a per-sample torch.bernoulli mask, no dropout API."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        keep = 1 - self.p
        mask = torch.bernoulli(torch.full((x.shape[0], 1), keep))
        return x * mask / keep


class Residual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.drop_path = torch.nn.Linear(8, 8), DropPath(0.5)

    def forward(self, x):
        return x + self.drop_path(self.fc(x))


def drop_path_step(model):
    return model(torch.randn(8, 8, generator=torch.Generator().manual_seed(1))).square().mean()


def test_the_first_advice_for_a_bernoulli_drop_path_is_what_removes_it(tmp_path):
    def model():
        torch.manual_seed(0)
        return Residual()
    result = quiet_compare(record(tmp_path / "npu", model(), drop_path_step, level="L1", seed=1),
                           record(tmp_path / "bench", model(), drop_path_step, level="L1", seed=2))
    trace = trace_randomness(result)
    assert list(trace.sources.call) == ["Torch.bernoulli.0.forward"], trace
    assert "host_random=True" in trace.advice[0] and "dropout_off=True" not in trace.advice[0], trace.advice
    # the advice holds: with host_random the runs agree, with dropout_off they still do not
    host = quiet_compare(record(tmp_path / "npu2", model(), drop_path_step, level="L1", seed=1, host_random=True),
                         record(tmp_path / "bench2", model(), drop_path_step, level="L1", seed=2, host_random=True))
    assert host.first_divergence() is None
    off = quiet_compare(record(tmp_path / "npu3", model(), drop_path_step, level="L1", seed=1, dropout_off=True),
                        record(tmp_path / "bench3", model(), drop_path_step, level="L1", seed=2, dropout_off=True))
    assert off.first_divergence() is not None


# ------------------------------------------------------------------------------- L2: overwritten inputs
def bert_mlm():
    cfg = transformers.BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=16, attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(cfg).train()


def t5():
    cfg = transformers.T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                dropout_rate=0.1, decoder_start_token_id=0)
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(cfg).train()


L2_MODELS = {"gpt2": lambda: gpt2(attn_pdrop=0.1, resid_pdrop=0.1, embd_pdrop=0.1), "bert": bert_mlm, "t5": t5}


def garbage(calls, draw_inputs):
    """The bench run's copy of the table with what uninitialised memory looks like in the in-place draws'
    ``self`` inputs: other numbers, NaN among them."""
    calls = calls.copy()
    calls.loc[draw_inputs, ["max", "min", "mean", "norm"]] = [float("nan"), -3.0e38, 7.0, 1.0e30]
    calls.loc[draw_inputs, "nan_count"] = 3
    return calls


@pytest.mark.parametrize("name", sorted(L2_MODELS))
def test_identical_seeded_l2_runs_with_dropout_never_compare_the_memory_a_draw_overwrites(tmp_path, name):
    npu = record(tmp_path / "npu", L2_MODELS[name](), lm_step, level="L2", seed=3)
    calls = npu.calls
    draw_inputs = (calls["op"] == "bernoulli_") & (calls["io"] == "input") & (calls["arg"] == "0")
    assert draw_inputs.sum() >= 2  # the dropout masks, drawn into empty_like memory
    result = quiet_compare(calls, garbage(calls, draw_inputs))
    assert result.first_divergence() is None
    graded = result[result["name"].str.startswith("Aten.bernoulli_.")]
    assert set(graded["result"]) == {"pass"} and set(graded["msprobe_result"]) == {"pass"}, \
        graded.loc[graded["result"] != "pass", ["name", "reasons"]].to_string()
    assert graded.loc[graded["name"].str.endswith(".input.0"), "uninitialised"].all()


def test_the_self_input_of_an_in_place_draw_is_never_compared_whoever_made_it():
    """``torch.ones(...).uniform_()``: uniform_ overwrites its self input whatever it holds, so even a self
    that a recorded call filled (no empty_like behind it) is not compared."""
    import pandas as pd

    from msprobe_nb.store.schema import coerce_calls

    def table(self_max):
        rows = [dict(step=0, rank=0, call_index=0, call="Aten.fill_.0.forward", name=f"Aten.fill_.0.forward.{io}.0",
                     io=io, arg="0", kind="tensor", dtype="torch.float32", shape=(4,), max=v, min=v, mean=v, norm=v)
                for io, v in (("input", 0.0), ("output", self_max))]
        rows += [dict(step=0, rank=0, call_index=1, call="Aten.uniform_.0.forward",
                      name=f"Aten.uniform_.0.forward.{io}.0", io=io, arg="0", kind="tensor", dtype="torch.float32",
                      shape=(4,), max=v, min=0.0, mean=v / 2, norm=v, producer=p)
                 for io, v, p in (("input", self_max, "Aten.fill_.0.forward"), ("output", 0.9, ""))]
        return coerce_calls(pd.DataFrame(rows))
    result = quiet_compare(table(1.0), table(1.0))
    row = result[result["name"] == "Aten.uniform_.0.forward.input.0"].iloc[0]
    assert bool(row["uninitialised"]) and row["result"] == "pass"


# ------------------------------------------------------------------------------- a call one side only makes
def llama(layers=2):
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                                   attn_implementation="eager")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).train()


def scaled_logits_step(scale):
    def step(model):
        ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        logits = model(ids).logits
        if scale:
            logits = torch.mul(logits, 1.001)  # EXTRA CALL
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    return step


@pytest.mark.parametrize("extra_on", ["bench", "npu"])
def test_a_call_made_by_one_run_only_is_the_root_whichever_run_makes_it(tmp_path, extra_on):
    """The bench scales the logits by 1.001 (1e-3 relative: under the tolerance once the bench is the
    reference, so only the gradients show it); with the sides swapped the NPU does."""
    npu = record(tmp_path / "npu", llama(), scaled_logits_step(extra_on == "npu"), level="L1")
    bench = record(tmp_path / "bench", llama(), scaled_logits_step(extra_on == "bench"), level="L1")
    d = quiet_compare(npu, bench).first_divergence()
    assert d is not None and d.call == "Torch.mul.0.forward" and d.kind == "extra", d
    assert f"made in the {'bench' if extra_on == 'bench' else 'NPU'} run only" in d.message
    assert d.frame and d.frame.startswith(__file__) and "EXTRA CALL" in (d.frame_source or ""), d


# ------------------------------------------------------------------------------- mostly unmatched dumps
def deep_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[m for _ in range(12) for m in (torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                                                torch.nn.GELU())])


def small_mlp():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(8, 8))


def mlp_step(model):
    return model(torch.randn(4, 8, generator=torch.Generator().manual_seed(1))).square().mean()


def test_two_unrelated_dumps_with_a_small_bench_are_said_to_be_mostly_unmatched(tmp_path, capsys):
    from msprobe_nb.cli import main
    from msprobe_nb.viewers.compare_viewer import CompareViewer

    npu = record(tmp_path / "npu", deep_mlp(), mlp_step, level="L1")
    bench = record(tmp_path / "bench", small_mlp(), mlp_step, level="L1")
    with pytest.warns(UserWarning, match="NPU rows have no bench counterpart"):
        res = compare(npu, bench)
    c = res.counts()
    assert c["unmatched"] > 0.8 * c["rows"]  # the bench is small: all of it matches, most of the NPU run does not
    assert res.mostly_unmatched and any("no bench counterpart" in n for n in res.notes)
    header = CompareViewer(res)._header_html()
    assert "warning:" in header and "no bench counterpart" in header
    assert main(["compare", str(tmp_path / "npu"), str(tmp_path / "bench"), "-q"]) == 3
    # the same run against itself is neither warned about nor a failure
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = compare(npu, record(tmp_path / "npu2", deep_mlp(), mlp_step, level="L1"))
    assert not same.mostly_unmatched
    assert main(["compare", str(tmp_path / "npu"), str(tmp_path / "npu2"), "-q"]) == 0
