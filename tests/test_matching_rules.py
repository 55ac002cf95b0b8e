"""The row-pairing rules one by one on small hand-made call tables (issue 36: tests that fail when a rule breaks):
which rows pair with which, backward renumbering, fuzzy counters, user mappings and their files, (step, rank)
groups, unmatched rows and where they go, and the errors. No recording, no compare(): pure pandas."""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import pytest

from msprobe_nb.analysis.matching import Mapping, MatchError, match_rows, pair_groups, parse_calls


def _t(calls: list[str], step: int = 0, rank: int = 0, ios: tuple = ("input.0", "output.0")) -> pd.DataFrame:
    """A calls table: the rows ``ios`` of each call, in execution order."""
    return pd.DataFrame([dict(step=step, rank=rank, call_index=ci, call=c, name=f"{c}.{s}", io=s.split(".")[0],
                              arg=s.split(".")[1]) for ci, c in enumerate(calls) for s in ios])


def _pairs(npu: pd.DataFrame, bench: pd.DataFrame, **kw) -> list[tuple]:
    """(NPU row name or None, bench row name or None) in the order of the matched table."""
    m = match_rows(npu, bench, **kw)
    nn, bn = npu["name"].to_numpy(), bench["name"].to_numpy()
    return [(nn[i] if i >= 0 else None, bn[j] if j >= 0 else None) for i, j in zip(m.npu_idx, m.bench_idx)]


def _same(names: list[str]) -> list[tuple]:
    return [(n, n) for n in names]


LIN = "Functional.linear.{}.forward"
LINB = "Functional.linear.{}.backward"


# ----------------------------------------------------------------------------------------------- exact names
def test_identical_dumps_pair_every_row_with_itself_in_execution_order():
    calls = [LIN.format(0), "Torch.relu.0.forward", LIN.format(1)]
    t = _t(calls)
    m = match_rows(t, t.copy())
    assert list(m.npu_idx) == list(range(6)) and list(m.bench_idx) == list(range(6))
    assert list(m.pair) == [0] * 6 and not m.mapped.any() and m.notes == [] and m.notes_by_row == {}
    assert list(m.pairs.columns) == ["step", "rank", "bench_step", "bench_rank", "npu_rows", "bench_rows"]
    assert m.pairs.values.tolist() == [[0, 0, 0, 0, 6, 6]] and m.unpaired.empty


def test_rows_are_read_in_call_index_order_then_recorded_order_and_indexed_by_position():
    t = _t([LIN.format(0), LIN.format(1)], ios=("input.0", "input.1", "output.0"))
    shuffled = t.iloc[[3, 0, 4, 1, 5, 2]].set_axis([50, 10, 30, 0, 40, 20])  # any index: positions are returned
    m = match_rows(shuffled, t)
    assert list(shuffled["name"].to_numpy()[m.npu_idx]) == list(t["name"])
    assert list(m.bench_idx) == list(range(6))
    # ties of call_index keep the recorded order: input.1 recorded before input.0 stays before it
    swapped = t.iloc[[1, 0, 2, 3, 4, 5]]
    assert [n for n, _ in _pairs(swapped, t)][:2] == [f"{LIN.format(0)}.input.1", f"{LIN.format(0)}.input.0"]


def test_a_row_pairs_only_with_the_same_call_counter_and_row_suffix():
    npu = _t([LIN.format(0), LIN.format(1)])
    bench = _t([LIN.format(1), LIN.format(2)])
    got = _pairs(npu, bench)
    assert (f"{LIN.format(1)}.input.0", f"{LIN.format(1)}.input.0") in got
    assert (f"{LIN.format(0)}.output.0", None) in got and (None, f"{LIN.format(2)}.output.0") in got
    assert len(got) == 6


def test_rows_without_a_partner_are_kept_npu_only_in_place_and_bench_only_after_their_predecessor():
    a, b, c, x, y = (LIN.format(k) for k in range(5))
    npu = _t([a, b, c], ios=("output.0",))
    bench = _t([x, a, y, b, c], ios=("output.0",)).iloc[[0, 1, 2, 4, 3]]  # recorded order is not call order
    got = _pairs(npu, bench)
    o = ".output.0"
    assert got == [(None, x + o), (a + o, a + o), (None, y + o), (b + o, b + o), (c + o, c + o)]
    m = match_rows(npu, bench)
    assert list(m.bench_idx) == [0, 1, 2, 4, 3]  # positions of the bench frame as given
    assert list(m.npu_idx) == [-1, 0, -1, 1, 2]  # -1: no row on that side


def test_several_bench_only_rows_keep_their_order_and_npu_only_rows_stay_where_they_ran():
    a, b, c, d = (LIN.format(k) for k in range(4))
    o = ".output.0"
    npu = _t([a, d, b], ios=("output.0",))
    bench = _t([a, c, "Torch.add.0.forward", b], ios=("output.0",))
    assert _pairs(npu, bench) == [(a + o, a + o), (None, c + o), (None, "Torch.add.0.forward" + o), (d + o, None),
                                  (b + o, b + o)]
    # bench-only rows after the last matched one go at the end, in bench order
    bench2 = _t([a, b, c, "Torch.add.0.forward"], ios=("output.0",))
    assert _pairs(npu, bench2)[-2:] == [(None, c + o), (None, "Torch.add.0.forward" + o)]


