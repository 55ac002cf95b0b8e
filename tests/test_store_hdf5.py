"""The kit's HDF5 store: round trips, crash safety, clear errors, no silent overwrite."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
import torch

from msprobe_nb.store.hdf5_layout import GROUPS
from msprobe_nb.store.hdf5_reader import DumpFormatError, is_hdf5_dump, read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter, resolve_dump_dir
from msprobe_nb.store.schema import COLUMN_NAMES, SCHEMA_VERSION, coerce_calls

NA = pd.NA


def _table() -> pd.DataFrame:
    """Every column, every awkward value: NA in nullable columns, shapes () and None, unicode, NaN/inf."""
    rows = {
        "step": [0, 0, 0, 1, 1],
        "rank": [0] * 5,
        "call_index": [0, 0, 1, 0, 2 ** 40],
        "call": ["Functional.linear.0.forward"] * 2 + ["Module.net 名.Linear.forward.0", "Tensor.add.0.forward", ""],
        "name": ["Functional.linear.0.forward.input.0", "Functional.linear.0.forward.output.0", "ü名🙂",
                 "a\nb\tc\"'\\", "nul\x00inside \udc80"],
        "family": ["Functional", "Functional", "Module", "Tensor", ""],
        "op": ["linear", "linear", "Linear", "add", "__getitem__"],
        "module_path": ["", "", "net 名", "", ""],
        "counter": [0, 0, 0, 0, -(2 ** 31)],
        "direction": ["forward", "forward", "forward", "backward", "parameters_grad"],
        "io": ["input", "output", "parameters", "input", "parameters_grad"],
        "arg": ["0", "0", "weight", "0.1", "k"],
        "is_kwarg": [False, False, True, False, True],
        "kind": ["tensor", "tensor", "tensor", "value", "none"],
        "dtype": ["torch.float32", "torch.bfloat16", "torch.float8_e4m3fn", "", ""],
        "shape": [(2, 3), (), (0, 4), None, (2 ** 40, 1, 1, 1, 1, 1, 1, 1, 1)],
        "numel": [6, 1, 0, NA, 2 ** 40],
        "device": ["cpu", "npu:0", "cuda:0", "", ""],
        "requires_grad": [True, False, NA, NA, True],
        "max": [1.5, float("nan"), float("inf"), -0.0, 1e-300],
        "min": [-1.5, float("-inf"), 0.0, float("nan"), -1e300],
        "mean": [0.1, 0.2, float("nan"), 0.0, 5e-324],
        "norm": [3.0, float("nan"), 0.0, 1.0, 2.0],
        "nan_count": [0, 1, NA, NA, 7],
        "posinf_count": [0, NA, 2, NA, 0],
        "neginf_count": [NA, 0, 0, NA, 2 ** 62],
        "hash": ["", "d41d8cd98f00b204e9800998ecf8427e", "", "", ""],
        "value_type": ["", "", "", "int", "slice"],
        "value": ["", "", "", "3", '{"start": 1, "stop": null}'],
        "data_name": ["Functional.linear.0.forward.input.0.pt", "", "", "", ""],
        "stack_id": [0, 0, 1, -1, 2 ** 31 - 1],
        "parent": ["Module.net 名.Linear.forward.0", "", "", "", ""],
        "tensor_id": [1, 2, NA, NA, 2 ** 62],
        "producer": ["", "Functional.linear.0.forward", "", "", ""],
        "rng": ["", "", "", "cpu", "custom:7"],
        "rng_state": ["", "", "", "ab12", ""],
    }
    # object columns: pandas infers pyarrow-backed text where pyarrow is installed, and pyarrow refuses the lone
    # surrogate above (the kit itself stores text as Python objects, store.schema.pandas_dtype)
    return coerce_calls(pd.DataFrame(rows, dtype=object))


def _columns(df: pd.DataFrame) -> dict[str, list]:
    return {c: df[c].tolist() for c in df.columns if c not in ("step", "rank")}


def _write(dump_dir: Path, df: pd.DataFrame, rank: int = 0, **kw) -> Path:
    with DumpWriter(dump_dir, rank=rank, meta={"task": "statistics"}, **kw) as w:
        for step, part in df.groupby("step", sort=True):
            w.write_step(int(step), _columns(part), {0: ["a.py:1"], 1: ["b.py:2", "c.py:3"]}, {}, {})
    return dump_dir


def test_every_column_round_trips(tmp_path):
    df = _table()
    parts = read_hdf5(_write(tmp_path / "d", df))
    pd.testing.assert_frame_equal(parts.calls, df)
    # bit-exact floats (assert_frame_equal treats -0.0 == 0.0)
    for c in ("max", "min", "mean", "norm"):
        assert parts.calls[c].to_numpy().view(np.int64).tolist() == df[c].to_numpy().view(np.int64).tolist()
    assert list(parts.calls.columns) == COLUMN_NAMES


def test_missing_columns_get_schema_defaults_and_none_strings_become_empty(tmp_path):
    with DumpWriter(tmp_path / "d", rank=3) as w:
        w.write_step(7, {"name": ["x", None], "shape": [None, (1,)], "stack_id": np.array([5, 6])}, {}, {}, {})
    calls = read_hdf5(tmp_path / "d").calls
    want = coerce_calls(pd.DataFrame({"step": [7, 7], "rank": [3, 3], "name": ["x", ""], "shape": [None, (1,)],
                                      "stack_id": [5, 6]}))
    pd.testing.assert_frame_equal(calls, want)


def test_numpy_inputs_and_many_chunk_boundaries(tmp_path):
    """Steps of every size relative to a chunk: inside the tail, filling it exactly, spanning several."""
    chunk = GROUPS["calls"][0]
    sizes = [0, 5, chunk - 5, 1, chunk, 3 * chunk + 7, 2, chunk - 3]
    expected = []
    with DumpWriter(tmp_path / "d") as w:
        for step, n in enumerate(sizes):
            ci = np.arange(n, dtype=np.int64)
            cols = {"call_index": ci, "name": np.array([f"n{step}_{i % 97}" for i in range(n)], dtype=object),
                    "max": ci * 0.5, "numel": ci + step}
            w.write_step(step, cols, {}, {}, {})
            expected.append(pd.DataFrame({"step": step, "rank": 0, **cols}))
    want = coerce_calls(pd.concat(expected, ignore_index=True))
    pd.testing.assert_frame_equal(read_hdf5(tmp_path / "d").calls, want)
    one = read_hdf5(tmp_path / "d", steps=[5])
    pd.testing.assert_frame_equal(one.calls, want[want.step == 5].reset_index(drop=True))
    assert one.meta["steps"] == [5]


def _dtypes() -> list[torch.dtype]:
    names = ["float32", "float64", "float16", "bfloat16", "bool", "uint8", "int8", "int16", "int32", "int64",
             "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


def _make(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size(),),
                        dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)  # arbitrary bit patterns: NaN payloads, -0.0, subnormals


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def test_tensors_round_trip_bit_exact(tmp_path):
    tensors = {}
    for i, dt in enumerate(_dtypes()):
        for shape in [(), (0, 3), (5,), (3, 4, 2)]:
            tensors[f"{dt}.{shape}"] = _make(dt, shape, i)
    tensors["transposed"] = torch.arange(12.0).reshape(3, 4).t()
    tensors["grad"] = torch.ones(3, requires_grad=True) * 2
    tensors["conj"] = torch.tensor([1 + 2j, 3 - 4j]).conj()
    tensors["negative view"] = torch._neg_view(torch.tensor([1.5, -2.0, 0.0]))  # its memory holds -values
    tensors["parameter"] = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    tensors["big"] = torch.randn(300, 500)
    tensors["several chunks"] = torch.randn(700_001)  # > two 1 MiB buffer chunks, odd length
    with DumpWriter(tmp_path / "d", rank=0) as w:
        names = list(tensors)
        half = len(names) // 2
        w.write_step(0, {"data_name": names[:half]}, {}, {}, {k: tensors[k] for k in names[:half]})
        w.write_step(1, {"data_name": names[half:]}, {}, {}, {k: tensors[k] for k in names[half:]})
    load = read_hdf5(tmp_path / "d").tensor_loader
    for name, t in tensors.items():
        for key in (name, f"rank0/{name}"):
            got = load(key)
            assert got.dtype == t.dtype and got.shape == t.shape, name
            assert torch.equal(_bits(got), _bits(t)), name
            assert not got.requires_grad
    with pytest.raises(KeyError, match="nope"):
        load("nope")


def test_numpy_arrays_handed_as_tensors_read_back_as_torch_tensors(tmp_path):
    """The recorder hands its host copies as numpy arrays: each is stored as the torch dtype of its numpy
    dtype, shape kept (a 0-d array too) and values bit for bit; a dtype torch lacks is refused by name."""
    rng = np.random.default_rng(0)
    arrays = {"scalar": np.array(2.5, np.float32), "empty": np.zeros((0, 3), np.int64),
              "half": rng.standard_normal((2, 3)).astype(np.float16), "flags": np.array([True, False]),
              "strided": np.arange(24.0).reshape(4, 6)[:, ::2], "bytes": np.arange(5, dtype=np.uint8)}
    with DumpWriter(tmp_path / "d", rank=0) as w:
        w.write_step(0, {"data_name": list(arrays)}, {}, {}, arrays)
        with pytest.raises(TypeError, match="'bad'.*numpy dtype uint16"):
            w.write_step(1, {"data_name": ["bad"]}, {}, {}, {"bad": np.zeros(2, np.uint16)})
    load = read_hdf5(tmp_path / "d").tensor_loader
    for name, a in arrays.items():
        got = load(name)
        assert str(got.dtype) == f"torch.{a.dtype}" and tuple(got.shape) == a.shape, name
        assert np.array_equal(got.numpy(), a), name


@pytest.mark.parametrize("compression", ["same", None])
def test_tensor_reads_through_the_block_cache(tmp_path, compression, monkeypatch):
    """Many tensors across several cache blocks, in and out of order; callers may modify what they get."""
    from msprobe_nb.store.hdf5_reader import TensorLoader
    monkeypatch.setattr(TensorLoader, "BLOCK_BYTES", 1 << 16)  # small blocks: many boundaries
    monkeypatch.setattr(TensorLoader, "MAX_BLOCKS", 2)
    g = torch.Generator().manual_seed(3)
    tensors = {f"t{i}": torch.randn(int(torch.randint(1, 9000, (1,), generator=g)), generator=g)
               for i in range(120)}
    with DumpWriter(tmp_path / "d", rank=0, tensor_compression=compression) as w:
        w.write_step(0, {"data_name": list(tensors)}, {}, {}, tensors)
    load = read_hdf5(tmp_path / "d").tensor_loader
    order = list(tensors)
    for name in order + order[::-1] + order[::7]:
        got = load(name)
        assert torch.equal(got, tensors[name]), name
        got.zero_()  # must not leak into the next read of the same block
    assert torch.equal(load("t5"), tensors["t5"])


def test_gzip_compression_and_tensor_reads_in_a_new_process(tmp_path):
    t = torch.randn(64, 64, dtype=torch.float16)
    with DumpWriter(tmp_path / "d", compression=4) as w:
        w.write_step(0, {"name": ["a"]}, {}, {}, {"a.pt": t})
    with h5py.File(tmp_path / "d" / "rank0.h5", "r") as f:
        assert f["tensors/u2"].compression == "gzip" and f["calls/name"].compression == "gzip"
    parts = read_hdf5(tmp_path / "d")
    assert torch.equal(parts.tensor_loader("a.pt"), t)
    with pytest.raises(ValueError, match="compression"):
        DumpWriter(tmp_path / "e", compression="zstd")


def test_side_tables_meta_and_construct(tmp_path):
    meta = {"task": "statistics", "level": "L1", "framework": "pytorch", "seed": 1234, "lr": 0.5,
            "deterministic": True, "note": None, "ranks_list": [0, 1], "名字": "值"}
    with DumpWriter(tmp_path / "d", rank=0, meta=meta) as w:
        w.write_step(0, {"name": ["a"], "stack_id": [3]}, {3: ["x.py:1", "y.py:2"]},
                     {"Module.m.M.forward.0": None, "Functional.relu.0.forward": "Module.m.M.forward.0"}, {})
        # the same stack id again (stored once) plus a new one; a different module tree in step 1
        w.write_step(1, {"name": ["b"], "stack_id": [4]}, {3: ["x.py:1", "y.py:2"], 4: ["z.py:9"]},
                     {"Module.m.M.forward.1": None}, {})
    parts = read_hdf5(tmp_path / "d")
    assert parts.stacks == {3: ["x.py:1", "y.py:2"], 4: ["z.py:9"]}
    assert parts.construct == {"Module.m.M.forward.0": None, "Functional.relu.0.forward": "Module.m.M.forward.0",
                               "Module.m.M.forward.1": None}
    by_step = parts.meta["construct_by_step"]
    assert set(by_step) == {(0, 0), (0, 1)} and by_step[(0, 1)] == {"Module.m.M.forward.1": None}
    for k, v in meta.items():
        assert parts.meta[k] == v
    assert parts.meta["schema_version"] == SCHEMA_VERSION and parts.meta["tool_version"]
    assert parts.meta["ranks"] == [0] and parts.meta["steps"] == [0, 1]
    with h5py.File(tmp_path / "d" / "rank0.h5", "r") as f:
        assert f["stacks/id"].shape[0] == 0  # two stacks: not a whole chunk yet, so in the tail, once
        assert json.loads(f["tail/stacks"].attrs["columns"]) == [["stacks/id", "<i4"], ["stacks/ends", "<i8"]]
        assert f["tail/stacks"].shape == (2, 1024, 12)  # one packed 12-byte record per row
        assert json.loads(f.attrs["meta"])["level"] == "L1"


def test_several_ranks_concatenate_sort_and_remap_stacks(tmp_path):
    d = tmp_path / "d"
    with DumpWriter(d, rank=1) as w:
        w.write_step(0, {"call_index": [1, 0], "name": ["r1b", "r1a"], "stack_id": [0, 1]},
                     {0: ["rank1 frame"], 1: ["shared"]}, {"M1": None}, {"x": torch.ones(2)})
    with DumpWriter(d, rank=0) as w:
        w.write_step(0, {"call_index": [0], "name": ["r0"], "stack_id": [0]}, {0: ["rank0 frame"], 1: ["shared"]},
                     {"M0": None}, {"x": torch.zeros(2)})
    parts = read_hdf5(d)
    c = parts.calls
    assert c["rank"].tolist() == [0, 1, 1] and c["name"].tolist() == ["r0", "r1a", "r1b"]
    frames = [parts.stacks[s] for s in c["stack_id"]]
    assert frames == [["rank0 frame"], ["shared"], ["rank1 frame"]]
    assert parts.meta["ranks"] == [0, 1] and parts.construct == {"M0": None, "M1": None}
    assert torch.equal(parts.tensor_loader("x"), torch.zeros(2))  # bare name: lowest rank
    assert torch.equal(parts.tensor_loader("rank1/x"), torch.ones(2))
    assert read_hdf5(d / "rank1.h5").calls["name"].tolist() == ["r1a", "r1b"]  # one file alone


def test_bad_input_is_rejected_before_writing_and_the_writer_keeps_working(tmp_path):
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(0, {"name": ["a", "b"]}, {}, {}, {})
        with pytest.raises(ValueError, match="unknown column"):
            w.write_step(1, {"name": ["new1"], "bogus": [1]}, {}, {}, {})
        with pytest.raises(ValueError, match="'max' has 1 values"):
            w.write_step(1, {"name": ["new2", "new3"], "max": [1.0]}, {}, {}, {})
        with pytest.raises(ValueError, match="counter"):
            w.write_step(1, {"name": ["new4"], "counter": [2 ** 40]}, {}, {}, {})
        with pytest.raises(TypeError, match="torch.Tensor"):
            w.write_step(1, {"name": ["new5"]}, {}, {}, {"t": [1, 2]})
        w.write_step(1, {"name": ["c"]}, {}, {}, {})
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write_step(2, {"name": ["d"]}, {}, {}, {})
    calls = read_hdf5(tmp_path / "d").calls
    assert calls["name"].tolist() == ["a", "b", "c"] and calls["step"].tolist() == [0, 0, 1]


def test_empty_dump_reads_as_an_empty_table(tmp_path):
    DumpWriter(tmp_path / "d").close()
    parts = read_hdf5(tmp_path / "d")
    assert len(parts.calls) == 0 and list(parts.calls.columns) == COLUMN_NAMES
    pd.testing.assert_series_equal(parts.calls.dtypes, coerce_calls(pd.DataFrame()).dtypes)
    assert is_hdf5_dump(tmp_path / "d") and is_hdf5_dump(tmp_path / "d" / "rank0.h5")


def test_read_while_the_writer_is_open_in_this_process(tmp_path):
    for swmr in (True, False):
        d = tmp_path / f"swmr{swmr}"
        w = DumpWriter(d, swmr=swmr)
        w.write_step(0, {"name": ["a", "b"]}, {}, {}, {"t": torch.arange(3)})
        parts = read_hdf5(d)
        assert parts.calls["name"].tolist() == ["a", "b"] and torch.equal(parts.tensor_loader("t"), torch.arange(3))
        w.write_step(1, {"name": ["c"]}, {}, {}, {})
        assert read_hdf5(d).calls["name"].tolist() == ["a", "b", "c"]
        w.close()
        assert read_hdf5(d).meta["steps"] == [0, 1]


# -- crash safety ----------------------------------------------------------------------------
CHILD = textwrap.dedent("""
    import sys, time, numpy as np, torch
    from msprobe_nb.store.hdf5_writer import DumpWriter
    dump, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(seed)
    w = DumpWriter(dump, rank=0, meta={"task": "tensor"})

    def step_data(step):
        n = 300 + 977 * (step % 5)  # sizes that cross chunk boundaries at different points
        i = np.arange(n)
        return n, {"call_index": i, "name": [f"s{step}.n{k}" for k in i], "numel": i + step,
                   "shape": [(int(k % 4), step) for k in i]}

    def write(step):
        n, cols = step_data(step)
        w.write_step(step, cols, {step % 7: [f"f{step % 7}.py:1"]}, {f"M{step}": None},
                     {f"t{step}": torch.full((n,), float(step)), f"h{step}": torch.arange(n, dtype=torch.int16)})
        print(step, flush=True)

    if mode == "between":   # kill while the "training step" computes, between write_step calls
        for s in range(3):
            write(s)
        n, cols = step_data(3)
        print("computing", flush=True)
        time.sleep(60)
    elif mode == "inside":  # kill inside write_step(3): data written and flushed, commit row not yet
        for s in range(3):
            write(s)
        def stall(row):
            print("inside", flush=True)
            time.sleep(60)
        w._append_index = stall
        write(3)
    else:                   # write steps as fast as possible until killed
        for s in range(100000):
            write(s)
