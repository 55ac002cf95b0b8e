"""The recorder's C row builder (capture/_row_builder.c) gives exactly the rows of its Python loop.

Both paths are fed the same calls, leaf kinds and tensor histories, and everything they leave behind is
compared: the rows, the recorder's seen-tensor entries, the tensor ids handed out and the summarizer's
statistics. Whole recordings of real models are compared column by column too.
"""
from __future__ import annotations

import collections
import math
import tempfile

import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import real_model

import msprobe_nb
from msprobe_nb.capture import c_contract
from msprobe_nb.capture import recorder as recorder_mod
from msprobe_nb.capture import stats as stats_mod
from msprobe_nb.capture.calls import Call
from msprobe_nb.capture.stats import Summarizer
from msprobe_nb.store.hdf5_reader import read_hdf5

pytestmark = pytest.mark.skipif(recorder_mod._build_rows is None,
                                reason="msprobe_nb.capture._row_builder is not built (no C compiler at install)")


class _Sub(torch.Tensor):
    """A tensor subclass: the C builder hands it to the recorder's Python code."""


def _recorder(task: str = "statistics", summary_mode: str = "statistics", c: bool = True):
    cfg = msprobe_nb.DumpConfig(dump_path=tempfile.mkdtemp(), level="L1", task=task, summary_mode=summary_mode)
    rec = recorder_mod.Recorder(cfg)
    if not c:
        rec.build_rows = None
    return rec


def _fed_both_ways(make_script, task: str = "statistics", summary_mode: str = "statistics") -> list:
    """Two recorders, the C row builder's and the Python loop's, each fed the script ``make_script()`` makes for
    it (a script may build fresh tensors for each)."""
    recs = []
    for c in (True, False):
        rec = _recorder(task, summary_mode, c)
        _feed(rec, make_script())
        recs.append(rec)
    return recs


