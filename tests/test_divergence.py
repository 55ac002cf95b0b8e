"""First divergence: root call, kind, user frame and downstream chain."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from msprobe_nb.analysis.compare import compare
from msprobe_nb.analysis.divergence import forward_of, user_frame
from msprobe_nb.analysis.grading import Thresholds
from msprobe_nb.store.schema import coerce_calls

SHARED = Path(__file__).resolve().parents[2] / "shared"
TOY = SHARED / "interop" / "msprobe-cpu-toy-L1"
needs_toy = pytest.mark.skipif(not (TOY / "stat_L1_npu").is_dir(), reason=f"msprobe interop data not found under {TOY}")


def chain_table(values: list[tuple[float, float]], *, step=0, rank=0, producers=True, stack_ids=None) -> pd.DataFrame:
    """Call k takes input.0 (value values[k][0]) and gives output.0 (values[k][1]); input.0 comes from call k-1."""
    rows = []
    for k, (vin, vout) in enumerate(values):
        call = f"Torch.op{k}.0.forward"
        for io, v in (("input", vin), ("output", vout)):
            rows.append(dict(step=step, rank=rank, call_index=k, call=call, name=f"{call}.{io}.0", io=io, arg="0",
                             kind="tensor", dtype="torch.float32", shape=(8,), requires_grad=False,
                             max=v, min=-v, mean=v / 10, norm=3 * v,
                             producer=(f"Torch.op{k - 1}.0.forward" if producers and io == "input" and k else ""),
                             stack_id=(stack_ids or {}).get(call, -1)))
    return coerce_calls(pd.DataFrame(rows))


class _StackDump:
    task = "statistics"

    def __init__(self, calls, frames):
        self.calls, self.stack_frames = calls, frames


def test_no_divergence_gives_none():
    t = chain_table([(1.0, 2.0), (2.0, 3.0)])
    assert compare(t, t.copy()).first_divergence() is None


def test_root_call_and_chain():
    bench = chain_table([(1, 2), (2, 3), (3, 4), (4, 5), (5, 6)])
    npu = chain_table([(1, 2), (2, 3), (3, 4.5), (4.5, 5.5), (5.5, 6.5)])
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.op2.0.forward" and d.kind == "call" and d.call_index == 2
    assert [n for n, _ in d.outputs] == ["Torch.op2.0.forward.output.0"]
    assert d.outputs[0][1] == pytest.approx(0.125)  # max 4.5 vs 4
    assert d.inputs == []
    assert d.chain == ["Torch.op3.0.forward", "Torch.op4.0.forward"]
    assert list(d.chain_table["via"]) == ["Torch.op3.0.forward.input.0", "Torch.op4.0.forward.input.0"]
    assert d.previous_call == "Torch.op1.0.forward"
    text = str(d)
    assert "Torch.op2.0.forward" in text and "flows into 2 later call(s)" in text
    assert d.to_dict()["chain"] == d.chain


def test_first_call_with_diverging_inputs_is_the_root():
    bench = chain_table([(1, 2), (2, 3)])
    npu = chain_table([(1.5, 2.5), (2.5, 3.5)])
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.op0.0.forward" and d.kind == "inputs"
    assert "very first recorded call" in d.message and "data loading" in d.message
    assert d.inputs[0][0] == "Torch.op0.0.forward.input.0"
    assert d.chain == ["Torch.op1.0.forward"]


def test_inputs_diverging_between_recorded_calls():
    bench = chain_table([(1, 2), (2, 3), (3, 4)])
    npu = chain_table([(1, 2), (2.5, 3.5), (3.5, 4.5)])  # op0's output agrees, op1's input does not
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.op1.0.forward" and d.kind == "inputs"
    assert "Torch.op0.0.forward produced them" in d.message
    d2 = compare(chain_table([(1, 2), (2.5, 3.5)], producers=False), chain_table([(1, 2), (2, 3)])).first_divergence()
    assert "unrecorded operation after Torch.op0.0.forward" in d2.message


def test_chain_follows_producers_when_known():
    bench = chain_table([(1, 2), (2, 3), (3, 4), (4, 5)])
    npu = chain_table([(1, 2), (2, 3.5), (3.5, 4.5), (4.5, 5.5)])
    npu.loc[npu["name"] == "Torch.op3.0.forward.input.0", "producer"] = "Torch.op0.0.forward"  # not diverging
    d = compare(npu, bench).first_divergence()
    assert d.call == "Torch.op1.0.forward" and d.chain == ["Torch.op2.0.forward"]
    npu["producer"] = ""  # without provenance: every later call with diverging inputs, in execution order
    assert compare(npu, bench).first_divergence().chain == ["Torch.op2.0.forward", "Torch.op3.0.forward"]


def test_tolerance_is_a_threshold():
    bench = chain_table([(1, 2), (2, 3)])
    npu = chain_table([(1, 2), (2, 3.003)])  # 0.1 % on the output
    r = compare(npu, bench)
    assert r.first_divergence().call == "Torch.op1.0.forward"
    assert r.first_divergence(thresholds=Thresholds(diverge_rtol=1e-2)) is None
    assert compare(npu, bench, thresholds=Thresholds(diverge_rtol=1e-2)).first_divergence() is None


def test_user_frame_from_stack():
    frames = {0: ["File /usr/lib/python3.11/site-packages/torch/nn/modules/linear.py, line 134, in forward, \n"
                  " return F.linear(input, self.weight, self.bias)",
                  "File /home/me/msprobe_nb/capture/api_mode.py, line 10, in wrapper, \n x()",
                  "File /home/me/train.py, line 42, in step, \n y = model(x)",
                  "File /home/me/train.py, line 80, in main, \n step()"]}
    bench = chain_table([(1, 2), (2, 3)])
    npu = chain_table([(1, 2), (2, 3.5)], stack_ids={"Torch.op1.0.forward": 0})
    d = compare(_StackDump(npu, frames), bench).first_divergence()
    assert d.frame == "/home/me/train.py:42" and d.frame_source == "y = model(x)"
    assert len(d.stack) == 4


def test_backward_root_uses_the_forward_stack():
    rows = []
    for k, (call, v) in enumerate([("Torch.mul.0.forward", 1.0), ("Torch.mul.0.backward", 2.0)]):
        for io in ("input", "output"):
            rows.append(dict(call_index=k, call=call, name=f"{call}.{io}.0", io=io, arg="0", kind="tensor",
                             dtype="torch.float32", shape=(2,), max=v, min=-v, mean=0.0, norm=v,
                             stack_id=0 if k == 0 else -1))
    bench = coerce_calls(pd.DataFrame(rows))
    npu = bench.copy()
    npu.loc[npu["name"] == "Torch.mul.0.backward.output.0", ["max", "norm"]] = [3.0, 3.0]
    frames = {0: ['File "/src/model.py", line 7, in forward']}
    d = compare(_StackDump(npu, frames), bench).first_divergence()
    assert d.call == "Torch.mul.0.backward" and d.frame == "/src/model.py:7"
    assert "stack of the forward call" in d.message


def test_ranks_and_steps():
    bench = pd.concat([chain_table([(1, 2), (2, 3), (3, 4), (4, 5)], rank=r) for r in (0, 1)])
    npu = pd.concat([chain_table([(1, 2), (2, 3), (3, 4), (4, 5.5)], rank=0),
                     chain_table([(1, 2), (2, 3.5), (3.5, 4), (4, 5)], rank=1)])
    r = compare(npu, bench)
    assert [(d.rank, d.call) for d in r.divergences()] == [(0, "Torch.op3.0.forward"), (1, "Torch.op1.0.forward")]
    first = r.first_divergence()
    assert (first.rank, first.call) == (1, "Torch.op1.0.forward")
    assert r.first_divergence(rank=0).call == "Torch.op3.0.forward"
    assert r.first_divergence(step=4) is None


def test_unmatched_rows_do_not_diverge():
    bench = chain_table([(1, 2), (2, 3)])
    npu = chain_table([(1, 2), (2, 3), (3, 4)])
    r = compare(npu, bench)
    assert r.counts()["unmatched"] == 2 and r.first_divergence() is None


def test_frame_parsing_helpers():
    assert user_frame(["File <site-packages>/torch/x.py, line 1, in f, \n a",
                       "File <peer>/model.py, line 68, in forward, \n attn = torch.softmax(scores, dim=-1)"]) == \
        ("<peer>/model.py:68", "attn = torch.softmax(scores, dim=-1)")
    assert user_frame(['  File "/a/b.py", line 3, in <module>']) == ("/a/b.py:3", None)
    assert user_frame([]) == (None, None)
    assert forward_of("Functional.linear.3.backward") == "Functional.linear.3.forward"
    assert forward_of("Module.fc.Linear.backward.0") == "Module.fc.Linear.forward.0"
    assert forward_of("Functional.linear.3.forward") is None


@needs_toy
def test_toy_model_first_divergence():
    from msprobe_nb.store.dump import load
    r = compare(load(TOY / "stat_L1_npu"), load(TOY / "stat_L1_bench"))
    d = r.first_divergence()
    # the NPU variant rounds attention scores through bfloat16 with a .to() that msprobe did not record:
    # the first recorded call to see different data is the softmax, through its input
    assert d.call == "Torch.softmax.0.forward" and d.kind == "inputs"
    assert d.previous_call == "Tensor.__mul__.0.forward"
    assert d.frame.endswith("model.py:68") and d.frame_source == "attn = torch.softmax(scores, dim=-1)"
    assert [n for n, _ in d.inputs] == ["Torch.softmax.0.forward.input.0"]
    assert d.chain[0] == "Functional.dropout.0.forward" and "Torch.softmax.1.forward" in d.chain
    assert r.first_divergence(thresholds=Thresholds(diverge_rtol=0.1)) is None


MEGATRON = SHARED / "interop" / "msprobe-npu-megatron-mix"


@pytest.mark.skipif(not MEGATRON.is_dir(), reason=f"msprobe interop data not found under {MEGATRON}")
def test_mix_level_dump_names_enclosing_modules():
    from msprobe_nb.store.dump import load
    d = load(MEGATRON)
    bench = d.calls
    npu = bench.copy()
    hit = (npu["call"] == "Tensor.__or__.0.forward") & (npu["io"] == "output")
    npu.loc[hit, ["max", "norm"]] = npu.loc[hit, ["max", "norm"]] * 3 + 1
    dv = compare(npu, bench).first_divergence()
    assert dv.call == "Tensor.__or__.0.forward" and dv.kind == "call"
    assert dv.modules and dv.modules[0].endswith("VocabParallelEmbedding.forward.0")
    assert "inside" in str(dv)


def test_a_call_whose_inputs_diverge_but_outputs_agree_is_the_root():
    """A comparison or a clamp can swallow a difference: its diverging inputs still mark where it entered."""
    bench = chain_table([(1, 2), (2, 3), (3, 4)])
    npu = chain_table([(1, 2), (2.5, 3), (3, 4)])  # call 1's input differs, its output does not
    d = compare(npu, bench).first_divergence()
    assert d is not None and d.call == "Torch.op1.0.forward" and d.kind == "inputs"
    assert d.inputs[0][0] == "Torch.op1.0.forward.input.0" and d.outputs == []
