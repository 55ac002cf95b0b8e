"""What recording does when the disk, the folder or another process gets in the way (our issue 14).

A full disk never renumbers or merges steps, a second writer never deletes the first one's data, an
unusable dump_path is refused at start(), and a live dump stays readable.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import msprobe_nb as mp
from msprobe_nb.store.hdf5_writer import DumpWriteError, DumpWriter


# ------------------------------------------------------------------ helpers
def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _record(path: Path, steps: int, before_step=None, **kw) -> tuple[dict[int, Exception], mp.Debugger]:
    """Record ``steps`` steps of a small model in tensor mode, each with its own input (so a renumbered step
    shows, and each step needs fresh disk space);
    ``before_step(s)`` runs before step ``s`` is written. Returns the errors step() raised, by step."""
    model = _model()
    dbg = mp.Debugger(dump_path=path, level="mix", task="tensor", **kw)
    dbg.start(model)
    errors: dict[int, Exception] = {}
    for s in range(steps):
        model(torch.full((4, 8), float(s + 1))).sum().backward()
        model.zero_grad()
        if before_step is not None:
            before_step(s)
        try:
            dbg.step()
        except DumpWriteError as e:
            errors[s] = e
    dbg.close()
    return errors, dbg


def _frames(frames: list[str]) -> tuple[str, ...]:
    """A stack up to ``_record`` (outermost last): what lies beyond depends on who called it."""
    mine = [i for i, fr in enumerate(frames) if ", in _record," in fr]
    return tuple(frames[:mine[0] + 1] if mine else frames)


def _rows(d, step: int) -> pd.DataFrame:
    """One step's rows without the step column, with each row's stack frames in place of its stack id."""
    c = d.calls[d.calls["step"] == step].drop(columns=["step"]).reset_index(drop=True)
    c["stack_id"] = [_frames(d.stack_frames.get(int(i), [])) for i in c["stack_id"]]
    return c


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> mp.Dump:
    """20 steps recorded with nothing in the way."""
    path = tmp_path_factory.mktemp("ref") / "dump"
    errors, _ = _record(path, 20)
    assert not errors
    return mp.load(path)


def _same_as_reference(d, reference, steps) -> None:
    """Each of ``steps`` holds the reference's rows and tensors of that step."""
    for s in steps:
        rows = _rows(d, s)
        pd.testing.assert_frame_equal(rows, _rows(reference, s), obj=f"step {s}")
        for name in set(rows["data_name"]) - {""}:
            assert torch.equal(d.load_tensor(name, s, 0), reference.load_tensor(name, s, 0)), (s, name)


# ------------------------------------------------------------------ 1. a full disk
def test_a_step_the_disk_refuses_is_dropped_and_marked_and_no_step_is_renumbered(tmp_path, monkeypatch, reference):
    """Writing steps 3 and 4 fails with ENOSPC (the marks of the drops are refused too, until step 5):
    every other step keeps its number and its own rows, and the dump lists 3 and 4 as dropped."""
    full = {"on": False}
    write, append = DumpWriter._write, DumpWriter._append_index

    def flaky_write(self, step, *args):
        full["on"] = step in (3, 4)
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(self, step, *args)

    def flaky_append(self, row):
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(self, row)

    monkeypatch.setattr(DumpWriter, "_write", flaky_write)
    monkeypatch.setattr(DumpWriter, "_append_index", flaky_append)
    errors, dbg = _record(tmp_path / "d", 8)

    assert sorted(errors) == [3, 4]
    for s, e in errors.items():
        assert isinstance(e, OSError) and e.errno == errno.ENOSPC and e.step == s
        assert f"step {s} could not be written" in str(e) and "No space left on device" in str(e)
        assert str(tmp_path / "d" / "rank0.h5") in str(e)
    assert sorted(dbg.dropped_steps) == [3, 4]
    d = mp.load(tmp_path / "d")
    assert d.steps == [0, 1, 2, 5, 6, 7] and d.dropped_steps == [3, 4]
    assert [x["step"] for x in d.meta["dropped"]] == [3, 4] and "ENOSPC" in d.meta["dropped"][0]["reason"]
    assert "dropped steps 3,4" in repr(d)
    _same_as_reference(d, reference, d.steps)


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a real full disk needs a small tmpfs: mounting one needs root and mount(8)")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode:
        pytest.skip(f"mounting a tmpfs is not allowed here: {proc.stderr.strip()}")


