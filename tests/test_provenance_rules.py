"""The random-source trace's rules one by one on small hand-made call tables (issue 36: tests that fail when a
rule breaks): which draw is blamed, which producers are walked, the chain, the notes on generator states, the
advice, the messages and the text. No recording, no compare(): a compare result is built from the rows."""
from __future__ import annotations

import pandas as pd
import pytest

from msprobe_nb.analysis.compare import gathered_result
from msprobe_nb.analysis.divergence import Divergence
from msprobe_nb.analysis.provenance import TRACE_COLUMNS, trace_randomness

RANDINT = "Torch.randint.0.forward"
GETITEM = "Tensor.__getitem__.0.forward"
LINEAR = "Functional.linear.0.forward"
DROPOUT = "Functional.dropout.0.forward"
LOSS = "Functional.mse_loss.0.forward"


def _c(ci: int, call: str, ins: tuple = (), family: str = "Torch", op: str = "add", rng: str = "", state: str = "",
       step: int = 0, rank: int = 0, outs: tuple = ("output",)) -> list[dict]:
    """The rows of one call: an input row per producer in ``ins`` ('' for data), then its output rows."""
    base = dict(step=step, rank=rank, call=call, call_index=ci, family=family, op=op, rng=rng, rng_state=state)
    rows = [{**base, "name": f"{call}.input.{k}", "io": "input", "arg": str(k), "producer": p}
            for k, p in enumerate(ins)]
    return rows + [{**base, "name": f"{call}.{io}.{k}", "io": io, "arg": str(k), "producer": ""}
                   for k, io in enumerate(outs)]


def _result(calls: list[dict], diverging: set[str] = frozenset(), bench: list[dict] | None = None,
            stacks: dict | None = None):
    """A compare result over ``calls`` (every row matched; the rows named in ``diverging`` diverge)."""
    rows = pd.DataFrame([{"pair": 0, "step": r["step"], "rank": r["rank"], "call_index": r["call_index"],
                          "call": r["call"], "name": r["name"], "io": r["io"], "arg": r["arg"], "op": r["op"],
                          "kind": "tensor", "match": "matched", "err": 0.5 if r["name"] in diverging else 0.0,
                          "diverges": r["name"] in diverging, "result": "pass", "producer": r["producer"],
                          "norm_rel": 0.0, "cosine": 1.0} for r in calls])
    res = gathered_result(rows, mode="statistics", thresholds=None, pairs=pd.DataFrame(), unpaired=pd.DataFrame(),
                          notes=[], stacks=stacks)
    res._ctx.npu.calls = pd.DataFrame(calls)
    res._ctx.bench.calls = pd.DataFrame(calls if bench is None else bench)
    return res


def _at(call: str, ci: int, kind: str = "inputs", step: int = 0, rank: int = 0) -> Divergence:
    return Divergence(call=call, step=step, rank=rank, call_index=ci, kind=kind, message="", rows=pd.DataFrame())


def _randint_story(state: str = "7 aa", bench_state: str = "7 bb") -> tuple[list[dict], list[dict], set[str]]:
    """Seed 003: a device randint indexes the data, the indexed batch feeds a linear layer."""
    npu = (_c(0, RANDINT, op="randint", rng="cuda", state=state) + _c(1, GETITEM, ("", RANDINT), "Tensor",
           "__getitem__") + _c(2, LINEAR, (GETITEM,), "Functional", "linear"))
    bench = [{**r, "rng_state": bench_state} if r["call"] == RANDINT else r for r in npu]
    bad = {f"{RANDINT}.output.0", f"{GETITEM}.input.1", f"{GETITEM}.output.0", f"{LINEAR}.input.0",
           f"{LINEAR}.output.0"}
    return npu, bench, bad


# --------------------------------------------------------------------------------------------- no trace
def test_runs_that_agree_have_nothing_to_trace():
    npu, _, _ = _randint_story()
    trace = trace_randomness(_result(npu))
    assert trace.divergence is None and not trace.found and trace.message == "the runs agree: nothing to trace"
    assert list(trace.sources.columns) == TRACE_COLUMNS and trace.sources.empty and trace.chain.empty
    assert str(trace) == "the runs agree: nothing to trace" and trace.advice == []