def test_a_name_recorded_twice_pairs_with_the_other_sides_second_one():
    a = LIN.format(0)
    two = pd.concat([_t([a], ios=("output.0",))] * 2, ignore_index=True)
    assert _pairs(two, two.copy()) == _same([a + ".output.0"] * 2) and list(match_rows(two, two).bench_idx) == [0, 1]
    assert _pairs(two, two.iloc[:1]) == [(a + ".output.0", a + ".output.0"), (a + ".output.0", None)]
    three = pd.concat([two, two.iloc[:1]], ignore_index=True)
    assert _pairs(two, three) == _same([a + ".output.0"] * 2) + [(None, a + ".output.0")]


def test_rows_whose_name_is_not_the_call_plus_suffix_pair_by_their_whole_name():
    npu = pd.DataFrame([dict(step=0, rank=0, call_index=0, call="Torch.add.0.forward", name="custom_row", io="",
                             arg=""), dict(step=0, rank=0, call_index=0, call="Torch.add.0.forward",
                                           name="Torch.add.0.forward.output.0", io="output", arg="0")])
    bench = npu.copy()
    bench.loc[0, "call"] = "Torch.add.7.forward"  # same row name, other call counter: the row name is not a suffix
    got = _pairs(npu, bench)
    assert sorted(got, key=str) == sorted([(None, "custom_row"), ("custom_row", None)] + _same(
        ["Torch.add.0.forward.output.0"]), key=str)
    bench.loc[0, "call"] = "Torch.add.0.forward"
    assert _pairs(npu, bench) == _same(["custom_row", "Torch.add.0.forward.output.0"])


# ------------------------------------------------------------------------------------- backward and fuzzy
def test_backward_calls_pair_by_their_order_among_the_same_apis_backward_calls():
    """Activation recomputation runs the forward again: the bench's backward counters are shifted."""
    npu = _t([LIN.format(0), LIN.format(1), LINB.format(1), LINB.format(0)])
    bench = _t([LIN.format(0), LIN.format(1), LINB.format(3), LINB.format(2)])
    got = _pairs(npu, bench)
    assert got[:4] == _same([f"{LIN.format(k)}.{s}" for k in (0, 1) for s in ("input.0", "output.0")])
    assert got[4:] == [(f"{LINB.format(1)}.{s}", f"{LINB.format(3)}.{s}") for s in ("input.0", "output.0")] + [
        (f"{LINB.format(0)}.{s}", f"{LINB.format(2)}.{s}") for s in ("input.0", "output.0")]
    assert not match_rows(npu, bench).mapped.any()


def test_forward_counters_are_never_renumbered_without_fuzzy():
    npu = _t([LIN.format(0), LIN.format(1)], ios=("output.0",))
    bench = _t([LIN.format(3), LIN.format(4)], ios=("output.0",))
    assert all(n is None or b is None for n, b in _pairs(npu, bench))


def test_module_calls_backward_calls_and_parameter_gradients_are_parsed_by_their_counter():
    calls = np.array(["Module.fc.Linear.forward.0", "Module.fc.Linear.backward.3", LIN.format(2), LINB.format(5),
                      "Module.fc.Linear.parameters_grad", "Module.fc.Linear.parameters_grad.2", "Tensor.add",
                      "a.b.forward", "x.7.sideways", "Torch.relu.x.forward", "a.b.3"], dtype=object)
    base, counter, direction = parse_calls(calls)
    assert list(base) == ["Module.fc.Linear.forward", "Module.fc.Linear.backward", "Functional.linear.forward",
                          "Functional.linear.backward", "Module.fc.Linear.parameters_grad",
                          "Module.fc.Linear.parameters_grad", "Tensor.add", "a.b.forward", "x.7.sideways",
                          "Torch.relu.x.forward", "a.b.3"]
    assert list(counter) == [0, 3, 2, 5, 0, 2, -1, -1, -1, -1, -1]
    assert list(direction) == ["forward", "backward", "forward", "backward", "parameters_grad", "parameters_grad",
                               "", "", "", "", ""]


def test_module_backward_calls_are_renumbered_and_parameter_gradients_are_not():
    mb = "Module.fc.Linear.backward.{}"
    npu = _t([mb.format(0), mb.format(1), "Module.fc.Linear.parameters_grad"], ios=("output.0",))
    bench = _t([mb.format(4), mb.format(6), "Module.fc.Linear.parameters_grad.1"], ios=("output.0",))
    got = _pairs(npu, bench)
    assert got[:2] == [(f"{mb.format(0)}.output.0", f"{mb.format(4)}.output.0"),
                       (f"{mb.format(1)}.output.0", f"{mb.format(6)}.output.0")]
    assert ("Module.fc.Linear.parameters_grad.output.0", None) in got and len(got) == 4