def _same(a, b) -> bool:
    """Equal, with NaN equal to NaN and 0.0 apart from -0.0 (rows hold NaN for 'none')."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _entry(summ, i: int):
    """Summary i's statistics as a tuple of floats, whether the Python summarizer made the tuple or the C row
    builder wrote them into the flat buffer; None for any other entry (staged, a device tensor)."""
    v = summ._values[i]
    if v is stats_mod.FLAT:
        return tuple(float(x) for x in np.frombuffer(summ._flat, np.float64).reshape(-1, 7)[i])
    return v if isinstance(v, tuple) else None


def _state(rec) -> tuple:
    """What a recording step has built so far: rows, seen entries (weakrefs as their targets' ids), ids, and
    the calls that have rows, with the slots their rows point at."""
    seen = {k: [id(e[0]()), *e[1:]] for k, e in rec._seen.items()}
    values = [_entry(rec.summarizer, i) for i in range(len(rec.summarizer._values))]
    calls = [(c.call, c.slot) for c in rec.calls]
    return rec.rows, seen, rec._next_tensor_id, values, list(rec._dtypes.values), list(rec._devices.values), calls


def _feed(rec, script):
    """Run the (io, value, kwargs) steps of ``script`` through add_rows, one call each."""
    for i, (io, value, kw) in enumerate(script()):  # kw: add_rows' keywords (prefix, is_kwarg, set_producer)
        c = Call(f"Tensor.op.{i}.forward", "Tensor", "op", i, "forward", "", "")
        c.dump, c.index = True, i
        rec.add_rows(c, "forward", io, value, **kw)


def _script_factory():
    """Leaves of every kind the builder meets, with tensors seen again, changed in place and returned."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 8, generator=g)
    w = nn.Parameter(torch.randn(3, 3, generator=g))
    bad = torch.tensor([1.0, float("nan"), 2.0])
    inf = torch.tensor([float("inf"), 1.0])
    tensors = {
        "a": a, "w": w, "t": a.t(), "neg": torch._neg_view(torch.randn(5, generator=g)),
        "f64": torch.randn(3, dtype=torch.float64, generator=g), "bf16": torch.randn(6, generator=g).bfloat16(),
        "i64": torch.arange(7), "bool": torch.tensor([True, False]), "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5), "grad": torch.randn(2, 2, generator=g).requires_grad_(),
        "meta": torch.empty(2, 3, device="meta"), "sub": torch.randn(3, generator=g).as_subclass(_Sub),
        "bad": bad, "inf": inf, "big": torch.randn(70_000, generator=g), "zero": torch.zeros(4),
        "negzero": torch.tensor([-0.0, 0.0]),
        # views that are not contiguous, read along their strides, one with a NaN and one with an inf
        "heads": torch.randn(2, 5, 3, 4, generator=g).transpose(1, 2), "bad_view": bad.repeat(2, 1).t(),
        "inf_slice": torch.cat([inf, inf, torch.ones(2)]).reshape(3, 2)[:, :1],
    }

    def script():
        yield "input", (tensors["a"], 1.0, None, 3, True, "mean", torch.float32, slice(1, None)), {}
        yield "output", (tensors["a"],), {"set_producer": True}  # an input returned: a new identity
        yield "input", (tensors["a"], tensors["w"]), {}  # seen unchanged
        tensors["a"].mul_(2.0)
        yield "input", (tensors["a"],), {}  # changed in place: summarised again
        yield "input", {"weight": tensors["w"], "bias": None, "eps": 1e-5, "dims": [0, 1]}, {"is_kwarg": True}
        yield "input", ([tensors["t"], tensors["neg"]], (tensors["f64"], (tensors["bf16"],))), {}
        yield "output", tuple(tensors[k] for k in ("i64", "bool", "empty", "scalar", "grad", "meta")), \
            {"set_producer": True}
        yield "output", (tensors["sub"], tensors["bad"], tensors["inf"], tensors["big"]), {"set_producer": True}
        yield "input", (tensors["sub"], tensors["bad"], tensors["zero"], tensors["negzero"]), {}
        yield "output", (tensors["heads"], tensors["bad_view"], tensors["inf_slice"]), {"set_producer": True}
        fresh = torch.ones(3)
        yield "output", (fresh,), {"set_producer": True}
        fresh.add_(1.0)
        yield "output", (fresh,), {"set_producer": True}  # changed and returned again
        yield "input", (fresh, -0.0, float("nan"), float("inf"), 2 ** 70, "x" * 100, torch.Size([2, 3])), {}
        yield "parameters_grad", {"weight": tensors["grad"]}, {}
        yield "input", [], {}  # no rows: the call is not one of the step's calls
        yield "input", {}, {"is_kwarg": True}
        yield "input", tensors["a"], {}  # a bare tensor, not in a tuple
        yield "input", 3.5, {}  # a bare value
        yield "input", tensors["grad"], {"prefix": "1"}  # a gradient's row: one tensor under its input's path
        yield "input", None, {"prefix": "0"}  # a gradient that did not flow
        yield "input", torch.Size([2, 5]), {}  # a tuple that is a leaf
        # scalars met before, and ones equal to them across types: the builder reads describe_value's cache
        yield "input", (1.0, 1, True, 3, "mean", 3.5, 1e-5, 1.0, 1, True), {}
        point = collections.namedtuple("Point", "x y")
        yield "input", (point(tensors["a"], None), torch.Size([4, 8]), _List([tensors["w"], 2])), {}
        yield "output", point(tensors["w"], {"k": tensors["a"]}), {"set_producer": True}  # walked by leaves()
        yield "input", {1: tensors["a"], (2, 3): None, "n": {"deep": [tensors["w"], {"x": 1}]}}, {}
        yield "input", (tensors["a"], {5: tensors["w"]}, [None, 1]), {"prefix": "p.0"}  # a backward's paths
        yield "input", {7: tensors["w"], "s": "text"}, {"prefix": "g"}
        yield "input", tuple(range(300)) + (tensors["a"],), {}  # positions past the 256 made once
        # paths past the 1,024 index strings made once, and keys and prefixes that are not ASCII or not plain str
        yield "input", ([None] * 1030 + [tensors["a"]],), {"prefix": "r"}
        yield "input", {"é": tensors["a"], "名": {"ü": [tensors["w"]]}, _Str("k"): None}, {"is_kwarg": True}
        yield "input", (tensors["a"], {"ß": tensors["w"], _Str("s"): 1}), {"prefix": "gé"}
        yield "input", [tensors["a"]] * 3, {"prefix": "q"}
        # foreach ops' lists of tensors, walked in C: seen and new tensors, a subclass, None, values, empty and
        # nested containers, a Size and a namedtuple among the elements, an empty key's path
        many = [torch.full((2,), float(i)) for i in range(40)]
        yield "input", (many, [tensors["w"], tensors["sub"], None, 2.0, torch.Size([3])], 0.9), {}
        yield "input", ([], (), [[], (tensors["a"], [None]), {"k": tensors["w"]}, point(1, tensors["a"])]), {}
        yield "input", {"": [tensors["a"], None], "lists": (many[:3], [tensors["bf16"]])}, {"is_kwarg": True}
        yield "output", [many[:2], many[2:4]], {"set_producer": True}
        yield "input", ([tensors["a"], [tensors["w"], [tensors["i64"], (tensors["bool"],)]]],), {"prefix": "g"}
        deep: list = [tensors["a"]]
        for _ in range(70):  # past leaves.MAX_DEPTH: the innermost lists are one value, at walk's depth
            deep = [deep, None]
        yield "input", (deep,), {}
    return script


class _List(list):
    """A list subclass: walked like a list by leaves.walk."""


class _Str(str):
    """A str subclass as a dict key: its path is str(key)."""


def _random_script(seed: int):
    """A script of random argument trees: lists, tuples, dicts, list subclasses and namedtuples nested up to
    four deep around plain tensors (some met again, some changed in place), a tensor subclass, None, scalars,
    strings and sizes; the same seed builds the same trees of fresh tensors."""
    import random

    rnd = random.Random(seed)
    pair = collections.namedtuple("Pair", "a b")
    pool = [torch.full((rnd.randint(1, 5),), float(i)) for i in range(6)]

    def leaf():
        k = rnd.randrange(8)
        if k < 3:
            return rnd.choice(pool)
        return [None, 1.5, 7, "s", torch.Size([2, rnd.randint(1, 3)]),
                torch.ones(2).as_subclass(_Sub)][k - 2] if k < 8 else None

    def tree(depth):
        if depth >= 4 or rnd.random() < 0.35:
            return leaf()
        n = rnd.randrange(4)
        kind = rnd.randrange(5)
        items = [tree(depth + 1) for _ in range(n)]
        if kind == 0:
            return items
        if kind == 1:
            return tuple(items)
        if kind == 2:
            return {rnd.choice(["", "k", 3, "x.y"]) if i == 0 else f"k{i}": v for i, v in enumerate(items)}
        if kind == 3:
            return _List(items)
        return pair(tree(depth + 1), tree(depth + 1))

    keep = []  # every tree lives to the end: a freed tensor's id taken again would depend on each path's timing

    def script():
        for i in range(60):
            if i % 7 == 3:
                rnd.choice(pool).add_(1.0)  # changed in place: summarised again where met next
            value = tuple(tree(1) for _ in range(rnd.randrange(1, 4))) if rnd.random() < 0.8 else tree(0)
            keep.append(value)
            kw = {"set_producer": True} if rnd.random() < 0.3 else {"prefix": "p"} if rnd.random() < 0.2 else {}
            yield ("output" if kw.get("set_producer") else "input"), value, kw
    return script


@pytest.mark.parametrize("seed", range(12))
def test_random_argument_trees_give_the_same_rows_either_way(seed):
    """Nested lists and tuples are walked in C, everything else as leaves.walk does: random trees of every
    container and leaf kind give the Python loop's rows, seen entries and tensor ids."""
    recs = _fed_both_ways(lambda: _random_script(seed))
    (rows1, seen1, *rest1), (rows2, seen2, *rest2) = _state(recs[0]), _state(recs[1])
    assert len(rows1) == len(rows2) > 20
    for r1, r2 in zip(rows1, rows2):
        assert _same(r1, r2), (r1, r2)
    assert [e[1:] for e in seen1.values()] == [e[1:] for e in seen2.values()]
    assert _same(rest1, rest2)


@pytest.mark.parametrize("task,summary_mode", [("statistics", "statistics"), ("statistics", "md5"),
                                               ("tensor", "statistics")])
def test_the_c_rows_equal_the_python_rows(task, summary_mode):
    recs = _fed_both_ways(_script_factory, task, summary_mode)
    c_state, py_state = _state(recs[0]), _state(recs[1])
    assert len(c_state[0]) == len(py_state[0]) > 40
    for r1, r2 in zip(c_state[0], py_state[0]):
        assert _same(r1, r2), (r1, r2)
    # the seen entries point at different tensor objects (each run made its own): compare all but the target
    assert [e[1:] for e in c_state[1].values()] == [e[1:] for e in py_state[1].values()]
    assert _same(c_state[2:], py_state[2:])
    s1, _ = recs[0].summarizer.materialize()
    s2, _ = recs[1].summarizer.materialize()
    assert s1.shape == s2.shape and ((s1 == s2) | (s1 != s1) & (s2 != s2)).all()
    if task == "tensor":  # the host copies: the same kind of copy, dtype, shape and bytes
        copies = [recs[0].summarizer.tensors, recs[1].summarizer.tensors]
        assert len(copies[0]) == len(copies[1]) > 15
        for a, b in zip(*copies):
            assert type(a) is type(b) and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape)
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous and a.flags.owndata and a.tobytes() == b.tobytes()
            else:
                assert torch.equal(a, b) or a.device.type == "meta"