@pytest.fixture
def small_disk(tmp_path):
    where = tmp_path / "small disk"
    _mount_tmpfs(where, "32m")  # tensor mode: each step takes a little over 1 MiB
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte with a ballast file."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        for size in (65536, 4096, 512, 1):  # down to the last partial block
            try:
                while os.write(fd, b"\0" * size) == size:
                    pass
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return ballast


def test_a_real_full_disk_drops_steps_but_every_step_reported_written_is_intact(small_disk, reference):
    """On a 32 MiB tmpfs: 5 steps, then the disk is filled to the last byte, 5 more steps, then the space
    comes back and 10 more. Each step step() reported written is there, numbered right, with its own rows;
    each step that raised is listed as dropped."""
    ballast = []

    def before_step(s):
        if s == 5:
            ballast.append(_fill(small_disk))
        if s == 10:
            ballast.pop().unlink()

    errors, _ = _record(small_disk / "dump", 20, before_step)
    assert errors and set(errors) <= set(range(5, 10)), errors  # the full disk did refuse steps
    assert all(e.errno == errno.ENOSPC for e in errors.values())
    d = mp.load(small_disk / "dump")
    written = [s for s in range(20) if s not in errors]
    assert d.steps == written and d.dropped_steps == sorted(errors)
    _same_as_reference(d, reference, written)


# ------------------------------------------------------------------ 2. a second process on the same dump_path
def _second_writer(path: str, on_exists: str, hold, go, out) -> None:
    """Child process: record steps 0-2 to ``path`` (``hold``: report, wait for ``go``, record 3-4), close."""
    def wait(s):
        if s == 3:
            out.put(("recording", str(path), os.getpid()))
            go.wait(120)

    try:
        errors, dbg = _record(Path(path), 5 if hold else 3, wait, on_exists=on_exists)
        out.put(("done", str(dbg.dump_dir), os.getpid()) if not errors else ("error", repr(errors), os.getpid()))
    except Exception as e:  # reported to the test, which expects it for the second writer
        out.put(("error", f"{type(e).__name__}: {e}", os.getpid()))