def test_backward_renumbering_counts_per_api_and_per_group():
    npu = pd.concat([_t([LINB.format(0), "Torch.mul.0.backward", LINB.format(1)], rank=r) for r in (0, 1)],
                    ignore_index=True)
    bench = pd.concat([_t([LINB.format(7), "Torch.mul.4.backward", LINB.format(9)], rank=r) for r in (0, 1)],
                      ignore_index=True)
    got = _pairs(npu, bench)
    assert len(got) == 12 and all(n is not None and b is not None for n, b in got)
    assert got[1] == (f"{LINB.format(0)}.output.0", f"{LINB.format(7)}.output.0")
    assert got[5] == (f"{LINB.format(1)}.output.0", f"{LINB.format(9)}.output.0")
    assert got[7] == (f"{LINB.format(0)}.output.0", f"{LINB.format(7)}.output.0")
    assert list(match_rows(npu, bench).pair) == [0] * 6 + [1] * 6


def test_fuzzy_pairs_the_kth_call_of_a_name_with_the_kth_whatever_the_counters():
    npu = _t([LIN.format(0), "Torch.relu.0.forward", LIN.format(1)], ios=("output.0",))
    bench = _t([LIN.format(5), "Torch.relu.3.forward", LIN.format(9), LIN.format(11)], ios=("output.0",))
    m = match_rows(npu, bench, fuzzy=True)
    got = _pairs(npu, bench, fuzzy=True)
    assert got == [(f"{LIN.format(0)}.output.0", f"{LIN.format(5)}.output.0"),
                   ("Torch.relu.0.forward.output.0", "Torch.relu.3.forward.output.0"),
                   (f"{LIN.format(1)}.output.0", f"{LIN.format(9)}.output.0"), (None, f"{LIN.format(11)}.output.0")]
    assert m.notes == ["fuzzy matching: call counters ignored, k-th call of a name paired with the k-th"]
    # forward and backward of one API are numbered apart
    npu = _t([LIN.format(0), LINB.format(0)], ios=("output.0",))
    bench = _t([LIN.format(2), LINB.format(8)], ios=("output.0",))
    assert _pairs(npu, bench, fuzzy=True) == [(f"{LIN.format(0)}.output.0", f"{LIN.format(2)}.output.0"),
                                              (f"{LINB.format(0)}.output.0", f"{LINB.format(8)}.output.0")]


# ------------------------------------------------------------------------------------------------- mappings
def test_a_mapped_call_pairs_with_the_named_bench_call_and_says_so():
    npu = _t([LIN.format(3), "Torch.relu.0.forward"])
    bench = _t(["Functional.matmul.1.forward", "Torch.relu.0.forward"])
    mp = Mapping(names={LIN.format(3): "Functional.matmul.1.forward"})
    m = match_rows(npu, bench, mapping=mp)
    assert _pairs(npu, bench, mapping=mp) == [(f"{LIN.format(3)}.{s}", f"Functional.matmul.1.forward.{s}")
                                              for s in ("input.0", "output.0")] + _same(
        ["Torch.relu.0.forward.input.0", "Torch.relu.0.forward.output.0"])
    assert list(m.mapped) == [True, True, False, False]
    assert m.notes_by_row == {0: "matched through the mapping as Functional.matmul.1.forward",
                              1: "matched through the mapping as Functional.matmul.1.forward"}
    assert all(b is None or n is None for n, b in _pairs(npu, bench)[:4])  # without the mapping: no linear pair


def test_a_mapped_backward_call_takes_the_bench_calls_counter_as_is():
    npu = _t([LINB.format(0), LINB.format(1)], ios=("output.0",))
    bench = _t([LINB.format(0), LINB.format(1)], ios=("output.0",))
    mp = Mapping(names={LINB.format(0): LINB.format(1), LINB.format(1): LINB.format(0)})
    assert _pairs(npu, bench, mapping=mp) == [(f"{LINB.format(0)}.output.0", f"{LINB.format(1)}.output.0"),
                                              (f"{LINB.format(1)}.output.0", f"{LINB.format(0)}.output.0")]


def test_a_call_mapped_to_a_missing_bench_call_stays_unpaired_but_flagged():
    npu = _t([LIN.format(0)], ios=("output.0",))
    bench = _t(["Torch.add.0.forward"], ios=("output.0",))
    mp = Mapping(names={LIN.format(0): "Torch.nothing.0.forward"})
    m = match_rows(npu, bench, mapping=mp)
    # a bench-only row before any matched one comes first
    assert _pairs(npu, bench, mapping=mp) == [(None, "Torch.add.0.forward.output.0"),
                                              (f"{LIN.format(0)}.output.0", None)]
    assert list(m.mapped) == [False, True]
    # the note says the mapping found nothing, never "matched" (grading shows it as the row's reason)
    assert m.notes_by_row == {1: "mapped to bench call Torch.nothing.0.forward, which has no such row in the bench "
                                 "dump"}


def test_a_mapped_row_pairs_with_the_named_bench_row_or_says_it_is_missing():
    a, b = LIN.format(0), "Functional.matmul.0.forward"
    npu = _t([a], ios=("input.0", "input.1", "output.0"))
    bench = _t([b], ios=("input.0", "input.1", "output.0"))
    mp = Mapping(names={f"{a}.input.0": f"{b}.input.1", f"{a}.input.1": f"{b}.input.5"})
    m = match_rows(npu, bench, mapping=mp)
    got = _pairs(npu, bench, mapping=mp)
    # bench-only rows right after the last matched bench row before them
    assert got == [(None, f"{b}.input.0"), (f"{a}.input.0", f"{b}.input.1"), (None, f"{b}.output.0"),
                   (f"{a}.input.1", None), (f"{a}.output.0", None)]
    assert m.notes_by_row == {3: f"mapped to bench row {b}.input.5, which is not in the bench dump"}
    assert list(m.mapped) == [False, True, False, True, False]