""")


def _child(dump: Path, mode: str, seed: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(dump), mode, str(seed)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _check_steps(dump: Path, n_steps: int) -> None:
    parts = read_hdf5(dump)
    c = parts.calls
    assert sorted(set(c["step"])) == list(range(n_steps))
    for s in range(n_steps):
        rows = c[c["step"] == s]
        n = 300 + 977 * (s % 5)
        assert len(rows) == n
        assert rows["numel"].tolist() == list(range(s, n + s))
        assert rows["name"].iloc[-1] == f"s{s}.n{n - 1}" and rows["shape"].iloc[-1] == ((n - 1) % 4, s)
        assert torch.equal(parts.tensor_loader(f"t{s}"), torch.full((n,), float(s)))
        assert parts.meta["construct_by_step"][(0, s)] == {f"M{s}": None}


@pytest.mark.parametrize("mode", ["between", "inside"])
def test_sigkill_during_step_3_keeps_steps_0_to_2(tmp_path, mode):
    dump = tmp_path / "run 运行"
    p = _child(dump, mode)
    try:
        lines = []
        while (line := p.stdout.readline().strip()) not in ("computing", "inside"):
            assert line, f"child died: {p.stderr.read()}"
            lines.append(line)
        assert lines == ["0", "1", "2"]
        _check_steps(dump, 3)  # readable while the writer is alive (SWMR)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    _check_steps(dump, 3)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_random_points_leaves_whole_steps(tmp_path, seed):
    dump = tmp_path / "d"
    p = _child(dump, "loop", seed)
    try:
        assert p.stdout.readline().strip() == "0", p.stderr.read()
        time.sleep(random.Random(seed).uniform(0.0, 0.4))
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    done = 1 + len(p.stdout.read().split())
    n_read = len(read_hdf5(dump).meta["steps"])
    assert n_read >= done  # every reported step survived (one more may have committed before the kill)
    _check_steps(dump, n_read)


# -- errors ----------------------------------------------------------------------------------
def _small_dump(d: Path) -> Path:
    with DumpWriter(d) as w:
        w.write_step(0, {"name": [f"n{i}" for i in range(5000)], "max": np.arange(5000.0)}, {}, {}, {})
    return d / "rank0.h5"


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        read_hdf5(tmp_path / "nowhere")


@pytest.mark.parametrize("content, match", [
    (b"", "empty file"),
    (b"not hdf5 at all, just text\n" * 10, "not an HDF5 file"),
])
def test_non_hdf5_files_raise_dump_format_error(tmp_path, content, match):
    f = tmp_path / "rank0.h5"
    f.write_bytes(content)
    for target in (f, tmp_path):
        with pytest.raises(DumpFormatError, match=match) as e:
            read_hdf5(target)
        assert str(f) in str(e.value)
    assert not is_hdf5_dump(f)


def test_truncated_file_raises_dump_format_error(tmp_path):
    f = _small_dump(tmp_path / "d")
    data = f.read_bytes()
    for cut in (len(data) // 2, 2048, 100):
        f.write_bytes(data[:cut])
        with pytest.raises(DumpFormatError) as e:
            read_hdf5(f)
        assert str(f) in str(e.value)


def test_corrupt_chunk_raises_dump_format_error(tmp_path):
    f = _small_dump(tmp_path / "d")
    with h5py.File(f, "r") as h:
        info = h["calls/name"].id.get_chunk_info(0)
    with open(f, "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
    with pytest.raises(DumpFormatError, match="corrupt") as e:
        read_hdf5(tmp_path / "d")
    assert str(f) in str(e.value)


def test_foreign_hdf5_and_wrong_versions_raise_dump_format_error(tmp_path):
    foreign = tmp_path / "foreign.h5"
    with h5py.File(foreign, "w") as h:
        h["x"] = np.arange(3)
    with pytest.raises(DumpFormatError, match="not a msprobe_nb dump") as e:
        read_hdf5(foreign)
    assert str(foreign) in str(e.value)
    assert not is_hdf5_dump(foreign)

    f = _small_dump(tmp_path / "d")
    with h5py.File(f, "r+") as h:
        h.attrs["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(DumpFormatError, match="schema_version") as e:
        read_hdf5(tmp_path / "d")
    assert str(f) in str(e.value)

    f = _small_dump(tmp_path / "e")
    with h5py.File(f, "r+") as h:
        del h["calls/max"]
    with pytest.raises(DumpFormatError, match="calls/max") as e:
        read_hdf5(f)
    assert str(f) in str(e.value)


def test_directory_without_dump_files(tmp_path):
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(DumpFormatError, match="rank"):
        read_hdf5(tmp_path)
    assert not is_hdf5_dump(tmp_path)


def test_file_left_open_by_its_writer_is_read_safely(tmp_path):
    """A copy taken while the writer holds the file carries HDF5's "open for write" flag, like a killed run."""
    w = DumpWriter(tmp_path / "live")
    w.write_step(0, {"name": [f"n{i}" for i in range(5000)]}, {}, {}, {})
    data = (tmp_path / "live" / "rank0.h5").read_bytes()
    w.close()
    copy = tmp_path / "copy" / "rank0.h5"
    copy.parent.mkdir()
    copy.write_bytes(data)
    assert len(read_hdf5(copy).calls) == 5000  # read in SWMR mode
    copy.write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpFormatError, match="truncated"):
        read_hdf5(copy)
    copy.write_bytes(data[:48] + b"\xaa" * (len(data) - 48))  # superblock intact, everything else garbage
    t0 = time.perf_counter()
    with pytest.raises(DumpFormatError) as e:
        read_hdf5(copy)
    assert str(copy) in str(e.value) and time.perf_counter() - t0 < 30  # fails instead of retrying for minutes
    assert not is_hdf5_dump(copy)


