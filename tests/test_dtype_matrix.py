"""Every dtype, every task, every level: recorded, compared with each other and exported without an exception;
low-precision statistics computed in float32 or wider (docs/hdf5_schema.md, "Statistics")."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import msprobe_nb as mp

#: metrics of a float16 tensor whose norm overflows float16 must not warn either
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2, torch.int8, torch.uint8,
          torch.int64, torch.bool, torch.complex64)


class _AllDtypes(torch.nn.Module):
    """A Linear whose output goes through every dtype, plus a 0-d and an empty tensor, and a float16 tensor
    whose norm (about 1.2e5) overflows float16 (65504) but not float32."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, bump: float = 0.0):
        y = self.lin(x) + bump
        for dt in DTYPES:
            t = y.to(dt)
            if dt == torch.bool:
                torch.logical_not(t)
            elif dt.is_floating_point and dt.itemsize == 1:
                t.float().sum()  # float8 has next to no kernels: a conversion and back
            else:
                t.clone()
        (y.sum().to(torch.bfloat16) * 2).clone()   # 0-d
        (y[:0].to(torch.bfloat16) + 1).clone()     # empty
        torch.full((4,), 60000.0, dtype=torch.float16).mul(1.0)
        return y.sum()


def _record(path, task, level, bump):
    torch.manual_seed(0)
    m = _AllDtypes()
    x = torch.randn(3, 4)
    with mp.record(dump_path=str(path), task=task, level=level, model=m) as d:
        m(x, bump).backward()
        d.step()
    return mp.load(path)


@pytest.mark.parametrize("level", ["L1", "mix", "L2"])
@pytest.mark.parametrize("task", ["statistics", "md5", "tensor"])
def test_every_dtype_records_compares_and_exports(tmp_path, task, level):
    a = _record(tmp_path / "a", task, level, 0.0)
    b = _record(tmp_path / "b", task, level, 1e-2)
    dtypes = set(a.calls["dtype"])
    want = {str(dt) for dt in DTYPES} if level != "L2" else {str(dt) for dt in DTYPES} - {"torch.float8_e5m2"}
    assert want <= dtypes, want - dtypes
    bf16 = a.calls.loc[a.calls["dtype"] == "torch.bfloat16", "shape"].dropna().map(tuple)
    assert (bf16 == ()).any() and bf16.map(lambda s: 0 in s).any()  # a 0-d and an empty tensor
    same = mp.compare(a, _record(tmp_path / "a2", task, level, 0.0), progress=False)  # two identical runs
    assert not same["diverges"].any()
    changed = mp.compare(a, b, progress=False)
    assert changed["diverges"].any()  # the change is seen
    out = a.export_msprobe(tmp_path / "msprobe")
    back = mp.compare(mp.load(out), a, progress=False)
    assert len(back) > 0 and not back["diverges"].any()


def test_low_precision_statistics_are_computed_in_float32_or_wider(tmp_path):
    dump = _record(tmp_path / "t", "tensor", "L1", 0.0)
    c = dump.calls
    half = c[(c["dtype"] == "torch.float16") & c["name"].str.startswith("Tensor.mul")].iloc[0]
    assert math.isfinite(half["norm"]) and half["norm"] == pytest.approx(120000.0, rel=1e-6)
    checked = 0
    for _, row in c[c["dtype"].isin(["torch.bfloat16", "torch.float16"]) & (c["data_name"] != "")].iterrows():
        t = dump.load_tensor(row["data_name"], step=int(row["step"]), rank=int(row["rank"]))
        if t.numel() == 0:
            continue
        wide = t.double()
        assert row["mean"] == pytest.approx(float(wide.mean()), rel=1e-6, abs=1e-6), row["name"]
        assert row["norm"] == pytest.approx(float(wide.norm()), rel=1e-6), row["name"]
        assert row["max"] == float(wide.max()) and row["min"] == float(wide.min())
        checked += 1
    assert checked >= 3
    assert np.isfinite(c.loc[c["dtype"] == "torch.float8_e4m3fn", "norm"].astype(float)).all()


def test_stored_bytes_decode_to_numpy_as_torch_widens_them():
    """bfloat16 (every bit pattern) and float8 (every pattern) become the float32 torch's ``.float()`` gives."""
    from msprobe_nb.store.tensor_arrays import array_of_bytes
    for dt, bits in ((torch.bfloat16, torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)),
                     (torch.float8_e4m3fn, torch.arange(256, dtype=torch.int32).to(torch.uint8)),
                     (torch.float8_e5m2, torch.arange(256, dtype=torch.int32).to(torch.uint8))):
        t = bits.view(dt)
        got = array_of_bytes(bits.view(torch.uint8).numpy(), str(dt), tuple(t.shape))
        want = t.float().numpy()
        assert got.dtype == np.float32
        assert np.array_equal(got, want, equal_nan=True), dt


def test_a_tensor_task_compare_of_kit_dumps_imports_no_torch(tmp_path):
    """The analysis reads kit tensors as numpy arrays (bf16 and fp8 as float32): no torch in the compare."""
    import subprocess
    import sys
    _record(tmp_path / "a", "tensor", "L1", 0.0)
    _record(tmp_path / "b", "tensor", "L1", 1e-2)
    code = (f"import sys, msprobe_nb as mp\n"
            f"r = mp.compare(mp.load({str(tmp_path / 'a')!r}), mp.load({str(tmp_path / 'b')!r}), progress=False)\n"
            "low = r['npu_dtype'].isin(['torch.bfloat16', 'torch.float8_e4m3fn'])\n"
            "print(r.mode, int(r.loc[low, 'cosine'].notna().sum()), int((r['tensor_status'] == 'file').sum()),\n"
            "      'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["tensor", p.stdout.split()[1], "0", "False"] and int(p.stdout.split()[1]) >= 2