def test_two_rows_mapped_to_missing_rows_stay_apart():
    a = LIN.format(0)
    npu = _t([a], ios=("input.0", "input.1"))
    bench = _t([a], ios=("output.0",))
    mp = Mapping(names={f"{a}.input.0": "gone.0", f"{a}.input.1": "gone.1"})
    assert _pairs(npu, bench, mapping=mp) == [(None, f"{a}.output.0"), (f"{a}.input.0", None),
                                              (f"{a}.input.1", None)]


def test_a_mapped_row_pairs_within_its_own_group():
    a = LIN.format(0)
    npu = pd.concat([_t([a], rank=r, ios=("output.0",)) for r in (0, 1)], ignore_index=True)
    bench = pd.concat([_t(["x"], rank=r, ios=("output.0",)) for r in (0, 1)], ignore_index=True)
    m = match_rows(npu, bench, mapping=Mapping(names={f"{a}.output.0": "x.output.0"}))
    assert list(m.npu_idx) == [0, 1] and list(m.bench_idx) == [0, 1] and list(m.pair) == [0, 1]


def test_module_prefixes_are_renamed_on_dot_boundaries_longest_first():
    mp = Mapping(modules={"encoder": "model", "encoder.layers": "model.blocks"})
    assert mp.rename_call("Module.encoder.layers.0.Linear.forward.0") == "Module.model.blocks.0.Linear.forward.0"
    assert mp.rename_call("Module.encoder.norm.LayerNorm.forward.0") == "Module.model.norm.LayerNorm.forward.0"
    assert mp.rename_call("Module.encoder") == "Module.model"
    assert mp.rename_call("Module.encoders.0.Linear.forward.0") == "Module.encoders.0.Linear.forward.0"
    assert mp.rename_call("Functional.encoder.0.forward") == "Functional.encoder.0.forward"  # modules only
    assert Mapping(modules={"add": "sub"}).rename_call("Tensor.add.0.forward") == "Tensor.add.0.forward"
    both = Mapping(names={"Module.encoder.x.forward.0": "Module.y.forward.0"}, modules={"encoder": "model"})
    assert both.rename_call("Module.encoder.x.forward.0") == "Module.y.forward.0"  # names first
    assert Mapping().rename_call("Module.encoder.x.forward.0") == "Module.encoder.x.forward.0"
    npu = _t(["Module.encoder.layers.0.Linear.forward.0"], ios=("output.0",))
    bench = _t(["Module.model.blocks.0.Linear.forward.0"], ios=("output.0",))
    m = match_rows(npu, bench, mapping=mp)
    assert list(m.bench_idx) == [0] and list(m.mapped) == [True]
    assert m.notes_by_row == {0: "matched through the mapping as Module.model.blocks.0.Linear.forward.0"}


# ------------------------------------------------------------------------------------------- mapping input
def test_mapping_load_takes_none_a_mapping_a_flat_dict_or_sections():
    assert Mapping.load(None) is None
    mp = Mapping(names={"a": "b"})
    assert Mapping.load(mp) is mp
    assert Mapping.load({"a": "b"}) == Mapping(names={"a": "b"}, modules={})
    assert Mapping.load({"names": {"a": "b"}, "modules": {".enc.": "model."}}) == Mapping({"a": "b"},
                                                                                        {"enc": "model"})
    assert Mapping.load({"names": None, "modules": {"x": "y"}}) == Mapping({}, {"x": "y"})
    assert Mapping.load({"modules": {"x": "y"}}) == Mapping({}, {"x": "y"})
    assert Mapping.load({}) == Mapping({}, {})
    assert Mapping.load({"names": "x"}) == Mapping({"names": "x"}, {})  # not a section: a flat rename
    with pytest.raises(MatchError, match="bad key 'names'"):  # another section: a flat dict, whose values are no names
        Mapping.load({"names": {"a": "b"}, "other": {"c": "d"}})


def test_mapping_load_refuses_what_is_not_a_dict_of_strings():
    with pytest.raises(MatchError, match=r"mapping must be a dict or a JSON/YAML file, got list"):
        Mapping.load([("a", "b")])
    with pytest.raises(MatchError, match=r"mapping names: every key and value must be a string \(bad key 'a'\)"):
        Mapping.load({"names": {"a": 1}})
    with pytest.raises(MatchError, match=r"mapping modules: every key and value must be a string \(bad key 3\)"):
        Mapping.load({"modules": {3: "x"}})
    with pytest.raises(MatchError, match=r"mapping names: .*\(bad key 'b'\)"):
        Mapping.load({"a": "x", "b": ["y"]})