def test_an_uncommitted_index_row_is_ignored(tmp_path):
    f = _small_dump(tmp_path / "d")
    with h5py.File(f, "r+") as h:
        idx = h["index/steps"]
        idx.resize((2, idx.shape[1]))  # a half-written commit: fill zeros, no commit marker
    assert read_hdf5(f).meta["steps"] == [0]


# -- paths -----------------------------------------------------------------------------------
def test_resolve_dump_dir_never_overwrites_silently(tmp_path):
    base = tmp_path / "runs" / "npu 运行"
    assert resolve_dump_dir(base) == base and base.is_dir()
    assert resolve_dump_dir(base) == base  # an empty directory is free
    _small_dump(base)
    with pytest.warns(UserWarning) as rec:
        second = resolve_dump_dir(base)
    assert second == tmp_path / "runs" / "npu 运行_1"
    assert str(base) in str(rec[0].message) and str(second) in str(rec[0].message)
    _small_dump(second)
    with pytest.warns(UserWarning):
        assert resolve_dump_dir(base, on_exists="new") == tmp_path / "runs" / "npu 运行_2"
    assert len(read_hdf5(base).calls) == len(read_hdf5(second).calls) == 5000  # both intact

    with pytest.raises(FileExistsError, match="npu 运行"):
        resolve_dump_dir(base, on_exists="error")
    with pytest.raises(FileExistsError, match="rank0.h5"):
        DumpWriter(base, rank=0)
    (base / "keep.txt").write_text("not a dump")
    with pytest.warns(UserWarning, match="deleted"):
        assert resolve_dump_dir(base, on_exists="overwrite") == base
    assert sorted(p.name for p in base.iterdir()) == ["keep.txt"]
    with pytest.raises(ValueError, match="on_exists"):
        resolve_dump_dir(base, on_exists="replace")
    with pytest.raises(FileExistsError, match="not a directory"):
        resolve_dump_dir(base / "keep.txt")


