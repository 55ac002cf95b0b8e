"""The flush at a step's end (store/hdf5_writer.py, ``DumpWriter._flush``).

A step that fills no chunk writes its tails and its commit row in place, past HDF5, and then skips HDF5's flush:
there is nothing in HDF5 to write. Whatever calls HDF5 to change the file (a chunk filled, an extent grown, a
chunk's first write, the tensor buffers) must still be flushed before the commit row, or a kill after the commit
leaves a file whose last step points at metadata that never reached the disk. The copy test below reads the
file as a kill right after each ``write_step`` would leave it.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from msprobe_nb.store.hdf5_reader import read_hdf5
from msprobe_nb.store.hdf5_writer import DumpWriter


@pytest.fixture
def flushes(monkeypatch):
    """The calls of HDF5's flush made by every DumpWriter, counted per writer."""
    seen: dict[int, int] = {}
    real = DumpWriter._create

    def create(self, *args, **kw):
        real(self, *args, **kw)
        f = self._file
        flush = f.flush

        def counted():
            seen[id(self)] = seen.get(id(self), 0) + 1
            flush()
        f.flush = counted

    monkeypatch.setattr(DumpWriter, "_create", create)
    return seen


def _names(step: int, n: int) -> dict:
    return {"name": [f"n{i % 7}" for i in range(n)], "call_index": np.arange(n), "numel": np.arange(n) + step}


def test_only_steps_that_call_hdf5_to_change_the_file_are_flushed(tmp_path, flushes):
    with DumpWriter(tmp_path / "d") as w:
        def flushed(step, cols, **kw):
            before = flushes.get(id(w), 0)
            w.write_step(step, cols, **kw)
            return flushes.get(id(w), 0) - before

        assert flushed(0, _names(0, 10)) == 1  # the tails' and the index's first chunks: allocated by HDF5
        assert [flushed(s, _names(s, 10)) for s in range(1, 6)] == [0] * 5  # all in place
        assert flushed(6, _names(6, 4096)) == 1  # the calls chunk fills: compressed chunks, extents, the other slot
        assert [flushed(s, _names(s, 10)) for s in (7, 8)] == [0, 0]
        assert flushed(9, {**_names(9, 10), "shape": [(9, 2)] * 10}) == 1  # the first shape: its groups' first rows
        assert flushed(10, {**_names(10, 10), "shape": [(10, 2)] * 10}) == 0  # another: after them, in place
        assert flushed(11, {**_names(11, 10), "name": ["new"] * 10}) == 0  # a new string: likewise
        assert flushed(12, _names(12, 3), tensors={"t": torch.ones(5)}) == 1  # the tensor buffers, through h5py
        assert flushed(13, _names(13, 10)) == 0
        w.mark_dropped(14)  # written in place as well
        assert flushed(15, _names(15, 10)) == 0


def test_a_flush_that_failed_is_made_at_the_next_step(tmp_path, flushes):
    with DumpWriter(tmp_path / "d") as w:
        w.write_step(0, _names(0, 10))
        real = w._file.flush
        w._file.flush = lambda: (_ for _ in ()).throw(OSError(28, "No space left on device"))
        with pytest.raises(OSError):
            w.write_step(1, _names(1, 4096))  # fills a chunk: HDF5 has something to write, and fails
        w._file.flush = real
        before = flushes.get(id(w), 0)
        w.write_step(1, _names(1, 10))  # in place, but the failed step's changes are still HDF5's
        assert flushes.get(id(w), 0) == before + 1
    assert read_hdf5(tmp_path / "d").meta["steps"] == [0, 1]


@pytest.mark.parametrize("seed", [0, 1])
def test_the_file_as_a_kill_after_each_step_leaves_it_reads_every_step(tmp_path, seed):
    # steps of every kind, in a random order: small ones in place, ones that fill chunks of the calls table,
    # new strings and shapes, tensors, dropped steps; after each, the file's bytes are copied (what a kill
    # leaves: HDF5's caches are lost, the operating system's are not) and the copy must read every step
    rng = np.random.default_rng(seed)
    d, copy = tmp_path / "d", tmp_path / "copy"
    written: dict[int, int] = {}
    with DumpWriter(d) as w:
        step = 0
        for k in range(40):
            kind = rng.integers(0, 6)
            n = int(rng.integers(1, 40)) if kind < 3 else int(rng.integers(1000, 5000))
            if kind == 5 and k % 2:
                w.mark_dropped(step)
                step += 1
            cols = _names(step, n)
            if kind == 1:
                cols["name"] = [f"new{step}"] * n
            if kind == 2:
                cols["shape"] = [(step, 2)] * n
            tensors = {f"t{step}": torch.full((n,), float(step))} if kind == 4 else None
            w.write_step(step, cols, tensors=tensors)
            written[step] = n
            step += 1
            shutil.rmtree(copy, ignore_errors=True)
            copy.mkdir()
            shutil.copyfile(d / "rank0.h5", copy / "rank0.h5")
            parts = read_hdf5(copy)
            c = parts.calls
            assert parts.meta["steps"] == sorted(written), k
            for s, m in written.items():
                rows = c[c["step"] == s]
                assert len(rows) == m and rows["numel"].tolist() == list(range(s, s + m)), (k, s)


def test_a_dataset_writer_counts_each_call_into_hdf5_and_no_write_in_place(tmp_path):
    import h5py

    from msprobe_nb.store.hdf5_appends import DatasetWriter
    from msprobe_nb.store.hdf5_direct_chunks import chunk_encoder
    from msprobe_nb.store.hdf5_filters import table_filter

    with h5py.File(tmp_path / "f.h5", "w", rdcc_nbytes=0) as f:
        tail = DatasetWriter(f.create_dataset("t", shape=(2, 8), dtype="int64", chunks=(1, 8)), in_place=True)
        tail.write_at((0, 0), np.ones((1, 3), np.int64))  # the chunk's first write: HDF5 allocates it
        tail.write_at((0, 3), np.ones((1, 3), np.int64))  # then in place
        assert tail.hdf5_calls == 1
        main = f.create_dataset("m", shape=(0,), maxshape=(None,), dtype="int64", chunks=(4,), fletcher32=True,
                                **table_filter("bitshuffle"))
        m = DatasetWriter(main, chunk_encoder(main))
        m.set_extent((8,))
        assert m.hdf5_calls == 1
        assert m.encode is not None
        m.write_chunks(0, np.arange(8), 4)
        assert m.hdf5_calls == 2