def test_mapping_files_in_json_and_yaml(tmp_path):
    j = tmp_path / "m.JSON"
    j.write_text('{"names": {"a": "b"}, "modules": {"enc": "model"}}', encoding="utf-8")
    assert Mapping.load(j) == Mapping({"a": "b"}, {"enc": "model"})
    assert Mapping.load(str(j)) == Mapping({"a": "b"}, {"enc": "model"})
    y = tmp_path / "m.yaml"
    y.write_text("names:\n  a: b\nmodules:\n  enc: model\n", encoding="utf-8")
    assert Mapping.load(y) == Mapping({"a": "b"}, {"enc": "model"})
    bare = tmp_path / "mapping"  # no suffix: YAML
    bare.write_text("a: b\n", encoding="utf-8")
    assert Mapping.load(bare) == Mapping({"a": "b"}, {})
    empty = tmp_path / "empty.yaml"
    empty.write_text("", encoding="utf-8")
    assert Mapping.load(empty) == Mapping({}, {})


def test_bad_mapping_files_are_named_in_the_error(tmp_path):
    with pytest.raises(MatchError, match=r"mapping file not found: .*nope\.yaml"):
        Mapping.load(tmp_path / "nope.yaml")
    with pytest.raises(MatchError, match="mapping file not found"):
        Mapping.load(tmp_path)  # a directory is no file
    j = tmp_path / "bad.json"
    j.write_text("{oops", encoding="utf-8")
    with pytest.raises(MatchError, match=r"mapping file .*bad\.json: invalid JSON \(") as e:
        Mapping.load(j)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    y = tmp_path / "bad.yaml"
    y.write_text("a: [1\n", encoding="utf-8")
    with pytest.raises(MatchError, match=r"mapping file .*bad\.yaml: invalid YAML \(") as e:
        Mapping.load(y)
    assert e.value.__suppress_context__
    lst = tmp_path / "list.json"
    lst.write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(MatchError, match="got list"):
        Mapping.load(lst)


def test_the_mini_yaml_reader_gives_sections_and_flat_keys(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)
    y = tmp_path / "m.yml"
    y.write_text("---\n# renames\nnames:\n  'a.0.forward': \"b.1.forward\"  # a comment\n\tc: d\n\n"
                 "modules:\n  enc: model\n", encoding="utf-8")
    assert Mapping.load(y) == Mapping({"a.0.forward": "b.1.forward", "c": "d"}, {"enc": "model"})
    flat = tmp_path / "flat.yml"
    flat.write_text("a: b #: not a key\nc: 'd'\n", encoding="utf-8")
    assert Mapping.load(flat) == Mapping({"a": "b", "c": "d"}, {})
    back = tmp_path / "back.yml"
    back.write_text("names:\n  a: b\nc: d\n  e: f\n", encoding="utf-8")
    with pytest.raises(MatchError, match=r"back\.yml, line 4: indented entry outside a section"):
        Mapping.load(back)
    bad = tmp_path / "bad.yml"
    bad.write_text("# x\nnames:\n  a b\n", encoding="utf-8")
    with pytest.raises(MatchError, match=r"bad\.yml, line 3: expected 'key: value' \(install PyYAML"):
        Mapping.load(bad)
    first = tmp_path / "first.yml"
    first.write_text("  a: b\n", encoding="utf-8")
    with pytest.raises(MatchError, match="line 1: indented entry outside a section"):
        Mapping.load(first)


# ------------------------------------------------------------------------------------------- (step, rank)
def test_groups_pair_by_step_and_rank_and_the_rest_is_reported_unpaired():
    npu = pd.concat([_t(["a"], step=s, rank=r) for s, r in ((1, 0), (1, 1), (2, 0))], ignore_index=True)
    bench = pd.concat([_t(["a"], step=s, rank=r, ios=("output.0",)) for s, r in ((1, 0), (2, 0), (2, 5))],
                      ignore_index=True)
    pairs, unpaired, notes = pair_groups(npu, bench)
    assert pairs.values.tolist() == [[1, 0, 1, 0, 2, 1], [2, 0, 2, 0, 2, 1]]
    assert unpaired.values.tolist() == [["npu", 1, 1, 2], ["bench", 2, 5, 1]]
    desc = "(NPU has steps [1, 2] ranks [0, 1], bench has steps [1, 2] ranks [0, 5])"
    assert notes == [f"npu groups without a counterpart, not compared: step 1 rank 1 (2 rows) {desc}",
                     f"bench groups without a counterpart, not compared: step 2 rank 5 (1 rows) {desc}"]
    m = match_rows(npu, bench)
    assert m.notes == notes and list(m.pair) == [0, 0, 1, 1]
    assert list(m.bench_idx) == [-1, 0, -1, 1] and list(m.npu_idx) == [0, 1, 4, 5]
    # groups recorded in another order: still by (step, rank)
    pairs2, unpaired2, notes2 = pair_groups(npu.iloc[::-1], bench.iloc[::-1])
    assert pairs2.values.tolist() == pairs.values.tolist() and unpaired2.values.tolist() == unpaired.values.tolist()
    assert notes2 == notes
    two = pd.concat([_t(["a"], step=s, rank=5) for s in (4, 3)] + [_t(["a"], step=1)], ignore_index=True)
    assert [u for u in pair_groups(npu, two)[1].values.tolist() if u[0] == "bench"] == [["bench", 3, 5, 2],
                                                                                          ["bench", 4, 5, 2]]