def test_without_a_divergence_given_the_first_one_is_traced():
    npu, bench, bad = _randint_story()
    trace = trace_randomness(_result(npu, bad, bench))
    assert trace.divergence.call == RANDINT and list(trace.sources.call) == [RANDINT]
    assert list(trace.chain.role) == ["random draw"]  # the draw is the first divergence itself


# ------------------------------------------------------------------------------------ the walk and chain
def test_the_walk_goes_from_the_divergence_through_producers_to_the_draw():
    npu, bench, bad = _randint_story()
    trace = trace_randomness(_result(npu, bad, bench), _at(LINEAR, 2))
    assert trace.found and list(trace.sources.call) == [RANDINT]
    src = trace.sources.iloc[0]
    assert (src.role, src.rng, src["step"], src["rank"]) == ("random draw", "cuda", 0, 0)
    assert list(trace.chain.call) == [RANDINT, GETITEM, LINEAR]
    assert list(trace.chain.role) == ["random draw", "carries it", "first divergence"]
    assert trace.message == f"{LINEAR} diverges because of random draw(s): {RANDINT}"
    assert trace.advice == ["randint: draw it on the host and move it, e.g. torch.randint(..., device='cpu')"
                            ".to(device), or record with host_random=True (--host-random) so every device draw "
                            "comes from one seeded CPU generator"]


def test_only_the_producers_of_diverging_inputs_are_walked():
    npu, bench, bad = _randint_story()
    other = "Torch.randn.0.forward"  # feeds the agreeing input 0; its state differs, its product agrees
    npu = _c(0, other, op="randn", rng="cuda", state="1 x") + [
        {**r, "producer": other} if r["name"] == f"{GETITEM}.input.0" else r for r in npu]
    bench = _c(0, other, op="randn", rng="cuda", state="1 y") + [
        {**r, "producer": other} if r["name"] == f"{GETITEM}.input.0" else r for r in bench]
    assert list(trace_randomness(_result(npu, bad, bench), _at(LINEAR, 2)).sources.call) == [RANDINT]


def test_with_no_diverging_input_every_producer_is_walked():
    """A permutation whose statistics agree although its order does not: only its generator state tells."""
    npu = _c(0, "Torch.randperm.0.forward", op="randperm", rng="cuda", state="3 a") + _c(
        1, GETITEM, ("", "Torch.randperm.0.forward"), "Tensor", "__getitem__")
    bench = [{**r, "rng_state": "3 b"} if r["op"] == "randperm" else r for r in npu]
    trace = trace_randomness(_result(npu, {f"{GETITEM}.output.0"}, bench), _at(GETITEM, 1, "call"))
    assert list(trace.sources.call) == ["Torch.randperm.0.forward"]
    assert list(trace.chain.call) == ["Torch.randperm.0.forward", GETITEM]
    assert trace.sources.iloc[0].note == ("generator state differs before this draw: earlier draws or seeds differ "
                                          "between the runs")


def test_a_dropout_fed_diverging_activations_passes_them_on_and_the_walk_goes_past_it():
    npu = (_c(0, "Torch.randn.0.forward", op="randn", rng="cuda", state="1 a")
           + _c(1, DROPOUT, ("Torch.randn.0.forward",), "Functional", "dropout", rng="cuda", state="1 b")
           + _c(2, LOSS, (DROPOUT,), "Functional", "mse_loss"))
    bad = {"Torch.randn.0.forward.output.0", f"{DROPOUT}.input.0", f"{DROPOUT}.output.0", f"{LOSS}.input.0",
           f"{LOSS}.output.0"}
    trace = trace_randomness(_result(npu, bad), _at(LOSS, 2))
    assert list(trace.sources.call) == ["Torch.randn.0.forward"]
    assert list(trace.chain.call) == ["Torch.randn.0.forward", DROPOUT, LOSS]
    assert list(trace.chain.role) == ["random draw", "carries it", "first divergence"]
    # same generator state on both sides, different numbers: the hardware generators differ
    assert trace.sources.iloc[0].note.startswith("same generator seed and state on both machines")