def test_relative_non_ascii_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d = resolve_dump_dir("runs/npu 运行")
    assert d == Path("runs/npu 运行")
    _small_dump(d)
    assert len(read_hdf5("runs/npu 运行").calls) == 5000
    assert os.path.exists("runs/npu 运行/rank0.h5")


def _tail_columns(f: h5py.File, group: str) -> dict[str, np.ndarray]:
    """A layout-3 tail as {column: (2, chunk) array}, to rewrite it the way older layouts stored it."""
    tail = f[f"tail/{group}"]
    record = np.dtype([(p, t) for p, t in json.loads(tail.attrs["columns"])])
    recs = np.ascontiguousarray(tail[()]).view(record)[..., 0]  # (2, chunk)
    del f[f"tail/{group}"]
    return {p: recs[p].astype(record[p].newbyteorder("=")) for p in record.names}


def test_layout_2_files_with_one_tail_per_dtype_still_read(tmp_path):
    """Dumps written with one tail per dtype of a group (layout 2: /tail/<group>/<dtype>, shape
    (2, columns, chunk)) stay readable."""
    df = _table()
    path = _write(tmp_path / "d", df) / "rank0.h5"
    with h5py.File(path, "r+") as f:
        for g in GROUPS:
            by_dtype: dict[str, list[str]] = {}
            cols = _tail_columns(f, g)
            for p, a in cols.items():
                by_dtype.setdefault(str(a.dtype), []).append(p)
            for dtype, paths in by_dtype.items():
                ds = f.create_dataset(f"tail/{g}/{dtype}", data=np.stack([cols[p] for p in paths], axis=1))
                ds.attrs["columns"] = json.dumps(paths)
        f.attrs["layout_version"] = 2
    pd.testing.assert_frame_equal(read_hdf5(path.parent).calls, df)