def test_one_step_each_pairs_whatever_the_step_numbers():
    npu, bench = _t(["a"], step=3), _t(["a"], step=7)
    pairs, unpaired, notes = pair_groups(npu, bench)
    assert pairs.values.tolist() == [[3, 0, 7, 0, 2, 2]] and unpaired.empty
    assert notes == ["NPU step 3 compared with bench step 7 (each dump has one step)"]
    pairs, _, notes = pair_groups(npu, bench, step_map={3: 7})
    assert pairs.values.tolist() == [[3, 0, 7, 0, 2, 2]] and notes == []
    assert pair_groups(npu, _t(["a"], step=3))[2] == []  # the same step: no note
    assert pair_groups(_t(["a"], step=7), _t(["a"], step=3))[0][["step", "bench_step"]].values.tolist() == [[7, 3]]
    # one NPU step, several bench steps: by number only
    bench = pd.concat([_t(["a"], step=s) for s in (1, 3)], ignore_index=True)
    pairs, unpaired, _ = pair_groups(npu, bench)
    assert pairs[["step", "bench_step"]].values.tolist() == [[3, 3]]
    assert unpaired.values.tolist() == [["bench", 1, 0, 2]]


def test_rank_and_step_maps_pair_npu_groups_with_the_named_bench_ones():
    npu = pd.concat([_t(["a"], rank=r) for r in (0, 1)], ignore_index=True)
    bench = pd.concat([_t(["a"], rank=r) for r in (4, 5)], ignore_index=True)
    pairs, unpaired, notes = pair_groups(npu, bench, rank_map={"0": "5", 1: 4})
    assert pairs.values.tolist() == [[0, 0, 0, 5, 2, 2], [0, 1, 0, 4, 2, 2]] and unpaired.empty and notes == []
    m = match_rows(npu, bench, rank_map={0: 5, 1: 4})
    assert list(m.npu_idx) == [0, 1, 2, 3] and list(m.bench_idx) == [2, 3, 0, 1]
    two = pd.concat([_t(["a"], step=s) for s in (0, 1)], ignore_index=True)
    pairs, _, _ = pair_groups(two, pd.concat([_t(["a"], step=s) for s in (10, 11)], ignore_index=True),
                              step_map={0: 11, 1: 10})
    assert pairs[["step", "bench_step"]].values.tolist() == [[0, 11], [1, 10]]


def test_nothing_in_common_is_an_error_that_describes_both_dumps():
    npu = pd.concat([_t(["a"], step=s) for s in (0, 1)], ignore_index=True)
    bench = pd.concat([_t(["a"], step=s, rank=2) for s in (0, 1)], ignore_index=True)
    with pytest.raises(MatchError) as e:
        match_rows(npu, bench)
    assert str(e.value) == ("no (step, rank) of the NPU dump has a counterpart in the bench dump: NPU has steps [0, 1] "
                            "ranks [0], bench has steps [0, 1] ranks [2]. Pass rank_map={npu_rank: bench_rank} / "
                            "step_map to pair them explicitly.")
    assert issubclass(MatchError, ValueError)
    with pytest.raises(MatchError, match="NPU has steps \\[\\] ranks \\[\\]"):
        match_rows(npu.iloc[:0], _t(["a"], step=1))
    with pytest.raises(MatchError, match="bench has steps \\[\\] ranks \\[\\]"):
        match_rows(_t(["a"], step=1), bench.iloc[:0])


# ---------------------------------------------------------------------------------------------- large tables
def _big(n: int, counter_from: int = 0) -> pd.DataFrame:
    return _t([LIN.format(k + counter_from) for k in range(n)], ios=("input.0", "input.1", "output.0"))


def test_a_large_table_pairs_as_a_small_one():
    npu, bench = _big(1700), _big(1700)  # 5100 rows: suffixes from the io and arg columns
    m = match_rows(npu, bench)
    assert list(m.npu_idx) == list(range(5100)) and list(m.bench_idx) == list(range(5100))
    bench = _big(1701)
    bench = bench.drop(index=[3, 4, 5]).reset_index(drop=True)  # call 1 missing; call 2000 extra
    got = _pairs(npu, bench)
    assert got[3] == (f"{LIN.format(1)}.input.0", None) and got[6] == _same([f"{LIN.format(2)}.input.0"])[0]
    assert got[-1] == (None, f"{LIN.format(1700)}.output.0") and len(got) == 5103


def test_a_large_table_with_renamed_rows_or_empty_io_columns_pairs_by_name():
    npu = _big(1700)
    bench = _big(1700)
    bench["io"], bench["arg"] = "", ""  # a reader that leaves io/arg empty
    assert list(match_rows(npu, bench).bench_idx) == list(range(5100))
    bench = _big(1700)
    bench["arg"] = "9"  # same length as the real arg: only the names tell
    assert list(match_rows(npu, bench).bench_idx) == list(range(5100))
    bench = _big(1700)
    bench.loc[7, "name"], npu.loc[7, "name"] = "renamed", "renamed"  # one row whose name is not call + suffix
    m = match_rows(npu, bench)
    assert list(m.bench_idx) == list(range(5100))
    bench.loc[7, "name"] = "renamed2"
    got = _pairs(npu, bench)
    assert ("renamed", None) in got and (None, "renamed2") in got and len(got) == 5101


