"""The first-divergence rules one by one on small hand-made compare tables (issue 36: tests that fail when a
rule breaks): which call is the root, its kind and message, the rows, the chain, the enclosing modules, the
calls one run makes alone, random draws, and the stack frame. No recording, no compare(): fast."""
from __future__ import annotations

import pandas as pd

from msprobe_nb.analysis.divergence import find_divergences, forward_of, is_user_file, parse_frame, user_frame
from msprobe_nb.analysis.grading import Thresholds

TH = Thresholds()


def _r(ci: int, call: str, io: str = "output", arg: str = "0", err: float = 0.0, **kw) -> dict:
    """A matched tensor row of call ``call`` (execution position ``ci``); it diverges when ``err`` > 1e-3."""
    r = dict(pair=0, step=0, rank=0, call_index=ci, call=call, name=f"{call}.{io}.{arg}", io=io, arg=arg, op="f",
             kind="tensor", match="matched", err=err, diverges=err > 1e-3, result="pass", norm_rel=err,
             producer="", cosine=1.0)
    r.update(kw)
    return r


def _t(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows)


def _one(rows: list[dict], **kw):
    ds = find_divergences(_t(rows), TH, **kw)
    assert len(ds) == 1, ds
    return ds[0]


def _calls(n: int, bad_out: int | None = None, bad_in: int | None = None, producers: bool = True) -> list[dict]:
    """Calls c0..c{n-1}, each with input.0 (from the call before) and output.0."""
    rows = []
    for k in range(n):
        prod = f"c{k - 1}" if producers and k else ""
        rows.append(_r(k, f"c{k}", "input", err=0.5 if bad_in is not None and k >= bad_in else 0.0, producer=prod))
        rows.append(_r(k, f"c{k}", "output", err=0.5 if bad_out is not None and k >= bad_out else 0.0))
    return rows


# ---------------------------------------------------------------------------------------------- the root
def test_no_rows_or_no_diverging_row_is_no_divergence():
    assert find_divergences(_t([_r(0, "c0")]).iloc[:0], TH) == []
    assert find_divergences(_t(_calls(3)), TH) == []


def test_the_first_call_whose_outputs_diverge_with_agreeing_inputs_is_the_root():
    rows = _calls(4, bad_out=2, bad_in=3)
    d = _one(rows)
    assert (d.call, d.kind, d.call_index, d.step, d.rank) == ("c2", "call", 2, 0, 0)
    assert d.message == "inputs agree within tolerance, outputs diverge: this call is where the runs part ways"
    assert d.outputs == [("c2.output.0", 0.5)] and d.inputs == []
    assert d.previous_call == "c1"
    assert d.chain == ["c3"] and list(d.chain_table["via"]) == ["c3.input.0"]
    assert list(d.chain_table["producer"]) == ["c2"] and list(d.chain_table["call_index"]) == [3]
    assert list(d.chain_table["err"]) == [0.5]


def test_the_table_is_read_in_execution_order_whatever_its_row_order():
    rows = _calls(4, bad_out=1, bad_in=2)[::-1]
    d = _one(rows)
    assert d.call == "c1" and d.previous_call == "c0" and d.chain == ["c2", "c3"]


def test_the_root_call_index_and_step_and_rank_are_its_own():
    rows = [{**r, "step": 3, "rank": 2, "call_index": r["call_index"] + 10} for r in _calls(3, bad_out=1)]
    d = _one(rows)
    assert (d.call, d.step, d.rank, d.call_index) == ("c1", 3, 2, 11)


def test_every_pair_gets_its_own_first_divergence_in_pair_order():
    a = [{**r, "pair": 1, "rank": 1} for r in _calls(3, bad_out=1)]
    b = [{**r, "pair": 0, "rank": 0} for r in _calls(3, bad_out=2)]
    ds = find_divergences(_t(a + b), TH)
    assert [(d.rank, d.call) for d in ds] == [(0, "c2"), (1, "c1")]


def test_rows_without_a_diverges_flag_set_never_make_a_root():
    rows = _calls(3)
    rows[3] = {**rows[3], "err": 0.5}  # err above the tolerance, but diverges False: the flag decides
    assert find_divergences(_t(rows), TH) == []


def test_bench_only_rows_and_skipped_ops_do_not_diverge():
    rows = _calls(3, bad_out=2)
    rows.insert(0, _r(0, "b0", "output", err=0.5, match="bench_only"))
    rows.insert(1, _r(1, "e1", "output", err=0.5, op="empty"))  # uninitialised memory: never compared
    d = _one(rows)
    assert d.call == "c2"
    assert find_divergences(_t(rows[:2] + _calls(3)), TH) == []


def test_a_call_whose_only_diverging_row_is_an_input_is_the_root():
    d = _one(_calls(3, bad_in=1)[:4] + [_r(2, "c2", "input", producer="c1"), _r(2, "c2")])
    assert d.call == "c1" and d.kind == "inputs" and d.inputs == [("c1.input.0", 0.5)] and d.outputs == []


# ---------------------------------------------------------------------------------------- inputs kinds
def test_diverging_inputs_of_the_first_call_come_from_the_data():
    d = _one(_calls(2, bad_in=0, bad_out=0))
    assert d.kind == "inputs" and d.previous_call is None
    assert d.message.startswith("the very first recorded call already receives diverging inputs")