def test_layout_1_files_with_one_tail_per_column_still_read(tmp_path):
    """Dumps written before tails were shared (layout 1: /tail/<column>, shape (2, chunk)) stay readable."""
    df = _table()
    path = _write(tmp_path / "d", df) / "rank0.h5"
    with h5py.File(path, "r+") as f:  # rewrite the tails as layout 1 had them
        for g in GROUPS:
            for p, a in _tail_columns(f, g).items():
                f.create_dataset(f"tail/{p}", data=a)
        f.attrs["layout_version"] = 1
    pd.testing.assert_frame_equal(read_hdf5(path.parent).calls, df)


def test_a_tail_record_layout_naming_a_non_numeric_type_is_refused(tmp_path):
    """The tail's record layout comes from the file; raw bytes must never be viewed as Python objects."""
    path = _small_dump(tmp_path / "d")
    with h5py.File(path, "r+") as f:
        cols = json.loads(f["tail/calls"].attrs["columns"])
        cols[0][1] = "|O"
        f["tail/calls"].attrs["columns"] = json.dumps(cols)
    with pytest.raises(DumpFormatError, match="non-numeric"):
        read_hdf5(path)


def test_coded_columns_repeat_their_values_by_code_and_bad_codes_are_refused(tmp_path):
    from msprobe_nb.store.schema import Coded
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(0, {"call": Coded(np.array([1, 0, 1]), ["a.0.forward", "b.0.forward"]),
                         "counter": Coded(np.array([0, 0, 1]), [7, 9])}, {}, {}, {})
        for codes in (np.array([0, 2]), np.array([-1, 0]), np.array([0.0, 1.0])):
            with pytest.raises(ValueError, match="column 'call': codes must be integers in \\[0, 2\\)"):
                w.write_step(1, {"call": Coded(codes, ["x", "y"])}, {}, {}, {})
        # one codes array shared by columns (a step's call fields) is checked against each column's values
        shared = np.array([0, 2])
        with pytest.raises(ValueError, match="column 'op': codes must be integers in \\[0, 2\\)"):
            w.write_step(1, {"call": Coded(shared, ["x", "y", "z"]), "op": Coded(shared, ["p", "q"])}, {}, {}, {})
    calls = read_hdf5(tmp_path / "d").calls
    assert calls["call"].tolist() == ["b.0.forward", "a.0.forward", "b.0.forward"]
    assert calls["counter"].tolist() == [7, 7, 9] and calls["step"].tolist() == [0, 0, 0]