def test_the_c_statistics_are_the_kernels():
    """A float32 tensor summarised by the builder gets the summarizer's own statistics, a transpose and a slice
    too (read along their strides); NaN, inf (contiguous or not) and a negative view are left to the
    summarizer (their values and counts come out the same)."""
    rec = _recorder()
    assert rec.summarizer.uses_kernel()
    g = torch.Generator().manual_seed(3)
    cases = [torch.randn(8, 16, 64, generator=g), torch.randn(1, generator=g), torch.randn(300_000, generator=g),
             torch.randn(64, 8, generator=g).t(), torch.tensor([1.0, float("nan")]), torch.tensor([float("-inf")]),
             torch._neg_view(torch.randn(5, generator=g)), torch.randn(6, 10, generator=g)[:, 2:7],
             torch.tensor([[1.0, float("nan")], [2.0, 3.0]]).t(), torch.tensor([[float("inf"), 1.0, 2.0]] * 2)[:, ::2]]
    c = Call("Torch.x.0.forward", "Torch", "x", 0, "forward", "", "")
    c.dump, c.index = True, 0
    rec.add_rows(c, "forward", "output", tuple(cases), set_producer=True)
    got, _ = rec.summarizer.materialize()
    plain = Summarizer()
    idx = [plain.summarize(t) for t in cases]
    want, _ = plain.materialize()
    for r, i in zip(rec.rows, idx):
        a, b = got[r[11]], want[i]
        assert ((a == b) | (a != a) & (b != b)).all(), (a, b)