def _rare_row(name: str, arg: str) -> tuple[pd.DataFrame, str]:
    """5100 rows of 2550 calls; row 8 (input 0 of call 4, a row the consistency sample does not read) renamed."""
    npu = _t([LIN.format(k) for k in range(2550)])
    npu.loc[8, ["name", "arg"]] = [name, arg]
    return npu, LIN.format(4)


@pytest.mark.parametrize("third_arg", [None, 1, 5])
def test_a_rare_argument_of_a_large_table_keeps_its_own_suffix(third_arg):
    npu, c4 = _rare_row(f"{LIN.format(4)}.input.10", "10")
    if third_arg is not None:  # a call before or after it takes a keyword argument "x"
        c = LIN.format(third_arg)
        npu.loc[2 * third_arg, ["name", "arg"]] = [f"{c}.input.x", "x"]
        npu.loc[2 * third_arg + 1, ["name", "arg"]] = [f"{c}.output.x", "x"]
    bench = _t([c4], ios=("input.10", "output.0"))
    got = [x for x in _pairs(npu, bench) if x[1] is not None]
    assert got == _same([f"{c4}.input.10", f"{c4}.output.0"])


@pytest.mark.parametrize("name", ["renamed", "renamed!", "renamed_row_nineteen"[:19], "{c4}.input.0.renamed"])
def test_a_renamed_row_of_a_large_table_pairs_by_its_whole_name(name):
    npu, c4 = _rare_row(name.format(c4=LIN.format(4)), "0")
    bench = _t([c4])
    got = _pairs(npu, bench)
    assert (name.format(c4=c4), None) in got and (None, f"{c4}.input.0") in got
    assert (f"{c4}.output.0", f"{c4}.output.0") in got


def test_several_npu_steps_against_one_bench_step_pair_by_number_only():
    npu = pd.concat([_t(["a"], step=s) for s in (0, 1)], ignore_index=True)
    pairs, unpaired, notes = pair_groups(npu, _t(["a"], step=1))
    assert pairs[["step", "bench_step"]].values.tolist() == [[1, 1]]
    assert unpaired.values.tolist() == [["npu", 0, 0, 2]] and len(notes) == 1


def test_match_rows_takes_the_tables_by_position_or_name_and_the_options_by_name():
    t = _t(["a"])
    assert list(match_rows(npu=t, bench=t).bench_idx) == [0, 1]
    with pytest.raises(TypeError):
        match_rows(t, t, True)


def test_a_bench_only_row_sits_before_the_next_npu_row_after_its_predecessor():
    a, b, c, d, e = (LIN.format(k) for k in range(5))
    o = ".output.0"
    npu = _t([a, b, d, e], ios=("output.0",))
    bench = _t([a, b, c, e], ios=("output.0",))
    assert _pairs(npu, bench) == [(a + o, a + o), (b + o, b + o), (None, c + o), (d + o, None), (e + o, e + o)]


def test_groups_that_called_different_apis_still_pair_within_each_group():
    a, b, c = LIN.format(0), "Torch.add.0.forward", "Torch.mul.0.forward"
    d = "Torch.sub.0.forward"
    for first, second in (([a, b], [a]), ([a, b, c], [a]), ([a, b, c], [b]), ([a, b, c, d], [a]),
                          ([a, b, c], [a, b])):
        npu = pd.concat([_t(first, rank=0, ios=("output.0",)), _t(second, rank=1, ios=("output.0",))],
                        ignore_index=True)
        bench = pd.concat([_t([a], rank=0, ios=("output.0",)), _t(second, rank=1, ios=("output.0",))],
                          ignore_index=True)
        m = match_rows(npu, bench)
        n, k = len(first), len(second)
        assert list(m.npu_idx) == list(range(n + k))
        assert list(m.bench_idx) == [0] + [-1] * (n - 1) + list(range(1, k + 1))
        assert list(m.pair) == [0] * n + [1] * k
    # more groups than call names
    npu = pd.concat([_t([a, b] if r == 0 else [a], rank=r, ios=("output.0",)) for r in range(3)], ignore_index=True)
    bench = pd.concat([_t([a], rank=r, ios=("output.0",)) for r in range(3)], ignore_index=True)
    assert list(match_rows(npu, bench).bench_idx) == [0, -1, 1, 2]


@pytest.mark.parametrize("row, io, name_arg, column_arg", [(0, "input", "0", "5"), (0, "input", "5", "0"),
                                                           (5099, "output", "0", "5")])