def test_a_second_process_on_the_same_dump_path_fails_at_start_or_writes_beside_it(tmp_path, reference):
    """Process A records to a path and is still going. Process B, on the same path: with "overwrite" (and
    "error") start() refuses at once, naming the path and A's pid; with "new" it writes to <path>_1. A's
    five steps are all there."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    path = tmp_path / "run"
    out, go = ctx.Queue(), ctx.Event()
    a = ctx.Process(target=_second_writer, args=(str(path), "overwrite", True, go, out))
    a.start()
    try:
        kind, where, a_pid = out.get(timeout=120)
        assert (kind, where) == ("recording", str(path)), where
        for on_exists in ("overwrite", "error", "new"):
            b = ctx.Process(target=_second_writer, args=(str(path), on_exists, False, go, out))
            b.start()
            b.join(120)
            kind, what, _ = out.get(timeout=5)
            if on_exists == "new":
                assert (kind, what) == ("done", str(tmp_path / "run_1")), what
            else:  # "error": the path holds A's dump; "overwrite": it is A's, being written
                want = "DumpInUseError" if on_exists == "overwrite" else "FileExistsError"
                assert kind == "error" and what.startswith(want), what
                assert str(path) in what and f"pid {a_pid}" in what, what
    finally:
        go.set()
        a.join(120)
    assert out.get(timeout=5) == ("done", str(path), a_pid)
    d = mp.load(path)
    assert d.steps == [0, 1, 2, 3, 4]
    _same_as_reference(d, reference, range(5))
    assert mp.load(tmp_path / "run_1").steps == [0, 1, 2]
    assert sorted(p.name for p in path.iterdir()) == ["rank0.h5", "setup_rank0.json"]  # the lock went with its writer


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path):
    """A run killed while recording leaves its rank0.lock behind; the next run on that path takes it over."""
    import signal
    import sys

    path = tmp_path / "run"
    path.mkdir()
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from msprobe_nb.store.hdf5_writer import DumpLock\n"
        "DumpLock.claim(sys.argv[1], 0)\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"), str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(FileExistsError, match=f"pid {child.pid}"):
            DumpWriter(path)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (path / "rank0.lock").exists()
    errors, dbg = _record(path, 2, on_exists="error")
    assert not errors and dbg.dump_dir == path and mp.load(path).steps == [0, 1]
    assert not (path / "rank0.lock").exists()


# ------------------------------------------------------------------ 3. unusable paths, partial steps, creation
def _read_only_dir(tmp_path: Path) -> Path:
    """A folder nobody may write: a read-only tmpfs when we are root (root ignores mode bits), else mode 0o555."""
    where = tmp_path / "read only"
    if os.geteuid() == 0:
        _mount_tmpfs(where, "1m")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
    else:
        where.mkdir()
        where.chmod(0o555)
    return where


@pytest.mark.parametrize("case", ["a file", "under a file", "read-only"])
def test_an_unusable_dump_path_is_refused_at_start_naming_the_path_and_the_problem(tmp_path, case):
    if case == "read-only":
        path = _read_only_dir(tmp_path) / "dump"
        problem = r"read-only file system|not writable"
    else:
        (tmp_path / "file").write_text("not a folder")
        path = tmp_path / "file" if case == "a file" else tmp_path / "file" / "dump"
        problem = "is not a directory" if case == "a file" else r"'.*file' is a file, not a folder"
    dbg = mp.Debugger(dump_path=path, level="mix")
    try:
        with pytest.raises(OSError, match=problem) as e:
            dbg.start(_model())
        assert str(path) in str(e.value)
        assert not dbg.recording
        dbg.step()  # nothing was recorded: nothing to write, and nothing raises again
    finally:
        dbg.close()
        if case == "read-only":
            subprocess.run(["umount", "-l", str(path.parent)], check=False)


def test_a_step_cut_short_by_an_exception_is_flagged_partial(tmp_path):
    """stop() called from an except block, and record() left by an exception: the step is flagged partial.
    A stop() with no exception in flight is an ordinary step."""
    model, x = _model(), torch.ones(4, 8)
    dbg = mp.Debugger(dump_path=tmp_path / "stop", level="mix")
    dbg.start(model)
    model(x).sum().backward()
    dbg.step()
    try:
        model(x)
        raise RuntimeError("the user's step failed")
    except RuntimeError:
        dbg.stop()
    dbg.start()
    model(x).sum()
    dbg.stop()  # step 1 goes on after the failure; no exception now, but the step stays partial
    dbg.step()
    dbg.start()
    model(x).sum().backward()
    dbg.close()
    d = mp.load(tmp_path / "stop")
    assert d.steps == [0, 1, 2] and d.partial_steps == [1] and "partial steps 1" in repr(d)

    with pytest.raises(ValueError, match="boom"), mp.record(dump_path=tmp_path / "rec", level="mix",
                                                           model=model) as dbg:
        model(x).sum().backward()
        dbg.step()
        model(x)
        raise ValueError("boom")
    d = mp.load(tmp_path / "rec")
    assert d.steps == [0, 1] and d.partial_steps == [1]
    assert d.meta["partial"] == [{"rank": 0, "step": 1}]


KILLED_WHILE_CREATING = """
import sys, time
from msprobe_nb.store import hdf5_appends as w
from msprobe_nb.store.hdf5_writer import DumpWriter
real = w.ColumnGroup.__init__
def slow(self, f, name, *a, **kw):
    real(self, f, name, *a, **kw)
    if name == "strings":  # the file exists, its header is not complete
        f.flush()
        print("creating", flush=True)
        time.sleep(120)
w.ColumnGroup.__init__ = slow
DumpWriter(sys.argv[1])
"""


def test_a_kill_while_the_file_is_created_leaves_no_rank_file_behind(tmp_path):
    """Killed while it creates rank0.h5, a run leaves no unreadable rank0.h5: the next run on the same path
    writes there (not to <path>_1), and removes what the killed one left."""
    import signal
    import sys

    path = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_CREATING, str(path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "creating"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert not (path / "rank0.h5").exists()
    errors, dbg = _record(path, 2)
    assert not errors and dbg.dump_dir == path
    assert mp.load(path).steps == [0, 1]
    assert sorted(p.name for p in path.iterdir()) == ["rank0.h5", "setup_rank0.json"]  # and the run's set-up


# ------------------------------------------------------------------ 4. live reads
LIVE_WRITER = """
import sys, time, torch
from pathlib import Path
from msprobe_nb.store.hdf5_writer import DumpWriter
stop, most = Path(sys.argv[2]), int(sys.argv[3])
with DumpWriter(sys.argv[1], meta={"task": "tensor"}) as w:
    s = 0
    while (not stop.exists() or s < 8) and s < most:
        n = 100 + 37 * (s % 9)  # steps crossing chunk boundaries at different points
        w.write_step(s, {"name": [f"s{s}.n{k}" for k in range(n)], "numel": list(range(s, s + n))},
                     tensors={f"t{s}": torch.full((300 + s,), float(s))})
        print(s, flush=True)
        s += 1
        time.sleep(0.005)