def _c_and_python_statistics(cases, monkeypatch):
    """The statistics the C builder gives each tensor of ``cases`` (one call's outputs) and those a plain
    Summarizer gives it, as two (n, 7) arrays, and the tensors the C builder left to the summarizer."""
    left = []
    real = Summarizer.summarize
    monkeypatch.setattr(Summarizer, "summarize", lambda self, t: left.append(t) or real(self, t))
    rec = _recorder()
    assert rec.summarizer.uses_kernel()
    c = Call("Torch.x.0.forward", "Torch", "x", 0, "forward", "", "")
    c.dump, c.index = True, 0
    rec.add_rows(c, "forward", "output", tuple(cases), set_producer=True)
    monkeypatch.setattr(Summarizer, "summarize", real)
    got, _ = rec.summarizer.materialize()
    plain = Summarizer()
    idx = [plain.summarize(t) for t in cases]
    want, _ = plain.materialize()
    return got[[r[11] for r in rec.rows]], want[idx], left


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_tensors_are_widened_in_c_as_the_summarizer_widens_them(dtype, monkeypatch):
    """A contiguous float16 / bfloat16 tensor (autocast's activations) gets, from the C builder, bit for bit the
    statistics the summarizer's widening gives it; a transpose, one beyond the widening's size, one with NaN
    or inf go to the summarizer. Every one of the 65,536 bit patterns, as a one-element tensor, widens to
    torch's float32 value (its max and min)."""
    g = torch.Generator().manual_seed(11)
    big = torch.randn(stats_mod.HALF_WIDEN_MAX_NUMEL + 1, generator=g)
    cases = [torch.randn(4, 16, 32, generator=g).to(dtype), torch.randn(7, generator=g).to(dtype) * 1e-6,
             torch.randn(64, 8, generator=g).to(dtype).t(), big.to(dtype),
             torch.tensor([1.0, float("nan")], dtype=dtype), torch.tensor([float("inf"), -2.0], dtype=dtype),
             torch.randn(6, 5, generator=g).to(dtype).requires_grad_(),
             torch.full((33,), 6e4 if dtype is torch.float16 else 3e38, dtype=dtype)]
    got, want, left = _c_and_python_statistics(cases, monkeypatch)
    assert ((got == want) | (got != got) & (want != want)).all(), (got, want)
    assert [id(t) for t in left] == [id(cases[i]) for i in (2, 3, 4, 5)]
    patterns = torch.arange(-(2 ** 15), 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)
    ones = list(patterns.reshape(-1, 1))
    got, want, left = _c_and_python_statistics(ones, monkeypatch)
    assert ((got == want) | (got != got) & (want != want)).all()
    wide = patterns.to(torch.float32).double().numpy()
    assert len(left) == (~np.isfinite(wide)).sum()  # only the NaN and inf patterns
    finite = np.isfinite(wide)
    assert (got[finite, 0] == wide[finite]).all() and (got[finite, 1] == wide[finite]).all()
    assert np.isnan(got[np.isnan(wide), 0]).all() and (got[np.isinf(wide), 0] == wide[np.isinf(wide)]).all()