def test_columns_repeated_from_the_last_step_reuse_its_ids_but_never_a_failed_steps(tmp_path):
    """The writer remembers the last committed step's conversions; a step that fails leaves none behind,
    even where its strings were looked up after being interned by that same step."""
    m_names = tuple(f"m{i}" for i in range(5))
    names = tuple(f"n{i}" for i in range(5))
    with DumpWriter(tmp_path / "d") as w:
        for step in (0, 1):
            w.write_step(step, {"name": names, "shape": ((1, 2),) * 5, "call_index": list(range(5))})
        assert w._memo["name"][0] is names and w._memo["call_index"][1].tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(ValueError, match="int32"):  # fails after 'producer' recalled m-names' new ids
            w.write_step(2, {"name": m_names, "producer": m_names}, {2 ** 40: ["f.py:1"]})
        # new strings take the ids the failed step had given m0..m4; 'producer' must not reuse them
        w.write_step(3, {"name": tuple(f"z{i}" for i in range(5)), "producer": m_names, "shape": [(1, 2)] * 5})
    c = read_hdf5(tmp_path / "d").calls
    assert c["step"].tolist() == [0] * 5 + [1] * 5 + [3] * 5
    assert c["name"].tolist() == list(names) * 2 + [f"z{i}" for i in range(5)]
    assert c["producer"].tolist() == [""] * 10 + list(m_names)
    assert c["shape"].tolist() == [(1, 2)] * 15 and c["call_index"].tolist() == [0, 1, 2, 3, 4] * 2 + [0] * 5