def test_diverging_inputs_from_an_agreeing_producer_name_it():
    rows = _calls(3, bad_in=1, bad_out=1)
    d = _one(rows)
    assert d.kind == "inputs" and d.call == "c1"
    assert d.message.startswith("inputs diverge although c0 produced them and every earlier call agrees")
    rows.insert(2, _r(1, "c1", "input", "1", err=0.5, producer="a9"))  # two producers: sorted, once each
    rows.insert(2, _r(1, "c1", "input", "2", err=0.5, producer="c0"))
    assert "although a9, c0 produced them" in _one(rows).message


def test_diverging_inputs_without_a_producer_enter_after_the_previous_call():
    d = _one(_calls(3, bad_in=2, producers=False))
    assert d.kind == "inputs" and d.call == "c2"
    assert "unrecorded operation after c1" in d.message and "treated as the root" in d.message


def test_an_own_argument_that_differs_is_the_root_with_both_values():
    rows = _calls(3, bad_out=1, bad_in=2)
    rows.insert(2, _r(1, "c1", "input", "1", err=0.5, kind="value", npu_value="0.5", bench_value="0.7"))
    d = _one(rows)
    assert d.call == "c1" and d.kind == "argument"
    assert "own non-tensor argument(s) differ (argument 1 '0.5' vs '0.7')" in d.message
    assert d.inputs == [("c1.input.1", 0.5)] and d.outputs == [("c1.output.0", 0.5)]
    # a diverging tensor input too: the inputs already differ, no argument of its own to blame
    rows.insert(2, _r(1, "c1", "input", "2", err=0.5))
    assert _one(rows).kind == "inputs"


def test_an_argument_without_an_arg_name_is_named_by_its_row_and_missing_values_are_unknown():
    rows = _calls(2, bad_out=1)
    rows.insert(2, _r(1, "c1", "input", "1", err=0.5, kind="value"))
    t = _t(rows).drop(columns=["arg"])
    d = find_divergences(t, TH)[0]
    assert d.kind == "argument" and "(c1.input.1 ? vs ?)" in d.message


def test_an_argument_passed_on_one_side_only_is_an_argument_that_differs():
    rows = _calls(3)
    rows.insert(2, _r(9, "c1", "input", "approximate", match="bench_only", kind="value",
                      npu_value=None, bench_value="tanh"))
    d = _one(rows)
    assert d.call == "c1" and d.kind == "argument" and d.call_index == 1  # placed at its call in the NPU run
    assert "argument approximate (not passed) vs 'tanh'" in d.message
    # passed on the NPU side only (and no bench-only row): this once failed on pandas' string columns
    rows[2] = {**rows[2], "match": "npu_only", "npu_value": "tanh", "bench_value": None, "call_index": 1}
    assert "argument approximate 'tanh' vs (not passed)" in _one(rows).message


def test_a_one_sided_row_is_no_argument_of_a_call_one_side_made_alone_or_a_tensor():
    rows = _calls(2) + [_r(2, "x", "input", "1", match="bench_only", kind="value", bench_value=1)]
    assert find_divergences(_t(rows), TH) == []
    rows = _calls(2) + [_r(1, "c1", "input", "1", match="npu_only", kind="tensor")]
    assert find_divergences(_t(rows), TH) == []
    rows = _calls(2) + [_r(1, "c1", "output", "1", match="npu_only", kind="value")]
    assert find_divergences(_t(rows), TH) == []
    rows = _calls(2)
    assert find_divergences(_t(rows).drop(columns=["kind"]), TH) == []


def test_several_arguments_name_the_first_four():
    rows = _calls(2, bad_out=1)
    for a in range(6, 0, -1):
        rows.insert(2, _r(1, "c1", "input", str(a), err=0.5, kind="value", npu_value=str(a), bench_value=f"m{a}"))
    d = _one(rows)
    assert d.message.count(" vs ") == 4 and "argument 4 '4' vs 'm4')" in d.message and "argument 5 " not in d.message


# ------------------------------------------------------------------------------------ nesting and modules
def _nested(inner_err: float = 0.5) -> list[dict]:
    """A module call m (opens first) holding s, holding t; m's output, s's and t's outputs diverge."""
    return [_r(0, "m", "input", parent=""), _r(0, "m", "output", err=0.5, parent=""),
            _r(1, "s", "input", parent="m"), _r(1, "s", "output", err=inner_err, parent="m"),
            _r(2, "t", "input", parent="s"), _r(2, "t", "output", err=inner_err, parent="s"),
            _r(3, "u", "input", parent=""), _r(3, "u", "output", err=0.5, parent="")]


def test_the_innermost_diverging_call_is_the_root_and_its_modules_are_named():
    d = _one(_nested())
    assert d.call == "t" and d.modules == ["s", "m"]
    assert "inside s (+1 outer)" in str(d)
    d = _one(_nested(inner_err=0.0))
    assert d.call == "m" and d.modules == []
    rows = [r for r in _nested() if r["call"] != "t"]
    d = _one(rows)
    assert d.call == "s" and d.modules == ["m"] and "inside m\n" in str(d) + "\n" and "outer" not in str(d)


def test_a_later_call_outside_the_module_does_not_become_the_root():
    rows = [r for r in _nested() if r["call"] in ("m", "u")]
    assert _one(rows).call == "m"
    rows = [{**r, "parent": "x"} if r["call"] == "u" else r for r in _nested()]  # an unknown parent
    assert _one(rows).call == "t"


def test_a_parent_cycle_ends_the_walk():
    rows = [_r(0, "a", err=0.5, parent="b"), _r(1, "b", err=0.5, parent="a"), _r(2, "c", err=0.5, parent="c")]
    d = _one(rows)
    assert d.call == "b" and d.modules == ["a"]