def test_integer_and_bool_tensors_are_summarised_in_c_as_the_summarizer_does(monkeypatch):
    """Token ids, masks, indices of every integer dtype and bool get, from the C builder, bit for bit the
    statistics of the summarizer's integer kernel (int64's extremes, a 0-d tensor, an odd count); a view that
    is not contiguous and a negative view go to the summarizer."""
    g = torch.Generator().manual_seed(12)
    cases = [torch.randint(0, 50_257, (4, 128), generator=g),
             torch.randint(-(2 ** 40), 2 ** 40, (1001,), generator=g), torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0]),
             torch.tensor(7),
             torch.randint(-5, 5, (3, 5), dtype=torch.int32, generator=g),
             torch.randint(-30_000, 30_000, (17,), dtype=torch.int16, generator=g),
             torch.randint(-128, 127, (9,), dtype=torch.int8, generator=g),
             torch.randint(0, 255, (70_000,), dtype=torch.uint8, generator=g),
             torch.rand(5, 6, generator=g) > 0.4, torch.ones(3, dtype=torch.bool), torch.zeros(4, dtype=torch.bool),
             torch.arange(16).expand(3, 16), torch._neg_view(torch.arange(6))]
    got, want, left = _c_and_python_statistics(cases, monkeypatch)
    assert ((got == want) | (got != got) & (want != want)).all(), (got, want)
    assert [id(t) for t in left] == [id(cases[i]) for i in (11, 12)]


def test_bad_arguments_raise_instead_of_crashing():
    build = recorder_mod._build_rows
    rec = _recorder()
    t = torch.ones(1)
    assert build([], (t, None), "", 0, "x", 0, False, False, "x", rec._seen, rec._row_ctx) == 2
    with pytest.raises(TypeError):
        build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen, ())
    with pytest.raises(TypeError):
        build([], (t,), None, 0, "x", 0, False, False, "x", rec._seen, rec._row_ctx)
    with pytest.raises(TypeError):
        build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen)
    mod = recorder_mod._row_builder
    with pytest.raises(TypeError):  # the host-copy entry is None or a triple
        build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen,
              c_contract.replaced(mod, rec._row_ctx, "host_copy", (1, 2)))
    with pytest.raises(TypeError):  # the integer dtypes are a tuple of six
        build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen,
              c_contract.replaced(mod, rec._row_ctx, "int_dtypes", (torch.int64,)))
    assert build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen,
                 c_contract.replaced(mod, rec._row_ctx, "host_copy", None)) == 1
    rec._seen[id(t)] = "not an entry"
    with pytest.raises(TypeError, match="seen"):
        build([], (t,), "", 0, "x", 0, False, False, "x", rec._seen, rec._row_ctx)


def test_a_failing_leaf_keeps_the_rows_before_it_with_their_call(monkeypatch):
    """A leaf that cannot be described fails the call's rows from there on; the rows already added still
    belong to a call of the step, on both paths."""
    class Bad:
        def __repr__(self):
            raise RuntimeError("no repr")

    for c_path in (True, False):
        rec = _recorder(c=c_path)
        c = Call("Torch.x.0.forward", "Torch", "x", 0, "forward", "", "")
        c.dump, c.index = True, 0
        with pytest.raises(RuntimeError, match="no repr"):
            rec.add_rows(c, "forward", "input", (torch.ones(2), Bad()))
        assert len(rec.rows) == 1 and rec.calls == [c] and rec.rows[0][0] == c.slot == 0


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        h = self.norm(self.lin(x))
        h = h.transpose(0, 1).contiguous().transpose(0, 1)
        return self.drop(torch.relu(h)) + x


def _record(tmp, level, c, make, task="statistics", dump=False):
    """The calls table of two recorded steps of ``make()``'s (model, one-step function), with the C row builder
    or (``c`` False) the Python loop (``dump``: the whole dump, to read its tensors)."""
    torch.manual_seed(0)
    model, run_step = make()
    saved = recorder_mod._build_rows, recorder_mod._split_rows, stats_mod._pack_stats
    if not c:  # as where setup.py found no compiler: the rows, their columns and the statistics' array in Python
        recorder_mod._build_rows = recorder_mod._split_rows = stats_mod._pack_stats = None
    try:
        dbg = msprobe_nb.Debugger(dump_path=tmp, level=level, task=task)
        for _ in range(2):
            dbg.start(model)
            run_step()
            dbg.stop()
            dbg.step()
        dbg.close()
    finally:
        recorder_mod._build_rows, recorder_mod._split_rows, stats_mod._pack_stats = saved
    return msprobe_nb.load(tmp) if dump else read_hdf5(tmp).calls