def test_a_blamed_draw_ends_its_branch_and_every_branch_is_walked():
    drop_in = "Functional.linear.1.forward"
    npu = (_c(0, "Torch.randn.0.forward", op="randn", rng="cuda", state="1 a")  # would be blamed (state differs)
           + _c(1, drop_in, ("Torch.randn.0.forward",), "Functional", "linear")
           + _c(2, DROPOUT, (drop_in,), "Functional", "dropout", rng="cuda", state="1 c")
           + _c(3, "Torch.rand.0.forward", op="rand", rng="cuda", state="1 d")
           + _c(4, LOSS, (DROPOUT, "Torch.rand.0.forward"), "Functional", "mse_loss"))
    bench = [{**r, "rng_state": "1 z"} if r["op"] == "randn" else r for r in npu]
    bad = {f"{DROPOUT}.output.0", "Torch.rand.0.forward.output.0", f"{LOSS}.input.0", f"{LOSS}.input.1",
           f"{LOSS}.output.0"}
    trace = trace_randomness(_result(npu, bad, bench), _at(LOSS, 4))
    assert list(trace.sources.call) == [DROPOUT, "Torch.rand.0.forward"]
    assert "dropout" in trace.message and "Torch.rand.0.forward" in trace.message
    assert list(trace.chain.call) == [DROPOUT, LOSS]  # the chain of the earliest draw


def test_sources_come_in_execution_order_and_the_chain_follows_the_earliest():
    npu = (_c(0, "Torch.rand.0.forward", op="rand", rng="cuda") + _c(1, "Torch.randn.0.forward", op="randn",
           rng="cuda") + _c(2, LOSS, ("Torch.randn.0.forward", "Torch.rand.0.forward"), "Functional", "mse_loss"))
    bad = {"Torch.rand.0.forward.output.0", "Torch.randn.0.forward.output.0", f"{LOSS}.input.0",
           f"{LOSS}.input.1", f"{LOSS}.output.0"}
    npu = [{**r, "rng": "host (for cuda)"} if r["op"] == "randn" else r for r in npu]
    trace = trace_randomness(_result(npu, bad), _at(LOSS, 2))
    assert list(trace.sources.call) == ["Torch.rand.0.forward", "Torch.randn.0.forward"]
    assert list(trace.chain.call) == ["Torch.rand.0.forward", LOSS]
    assert trace.message.endswith("Torch.rand.0.forward, Torch.randn.0.forward")
    assert [a.split(":")[0] for a in trace.advice] == ["rand", "randn"]
    assert trace.advice[1] == "randn: already drawn on the host; check that both runs use the same seed"
    # the walk stops once max_calls calls are known: the loss's two producers make three at once
    assert not trace_randomness(_result(npu, bad), _at(LOSS, 2), max_calls=2).found


def test_the_walk_stops_at_max_calls():
    npu, bench, bad = _randint_story()
    res = _result(npu, bad, bench)
    assert not trace_randomness(res, _at(LINEAR, 2), max_calls=3).found  # three calls known: the draw not read
    assert trace_randomness(res, _at(LINEAR, 2), max_calls=4).found


def test_a_backward_call_walks_to_its_forward_first():
    bwd = "Functional.dropout.0.backward"
    npu = (_c(0, DROPOUT, ("",), "Functional", "dropout", rng="cuda", state="2 a")
           + _c(1, "Functional.mse_loss.0.backward", (), "Functional", "mse_loss")
           + _c(2, bwd, ("Functional.mse_loss.0.backward",), "Functional", "dropout"))
    bad = {f"{DROPOUT}.output.0", "Functional.mse_loss.0.backward.output.0", f"{bwd}.input.0", f"{bwd}.output.0"}
    stacks = {(DROPOUT, 0, 0): ['File "/src/model.py", line 12, in forward\n    h = F.dropout(h, 0.1)']}
    trace = trace_randomness(_result(npu, bad, stacks=stacks), _at(bwd, 2))
    assert list(trace.sources.call) == [DROPOUT] and list(trace.chain.call) == [DROPOUT, bwd]
    first = trace.chain.iloc[1]  # the backward has no stack of its own: its forward's
    assert (first.role, first.file, first.line, first.code) == ("first divergence", "/src/model.py", 12,
                                                                 "h = F.dropout(h, 0.1)")
    stacks[(bwd, 0, 0)] = ['File "/src/train.py", line 30, in step']  # its own stack when it has one
    first = trace_randomness(_result(npu, bad, stacks=stacks), _at(bwd, 2)).chain.iloc[1]
    assert (first.file, first.line, first.code) == ("/src/train.py", 30, "")
    # the forward not recorded: nothing to walk to
    npu2 = [r for r in npu if r["call"] != DROPOUT]
    trace = trace_randomness(_result(npu2, bad), _at(bwd, 1))
    assert not trace.found and list(trace.chain.call) == [bwd]


