"""Hostile or damaged dumps: nothing is written outside the folder the user named, nothing outside a dump is
read without ``allow_outside=True``, nothing is unpickled, and every bad input is a DumpFormatError that names
the file and what is wrong (issue 14)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import msprobe_nb as mp
from msprobe_nb.store.errors import DumpFormatError

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