def _assert_same_columns(c, py):
    assert list(c.columns) == list(py.columns)
    for col in c.columns:
        a, b = c[col], py[col]
        assert ((a == b).fillna(False) | (a.isna() & b.isna())).all(), col


def _with_adamw(build, step):
    """``make`` for _record: the model and batch of ``build()``, trained by ``step`` with AdamW."""
    def make():
        model, batch = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, lambda: step(model, opt, batch)
    return make


def _own_model():
    return nn.Sequential(_Block(), _Block(), nn.Linear(16, 4)), torch.randn(8, 16)


def _own_step(model, opt, x):
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


def _gpt2():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the models extra)")
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg), torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))


def _lm_step(model, opt, ids):
    opt.zero_grad()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("model", ["own", "gpt2"])
def test_a_recording_is_the_same_with_either_row_builder(tmp_path, level, model):
    make = _with_adamw(_own_model, _own_step) if model == "own" else _with_adamw(_gpt2, _lm_step)
    c = _record(tmp_path / "c", level, True, make)
    py = _record(tmp_path / "py", level, False, make)
    assert len(c) == len(py) > 20
    _assert_same_columns(c, py)


@pytest.mark.parametrize("model", ["own", "gpt2"])
def test_a_foreach_optimizer_records_the_same_with_either_row_builder(tmp_path, model):
    """AdamW's multi-tensor path (the GPU and NPU default): each ``_foreach_*`` call takes lists of every
    parameter, gradient and moment, which the C builder walks itself; one row per tensor of each list."""
    build, step = (_own_model, _own_step) if model == "own" else (_gpt2, _lm_step)

    def make():
        m, batch = build()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=True)
        return m, lambda: step(m, opt, batch)

    c = _record(tmp_path / "c", "L1", True, make)
    py = _record(tmp_path / "py", "L1", False, make)
    n_params = len(list(make()[0].parameters()))
    listed = c[c.op.str.startswith("_foreach_") & (c.io == "input") & c.arg.str.contains(".", regex=False)]
    assert listed.op.nunique() >= 5
    # every list argument has one tensor row per parameter, its path the argument's position and the index
    for (_, _, position), rows in listed.groupby([listed.step, listed.call, listed.arg.str.split(".").str[0]]):
        assert list(rows.arg) == [f"{position}.{i}" for i in range(n_params)]
        assert (rows.kind == "tensor").all() or position != "0"  # later lists may hold floats (bias corrections)
    assert len(c) == len(py)
    _assert_same_columns(c, py)


@pytest.mark.parametrize("model", ["own", "gpt2"])
def test_a_tensor_recording_is_the_same_with_either_row_builder(tmp_path, model):
    """The tensor task: the C builder makes small float32 copies itself; every saved tensor reads back with the
    same dtype, shape and bits as the Python path's."""
    make = _with_adamw(_own_model, _own_step) if model == "own" else _with_adamw(_gpt2, _lm_step)
    c = _record(tmp_path / "c", "L1", True, make, task="tensor", dump=True)
    py = _record(tmp_path / "py", "L1", False, make, task="tensor", dump=True)
    _assert_same_columns(c.calls, py.calls)
    saved = c.calls.loc[c.calls["data_name"] != "", ["data_name", "step", "rank"]].drop_duplicates()
    assert len(saved) > 20
    for name, step, rank in saved.itertuples(index=False):
        a, b = c.load_tensor(name, step, rank), py.load_tensor(name, step, rank)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name  # bits: NaN too


@pytest.mark.parametrize("name", ["bert", "t5", "mixtral", "vit", "resnet", "unet"])
def test_real_models_record_the_same_with_either_row_builder(tmp_path, name):
    """The benchmark's real models (GPT-2 above): BERT's bfloat16 autocast, T5's encoder-decoder, Mixtral's
    routing, ViT, ResNet's BatchNorm, the diffusers UNet; statistics L1, two steps each way."""
    make = real_model(name)
    c, py = _record(tmp_path / "c", "L1", True, make), _record(tmp_path / "py", "L1", False, make)
    assert len(c) == len(py) > 100
    # torch.empty's memory is whatever was there (Mixtral's routing makes one): its statistics differ by run
    garbage = c.op.str.startswith("empty") | c.producer.str.startswith("Torch.empty")
    assert (garbage == (py.op.str.startswith("empty") | py.producer.str.startswith("Torch.empty"))).all()
    _assert_same_columns(c[~garbage], py[~garbage])