def test_without_a_parent_column_the_first_diverging_call_is_the_root():
    t = _t(_nested()).drop(columns=["parent"])
    d = find_divergences(t, TH)[0]
    assert d.call == "m" and d.modules == []


# ---------------------------------------------------------------------------------------------- chain
def test_the_chain_follows_producers_and_lists_each_call_once():
    rows = _calls(5, bad_out=1, bad_in=2)
    rows.insert(4, _r(2, "c2", "input", "1", err=0.5, producer="c1"))  # two diverging inputs: one entry
    rows[-2] = {**rows[-2], "producer": "c0"}  # c4's diverging input comes from c0, which agrees
    d = _one(rows)
    assert d.call == "c1" and d.chain == ["c2", "c3"]
    assert list(d.chain_table["via"]) == ["c2.input.1", "c3.input.0"]
    rows = [{**r, "producer": ""} for r in rows]  # no provenance: every later call with a diverging input
    assert _one(rows).chain == ["c2", "c3", "c4"]
    t = _t(rows).drop(columns=["producer"])
    assert find_divergences(t, TH)[0].chain == ["c2", "c3", "c4"]


def test_a_long_chain_is_cut_in_the_text():
    d = _one(_calls(9, bad_out=1, bad_in=2))
    assert len(d.chain) == 7
    assert "flows into 7 later call(s): c2, c3, c4, c5, c6 ... (+2 more)" in str(d)
    d = _one(_calls(7, bad_out=1, bad_in=2))
    assert "flows into 5 later call(s): c2, c3, c4, c5, c6\n" in str(d) + "\n"


def test_the_text_and_dict_of_a_divergence():
    rows = _calls(3, bad_out=1, bad_in=2)
    for a in range(10, 0, -1):
        rows.insert(4, _r(1, "c1", "output", str(a), err=0.25))
    d = _one(rows)
    text = str(d)
    assert text.splitlines()[:2] == ["first divergence: c1 (step 0, rank 0, call #1)", f"  {d.message}"]
    assert text.count("  output c1.output.") == 8 and "relative error 0.25" in text and "at " not in text
    assert repr(d) == text
    dd = d.to_dict()
    assert (dd["call"], dd["kind"], dd["chain"], dd["previous_call"], dd["modules"]) == ("c1", "call", ["c2"], "c0",
                                                                                         [])
    assert dd["outputs"][0] == ("c1.output.0", 0.5) and len(dd["outputs"]) == 11 and dd["inputs"] == []
    assert (dd["step"], dd["rank"], dd["call_index"], dd["frame"]) == (0, 0, 1, None)


def test_the_rows_shown_depend_on_the_mode():
    rows = _calls(2, bad_out=1)
    for r in rows:
        r.update(max_abs_err=1.0, rmse=0.1, max_rel=0.5)
    d = _one(rows)
    assert "cosine" not in d.rows.columns and "rmse" not in d.rows.columns and "max_rel" in d.rows.columns
    assert list(d.rows["name"]) == ["c1.output.0"]
    d = _one(rows, mode="tensor")
    assert {"cosine", "max_abs_err", "rmse"} <= set(d.rows.columns)