# ---------------------------------------------------------------------------------- what counts as a draw
@pytest.mark.parametrize("family, op, call", [
    ("Module", "Dropout", "Module.drop.Dropout.forward.0"), ("Aten", "bernoulli", "Aten.bernoulli.0.forward"),
    ("Torch", "randint", RANDINT), ("Functional", "dropout", DROPOUT)])
def test_without_a_recorded_generator_the_api_says_whether_it_draws(family, op, call):
    """msprobe dumps record no generator: the known random APIs are draws."""
    npu = _c(0, call, ("",), family, op)
    assert list(trace_randomness(_result(npu, {f"{call}.output.0"}), _at(call, 0, "call")).sources.call) == [call]


@pytest.mark.parametrize("rng", ["", "dropout-off", "no draw"])
def test_calls_that_draw_nothing_are_never_sources(rng):
    family, op = ("Torch", "add") if rng == "" else ("Functional", "dropout")
    call = "Torch.add.0.forward" if rng == "" else DROPOUT
    npu = _c(0, call, ("",), family, op, rng=rng, state="1 a")
    trace = trace_randomness(_result(npu, {f"{call}.output.0"}, [{**r, "rng_state": "2 b"} for r in npu]),
                             _at(call, 0, "call"))
    assert not trace.found and trace.message.startswith(f"{call} computes differently with agreeing inputs")
    assert list(trace.chain.role) == ["first divergence"]


def test_a_draw_that_passes_differences_on_is_blamed_only_when_its_generator_state_differs():
    npu = _c(0, LINEAR, ("",), "Functional", "linear") + _c(1, "Tensor.bernoulli_.0.forward", (LINEAR,), "Tensor",
                                                          "bernoulli_", rng="cuda", state="5 a")
    bad = {f"{LINEAR}.output.0", "Tensor.bernoulli_.0.forward.input.0", "Tensor.bernoulli_.0.forward.output.0"}
    d = _at("Tensor.bernoulli_.0.forward", 1)
    for bench_state, found in (("5 b", True), ("5 0", True), ("5 a", False), ("", False)):
        bench = [{**r, "rng_state": bench_state} if r["op"] == "bernoulli_" else r for r in npu]
        assert trace_randomness(_result(npu, bad, bench), d).found is found, bench_state
    no_state = [{**r, "rng_state": ""} for r in npu]
    assert not trace_randomness(_result(no_state, bad, [{**r, "rng_state": "5 b"} for r in npu]), d).found
    no_call = [r for r in npu if r["op"] != "bernoulli_"]  # the bench did not make the draw
    assert not trace_randomness(_result(npu, bad, no_call), d).found


def test_a_diverging_parameter_gradient_counts_as_an_output():
    call = "Init.normal_.0.forward"
    npu = _c(0, call, ("",), "Init", "normal_", rng="cuda", outs=("parameters_grad",))
    trace = trace_randomness(_result(npu, {f"{call}.parameters_grad.0"}), _at(call, 0, "call"))
    assert list(trace.sources.call) == [call]


# ------------------------------------------------------------------------------------ other steps and ranks
def test_rows_of_other_steps_and_ranks_are_not_read():
    npu, bench, bad = _randint_story()
    # the same calls at another step and rank, first in the tables: not a draw there, and diverging everywhere
    other = [{**r, "step": s, "rank": k, "rng": "", "op": "add", "rng_state": ""}
             for s, k in ((1, 0), (0, 1)) for r in npu]
    everything = {r["name"] for r in npu} - {f"{GETITEM}.input.1"}
    res = _result(other + npu, bad, other + bench)
    res.loc[res["step"].eq(1) | res["rank"].eq(1), "diverges"] = res["name"].isin(everything)
    trace = trace_randomness(res, _at(LINEAR, 2))
    assert list(trace.sources.call) == [RANDINT] and list(trace.chain.call) == [RANDINT, GETITEM, LINEAR]
    assert trace.sources.iloc[0].note.startswith("generator state differs")
    d = _at(LINEAR, 2, step=1)  # at step 1 the same calls draw nothing
    assert not trace_randomness(res, d).found