def _rows_of_every_kind() -> list[tuple]:
    """A recorded step's rows: tensors (with and without gradients), None, values, NaN-marked numbers."""
    rec = _recorder()
    c = Call("Torch.f.0.forward", "Torch", "f", 0, "forward")
    x = torch.randn(3, 4, requires_grad=True)
    rec.add_rows(c, "forward", "input", (x, None, 2.5, "text", torch.arange(4), [x * 2, (1, True)]))
    rec.add_rows(c, "forward", "output", {"y": x.sum(), "z": None}, set_producer=True)
    return rec.rows


def test_the_rows_split_into_the_same_columns_in_c_and_python(monkeypatch):
    rows = _rows_of_every_kind()
    cols, nums = recorder_mod._columns(rows)
    monkeypatch.setattr(recorder_mod, "_split_rows", None)
    want_cols, want_nums = recorder_mod._columns(rows)
    assert set(nums) == set(want_nums) == set(recorder_mod._NUMERIC)
    for f in recorder_mod._NUMERIC:
        assert nums[f].dtype == want_nums[f].dtype == np.float64
        np.testing.assert_array_equal(nums[f], want_nums[f])  # NaN where the row has no number
    for f, i in recorder_mod._F.items():
        if f not in recorder_mod._NUMERIC:
            assert _same(list(cols[i]), list(want_cols[i])), f


def test_a_row_split_cannot_take_goes_the_python_way():
    rows = _rows_of_every_kind()
    split, k = recorder_mod._split_rows, len(recorder_mod._NUMERIC)
    with pytest.raises(TypeError, match="tuple of the row's fields"):
        split([*rows, rows[0][:-1]], recorder_mod._NUMERIC_AT, np.empty((k, len(rows) + 1)))
    odd = (*rows[0][:5], "tensor", *rows[0][6:])  # a kind that is no number
    with pytest.raises(TypeError, match="neither an int nor a float"):
        split([odd], recorder_mod._NUMERIC_AT, np.empty((k, 1)))
    with pytest.raises(ValueError, match="len\\(numeric\\) \\* len\\(rows\\)"):
        split(rows, recorder_mod._NUMERIC_AT, np.empty((k, len(rows) + 1)))
    with pytest.raises(ValueError, match="could not convert"):  # the Python way names what is wrong
        recorder_mod._columns([odd])


def test_the_statistics_pack_into_the_array_numpy_makes():
    pack = stats_mod._pack_stats
    values = [(1.0, -2.0, 0.5, 3.0, 0.0, 0.0, 0.0), (math.nan, math.inf, -math.inf, -0.0, 1.0, 2.0, 3.0)]
    out = np.empty((2, 7))
    assert pack(values, b"", out) is True
    np.testing.assert_array_equal(out, np.array(values))
    assert np.signbit(out[1, 3])
    assert pack([], b"", np.empty((0, 7))) is True
    for odd in ([values[0], None], [values[0], (1.0,) * 6], [values[0], (1, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0)],
                [values[0], torch.zeros(7)], [values[0], stats_mod.FLAT]):  # a mark past the flat rows
        assert pack(odd, b"", np.empty((2, 7))) is False  # the summarizer then converts the list itself
    with pytest.raises(ValueError, match="7 doubles per entry"):
        pack(values, b"", np.empty((3, 7)))


def test_flat_rows_and_tuples_pack_by_their_index():
    """The C row builder's summaries are Ellipsis in values and 7 doubles at the same index of the flat buffer
    (rows it did not write are padding); tuples between them keep their places."""
    pack, flat_mark = stats_mod._pack_stats, stats_mod.FLAT
    rows = np.arange(21, dtype=np.float64).reshape(3, 7)
    rows[1] = np.nan  # padding under the tuple's entry
    mid = (-1.0, -2.0, -3.0, -0.0, 4.0, 5.0, 6.0)
    out = np.empty((4, 7))
    assert pack([flat_mark, mid, flat_mark, (7.0,) * 7], rows.tobytes(), out) is True
    np.testing.assert_array_equal(out, np.vstack([rows[0], mid, rows[2], [7.0] * 7]))
    assert np.signbit(out[1, 3])
    for bad in (rows.tobytes()[:-8], np.zeros((5, 7)).tobytes()):  # not whole rows; more rows than entries
        with pytest.raises(ValueError, match="flat buffer"):
            pack([flat_mark] * 4, bad, out)