def test_string_columns_mixing_known_new_and_missing_values(tmp_path):
    """None, NaN and pandas' NA among known and new strings, step after step (the writer remembers a step's
    ids): each string reads back as itself, each missing value as "" in the calls table and as None for a
    construct parent, where the schema keeps "no value" apart."""
    steps = [["a", None, "b", float("nan"), "a", pd.NA, None, "c"],
             [None, None, "a", "d", None, None, "b", "c"],
             [None, None, "a", "d", None, None, "b", "c"],  # as the last step: its ids are recalled
             [None] * 8]
    parents = [{"x": None, "y": "a"}, {"x": "y", "y": None}, {"x": "y", "y": None}, {"x": None, "y": None}]
    with DumpWriter(tmp_path / "d") as w:
        for step, (vals, con) in enumerate(zip(steps, parents)):
            w.write_step(step, {"value": vals, "producer": vals[::-1]}, {}, con, {})
    parts = read_hdf5(tmp_path / "d")
    c = parts.calls

    def plain(vals):
        return [v if isinstance(v, str) else "" for v in vals]
    assert c["value"].tolist() == [v for vals in steps for v in plain(vals)]
    assert c["producer"].tolist() == [v for vals in steps for v in plain(vals[::-1])]
    by_step = parts.meta["construct_by_step"]
    assert [by_step[(0, s)] for s in range(4)] == parents