"""


def _check_live_step(d, s: int) -> None:
    rows = d.calls[d.calls["step"] == s]
    n = 100 + 37 * (s % 9)
    assert rows["name"].tolist() == [f"s{s}.n{k}" for k in range(n)]
    assert rows["numel"].tolist() == list(range(s, s + n))
    assert torch.equal(d.load_tensor(f"t{s}", s, 0), torch.full((300 + s,), float(s)))


def test_a_live_dump_reads_again_after_a_tensor_read(tmp_path):
    """A writer process keeps recording; this process loads the dump, reads a tensor (its loader keeps the
    file open), and loads again, six times, then once more after the writer has exited. Every load is
    whole and right (before the fix, every load after a tensor read failed, the last one too)."""
    import sys

    path, stop = tmp_path / "live", tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(path), str(stop), "400"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0", child.stderr.read()
        seen = []
        for _ in range(6):
            d = mp.load(path)
            s = d.steps[-1]
            _check_live_step(d, s)
            again = mp.load(path)
            assert again.steps[:len(d.steps)] == d.steps == list(range(len(d.steps)))
            _check_live_step(again, again.steps[-1])
            seen.append(len(again.steps))
        assert seen[-1] > seen[0]  # the writer was going on meanwhile
    finally:
        stop.touch()
        out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    written = int(out.split()[-1]) + 1
    final = mp.load(path)  # the loaders above still hold the file open
    assert final.steps == list(range(written))
    for s in final.steps[::7] + final.steps[-3:]:
        _check_live_step(final, s)


def test_a_slow_reader_of_a_live_dump_gets_the_rows_of_the_commit_it_read(tmp_path, monkeypatch):
    """A reader that takes a second between reading the commit index and the tails: meanwhile the writer
    fills several chunks and writes each tail slot again. The rows read are still those of that commit."""
    import sys
    import time

    from msprobe_nb.store import hdf5_reader

    check = hdf5_reader.check_extents

    def slow(*args):
        check(*args)
        time.sleep(1.0)

    monkeypatch.setattr(hdf5_reader, "check_extents", slow)
    path, stop = tmp_path / "live", tmp_path / "stop"
    child = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(path), str(stop), "5000"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "0", child.stderr.read()
        time.sleep(0.3)
        for _ in range(2):
            d = mp.load(path)
            c = d.calls
            for s in d.steps:
                rows = c[c["step"] == s]
                n = 100 + 37 * (s % 9)
                assert rows["name"].tolist() == [f"s{s}.n{k}" for k in range(n)], s
                assert rows["numel"].tolist() == list(range(s, s + n)), s
    finally:
        stop.touch()
        child.communicate(timeout=60)


@pytest.mark.parametrize("layout", [3, 4])
def test_layout_3_and_4_files_still_read(tmp_path, layout):
    """Files of layout 3 (the same tails, index rows without ``flags``) and 4 (without checksums) read as
    they did."""
    import h5py

    from msprobe_nb.store.hdf5_layout import INDEX_FIELDS, INDEX_FIELDS_V3, INDEX_FIELDS_V4

    with DumpWriter(tmp_path / "d", meta={"task": "tensor"}) as w:
        for s in range(3):
            n = 3000 * s + 5  # crossing the calls chunk (4096 rows)
            w.write_step(s, {"name": [f"s{s}.n{k}" for k in range(n)], "numel": list(range(n))},
                         tensors={f"t{s}": torch.arange(s + 1)})
    want = mp.load(tmp_path / "d")
    f = tmp_path / "d" / "rank0.h5"
    fields = INDEX_FIELDS_V3 if layout == 3 else INDEX_FIELDS_V4
    with h5py.File(f, "r+") as h:
        rows = h["index/steps"][()]
        del h["index/steps"]
        keep = [INDEX_FIELDS.index(k) for k in fields]
        ds = h.create_dataset("index/steps", data=rows[:, keep], maxshape=(None, len(keep)), chunks=(256, len(keep)))
        ds.attrs["fields"] = json.dumps(fields)
        h.attrs["layout_version"] = layout
        del h.attrs["attrs_crc"]
    got = mp.load(tmp_path / "d")
    pd.testing.assert_frame_equal(got.calls, want.calls)
    assert got.steps == [0, 1, 2] and torch.equal(got.load_tensor("t2", 2, 0), torch.arange(3))


# ------------------------------------------------------------------ 5. integrity
def _three_steps(d: Path, rows: int = 5) -> Path:
    with DumpWriter(d, meta={"task": "statistics", "note": "kept as written"}) as w:
        for s in range(3):
            w.write_step(s, {"name": [f"s{s}.n{k}" for k in range(rows)], "numel": [s * 1000 + k for k in range(rows)]})
    return d / "rank0.h5"


def _flip(f: Path, offset: int) -> None:
    with open(f, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x10]))


def test_a_flipped_byte_in_a_tail_is_refused_naming_the_file_the_step_and_the_dataset(tmp_path):
    import h5py

    f = _three_steps(tmp_path / "d")
    with h5py.File(f, "r") as h:
        tail = h["tail/calls"]
        record = np.dtype([tuple(c) for c in json.loads(tail.attrs["columns"])])
        chunk = tail.id.get_chunk_info_by_coord((0, 0, 0))  # slot 0: every row so far
    _flip(f, chunk.byte_offset + 7 * record.itemsize + record.fields["calls/numel"][1])  # row 7: step 1's
    with pytest.raises(mp.DumpFormatError, match=r"/tail/calls fails its checksum in the rows of step 1") as e:
        mp.load(tmp_path / "d")
    assert str(f) in str(e.value)


def test_a_flipped_byte_in_the_commit_index_is_refused(tmp_path):
    import h5py

    from msprobe_nb.store.hdf5_layout import INDEX_FIELDS

    f = _three_steps(tmp_path / "d")
    with h5py.File(f, "r") as h:
        chunk = h["index/steps"].id.get_chunk_info(0)
    _flip(f, chunk.byte_offset + (1 * len(INDEX_FIELDS) + INDEX_FIELDS.index("step")) * 8)  # row 1: step 1 -> 17
    with pytest.raises(mp.DumpFormatError, match=r"/index/steps row 1 \(step 17\) fails its checksum") as e:
        mp.load(tmp_path / "d")
    assert str(f) in str(e.value)


def test_a_flipped_byte_in_the_last_committed_row_of_the_index_is_refused(tmp_path):
    """The newest commit is the one a crash or a bad disk hits first: its row is checked like every other."""
    import h5py

    from msprobe_nb.store.hdf5_layout import INDEX_FIELDS

    f = _three_steps(tmp_path / "d")
    with h5py.File(f, "r") as h:
        chunk = h["index/steps"].id.get_chunk_info(0)
        last = int(np.flatnonzero(h["index/steps"][()][:, INDEX_FIELDS.index("step")] == 2)[-1])
    _flip(f, chunk.byte_offset + (last * len(INDEX_FIELDS) + INDEX_FIELDS.index("step")) * 8)  # step 2 -> 18
    with pytest.raises(mp.DumpFormatError, match=rf"/index/steps row {last} \(step 18\) fails its checksum") as e:
        mp.load(tmp_path / "d")
    assert str(f) in str(e.value)


def test_a_flipped_byte_in_the_meta_attribute_is_refused(tmp_path):
    f = _three_steps(tmp_path / "d")
    data = f.read_bytes()
    at = data.find(b"kept as written")
    assert at > 0 and data.find(b"kept as written", at + 1) < 0
    _flip(f, at + 3)  # "kept" -> "ke{t": still valid JSON, a different value
    with pytest.raises(mp.DumpFormatError, match=r"attributes .* fail their checksum") as e:
        mp.load(tmp_path / "d")
    assert str(f) in str(e.value)


def test_a_flipped_byte_in_a_compressed_chunk_is_refused(tmp_path):
    import h5py

    f = _three_steps(tmp_path / "d", rows=3000)  # 9000 rows: two whole chunks of /calls/*
    with h5py.File(f, "r") as h:
        chunk = h["calls/numel"].id.get_chunk_info(1)
    _flip(f, chunk.byte_offset + chunk.size // 2)
    with pytest.raises(mp.DumpFormatError, match=r"/calls/numel rows 0\.\.8191 are corrupt") as e:
        mp.load(tmp_path / "d")
    assert str(f) in str(e.value)