def test_rows_of_neighbouring_steps_and_ranks_are_not_read():
    """The trace is read at step 1 rank 1; the groups before and after it differ: no draw, more diverging rows."""
    npu, bench, bad = _randint_story()
    other = "Torch.randn.0.forward"  # feeds GETITEM's input 0, which diverges in the other groups only
    npu = _c(0, other, op="randn", rng="cuda", state="1 x") + [
        {**r, "producer": other} if r["name"] == f"{GETITEM}.input.0" else r for r in npu]
    bench = [{**r, "rng_state": "1 y"} if r["call"] == other else r for r in npu]
    bench = [{**r, "rng_state": "7 bb"} if r["call"] == RANDINT else r for r in bench]
    at = [(1, 1)]
    around = [(0, 1), (1, 0), (2, 1), (1, 2), (0, 0), (2, 2)]
    lift = lambda rows, groups, **kw: [{**r, "step": s, "rank": k, **kw} for s, k in groups for r in rows]  # noqa: E731
    n_rows = lift(npu, around, rng="", rng_state="", op="add") + lift(npu, at)
    b_rows = lift(bench, around, rng="", rng_state="", op="add") + lift(bench, at)
    res = _result(n_rows, bad, b_rows)
    res.loc[~(res["step"].eq(1) & res["rank"].eq(1)), "diverges"] = True
    trace = trace_randomness(res, _at(LINEAR, 2, step=1, rank=1))
    assert list(trace.sources.call) == [RANDINT] and list(trace.chain.call) == [RANDINT, GETITEM, LINEAR]
    assert trace.sources.iloc[0].note.startswith("generator state differs")
    assert (trace.sources.iloc[0]["step"], trace.sources.iloc[0]["rank"]) == (1, 1)


def test_a_forward_that_was_not_recorded_is_not_walked():
    """It takes no room under max_calls: the backward's recorded producer is read next."""
    bwd = "Functional.linear.0.backward"
    npu = _c(0, "Torch.rand.0.forward", op="rand", rng="cuda") + _c(1, bwd, ("Torch.rand.0.forward",),
                                                                    "Functional", "linear")
    bad = {"Torch.rand.0.forward.output.0", f"{bwd}.input.0", f"{bwd}.output.0"}
    trace = trace_randomness(_result(npu, bad), _at(bwd, 1), max_calls=3)
    assert list(trace.sources.call) == ["Torch.rand.0.forward"]


def test_a_producer_that_was_not_recorded_ends_the_walk():
    npu, bench, bad = _randint_story()
    npu = [{**r, "producer": "Tensor.unrecorded.0.forward"} if r["name"] == f"{GETITEM}.input.1" else r
           for r in npu]
    trace = trace_randomness(_result(npu, bad, bench), _at(LINEAR, 2))
    assert not trace.found and list(trace.chain.call) == [LINEAR]
    assert trace.message.startswith(f"{LINEAR} receives diverging inputs, and no recorded random draw")


def test_a_diverging_parameter_is_no_input_and_its_producer_is_not_walked():
    """Only the producers of inputs are followed (a parameter's producer would be an earlier update)."""
    mod = "Module.fc.Linear.forward.0"
    init = "Init.normal_.0.forward"
    npu = _c(0, init, (), "Init", "normal_", rng="cuda", state="1 a") + [
        {**r, "io": "parameters", "name": f"{mod}.parameters.weight", "producer": init}
        for r in _c(1, mod, ("",), "Module", "Linear")[:1]] + _c(1, mod, ("",), "Module", "Linear")
    bench = [{**r, "rng_state": "1 b"} if r["call"] == init else r for r in npu]
    bad = {f"{mod}.parameters.weight", f"{mod}.output.0"}
    trace = trace_randomness(_result(npu, bad, bench), _at(mod, 1, "call"))
    assert not trace.found and list(trace.chain.call) == [mod]


