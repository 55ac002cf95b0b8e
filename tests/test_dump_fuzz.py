"""Seeded fuzzing of damaged dumps: reading one (``mp.load``, then ``compare`` against the clean dump) gives a
named error (DumpFormatError, CompareError, ConfigError) or the clean dump's own result, never a silently
different result and never a raw traceback (our issue 14).

Kit dumps: truncations and bit flips of a small statistics dump. Layout 5 checks every byte a reader takes
(docs/hdf5_schema.md, "Checksums"), so a read that succeeds must equal the clean one. Tensor bytes carry no
checksum, so the kit dump here holds none. msprobe dumps: hostile JSON (truncated, flipped, values of the
wrong kind, deep nesting) must give a named error or load; text that means the same JSON must load the same.
Bounded to a few seconds; the seeds make every run the same.
"""
from __future__ import annotations

import json
import random
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import msprobe_nb as mp
from msprobe_nb.analysis.compare import CompareError
from msprobe_nb.config import ConfigError
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.hdf5_writer import DumpWriter

NAMED = (DumpFormatError, CompareError, ConfigError)
#: compare() on at most this many damaged dumps that read back whole (each takes ~0.1 s; the equality of
#: what was read already decides the rest)
COMPARES = 3


def _read(path: Path, clean: mp.Dump | None = None):
    """``mp.load(path)``, then, with ``clean``, ``compare`` of it against ``clean``: (dump, result), or the
    named error. Anything else raised fails the test where it is called."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compare's notes ("only 3 of 8 rows matched") are not the point here
        try:
            d = mp.load(path)
            return d, (mp.compare(d, clean, progress=False) if clean is not None else None)
        except NAMED as e:
            return e, None


def _same(d: mp.Dump, ref: mp.Dump) -> str | None:
    """What differs between two reads of a dump (None: nothing)."""
    if not d.calls.equals(ref.calls):
        return "calls"
    if d.stack_frames != ref.stack_frames or d._parts.construct != ref._parts.construct:
        return "stacks or module tree"
    skip = ("files", "construct_by_step")
    if {k: v for k, v in d.meta.items() if k not in skip} != {k: v for k, v in ref.meta.items() if k not in skip}:
        return "meta"
    if dict(d.meta["construct_by_step"]) != dict(ref.meta["construct_by_step"]):
        return "construct_by_step"
    return None


# ------------------------------------------------------------------ the kit's HDF5 dump
def _kit_dump(path: Path) -> Path:
    """Three steps of a statistics dump: calls, strings, shapes, stacks, module tree, a dropped and a partial
    step, all in the tails (each group below one chunk)."""
    with DumpWriter(path, meta={"task": "statistics", "level": "mix", "framework": "pytorch"}) as w:
        for s in range(3):
            n = 5
            w.write_step(s, {"name": [f"Torch.add.{k}.forward.output.0" for k in range(n)],
                             "call": [f"Torch.add.{k}.forward" for k in range(n)], "max": np.arange(n) * 1.5 + s,
                             "min": np.zeros(n) - s, "numel": list(range(n)), "shape": [(2, k) for k in range(n)],
                             "kind": ["tensor"] * n, "direction": ["forward"] * n, "io": ["output"] * n,
                             "dtype": ["torch.float32"] * n, "stack_id": [s % 2] * n},
                         stacks={s % 2: [f"File train.py, line {10 + s}, in step"]},
                         construct={f"Torch.add.{k}.forward": "Module.net.forward.0" for k in range(n)},
                         partial=s == 2)
        w.mark_dropped(3, 28)
    return path / "rank0.h5"


def _mutations(data: bytes, rng: random.Random, flips: int, truncations: int) -> list[tuple[str, bytes]]:
    """Bit flips, mostly where the file holds something (most of it is chunk fill), and truncations."""
    arr = np.frombuffer(data, np.uint8)
    busy = np.flatnonzero(arr | np.concatenate(([0], arr[:-1])))  # non-zero bytes and the ones after them
    out = []
    for i in range(flips):
        at = int(busy[rng.randrange(len(busy))]) if i % 5 else rng.randrange(len(data))
        b = bytearray(data)
        b[at] ^= 1 << rng.randrange(8)
        out.append((f"bit flip at byte {at}", bytes(b)))
    for _ in range(truncations):
        cut = rng.randrange(len(data))
        out.append((f"truncated to {cut} bytes", data[:cut]))
    return out


def test_damaged_kit_dumps_give_named_errors_or_the_clean_result(tmp_path):
    f = _kit_dump(tmp_path / "clean")
    clean = mp.load(tmp_path / "clean")
    assert clean.steps == [0, 1, 2] and clean.partial_steps == [2] and clean.dropped_steps == [3]
    bench = mp.load(tmp_path / "clean")  # compare() fills in the calls of the dumps it is given (their op column)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the same dump": yes
        ref = pd.DataFrame(mp.compare(mp.load(tmp_path / "clean"), bench, progress=False))
    data = f.read_bytes()
    named = compared = 0
    for i, (what, damaged) in enumerate(_mutations(data, random.Random(14), flips=36, truncations=6)):
        d = tmp_path / f"bad{i}"
        d.mkdir()
        (d / "rank0.h5").write_bytes(damaged)
        got, result = _read(d)
        if isinstance(got, Exception):
            named += 1
            assert str(d / "rank0.h5") in str(got), (what, got)
            continue
        assert _same(got, clean) is None, f"{what}: read silently differs from the clean dump ({_same(got, clean)})"
        if compared < COMPARES:
            got, result = _read(d, bench)
            assert not isinstance(got, Exception), (what, got)
            pd.testing.assert_frame_equal(pd.DataFrame(result), ref, obj=what)
            compared += 1
        shutil.rmtree(d)
    assert named >= 20  # most damage was caught, not read around


# ------------------------------------------------------------------ msprobe dumps
def _t(**extra) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 3], "Max": 1.0, "Min": -1.0, "Mean": 0.5,
            "Norm": 2.0, "requires_grad": False, **extra}


MS_DUMP = {
    "task": "statistics", "level": "mix", "framework": "pytorch", "dump_data_dir": None,
    "data": {
        "Module.fc.Linear.forward.0": {"input_args": [_t()], "input_kwargs": {}, "output": [_t(Max=3.0)]},
        "Torch.add.0.forward": {"input_args": [_t(), _t(Max=2.0, shape=[3])],
                                "input_kwargs": {"alpha": {"type": "int", "value": 1}}, "output": [_t(Mean=0.25)]},
        "Functional.relu.0.forward": {"input_args": [_t()],
                                      "input_kwargs": {"inplace": {"type": "bool", "value": False}},
                                      "output": [_t(Min=0.0)]},
        "Functional.relu.0.backward": {"input": [_t()], "output": [_t(Norm=1.5)]},
    },
}
MS_SIDE = {
    "construct.json": {"Module.fc.Linear.forward.0": None, "Torch.add.0.forward": "Module.fc.Linear.forward.0",
                       "Functional.relu.0.forward": "Module.fc.Linear.forward.0"},
    "stack.json": {"0": [["Torch.add.0.forward", "Functional.relu.0.forward"],
                         ["File train.py, line 3, in step, \n y = net(x)"]]},
}
HOSTILE_VALUES = ["x", -1, 10 ** 30, 1e308, None, [], {}, True, "[" * 150 + "]" * 150, [[[[[[[[[[1]]]]]]]]]],
                  {"type": "torch.Tensor"}, "\udcff", "9" * 5000, [-3, 2]]


def _write_ms(root: Path, dump: dict, side: dict, text: str | None = None) -> Path:
    rank = root / "step0" / "rank0"
    rank.mkdir(parents=True)
    (rank / "dump.json").write_text(text if text is not None else json.dumps(dump), encoding="utf-8",
                                    errors="surrogatepass")
    for name, obj in side.items():
        (rank / name).write_text(json.dumps(obj), encoding="utf-8")
    return root


def _nodes(obj, path=()):
    """Every (path, value) below ``obj``."""
    yield path, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, (*path, i))


def _replaced(obj, path, value):
    obj = json.loads(json.dumps(obj))
    if not path:
        return value
    at = obj
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return obj


def test_hostile_msprobe_json_gives_named_errors_and_same_json_the_same_dump(tmp_path):
    clean_root = _write_ms(tmp_path / "clean", MS_DUMP, MS_SIDE)
    clean, bench = mp.load(clean_root), mp.load(clean_root)  # compare() fills in the calls it is given
    assert len(clean.calls) == 11 and clean.stack("Torch.add.0.forward")
    rng = random.Random(14)
    text = json.dumps(MS_DUMP)
    cases: list[tuple[str, str | None, dict, dict, bool]] = []  # what, dump.json text, dump, sides, must equal
    for i in range(6):  # the same JSON, written otherwise (not reordered: the order of the calls is data)
        same = json.dumps(MS_DUMP, indent=rng.choice([None, 1, "\t"]), ensure_ascii=bool(i % 2),
                          separators=rng.choice([None, (",", ":"), (" ,", " : ")]))
        cases.append((f"rewritten {i}", same, MS_DUMP, MS_SIDE, True))
    for _ in range(8):
        cut = rng.randrange(1, len(text))
        cases.append((f"dump.json cut at {cut}", text[:cut], MS_DUMP, MS_SIDE, False))
    for _ in range(10):
        at = rng.randrange(len(text))
        flipped = text[:at] + chr(ord(text[at]) ^ (1 << rng.randrange(7))) + text[at + 1:]
        cases.append((f"dump.json flipped at {at}", flipped, MS_DUMP, MS_SIDE, False))
    nodes = [p for p, _ in _nodes(MS_DUMP)]
    for _ in range(20):
        where, value = rng.choice(nodes), rng.choice(HOSTILE_VALUES)
        cases.append((f"dump.json {list(where)} = {str(value)[:30]!r}", None, _replaced(MS_DUMP, where, value),
                      MS_SIDE, False))
    for name, obj in MS_SIDE.items():
        for _ in range(4):
            where, value = rng.choice([p for p, _ in _nodes(obj)]), rng.choice(HOSTILE_VALUES)
            cases.append((f"{name} {list(where)} = {str(value)[:30]!r}", None, MS_DUMP,
                          {**MS_SIDE, name: _replaced(obj, where, value)}, False))
    compared = 0
    for i, (what, dump_text, dump, side, must_equal) in enumerate(cases):
        root = _write_ms(tmp_path / f"case{i}", dump, side, dump_text)
        got, _ = _read(root)
        if must_equal:
            assert not isinstance(got, Exception), (what, got)
            assert got.calls.equals(clean.calls) and got.stack_frames == clean.stack_frames, what
        elif isinstance(got, Exception):
            assert "dump.json" in str(got) or ".json" in str(got) or str(root) in str(got), (what, got)
        elif compared < COMPARES:  # it loaded: what it means is up to the text, but compare must cope
            got, _ = _read(root, bench)
            compared += 1
        shutil.rmtree(root)


@pytest.mark.parametrize("seed", [1, 2])
def test_truncated_kit_dumps_are_named_errors_or_whole_steps(tmp_path, seed):
    """Truncations of a dump that spans whole chunks (a killed copy, a short download): a named error, or,
    where the cut lies beyond everything committed, the clean dump."""
    with DumpWriter(tmp_path / "clean") as w:
        for s in range(3):
            w.write_step(s, {"name": [f"n{s}.{k}" for k in range(3000)], "max": np.arange(3000.0) + s})
    clean = mp.load(tmp_path / "clean")
    data = (tmp_path / "clean" / "rank0.h5").read_bytes()
    rng = random.Random(seed)
    for i in range(6):
        cut = rng.randrange(len(data))
        d = tmp_path / f"cut{i}"
        d.mkdir()
        (d / "rank0.h5").write_bytes(data[:cut])
        got, _ = _read(d)
        assert isinstance(got, Exception) or _same(got, clean) is None, f"cut at {cut}: {_same(got, clean)}"