def test_a_new_string_on_many_rows_is_stored_once(tmp_path):
    """A string new in a step (an optimizer's step size, the same on every parameter's rows) is interned once:
    every row reads it back, and the strings table holds it once."""
    vals = ["0.125", "x", "0.125", None, "0.125", "x", 3.5, "3.5"]
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(0, {"value": vals}, {}, {}, {})
        assert w._groups["strings"].length == len({"", "0.125", "x", "3.5"})  # the committed strings
        w.write_step(1, {"value": ["y", "y", "0.125"]}, {}, {}, {})
        assert w._groups["strings"].length == len({"", "0.125", "x", "3.5", "y"})
    c = read_hdf5(tmp_path / "d").calls
    assert c["value"].tolist() == ["0.125", "x", "0.125", "", "0.125", "x", "3.5", "3.5", "y", "y", "0.125"]


def test_the_recorder_keeps_numpy_copies_only_of_dtypes_the_writer_stores():
    """capture (stats._NUMPY_HELD) and the store (tensor_bytes.SHARED_DTYPES) each list the dtypes kept as numpy
    copies, since neither layer imports the other's list: they must stay the same set."""
    from msprobe_nb.capture.stats import _NUMPY_HELD
    from msprobe_nb.store.tensor_bytes import SHARED_DTYPES

    assert _NUMPY_HELD == {getattr(torch, n) for n in SHARED_DTYPES}
