"""Hostile or damaged dumps: nothing is written outside the folder the user named, nothing outside a dump is
read without ``allow_outside=True``, nothing is unpickled, and every bad input is a DumpFormatError that names
the file and what is wrong (issue 14)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import msprobe_nb as mp
from msprobe_nb.cli import main
from msprobe_nb.store.dump import Dump, load
from msprobe_nb.store.errors import DumpFormatError
from msprobe_nb.store.msprobe_reader import load_tensor_file
from msprobe_nb.store.schema import DumpParts, coerce_calls

ESCAPING = "../../../../outside/ESCAPED.0.forward"


def _t(**extra) -> dict:
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5,
            "Norm": 1.0, "requires_grad": False, **extra}


def _dump_json(data: dict, task: str = "statistics", dump_data_dir: str | None = None) -> str:
    return json.dumps({"task": task, "level": "L1", "framework": "pytorch", "dump_data_dir": dump_data_dir,
                       "data": data})


def _rank(folder: Path, data: dict, **kw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dump.json").write_text(_dump_json(data, **kw), encoding="utf-8")
    return folder


def _tensor_rank(folder: Path, data_name: str = "x.pt", call: str = "Torch.add.0.forward", **kw) -> Path:
    """A tensor-mode rank folder whose one input names ``data_name`` (dump_tensor_data is created empty)."""
    _rank(folder, {call: {"input_args": [_t(data_name=data_name)], "input_kwargs": {}, "output": []}},
          task="tensor", **kw)
    (folder / "dump_tensor_data").mkdir(exist_ok=True)
    return folder


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# ----------------------------------------------------------------------------- A: writing stays inside -o
def test_cli_export_of_escaping_record_name_stays_in_output_folder(tmp_path: Path, capsys):
    src = _tensor_rank(tmp_path / "src" / "rank0", data_name="x.bin", call=ESCAPING)
    torch.save(torch.tensor([0.0, 1.0]), src / "dump_tensor_data" / "x.bin")
    (tmp_path / "outside").mkdir()  # where the record name points from out/step0/rank0/dump_tensor_data
    out = tmp_path / "out"
    before = _tree(tmp_path)
    assert main(["export", str(src), "-o", str(out)]) == 0
    capsys.readouterr()
    created = _tree(tmp_path) - before
    assert created and all(p.startswith("out") for p in created), sorted(created)
    files = list((out / "step0" / "rank0" / "dump_tensor_data").iterdir())
    assert len(files) == 1 and "/" not in files[0].name
    back = load(out)  # the written data_name is the sanitised file name, and it loads back
    assert torch.equal(back.tensor(f"{ESCAPING}.input.0"), torch.tensor([0.0, 1.0]))


def _kit_dump(names: list[str]) -> Dump:
    """A tensor-mode dump as the kit holds it (data_name "step0/<row name>") with the given row names."""
    n = len(names)
    # object columns: where pyarrow is installed pandas infers pyarrow-backed text, which refuses lone surrogates
    calls = coerce_calls(pd.DataFrame({
        "call_index": list(range(n)), "call": names, "name": [f"{c}.input.0" for c in names],
        "io": ["input"] * n, "arg": ["0"] * n, "direction": ["forward"] * n, "family": ["Torch"] * n,
        "kind": ["tensor"] * n, "dtype": ["torch.float32"] * n, "shape": [(1,)] * n, "numel": [1] * n,
        "max": [float(i) for i in range(n)], "data_name": [f"step0/{c}.input.0" for c in names]}, dtype=object))
    table = {f"step0/{c}.input.0": torch.tensor([float(i)]) for i, c in enumerate(names)}
    return Dump(DumpParts(calls=calls, meta={"task": "tensor", "level": "L1"}, tensor_loader=table.__getitem__))


def test_export_sanitises_every_name_made_from_dump_content(tmp_path: Path):
    names = [ESCAPING, "/abs/olute.0.forward", "back\\slash.0.forward", "nul\x00and\nnewline.0.forward",
             "lone \udc80 surrogate.0.forward", "long" + "x" * 400 + ".0.forward", "long" + "x" * 401 + ".0.forward"]
    (tmp_path / "outside").mkdir()
    before = _tree(tmp_path)
    out = _kit_dump(names).export_msprobe(tmp_path / "out")
    assert all(p.startswith("out") for p in _tree(tmp_path) - before)
    files = sorted((out / "step0" / "rank0" / "dump_tensor_data").iterdir())
    assert len(files) == len(names)  # the two long names stay distinct after cutting
    assert all(len(f.name.encode()) <= 255 for f in files)
    back = load(out)
    for i, c in enumerate(names):
        assert back.tensor(f"{c}.input.0").item() == float(i)


def test_export_refuses_symlink_out_of_output_folder_and_name_collisions(tmp_path: Path):
    dump = _kit_dump(["Torch.add.0.forward"])
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"keep me")
    tensor_dir = tmp_path / "out" / "step0" / "rank0" / "dump_tensor_data"
    tensor_dir.mkdir(parents=True)
    (tensor_dir / "Torch.add.0.forward.input.0.pt").symlink_to(victim)  # planted before the export
    with pytest.raises(DumpFormatError, match="outside the output folder"):
        dump.export_msprobe(tmp_path / "out")
    assert victim.read_bytes() == b"keep me" and not (tensor_dir.parent / "dump.json").exists()
    with pytest.raises(DumpFormatError, match="would both be saved as") as e:  # "a/b" and "a_b" meet
        _kit_dump(["a/b.0.forward", "a_b.0.forward"]).export_msprobe(tmp_path / "out2")
    assert "a/b.0.forward.input.0" in str(e.value) and not (tmp_path / "out2" / "step0").exists()


# ----------------------------------------------------------------------------- A: reading stays inside the dump
def test_data_name_with_a_path_is_refused_at_load(tmp_path: Path):
    folder = _tensor_rank(tmp_path / "rank0", data_name="../../outside/x.pt")
    with pytest.raises(DumpFormatError, match=r'\["data_name"\].*plain file name') as e:
        load(folder)
    assert str(folder / "dump.json") in str(e.value)


@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_dump_data_dir_outside_the_dump_is_not_read(tmp_path: Path, how: str):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    torch.save(torch.ones(2), outside / "x.pt")
    ddd = str(outside) if how == "absolute" else "../elsewhere"
    folder = _tensor_rank(tmp_path / "rank0", dump_data_dir=ddd)
    d = load(folder)  # the statistics load; only reading the outside file is refused
    with pytest.raises(DumpFormatError, match="outside the dump folder.*dump_data_dir") as e:
        d.tensor("Torch.add.0.forward.input.0")
    assert str(outside / "x.pt") in str(e.value) and "allow_outside=True" in str(e.value)
    assert torch.equal(load(folder, allow_outside=True).tensor("Torch.add.0.forward.input.0"), torch.ones(2))


def test_symlink_in_dump_tensor_data_leading_outside_is_refused(tmp_path: Path):
    secret = tmp_path / "secret.pt"
    torch.save(torch.zeros(2), secret)
    folder = _tensor_rank(tmp_path / "dump" / "rank0")
    (folder / "dump_tensor_data" / "x.pt").symlink_to(secret)
    with pytest.raises(DumpFormatError, match="outside the dump folder.*symlink") as e:
        load(folder).tensor("Torch.add.0.forward.input.0")
    assert str(folder / "dump_tensor_data" / "x.pt") in str(e.value)
    assert torch.equal(load(folder, allow_outside=True).tensor("Torch.add.0.forward.input.0"), torch.zeros(2))
    # a symlink that stays inside the folder loaded is fine
    torch.save(torch.full((2,), 3.0), folder / "real.pt")
    (folder / "dump_tensor_data" / "x.pt").unlink()
    (folder / "dump_tensor_data" / "x.pt").symlink_to(folder / "real.pt")
    assert load(folder).tensor("Torch.add.0.forward.input.0")[0] == 3.0


def test_cli_export_reads_outside_tensors_only_with_allow_outside(tmp_path: Path, capsys):
    secret = tmp_path / "secret.pt"
    torch.save(torch.zeros(2), secret)
    folder = _tensor_rank(tmp_path / "dump" / "rank0")
    (folder / "dump_tensor_data" / "x.pt").symlink_to(secret)
    assert main(["export", str(folder), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msprobe-nb: error:") and "outside the dump folder" in err and "--allow-outside" in err
    assert main(["export", str(folder), "-o", str(tmp_path / "out2"), "--allow-outside"]) == 0
    capsys.readouterr()
    assert torch.equal(load(tmp_path / "out2").tensor("Torch.add.0.forward.input.0"), torch.zeros(2))


# ----------------------------------------------------------------------------- B: the reader follows the signature
def test_damaged_kit_files_get_the_hdf5_diagnosis(tmp_path: Path):
    sig = b"\x89HDF\r\n\x1a\n"
    cases = {"folder": ("d1/rank0.h5", sig + b"\0" * 200, "d1"), "empty": ("d2/rank0.h5", b"", "d2"),
             "file": ("d3/rank0.h5", sig + b"\xff" * 200, "d3/rank0.h5"),
             "no suffix": ("d4/blob", sig + b"\xff" * 200, "d4/blob")}
    for what, (name, data, target) in cases.items():
        f = tmp_path / name
        f.parent.mkdir()
        f.write_bytes(data)
        with pytest.raises(DumpFormatError) as e:
            mp.load(tmp_path / target)
        msg = str(e.value)
        assert "HDF5" in msg or "empty file" in msg, (what, msg)
        assert "msprobe dump" not in msg and "UTF-8" not in msg and str(f) in msg, (what, msg)


def test_truncated_kit_dump_gets_the_hdf5_diagnosis(tmp_path: Path):
    from msprobe_nb.store.hdf5_writer import DumpWriter

    with DumpWriter(tmp_path / "kit", rank=0) as w:
        w.write_step(0, {"name": ["a", "b"], "call": ["Torch.add.0.forward"] * 2})
    f = tmp_path / "kit" / "rank0.h5"
    f.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(DumpFormatError, match="HDF5|truncated") as e:
        mp.load(tmp_path / "kit")
    assert "rank0.h5" in str(e.value) and "msprobe dump found" not in str(e.value)


# ----------------------------------------------------------------------------- C: hostile JSON
def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


_CALL = '"Torch.add.0.forward"'
HOSTILE = {
    "990 levels": ('{"data": {' + _CALL + ': {"input_args": ' + _deep(990) + ', "output": []}}}',
                   # json's own limit, or the reader's depth check where the recursion limit is higher (torch's
                   # compiler raises it on import)
                   r"nested too deep|nests deeper than"),
    "300 levels": ('{"data": {' + _CALL + ': {"input_args": ' + _deep(300) + ', "output": []}}}',
                   "deeper than 100 levels"),
    "300 levels in a value": ('{"data": {' + _CALL + ': {"input_args": [{"type": "list", "value": ' + _deep(300)
                              + '}]}}}', "deeper than 100 levels"),
    "5001 digits": ('{"data": {' + _CALL + ': {"input_args": [{"type": "int", "value": ' + "1" * 5001 + '}]}}}',
                    "too many digits"),
    "huge shape": (_dump_json({"Torch.add.0.forward": {"input_args": [_t(shape=[10 ** 30, 2])]}}),
                   r'\["shape"\].*more elements'),
    "huge shape product": (_dump_json({"Torch.add.0.forward": {"input_args": [_t(shape=[2 ** 40] * 2)]}}),
                           r'\["shape"\].*more elements'),
    "negative shape": (_dump_json({"Torch.add.0.forward": {"input_args": [_t(shape=[-3, 2])]}}),
                       r'\["shape"\].*negative'),
    "input_args a string": (_dump_json({"Torch.add.0.forward": {"input_args": "hello"}}),
                            r'\["input_args"\] is \'hello\', expected a list'),
    "output a number": (_dump_json({"Torch.add.0.forward": {"output": 5}}), r'\["output"\] is 5, expected'),
    "type 5": (_dump_json({"Torch.add.0.forward": {"input_args": [{"type": 5, "value": 3}]}}),
               r'\["type"\] is 5, expected a type name'),
    "duplicate data key": ('{"task": "statistics", "data": {' + _CALL + ': {"input_args": []}}, "data": {}}',
                           "key 'data' appears twice"),
    "huge stat": (_dump_json({"Torch.add.0.forward": {"input_args": [_t(Max=10 ** 400)]}}),
                  r'\["Max"\].*beyond the range of a float'),
    "dtype a list": (_dump_json({"Torch.add.0.forward": {"input_args": [_t(dtype=["x"])]}}),
                     r'\["dtype"\].*expected a string'),
    "task an object": ('{"task": {"a": 1}, "data": {}}', r'"task" is .*expected a string'),
    "deep construct value": (None, "construct.json"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_dump_json_is_a_dump_format_error(tmp_path: Path, case: str, capsys):
    text, pattern = HOSTILE[case]
    folder = tmp_path / "rank0"
    folder.mkdir()
    if text is None:  # the side files are hostile too
        text = _dump_json({"Torch.add.0.forward": {"output": [_t()]}})
        (folder / "construct.json").write_text('{"Torch.add.0.forward": ' + _deep(300) + "}")
    (folder / "dump.json").write_text(text, encoding="utf-8")
    with pytest.raises(DumpFormatError, match=pattern) as e:
        load(folder)
    assert str(folder) in str(e.value)
    assert main(["compare", str(folder), str(folder), "-q"]) == 2  # through compare and the CLI: no internal error
    err = capsys.readouterr().err
    assert err.startswith("msprobe-nb: error:") and str(folder) in err and "internal error" not in err


def test_dump_json_with_a_bom_is_accepted(tmp_path: Path):
    folder = tmp_path / "rank0"
    folder.mkdir()
    text = _dump_json({"Torch.add.0.forward": {"input_args": [_t()], "input_kwargs": {}, "output": [_t()]}})
    (folder / "dump.json").write_bytes(b"\xef\xbb\xbf" + text.encode())
    (folder / "construct.json").write_bytes(b"\xef\xbb\xbf{}")
    assert len(load(folder).calls) == 2


def test_unicode_digit_counter_is_not_a_counter(tmp_path: Path):
    folder = _rank(tmp_path / "rank0", {"Torch.add.\u00b2.forward": {"output": [_t()]},
                                        "Torch.add." + "9" * 30 + ".forward": {"output": [_t()]}})
    c = load(folder).calls
    assert list(c["counter"]) == [0, 0]


# ----------------------------------------------------------------------------- C: tensor files
@pytest.mark.parametrize("array, pattern", [
    (np.array(["ab", "cd"], dtype="<U2"), "dtype '<U2'"),
    (np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]), "dtype"),
    (np.zeros(2, dtype="datetime64[s]"), "dtype"),
    (np.zeros(2, dtype=np.longdouble), "dtype"),
])
def test_npy_of_non_numeric_dtype_is_refused(tmp_path: Path, array: np.ndarray, pattern: str):
    f = tmp_path / "t.npy"
    np.save(f, array, allow_pickle=False)
    with pytest.raises(DumpFormatError, match=pattern) as e:
        load_tensor_file(f)
    assert str(f) in str(e.value)


def test_npy_header_claiming_more_than_the_file_holds_is_refused(tmp_path: Path):
    f = tmp_path / "t.npy"
    with open(f, "wb") as fh:  # 40 GB claimed, 16 bytes present: refused from the header, nothing allocated
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f4", "fortran_order": False, "shape": (10 ** 10,)})
        fh.write(b"\0" * 16)
    with pytest.raises(DumpFormatError, match="header claims.*truncated") as e:
        load_tensor_file(f)
    assert str(f) in str(e.value)


def test_npy_big_endian_and_unsigned_load(tmp_path: Path):
    for dtype in (">f4", ">i8", "u2", "?", "c8"):
        f = tmp_path / f"t{dtype.strip('<>?')}.npy"
        np.save(f, np.arange(3).astype(dtype))
        assert load_tensor_file(f).tolist() == np.arange(3).astype(dtype).tolist()


class _Payload:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_pt_files_load_with_weights_only(tmp_path: Path, monkeypatch):
    f = tmp_path / "t.pt"
    torch.save(_Payload(), f)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # cannot override an explicit weights_only=True
    with pytest.raises(DumpFormatError, match="cannot load the tensor safely"):
        load_tensor_file(f)
    seen = {}
    real = torch.load

    def spy(*a, **kw):
        seen.update(kw)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "load", spy)
    torch.save(torch.ones(1), f)
    assert load_tensor_file(f).item() == 1.0 and seen.get("weights_only") is True


# ----------------------------------------------------------------------------- F: the HDF5 commit index
def _kit_file(tmp_path: Path) -> Path:
    from msprobe_nb.store.hdf5_writer import DumpWriter

    with DumpWriter(tmp_path / "kit", rank=0) as w:
        for step in range(3):
            w.write_step(step, {"name": [f"n{i}" for i in range(5)], "call": ["Torch.add.0.forward"] * 5},
                         tensors={f"t{step}": torch.arange(4, dtype=torch.float32)})
    return tmp_path / "kit" / "rank0.h5"


def _poke(f: Path, row: int, field: str, value: int) -> None:
    import h5py

    from msprobe_nb.store.hdf5_layout import INDEX_FIELDS

    with h5py.File(f, "r+") as h:
        h["index/steps"][row, INDEX_FIELDS.index(field)] = value


@pytest.mark.parametrize("row, field, value, pattern", [
    (2, "calls", 10 ** 9, r"calls has 1000000000 rows.*holds"),
    (2, "u4", 10 ** 12, r"tensors/u4 has 1000000000000 entries"),
    (1, "calls_slot", 2, r"row 1 names tail slots .*0 or 1"),
    (1, "strings", 0, r"row 1: the length of strings goes from \d+ to 0"),
    (1, "step", 2 ** 40, r"row 1: step 1099511627776 does not fit int32"),
    (1, "commit", 0, r"row 2 is a commit after row 1"),
])
def test_damaged_commit_index_is_refused_at_once(tmp_path: Path, row: int, field: str, value: int, pattern: str):
    import time

    from msprobe_nb.store.hdf5_reader import read_hdf5

    f = _kit_file(tmp_path)
    assert read_hdf5(f).meta["steps"] == [0, 1, 2]
    _poke(f, row, field, value)
    t0 = time.perf_counter()
    with pytest.raises(DumpFormatError, match=pattern) as e:
        mp.load(tmp_path / "kit")
    assert time.perf_counter() - t0 < 5 and str(f) in str(e.value)


def test_index_extent_beyond_the_file_is_refused(tmp_path: Path):
    import h5py

    from msprobe_nb.store.hdf5_reader import read_hdf5

    f = _kit_file(tmp_path)
    with h5py.File(f, "r+") as h:
        h["index/steps"].resize((10 ** 8, h["index/steps"].shape[1]))  # 19 GB of fill rows, no disk used
    with pytest.raises(DumpFormatError, match=r"/index/steps claims 100000000 rows") as e:
        read_hdf5(f)
    assert str(f) in str(e.value)


def test_calls_extent_of_fill_values_is_refused(tmp_path: Path):
    import h5py

    from msprobe_nb.store.hdf5_layout import GROUPS
    from msprobe_nb.store.hdf5_reader import read_hdf5

    f = _kit_file(tmp_path)
    with h5py.File(f, "r+") as h:  # every calls column claims 10**8 rows, none of them stored
        for col in GROUPS["calls"][1]:
            h[col].resize((10 ** 8,))
    _poke(f, 2, "calls", 10 ** 8)
    with pytest.raises(DumpFormatError, match=r"calls has 100000000 rows.*holds 0"):
        read_hdf5(f)