def test_the_summarizer_materializes_flat_rows_beside_device_entries(monkeypatch):
    """A step that mixes the C rows' flat statistics with an entry pack_stats does not take (a tensor, as a
    device's summaries are) goes through the summarizer's own loop, which reads each flat row at its index."""
    s = stats_mod.Summarizer()
    s._values = [(1.0,) * 7, stats_mod.FLAT, torch.full((7,), 2.0, dtype=torch.float64), stats_mod.FLAT]
    flat = np.full((4, 7), np.nan)
    flat[1], flat[3] = 3.0, 4.0
    s._flat = bytearray(flat.tobytes())
    out, _ = s.materialize()
    np.testing.assert_array_equal(out, np.array([[1.0] * 7, [3.0] * 7, [2.0] * 7, [4.0] * 7]))
    monkeypatch.setattr(stats_mod, "_pack_stats", None)  # no kernel: the same loop
    s._values[2] = (2.0,) * 7
    out, _ = s.materialize()
    np.testing.assert_array_equal(out, np.array([[1.0] * 7, [3.0] * 7, [2.0] * 7, [4.0] * 7]))


def test_a_tensor_attribute_patched_between_calls_is_read_anew(monkeypatch):
    """The C rows read a tensor's dtype, shape, requires_grad and _version through the getters they cached for
    its type; a class patched since (a property put over requires_grad on nn.Parameter) gives the type a new
    version tag, and the next row reads the property, as the Python rows do. A plain tensor and a parameter
    taking turns use both entries of the cache."""
    p = nn.Parameter(torch.ones(3))
    t = torch.zeros(2)

    def script():
        for _ in range(3):
            yield "input", (p, t, p), {}
        monkeypatch.setattr(nn.Parameter, "requires_grad", property(lambda self: False), raising=False)
        with torch.no_grad():
            p.add_(0)  # read again, not as seen unchanged
        yield "input", (t, p), {}
        monkeypatch.undo()
        with torch.no_grad():
            p.add_(0)
        yield "input", (p, t), {}

    recs = _fed_both_ways(lambda: script)
    rows_c, rows_py = _state(recs[0])[0], _state(recs[1])[0]
    assert len(rows_c) == len(rows_py) == 13
    for r1, r2 in zip(rows_c, rows_py):
        assert _same(r1, r2), (r1, r2)
    grad = recorder_mod._F["requires_grad"]
    assert [r[grad] for r in rows_c[-4:]] == [0.0, 0.0, 1.0, 0.0]  # the patched property, then the getter again


def test_a_method_an_instance_attribute_shadows_is_called_as_python_calls_it():
    """Before the kernel reads a tensor, the C rows call its is_contiguous(), is_neg() and data_ptr() through
    the methods' C functions; an instance attribute of that name is what ``t.data_ptr()`` calls in Python, and
    so in C. Here it points at another tensor's zeros: both ways summarise the zeros."""
    zeros = torch.zeros(64)
    shadowed = torch.randn(64, generator=torch.Generator().manual_seed(3)) + 5.0
    shadowed.data_ptr = zeros.data_ptr  # type: ignore[method-assign]
    plain = torch.randn(64, generator=torch.Generator().manual_seed(4))

    def script():
        yield "input", (plain, shadowed), {}

    recs = _fed_both_ways(lambda: script)
    rows_c, rows_py = _state(recs[0])[0], _state(recs[1])[0]
    assert len(rows_c) == len(rows_py) == 2 and all(_same(r1, r2) for r1, r2 in zip(rows_c, rows_py))
    stats_c, _ = recs[0].summarizer.materialize()
    stats_py, _ = recs[1].summarizer.materialize()
    assert (stats_c == stats_py).all()
    assert stats_c[1, :4].tolist() == [0.0, 0.0, 0.0, 0.0]  # the zeros the instance attribute points at
    assert stats_c[0, 0] == plain.max().item()


def test_rows_of_one_shape_share_one_plain_tuple_across_steps():
    """The C rows hold each shape of plain ints as one plain tuple, kept from step to step, so the writer finds the
    last step's shape column equal to this one's object by object; the Python rows make tuples of their own, equal
    to these."""
    shape = (3, 5)

    def script():
        return [("input", torch.zeros(shape), {}), ("output", torch.ones(shape), {}), ("input", torch.zeros(2, 7), {})]
    c_rows = []
    for _ in range(2):  # two recorders: two steps of a run, or two runs in one process
        c_rec, py_rec = _fed_both_ways(lambda: script)
        c_rows.append(c_rec.rows)
        assert [_same(a, b) for a, b in zip(c_rec.rows, py_rec.rows)] == [True] * 3
    at = recorder_mod._F["shape"]
    first, second = ([r[at] for r in rows] for rows in c_rows)
    assert first[0] == shape and type(first[0]) is tuple
    assert first[0] is first[1] is second[0] is second[1] and first[2] is second[2]