def test_a_bench_table_without_steps_is_read_whole():
    npu, bench, bad = _randint_story("7 aa", "8 aa")
    res = _result(npu, bad, bench)
    res._ctx.bench.calls = res._ctx.bench.calls.drop(columns=["step", "rank"])
    note = trace_randomness(res, _at(LINEAR, 2)).sources.iloc[0].note
    assert note == "generators seeded differently (7 vs 8): use one seed (seed_all)"


def test_an_empty_bench_table_gives_no_note():
    npu, _, bad = _randint_story()
    res = _result(npu, bad, bench=[])
    res._ctx.bench.calls = pd.DataFrame(columns=list(res._ctx.npu.calls.columns))
    trace = trace_randomness(res, _at(LINEAR, 2))
    assert list(trace.sources.call) == [RANDINT] and trace.sources.iloc[0].note == ""


def test_a_table_without_divergence_flags_walks_every_producer():
    npu, bench, bad = _randint_story()
    res = _result(npu, bad, bench).drop(columns=["diverges"])
    trace = trace_randomness(res, _at(LINEAR, 2))
    assert list(trace.sources.call) == [RANDINT]  # found through its differing generator state


# ------------------------------------------------------------------------------------------------- notes
@pytest.mark.parametrize("npu_state, bench_state, note", [
    ("7 aa", "7 aa", "same generator seed and state on both machines, different numbers: the device generators "
                     "differ between machines (same seed, different hardware)"),
    ("7 aa", "9 aa", "generators seeded differently (7 vs 9): use one seed (seed_all)"),
    ("9 aa", "7 aa", "generators seeded differently (9 vs 7): use one seed (seed_all)"),
    ("7 aa", "7 bb", "generator state differs before this draw: earlier draws or seeds differ between the runs"),
    ("1234 bb", "1234 aa", "generator state differs before this draw: earlier draws or seeds differ between the runs"),
    ("", "7 bb", ""), ("7 aa", "", "")])
def test_the_note_says_how_the_generators_compare(npu_state, bench_state, note):
    npu, bench, bad = _randint_story(npu_state, bench_state)
    assert trace_randomness(_result(npu, bad, bench), _at(LINEAR, 2)).sources.iloc[0].note == note


# ------------------------------------------------------------------------------------------------ advice
@pytest.mark.parametrize("family, op, rng, advice", [
    ("Random", "random", "python", "Random.random: seed Python's and numpy's generators identically on both "
     "machines (msprobe_nb.seed_all(seed)) or move the draw out of the compared region"),
    ("NumPy", "rand", "numpy", "NumPy.rand: seed Python's and numpy's"),
    ("Torch", "randn", "custom:0", "randn: the draw uses your own torch.Generator: seed it identically"),
    ("Functional", "scaled_dot_product_attention", "cuda", "scaled_dot_product_attention: its dropout mask is drawn "
     "inside the attention kernel; switch dropout off while aligning (dropout_off=True / --dropout-off sets "
     "dropout_p=0)"),
    ("Module", "Dropout", "cuda", "Dropout: switch dropout off while aligning (dropout_off=True / --dropout-off), "
     "or draw the masks on the host (host_random=True / --host-random)"),
    ("Tensor", "bernoulli_", "cuda", "bernoulli_: record with host_random=True (--host-random) so the mask comes "
     "from one seeded CPU generator on both machines (dropout_off only zeroes dropout APIs' p, not this draw)"),
    ("Torch", "bernoulli", "cuda", "bernoulli: record with host_random=True"),
    ("Torch", "rand", "host:cpu", "rand: already drawn on the host; check that both runs use the same seed"),
    ("Torch", "rand", "cuda", "rand: draw it on the host and move it, e.g. torch.rand(..., device='cpu')"),
    ("Init", "xavier_uniform_", "cuda", "xavier_uniform_: draw it on the host and move it"),
    ("Torch", "rand", "xpu:0", "rand: draw it on the host and move it"),  # a device sorting after "python"
    ("Functional", "dropout", "cuda:0 (left as drawn: checkpoint recompute)", "dropout: drawn inside an activation "
     "checkpoint that dropout_off and host_random cannot reach; record at L1 or mix with use_reentrant=True"),
])
def test_the_advice_fits_the_draw(family, op, rng, advice):
    call = f"{family}.{op}.0.forward"
    npu = _c(0, call, (), family, op, rng=rng)
    trace = trace_randomness(_result(npu, {f"{call}.output.0"}), _at(call, 0, "call"))
    assert len(trace.advice) == 1 and trace.advice[0].startswith(advice)


