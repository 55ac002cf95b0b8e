"""Whole chunks encoded by the writer (store/_chunk_codec.c, store/hdf5_direct_chunks.py) are the bytes HDF5's own
filter pipeline stores for them, so a dump written either way is the same file to every reader. HDF5 itself is
the reference: each case writes the data through its filters and reads the stored chunk back raw."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from msprobe_nb.store import hdf5_appends, hdf5_direct_chunks
from msprobe_nb.store.hdf5_filters import load_plugins, table_filter
from msprobe_nb.store.hdf5_layout import GROUPS
from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter

codec = hdf5_direct_chunks._chunk_codec
pytestmark = pytest.mark.skipif(
    codec is None or not load_plugins() or not hdf5_direct_chunks._bind(),
    reason="msprobe_nb.store._chunk_codec is not built (no C compiler at install) or hdf5plugin's bitshuffle "
           "library is missing: every chunk goes through HDF5's filters")

BITSHUFFLE = table_filter("bitshuffle")


def _data(dtype: str, n: int, pattern: str, rng: np.random.Generator) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, n).astype(bool) if pattern != "ones" else np.ones(n, bool)
    if pattern == "walk":  # what a column of ids or counters looks like
        return np.cumsum(rng.integers(-2, 3, n)).astype(dt)
    if pattern == "noise":  # incompressible: LZ4's output is larger than its input
        return rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8).view(dt)
    if pattern == "ones":  # every byte 0xff: the checksum's sums fold to 0xffff
        return np.full(n * dt.itemsize, 255, np.uint8).view(dt)
    return np.zeros(n, dt)


def _stored(f: h5py.File, name: str, data: np.ndarray, **filters) -> tuple[h5py.Dataset, bytes]:
    ds = f.create_dataset(name, shape=data.shape, maxshape=(None,), chunks=data.shape, dtype=data.dtype, **filters)
    ds[:] = data
    f.flush()
    mask, raw = ds.id.read_direct_chunk((0,))
    assert mask == 0
    return ds, raw


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "int32", "int8", "uint8", "uint16", "bool"])
def test_an_encoded_chunk_is_the_bytes_hdf5s_filters_store(tmp_path, dtype):
    rng = np.random.default_rng(7)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        for n in (4096, 1024, 1000, 17, 65536):
            for pattern in ("walk", "noise", "ones", "zeros"):
                data = _data(dtype, n, pattern, rng)
                ds, raw = _stored(f, f"{pattern}{n}", data, fletcher32=True, **BITSHUFFLE)
                encode = hdf5_direct_chunks.chunk_encoder(ds)
                assert encode is not None
                assert encode(np.ascontiguousarray(data, ds.dtype)) == raw, (dtype, n, pattern)


@pytest.mark.parametrize("nbytes", [1, 2, 3, 719, 720, 721, 1439, 1440, 1441, 4097])
def test_the_checksum_is_hdf5s_fletcher32(tmp_path, nbytes):
    rng = np.random.default_rng(nbytes)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        for k, data in enumerate((rng.integers(0, 256, nbytes, dtype=np.uint8), np.full(nbytes, 255, np.uint8),
                                  np.zeros(nbytes, np.uint8))):
            _, raw = _stored(f, f"d{k}", data, fletcher32=True)  # the data, then HDF5's checksum
            assert raw[:-4] == data.tobytes()
            assert codec.fletcher32(data) == int.from_bytes(raw[-4:], "little")


@pytest.mark.parametrize("filters", [
    {"compression": "lzf", "shuffle": True, "fletcher32": True},
    {"compression": "gzip", "fletcher32": True},
    dict(BITSHUFFLE),  # no checksum
    {**BITSHUFFLE, "compression_opts": (256, 2), "fletcher32": True},  # a block size of its own
    {**BITSHUFFLE, "compression_opts": (0, 0), "fletcher32": True},  # the bit transpose without LZ4
    {"fletcher32": True},
])
def test_any_other_pipeline_is_left_to_hdf5(tmp_path, filters):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        ds, _ = _stored(f, "d", np.arange(64, dtype=np.int64), **filters)
        assert hdf5_direct_chunks.chunk_encoder(ds) is None


def test_a_two_dimensional_or_compound_dataset_is_left_to_hdf5(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        two = f.create_dataset("two", shape=(8, 8), chunks=(8, 8), dtype="f8", fletcher32=True, **BITSHUFFLE)
        rec = f.create_dataset("rec", shape=(8,), maxshape=(None,), chunks=(8,), dtype=[("a", "f8"), ("b", "i4")],
                               fletcher32=True, **BITSHUFFLE)
        assert hdf5_direct_chunks.chunk_encoder(two) is None
        assert hdf5_direct_chunks.chunk_encoder(rec) is None


def test_encode_refuses_a_partial_element():
    with pytest.raises(ValueError, match="whole number of 8-byte elements"):
        codec.encode(b"\0" * 12, 8)
    with pytest.raises(ValueError, match="whole number"):
        codec.encode(b"", 8)


def _steps(chunk: int) -> list[dict]:
    rng = np.random.default_rng(3)
    sizes = [chunk - 5, 2 * chunk + 9, 700, chunk]  # fills the first chunk, then two more at once
    return [{"call_index": list(range(n)), "max": rng.standard_normal(n).tolist(), "numel": list(range(n)),
             "name": [f"s{s}.c{i % 37}" for i in range(n)], "is_kwarg": [bool(i % 3) for i in range(n)]}
            for s, n in enumerate(sizes)]


def _write(d, steps) -> list[DumpWriter]:
    with DumpWriter(d) as w:
        for s, cols in enumerate(steps):
            w.write_step(s, cols)
    return w


def test_a_dump_written_with_encoded_chunks_is_the_file_hdf5s_filters_make(tmp_path, monkeypatch):
    chunk = GROUPS["calls"][0]
    steps = _steps(chunk)
    written = []
    direct_write = hdf5_appends.DatasetWriter.write_chunks

    def spy(self, start, block, size):
        written.append((self.ds.name, start, len(block)))
        direct_write(self, start, block, size)
    monkeypatch.setattr(hdf5_appends.DatasetWriter, "write_chunks", spy)
    w = _write(tmp_path / "direct", steps)
    assert all(ds.encode is not None for ds in w._groups["calls"].main.values())
    calls = [x for x in written if x[0].startswith("/calls/")]
    assert len(calls) == 2 * len(GROUPS["calls"][1])  # two steps fill chunks: every column's went through the codec
    monkeypatch.setattr(hdf5_appends, "chunk_encoder", lambda ds: None)
    w = _write(tmp_path / "hdf5", steps)
    assert all(ds.encode is None for ds in w._groups["calls"].main.values())
    direct, hdf5 = read_hdf5(tmp_path / "direct"), read_hdf5(tmp_path / "hdf5")
    assert len(direct.calls) == sum(len(s["name"]) for s in steps)
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(direct.calls, hdf5.calls)
    files = [next((tmp_path / name).glob("*.h5")) for name in ("direct", "hdf5")]
    whole = len(direct.calls) // chunk
    assert whole == 4
    with h5py.File(files[0], "r") as a, h5py.File(files[1], "r") as b:
        for path in GROUPS["calls"][1]:
            x, y = a[path], b[path]
            assert x.id.get_num_chunks() == y.id.get_num_chunks() == whole
            for k in range(whole):
                assert x.id.read_direct_chunk((k * chunk,)) == y.id.read_direct_chunk((k * chunk,)), (path, k)