# ----------------------------------------------------------------------------- calls one side makes alone
def test_a_call_the_npu_run_makes_alone_behind_diverging_inputs_is_the_root():
    rows = _calls(2) + [_r(2, "x", "input", producer="c1", match="npu_only"),
                        _r(2, "x", "output", match="npu_only"),
                        _r(3, "y", "input", producer="x", match="npu_only"),
                        _r(3, "y", "output", match="npu_only"),
                        _r(4, "c2", "input", err=0.5, producer="y"), _r(4, "c2", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "x" and d.kind == "extra" and d.call_index == 2
    assert "made in the NPU run only" in d.message and "reaches c2, whose inputs diverge" in d.message
    # a producer that made a matched row is no extra call
    rows[5] = {**rows[5], "match": "matched"}
    assert _one(rows).call == "y"


def test_an_extra_call_is_looked_for_only_behind_diverging_inputs():
    rows = _calls(2) + [_r(2, "x", "output", match="npu_only"),
                        _r(4, "c2", "input", producer="x"), _r(4, "c2", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "c2" and d.kind == "call"


def test_a_call_the_bench_run_makes_alone_behind_diverging_inputs_is_the_root():
    rows = _calls(2) + [_r(5, "c2", "input", err=0.5, producer="c1", bench_producer="bz"),
                        _r(5, "c2", "output", err=0.5)]
    for r in rows:
        r.setdefault("bench_producer", "")
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    rows += [_r(2, "by", "input", match="bench_only", bench_call="by", bench_call_index=2, bench_producer="c1"),
             _r(2, "by", "output", match="bench_only", bench_call="by", bench_call_index=2, bench_producer=""),
             _r(3, "bz", "input", match="bench_only", bench_call="bz", bench_call_index=3, bench_producer="by"),
             _r(3, "bz", "output", match="bench_only", bench_call="bz", bench_call_index=3, bench_producer="")]
    d = _one(rows)
    assert d.call == "by" and d.kind == "extra"  # the earliest bench-only call of the chain
    assert "made in the bench run only" in d.message and "reaches c2, whose inputs diverge" in d.message
    assert d.call_index == 5 and d.rows.empty and d.chain == ["c2"] and d.chain_table.empty
    seen = []

    def stack_of(call, step, rank, side="npu"):
        seen.append((call, step, rank, side))
        return ['File "/src/bench.py", line 3, in f\n    y = x * 1.001']
    d = _one(rows, stack_of=stack_of)
    assert seen == [("by", 0, 0, "bench")] and d.frame == "/src/bench.py:3" and d.frame_source == "y = x * 1.001"

    def npu_only_stacks(call, step, rank):
        return ["File /src/npu.py, line 1, in f"]
    assert _one(rows, stack_of=npu_only_stacks).frame is None
    # the chain is only bench-only calls: 'by' made a matched row too, so 'bz' is the earliest
    rows[-4] = {**rows[-4], "match": "matched"}
    assert _one(rows).call == "bz"


def test_a_bench_only_call_after_the_root_sits_before_the_next_matched_call():
    rows = _calls(2) + [_r(5, "c2", "input", err=0.5, producer="c1", bench_producer="bz"),
                        _r(5, "c2", "output", err=0.5), _r(6, "c3", "output"), _r(7, "c4", "output")]
    for r in rows:
        r.setdefault("bench_producer", "")
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    rows[-2]["bench_call_index"], rows[-1]["bench_call_index"] = 9, 10
    rows += [_r(7, "bz", "output", match="bench_only", bench_call="bz", bench_call_index=7, bench_producer="")]
    assert _one(rows).call_index == 6  # the first matched NPU call after it in the bench run
    rows[-1]["bench_call_index"] = 11
    assert _one(rows).call_index == 7  # nothing matched after it: the last call index


def test_a_random_draw_whose_state_differs_is_the_root_though_its_statistics_agree():
    rows = _calls(4, bad_in=3, bad_out=3)
    for r in rows:
        r.update(npu_rng_state="s", bench_rng_state="s")
    rows[2] = {**rows[2], "npu_rng_state": "s1", "bench_rng_state": "s2"}  # c1's draw
    d = _one(rows)
    assert d.call == "c1" and d.kind == "call" and "a random draw whose generator state differs" in d.message
    assert d.chain == [] and d.outputs == []
    rows[2] = {**rows[2], "bench_rng_state": ""}  # not recorded on one side: no evidence
    assert _one(rows).call == "c3"
    t = _t(rows).drop(columns=["producer"])
    assert find_divergences(t, TH)[0].call == "c3"


def test_a_draw_is_found_behind_a_call_whose_outputs_diverge_with_agreeing_inputs():
    rows = _calls(3, bad_out=2)
    for r in rows:
        r.update(npu_rng_state="", bench_rng_state="")
    rows[0] = {**rows[0], "npu_rng_state": "a", "bench_rng_state": "b"}
    d = _one(rows)
    assert d.call == "c0" and "random draw" in d.message
    rows[0] = {**rows[0], "npu_rng_state": "", "bench_rng_state": ""}
    assert _one(rows).call == "c2"


def test_a_backward_fed_by_a_call_the_npu_run_makes_alone_names_that_call():
    rows = [_r(0, "F.a.0.forward", "input"), _r(0, "F.a.0.forward", "output"),
            _r(1, "F.x.0.forward", "input", producer="F.a.0.forward", match="npu_only"),
            _r(1, "F.x.0.forward", "output", match="npu_only"),
            _r(2, "F.a.0.backward", "input", err=0.5), _r(2, "F.a.0.backward", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "F.x.0.forward" and d.kind == "extra" and "reaches F.a.0.backward" in d.message
    rows[3] = {**rows[3], "match": "matched"}
    rows[2] = {**rows[2], "match": "matched"}
    assert _one(rows).call == "F.a.0.backward"


def test_a_backward_fed_by_a_call_the_bench_run_makes_alone_names_that_call():
    rows = [_r(0, "F.a.0.forward", "input"), _r(0, "F.a.0.forward", "output"),
            _r(2, "F.a.0.backward", "input", err=0.5), _r(2, "F.a.0.backward", "output", err=0.5)]
    for r in rows:
        r.update(bench_call=r["call"].replace("F.a", "B.a"), bench_call_index=r["call_index"], bench_producer="")
    rows += [_r(1, "F.y.0.forward", "input", match="bench_only", bench_call="B.y.0.backward", bench_call_index=1,
                bench_producer="B.a.0.forward"),
             _r(1, "F.y.0.forward", "output", match="bench_only", bench_call="B.y.0.backward", bench_call_index=1,
                bench_producer=""),
             _r(1, "F.y.0.forward", "input", match="bench_only", bench_call="B.y.0.forward", bench_call_index=1,
                bench_producer="")]
    d = _one(rows)
    assert d.call == "B.y.0.forward" and d.kind == "extra" and "made in the bench run only" in d.message
    d = _one(rows[4:] + rows[:4])  # the bench-only rows first: the forward's bench name is still its own
    assert d.call == "B.y.0.forward" and d.kind == "extra"


# ----------------------------------------------------------------------------------------- stack frames
def test_the_roots_stack_gives_its_user_frame_and_a_backward_falls_back_to_its_forward():
    rows = _calls(2, bad_out=1)
    stacks = {"c1": ["File /x/site-packages/torch/f.py, line 9, in g", 'File "/src/m.py", line 4, in fwd\n  y = f(x)']}
    d = _one(rows, stack_of=lambda c, s, r: stacks.get(c, []))
    assert d.frame == "/src/m.py:4" and d.frame_source == "y = f(x)" and len(d.stack) == 2
    assert "  at /src/m.py:4: y = f(x)" in str(d) and not d.message.endswith("(stack of the forward call)")
    rows = [{**r, "call": r["call"] + ".0.backward"} for r in rows]
    stacks = {"c1.0.forward": ['File "/src/m.py", line 5, in fwd']}
    d = _one(rows, stack_of=lambda c, s, r: stacks.get(c))
    assert d.frame == "/src/m.py:5" and d.frame_source is None and d.message.endswith(" (stack of the forward call)")
    assert "  at /src/m.py:5\n" in str(d) + "\n"


def test_frames_inside_torch_the_kit_or_python_are_not_the_users():
    for p in ("/x/site-packages/a.py", "/x/dist-packages/a.py", "/y/torch/nn.py", "C:\\torch\\nn.py",
              "/w/msprobe_nb/capture/api.py", "/w/msprobe_nb/debugger.py", "/w/msprobe_nb/magics.py",
              "/z/msprobe/core.py", "C:\\msprobe\\core.py", "<frozen runpy>", "/usr/lib/python3.11/a.py", "<string>"):
        assert not is_user_file(p), p
    assert is_user_file("/home/me/train.py") and is_user_file("/w/msprobe_nb/analysis/x.py")
    assert parse_frame('File "/a b/c.py", line 12, in run\n    z = 1\n') == ("/a b/c.py", 12, "run", "z = 1")
    assert parse_frame("File /a.py, line 3") == ("/a.py", 3, "", "")
    assert parse_frame("no frame here") is None
    assert user_frame(["garbage", "File /lib/python3/x.py, line 1, in f", "File /u.py, line 2, in g"]) == \
        ("/u.py:2", None)
    assert user_frame(None) == (None, None)
    assert forward_of("a.backward.b.backward") == "a.backward.b.forward" and forward_of("a.forward") is None


def test_the_draw_nearest_the_diverging_call_is_named_past_unknown_producers():
    rows = [_r(0, "c0", "output", npu_rng_state="a", bench_rng_state="b"),
            _r(1, "c1", "output", npu_rng_state="a", bench_rng_state="b"),
            _r(2, "c2", "input", producer="c0"), _r(2, "c2", "output"),
            _r(3, "c3", "input", "0", producer="zz"), _r(3, "c3", "input", "1", producer="c1"),
            _r(3, "c3", "input", "2", producer="c2"), _r(3, "c3", "output", err=0.5)]
    for r in rows:
        r.setdefault("npu_rng_state", "")
        r.setdefault("bench_rng_state", "")
    d = _one(rows)
    assert d.call == "c1" and "random draw" in d.message


def test_an_extra_call_is_found_past_unknown_and_matched_producers():
    rows = [_r(0, "c0", "output"), _r(1, "x", "output", match="npu_only"),
            _r(2, "c2", "input", "0", err=0.5, producer="zz"), _r(2, "c2", "input", "1", err=0.5, producer="c0"),
            _r(2, "c2", "input", "2", err=0.5, producer="x"), _r(2, "c2", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "x" and d.kind == "extra"


def test_of_two_bench_only_producers_the_earlier_is_the_root():
    rows = _calls(2) + [_r(5, "c2", "input", "0", err=0.5, producer="c1", bench_producer="bq"),
                        _r(5, "c2", "input", "1", err=0.5, producer="c1", bench_producer="bz"),
                        _r(5, "c2", "output", err=0.5)]
    for r in rows:
        r.setdefault("bench_producer", "")
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    for name, bci in (("ba", 0), ("bq", 2), ("bz", 4)):  # ba: a bench-only call elsewhere
        rows.append(_r(bci, name, "output", match="bench_only", bench_call=name, bench_call_index=bci,
                       bench_producer=""))
    d = _one(rows)
    assert d.call == "bq" and d.kind == "extra"


def test_a_draw_behind_an_agreeing_input_is_not_blamed():
    rows = [_r(1, "c1", "output", npu_rng_state="a", bench_rng_state="b"), _r(2, "c2", "output"),
            _r(3, "c3", "input", "0", err=0.5, producer="c2"), _r(3, "c3", "input", "1", producer="c1"),
            _r(3, "c3", "output", err=0.5)]
    for r in rows:
        r.setdefault("npu_rng_state", "")
        r.setdefault("bench_rng_state", "")
    d = _one(rows)
    assert d.call == "c3" and d.kind == "inputs"


def test_a_bench_only_root_shows_no_rows_and_only_their_columns():
    rows = _calls(2) + [_r(5, "c2", "input", err=0.5, producer="c1", bench_producer="by"),
                        _r(5, "c2", "output", err=0.5)]
    for r in rows:
        r.setdefault("bench_producer", "")
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    rows.append(_r(2, "by", "output", match="bench_only", bench_call="by", bench_call_index=2, bench_producer=""))
    d = _one(rows)
    assert d.call == "by" and list(d.rows.columns) == ["name", "io", "err"] and d.rows.empty


def test_a_backward_with_diverging_inputs_and_no_producers_recorded_is_the_root():
    rows = [_r(0, "F.a.0.forward", "input"), _r(0, "F.a.0.forward", "output"),
            _r(1, "F.a.0.backward", "input", err=0.5), _r(1, "F.a.0.backward", "output", err=0.5)]
    d = find_divergences(_t(rows).drop(columns=["producer"]), TH)[0]
    assert d.call == "F.a.0.backward" and d.kind == "inputs"


def test_a_backward_names_the_npu_only_consumer_of_its_forward_not_an_earlier_one():
    rows = [_r(0, "F.z.0.forward", "input", producer="", match="npu_only"),
            _r(0, "F.z.0.forward", "output", match="npu_only"),
            _r(1, "F.a.0.forward", "input"), _r(1, "F.a.0.forward", "output"),
            _r(2, "F.x.0.forward", "input", producer="F.a.0.forward", match="npu_only"),
            _r(2, "F.x.0.forward", "output", match="npu_only"),
            _r(3, "F.a.0.backward", "input", err=0.5), _r(3, "F.a.0.backward", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "F.x.0.forward" and d.kind == "extra"


def _bench_backward_rows(backward_in_err: float = 0.5) -> list[dict]:
    """F.p, F.a forward, F.a backward (its outputs diverge; its inputs by ``backward_in_err``); the bench run
    alone makes B.y.0.forward / backward, which consumed the bench forward B.a.0.forward."""
    rows = [_r(0, "F.p.0.forward", "output"), _r(1, "F.a.0.forward", "input"), _r(1, "F.a.0.forward", "output"),
            _r(3, "F.a.0.backward", "input", err=backward_in_err), _r(3, "F.a.0.backward", "output", err=0.5)]
    for r in rows:
        r.update(bench_call=r["call"].replace("F.", "B."), bench_call_index=r["call_index"], bench_producer="")
    rows += [_r(2, "F.y.0.forward", "input", match="bench_only", bench_call="B.y.0.backward", bench_call_index=2,
                bench_producer="B.a.0.forward"),
             _r(2, "F.y.0.forward", "input", match="bench_only", bench_call="B.y.0.forward", bench_call_index=2,
                bench_producer="")]
    return rows


def test_a_backward_names_the_bench_consumer_of_its_own_forward_after_other_matched_calls():
    d = _one(_bench_backward_rows())
    assert d.call == "B.y.0.forward" and d.kind == "extra"


def test_a_backward_whose_inputs_agree_is_the_root_whatever_the_bench_run_made_alone():
    d = _one(_bench_backward_rows(backward_in_err=0.0))
    assert d.call == "F.a.0.backward" and d.kind == "call"


def test_of_two_npu_only_producers_the_earlier_is_the_root():
    rows = [_r(0, "c0", "output"), _r(2, "x", "output", match="npu_only"), _r(3, "y", "output", match="npu_only"),
            _r(4, "c2", "input", "0", err=0.5, producer="x"), _r(4, "c2", "input", "1", err=0.5, producer="y"),
            _r(4, "c2", "output", err=0.5)]
    assert _one(rows).call == "x"


def test_a_call_the_bench_run_made_alone_is_no_previous_call_of_a_one_sided_argument():
    rows = [_r(-1, "bx", "output", match="bench_only"), _r(0, "c0", "input"), _r(0, "c0", "output"),
            _r(7, "c0", "input", "approximate", match="bench_only", kind="value", bench_value="tanh")]
    d = _one(rows)
    assert d.call == "c0" and d.kind == "argument" and d.previous_call is None


def _bench_extra_rows(extra: str = "bz", extra_bci: int = 7) -> list[dict]:
    """c0, c1 (matched), c2 (its input diverges, the bench run's producer is ``extra``), c3 and c4 after it."""
    rows = _calls(2) + [_r(5, "c2", "input", err=0.5, producer="c1", bench_producer=extra),
                        _r(5, "c2", "output", err=0.5), _r(6, "c3", "output"), _r(7, "c4", "output")]
    for r in rows:
        r.setdefault("bench_producer", "")
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    rows[-2]["bench_call_index"], rows[-1]["bench_call_index"] = 9, 10
    rows.append(_r(-1, extra, "output", match="bench_only", bench_call=extra, bench_call_index=extra_bci,
                   bench_producer=""))
    return rows


def test_a_bench_only_call_sits_before_the_next_matched_call_whatever_the_names_around_it():
    rows = _bench_extra_rows()
    rows.insert(0, _r(0, "a0", "output", bench_call="a0", bench_call_index=0, bench_producer=""))
    assert _one(rows).call_index == 6


def test_a_bench_only_backward_whose_forward_both_runs_made_is_the_root_itself():
    rows = _bench_extra_rows(extra="B.y.0.backward")
    rows.insert(0, _r(0, "B.y.0.forward", "output", bench_call="B.y.0.forward", bench_call_index=0, bench_producer=""))
    d = _one(rows)
    assert d.call == "B.y.0.backward" and d.kind == "extra"


def test_the_chain_holds_only_calls_after_the_root_not_its_enclosing_module():
    rows = [_r(0, "m", "input", err=0.5, parent=""), _r(0, "m", "output", err=0.5, parent=""),
            _r(1, "t", "input", parent="m"), _r(1, "t", "output", err=0.5, parent="m")]
    d = _one(rows)
    assert d.call == "t" and d.kind == "call" and d.chain == [] and d.modules == ["m"]


# ------------------------------------------------------------------------------ more mutation survivors
def _div(**kw):
    from msprobe_nb.analysis.divergence import Divergence

    return Divergence(**{"call": "c1", "step": 0, "rank": 0, "call_index": 1, "kind": "call", "message": "m",
                         "rows": pd.DataFrame(columns=["name", "io", "err"]), **kw})


def test_the_text_counts_outer_modules_and_the_calls_left_out_of_a_chain():
    assert "inside a (+2 outer)" in str(_div(modules=["a", "b", "c"]))
    for n, more in ((3, ""), (5, ""), (6, " ... (+1 more)"), (11, " ... (+6 more)")):
        chain = [f"x{k}" for k in range(n)]
        line = f"  flows into {n} later call(s): {', '.join(chain[:5])}{more}"
        assert str(_div(chain=chain)).splitlines()[-1] == line, n


def test_an_npu_only_call_with_arguments_and_nothing_diverging_is_no_divergence():
    rows = _calls(2) + [_r(2, "x", "input", "0", match="npu_only"),
                        _r(2, "x", "input", "dim", match="npu_only", kind="value", npu_value="1"),
                        _r(2, "x", "output", match="npu_only")]
    assert find_divergences(_t(rows), TH) == []


def test_a_bench_side_argument_is_placed_at_its_call_beside_calls_the_bench_run_made_alone():
    # the bench passes approximate='tanh' to c1 and also makes a call of its own (b9): c1 is the root, at its
    # own NPU position after c0
    rows = _calls(3)
    rows.insert(2, _r(-1, "c1", "input", "approximate", match="bench_only", kind="value", npu_value=None,
                      bench_value="tanh"))
    rows.append(_r(-1, "b9", "output", match="bench_only"))
    rows.append(_r(-1, "b9", "input", match="bench_only"))
    # pair 1, after an agreeing pair 0: its rows' labels in the table do not start at 0
    rows = [{**r, "pair": 0, "rank": 0} for r in _calls(3)] + [{**r, "pair": 1, "rank": 1} for r in rows]
    t = _t(rows)
    t["call_index"] = t["call_index"].astype("Int64")
    t.loc[t["match"] == "bench_only", "call_index"] = pd.NA
    d = find_divergences(t, TH)[0]
    assert (d.call, d.kind, d.call_index, d.previous_call, d.rank) == ("c1", "argument", 1, "c0", 1)


def test_a_draw_later_in_the_run_is_the_root_with_its_own_position_and_rows():
    rows = _calls(5, bad_in=4, bad_out=4)
    for r in rows:
        r.update(npu_rng_state="", bench_rng_state="")
    rows[6] = {**rows[6], "npu_rng_state": "s1", "bench_rng_state": "s2"}  # c3's draw (its input row)
    d = _one(rows)
    assert (d.call, d.call_index, d.previous_call) == ("c3", 3, "c2") and d.rows.empty


def test_a_draw_state_that_sorts_either_way_differs_and_one_recorded_side_is_no_evidence():
    rows = _calls(4, bad_in=3, bad_out=3)
    for r in rows:
        r.update(npu_rng_state="s", bench_rng_state="s")
    rows[2] = {**rows[2], "npu_rng_state": "s2", "bench_rng_state": "s1"}  # NPU's state sorts after the bench's
    assert _one(rows).call == "c1"
    rows[2] = {**rows[2], "npu_rng_state": "", "bench_rng_state": "s1"}  # only the bench recorded it
    assert _one(rows).call == "c3"


def test_an_extra_call_shows_only_its_own_rows_not_its_consumers():
    rows = _calls(2) + [_r(2, "x", "output", match="npu_only"),
                        _r(3, "c2", "input", err=0.5, producer="x"), _r(3, "c2", "output", err=0.5),
                        _r(4, "c3", "input", err=0.5, producer="c2"), _r(4, "c3", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "x" and d.kind == "extra" and d.rows.empty and d.chain == ["c2", "c3"]


def test_an_extra_call_behind_an_agreeing_input_is_not_blamed():
    rows = [_r(0, "a", "output"), _r(1, "x", "output", match="npu_only"),
            _r(2, "c2", "input", "0", err=0.5, producer="a"), _r(2, "c2", "input", "1", producer="x"),
            _r(2, "c2", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "c2" and d.kind == "inputs" and "although a produced them" in d.message


def test_a_backward_with_its_own_stack_keeps_it():
    rows = [{**r, "call": r["call"] + ".0.backward"} for r in _calls(2, bad_out=1)]
    stacks = {"c1.0.backward": ['File "/src/own.py", line 7, in bwd'], "c1.0.forward": ['File "/src/f.py", line 5']}
    d = _one(rows, stack_of=lambda c, s, r: stacks.get(c))
    assert d.frame == "/src/own.py:7" and not d.message.endswith("(stack of the forward call)")


def test_a_parent_that_names_no_recorded_call_encloses_nothing():
    rows = [_r(0, "c0", err=0.5, parent=""), _r(1, "c1", parent=""), _r(2, "c2", err=0.5, parent="Module.gone")]
    assert _one(rows).call == "c0"
    rows = [_r(0, "c0", parent=""), _r(1, "c1", err=0.5, parent=""), _r(2, "c2", err=0.5, parent="Module.gone")]
    assert _one(rows).call == "c1"


def test_a_call_without_a_parent_is_not_nested_in_the_last_calls_module():
    rows = [_r(0, "c0", err=0.5, parent=""), _r(1, "c1", err=0.5, parent=""), _r(2, "c2", parent="c0")]
    assert _one(rows).call == "c0"


def test_an_earlier_module_that_does_not_diverge_is_not_the_roots():
    rows = [_r(0, "m", parent=""), _r(1, "c1", err=0.5, parent=""), _r(2, "c2", err=0.5, parent="m")]
    assert _one(rows).call == "c1"


def test_nesting_and_the_chain_hold_past_256_calls():
    # call codes past CPython's small-int cache: a comparison by identity would miss them
    rows = [_r(k, f"c{k}", "output", parent="") for k in range(280)]
    rows += [_r(280, "m", "output", err=0.5, parent=""),
             _r(281, "t", "input", parent="m"), _r(281, "t", "output", err=0.5, parent="m"),
             _r(282, "u", "input", "0", err=0.5, producer="t", parent=""),
             _r(282, "u", "input", "1", err=0.5, producer="t", parent=""), _r(282, "u", "output", parent="")]
    d = _one(rows)
    assert d.call == "t" and d.modules == ["m"] and d.chain == ["u"]


def test_without_bench_producers_no_bench_only_call_is_blamed():
    rows = _calls(2) + [_r(5, "c2", "input", err=0.5, producer="c1"), _r(5, "c2", "output", err=0.5)]
    for r in rows:
        r.update(bench_call=r["call"], bench_call_index=r["call_index"])
    rows.append(_r(-1, "bz", "output", match="bench_only", bench_call="bz", bench_call_index=3))
    d = _one(rows)  # a table with bench_call but no bench_producer column
    assert d.call == "c2" and d.kind == "inputs"


def test_a_bench_only_root_of_a_single_row_and_a_single_row_forward():
    rows = _bench_extra_rows()
    for r in rows:
        r.update(bench_step=0, bench_rank=0)
    d = _one(rows)  # the bench-only call has one row only
    assert d.call == "bz" and d.kind == "extra" and (d.step, d.rank) == (0, 0)
    rows = [r for r in _bench_backward_rows() if not (r["call"] == "F.a.0.forward" and r["io"] == "input")]
    d = _one(rows)  # the forward has one (matched) row only
    assert d.call == "B.y.0.forward" and d.kind == "extra"


def test_the_forwards_bench_name_comes_from_its_own_matched_rows():
    rows = _bench_backward_rows()
    # a matched call whose name sorts before the forward's, first in the table, and an NPU-only row of the
    # forward itself (a tensor the bench run did not pass) before its matched rows
    rows.insert(0, _r(0, "F.a.0.aaaa", "output", bench_call="B.zz", bench_call_index=0, bench_producer=""))
    rows.insert(0, _r(1, "F.a.0.forward", "input", "extra", match="npu_only", bench_call=None, bench_producer=""))
    for r in rows:  # no bench row without a producer: a forward taken as named '' would find no consumer
        if r["match"] == "bench_only" and not r["bench_producer"]:
            r["bench_producer"] = "B.p.0.forward"
    d = _one(rows)
    assert d.call == "B.y.0.forward" and d.kind == "extra"


def test_a_call_both_runs_made_is_no_one_sided_consumer_though_one_of_its_inputs_is():
    rows = [_r(0, "F.a.0.forward", "input"), _r(0, "F.a.0.forward", "output"),
            _r(1, "F.m.0.forward", "input", "0", producer="F.a.0.forward"),
            _r(1, "F.m.0.forward", "input", "1", producer="F.a.0.forward", match="npu_only"),  # an NPU-only input
            _r(1, "F.m.0.forward", "output"),
            _r(2, "F.a.0.backward", "input", err=0.5), _r(2, "F.a.0.backward", "output", err=0.5)]
    d = _one(rows)
    assert d.call == "F.a.0.backward" and d.kind == "inputs"


def test_the_one_sided_consumer_is_the_one_fed_by_the_forward_not_by_a_later_named_call():
    rows = [_r(0, "F.a.0.forward", "input"), _r(0, "F.a.0.forward", "output"),
            _r(1, "F.y.0.forward", "input", producer="F.z.0.forward", match="npu_only"),  # 'F.z' sorts after 'F.a'
            _r(1, "F.y.0.forward", "output", match="npu_only"),
            _r(2, "F.x.0.forward", "input", producer="F.a.0.forward", match="npu_only"),
            _r(2, "F.x.0.forward", "output", match="npu_only"),
            _r(3, "F.a.0.backward", "input", err=0.5), _r(3, "F.a.0.backward", "output", err=0.5)]
    assert _one(rows).call == "F.x.0.forward"


def test_of_two_bench_only_consumers_the_earlier_in_the_bench_run_is_named():
    rows = _bench_backward_rows()
    rows = [r for r in rows if r["match"] != "bench_only"]
    for name, bci in (("B.q.0.forward", 6), ("B.y.0.forward", 2)):  # listed later-first
        rows.append(_r(-1, "F.?", "input", match="bench_only", bench_call=name, bench_call_index=bci,
                       bench_producer="B.a.0.forward", call_index=None))
    t = _t(rows)
    t["call_index"] = t["call_index"].astype("Int64")
    d = find_divergences(t, TH)[0]
    assert d.call == "B.y.0.forward" and d.kind == "extra"


def test_modules_stop_at_a_call_that_is_its_own_parent_and_keep_any_name_order():
    rows = [_r(0, "Module.fc.Linear.forward.0", "input", parent="Module.fc.Linear.forward.0"),
            _r(1, "Functional.linear.0.forward", "output", err=0.5, parent="Module.fc.Linear.forward.0")]
    d = _one(rows)
    assert d.call == "Functional.linear.0.forward" and d.modules == ["Module.fc.Linear.forward.0"]
    rows = [_r(0, "c0", "output", err=0.5, parent="c0")]
    assert _one(rows).modules == []


def test_the_rows_shown_have_exactly_their_columns_and_tensor_mode_built_at_run_time():
    rows = _calls(2, bad_out=1)
    for r in rows:
        r.update(max_abs_err=1.0, rmse=0.1, max_rel=0.5)
    d = _one(rows)
    assert list(d.rows.columns) == ["name", "io", "arg", "err", "result", "max_rel", "norm_rel"]
    mode = "".join(["ten", "sor"])  # e.g. from a command line: equal to "tensor", not the same object
    assert {"cosine", "max_abs_err", "rmse"} <= set(_one(rows, mode=mode).rows.columns)