def test_the_same_advice_is_given_once():
    d2 = "Functional.dropout.1.forward"
    npu = (_c(0, DROPOUT, ("",), "Functional", "dropout", rng="cuda") + _c(1, d2, ("",), "Functional", "dropout",
           rng="cuda") + _c(2, LOSS, (DROPOUT, d2), "Functional", "mse_loss"))
    bad = {f"{DROPOUT}.output.0", f"{d2}.output.0", f"{LOSS}.input.0", f"{LOSS}.input.1", f"{LOSS}.output.0"}
    trace = trace_randomness(_result(npu, bad), _at(LOSS, 2))
    assert len(trace.sources) == 2 and len(trace.advice) == 1


# ---------------------------------------------------------------------------------------------- messages
@pytest.mark.parametrize("kind, start", [
    ("argument", "is called with a different non-tensor argument on the two sides and no random draw feeds it"),
    ("call", "computes differently with agreeing inputs and no random draw feeds it"),
    ("inputs", "receives diverging inputs, and no recorded random draw produced them"),
    ("extra", "receives diverging inputs, and no recorded random draw produced them")])
def test_without_a_draw_the_message_names_the_kind_of_difference(kind, start):
    npu = _c(0, LINEAR, ("",), "Functional", "linear")
    trace = trace_randomness(_result(npu, {f"{LINEAR}.output.0"}), _at(LINEAR, 0, kind))
    assert trace.message == f"{LINEAR} {start}" + trace.message.split(start, 1)[1] and not trace.found
    assert trace.chain.iloc[0].call == LINEAR and trace.chain.iloc[0].role == "first divergence"


# ----------------------------------------------------------------------------------------- text and frames
def test_the_text_names_each_draw_its_place_code_note_and_fix():
    npu, bench, bad = _randint_story("7 aa", "7 bb")
    stacks = {(RANDINT, 0, 0): ["File /x/site-packages/torch/f.py, line 9, in g",
                                'File "/src/train.py", line 40, in step\n    t = torch.randint(0, 9, (4,))']}
    trace = trace_randomness(_result(npu, bad, bench, stacks), _at(LINEAR, 2))
    src = trace.sources.iloc[0]
    assert (src.file, src.line, src.code) == ("/src/train.py", 40, "t = torch.randint(0, 9, (4,))")
    text = str(trace).splitlines()
    assert text[0] == trace.message
    assert text[1] == f"  random draw {RANDINT} on cuda at /src/train.py:40"
    assert text[2] == "      t = torch.randint(0, 9, (4,))"
    assert text[3].startswith("      generator state differs") and text[4] == f"  fix: {trace.advice[0]}"
    assert len(text) == 5 and repr(trace) == str(trace)
    html = trace._repr_html_()
    assert html.startswith("<div style='font-family:monospace'>") and html.count("<br>") == 4
    assert "torch.randint(0, 9, (4,))" in html


def test_a_draw_without_stack_or_generator_says_so():
    call = "Module.drop.Dropout.forward.0"
    npu = _c(0, call, ("",), "Module", "Dropout")
    stacks = {(call, 0, 0): ['File "/src/m.py", line x, in f']}  # no line number: not a frame
    trace = trace_randomness(_result(npu, {f"{call}.output.0"}, stacks=stacks), _at(call, 0, "call"))
    src = trace.sources.iloc[0]
    assert (src.file, src.line, src.code, src.rng) == ("", None, "", "")
    assert str(trace).splitlines()[1] == f"  random draw {call} on unknown generator at (no stack recorded)"
    assert len(str(trace).splitlines()) == 3  # no code, no note: the fix line follows


def test_html_escapes_the_text():
    call = "Torch.rand.0.forward"
    npu = _c(0, call, (), "Torch", "rand", rng="cuda")
    stacks = {(call, 0, 0): ['File "/src/<m>.py", line 3, in f\n    x = a < b']}
    trace = trace_randomness(_result(npu, {f"{call}.output.0"}, stacks=stacks), _at(call, 0, "call"))
    html = trace._repr_html_()
    assert "/src/&lt;m&gt;.py:3" in html and "x = a &lt; b" in html