def test_a_large_table_whose_first_or_last_row_disagrees_with_its_arg_column_is_read_by_names(row, io, name_arg,
                                                                                               column_arg):
    npu = _t([LIN.format(k) for k in range(2550)])
    c = LIN.format(row // 2)
    npu.loc[row, ["name", "arg"]] = [f"{c}.{io}.{name_arg}", column_arg]
    assert (f"{c}.{io}.{name_arg}",) * 2 in _pairs(npu, _t([c], ios=(f"{io}.{name_arg}",)))


def test_below_5000_rows_the_names_decide_even_where_the_arg_column_disagrees():
    npu = _t([LIN.format(k) for k in range(1500)])  # 3000 rows
    npu.loc[2, "arg"] = "5"  # its name says input 0 (row 2, one a sample would not read)
    c1 = LIN.format(1)
    assert (f"{c1}.input.0", f"{c1}.input.0") in _pairs(npu, _t([c1]))


def test_a_rare_second_input_of_a_large_table_keeps_its_own_suffix():
    npu, c4 = _rare_row(f"{LIN.format(4)}.input.1", "1")
    got = _pairs(npu, _t([c4]))
    assert (f"{c4}.input.1", None) in got and (None, f"{c4}.input.0") in got


def test_a_rare_output_of_a_large_table_keeps_its_own_suffix():
    npu, c4 = _rare_row(f"{LIN.format(4)}.input.0", "0")
    npu.loc[9, ["name", "arg"]] = [f"{c4}.output.1", "1"]  # row 9, another the sample does not read
    got = _pairs(npu, _t([c4]))
    assert (f"{c4}.output.1", None) in got and (None, f"{c4}.output.0") in got


def test_the_backward_order_is_counted_in_each_group_on_its_own():
    npu = pd.concat([_t([LINB.format(1), LINB.format(0)], rank=0, ios=("output.0",)),
                     _t([LINB.format(0), LINB.format(1)], rank=1, ios=("output.0",))], ignore_index=True)
    bench = pd.concat([_t([LINB.format(3), LINB.format(2)], rank=0, ios=("output.0",)),
                       _t([LINB.format(7), LINB.format(8)], rank=1, ios=("output.0",))], ignore_index=True)
    assert _pairs(npu, bench)[2:] == [(f"{LINB.format(0)}.output.0", f"{LINB.format(7)}.output.0"),
                                      (f"{LINB.format(1)}.output.0", f"{LINB.format(8)}.output.0")]


def test_calls_without_a_counter_pair_among_counted_ones():
    calls = ["Tensor.add", LIN.format(0), "Tensor.mul", LIN.format(1), LIN.format(2), "x"]
    npu = _t(calls)
    bench = _t(calls[1:] + ["Tensor.sub"])
    got = _pairs(npu, bench)
    assert [x for x in got if x[0] and x[1]] == _same([f"{c}.{s}" for c in calls[1:] for s in ("input.0",
                                                                                                 "output.0")])


def test_a_rare_keyword_argument_among_parameter_rows_keeps_its_own_suffix():
    npu, c4 = _rare_row(f"{LIN.format(4)}.input.cache_index", "cache_index")
    c1 = LIN.format(1)
    npu.loc[2, ["name", "io"]] = [f"{c1}.parameters.0", "parameters"]
    npu.loc[3, ["name", "io"]] = [f"{c1}.parameters_grad.0", "parameters_grad"]
    bench = _t([c4], ios=("input.cache_index", "output.0"))
    got = [x for x in _pairs(npu, bench) if x[1] is not None]
    assert got == _same([f"{c4}.input.cache_index", f"{c4}.output.0"])


def test_a_name_without_a_counter_never_pairs_with_a_counted_call_of_the_same_stem():
    npu = _t(["Functional.linear.forward", "Functional.linear.backward"], ios=("output.0",))
    bench = _t([LIN.format(0), LINB.format(0)], ios=("output.0",))
    assert all(n is None or b is None for n, b in _pairs(npu, bench))


def test_rows_mapped_to_missing_rows_never_take_another_rows_partner():
    a = LIN.format(0)
    ios = ("input.0", "input.1", "input.2", "input.3", "output.0")
    npu, bench = _t([a], ios=ios), _t([a], ios=ios)
    for gone in ([f"{a}.input.0"], [f"{a}.input.0", f"{a}.input.1"]):
        mp = Mapping(names={g: f"gone.{k}" for k, g in enumerate(gone)})
        got = _pairs(npu, bench, mapping=mp)
        assert [x for x in got if x[0] and x[1]] == _same([f"{a}.{s}" for s in ios[len(gone):]])
    for k in (3, 4):  # the largest key odd or even
        mp = Mapping(names={f"{a}.input.0": "gone"})
        got = _pairs(_t([a], ios=ios[:k]), _t([a], ios=ios[:k]), mapping=mp)
        assert [x for x in got if x[0] and x[1]] == _same([f"{a}.{s}" for s in ios[1:k]])
    one = _t([a], ios=("output.0",))
    assert _pairs(one, one, mapping=Mapping(names={f"{a}.output.0": "gone"})) == [
        (None, f"{a}.output.0"), (f"{a}.output.0", None)]


def test_two_io_arg_pairs_whose_codes_could_meet_keep_their_own_suffixes():
    # five argument names: (input, xx) and (output, y) are the 3rd and 5th, and their labels '.input.xx' and
    # '.output.y' are as long; the (output, y) row is one the consistency sample does not read
    npu = _t([LIN.format(k) for k in range(2550)])  # 5100 rows
    c4, c5, c6 = (LIN.format(k) for k in (4, 5, 6))
    for row, call, io, arg in ((8, c4, "input", "a"), (10, c5, "input", "xx"), (12, c6, "input", "b"),
                               (13, c6, "output", "y")):
        npu.loc[row, ["name", "io", "arg"]] = [f"{call}.{io}.{arg}", io, arg]
    got = _pairs(npu, _t([c6], ios=("input.b", "output.y")))
    assert (f"{c6}.output.y",) * 2 in got and (f"{c6}.input.b",) * 2 in got
