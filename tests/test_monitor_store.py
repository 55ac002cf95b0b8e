"""The monitor's record keeps the kit's crash rules: a killed run keeps every finished step, a step cut short is
never read, the record is readable while it is written, and a damaged file is an error naming it."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest

import msprobe_nb as mp
from msprobe_nb.store import monitor_store
from msprobe_nb.store.monitor_store import MonitorWriter, read_monitor

REPO = Path(__file__).resolve().parents[1]
COLUMNS = ["norm", "numel"]


def _step(w: MonitorWriter, step: int, n: int = 4) -> None:
    names = [f"layer{i}.weight" for i in range(n)]
    w.write_step(step, names, ["grad"] * n, np.full((n, 2), float(step)), {"loss": step / 10})


def test_the_record_is_readable_while_it_is_written(tmp_path):
    w = MonitorWriter(tmp_path / "live", 0, COLUMNS, {"what": "live"})
    for s in range(3):
        _step(w, s)
    assert read_monitor(tmp_path / "live")[0]["steps"].tolist() == [0, 1, 2]
    for s in range(3, 5):
        _step(w, s)
    m = mp.load_monitor(tmp_path / "live")
    assert m.steps == [0, 1, 2, 3, 4] and m.meta[0]["what"] == "live"
    w.close()
    assert not (tmp_path / "live" / "monitor_rank0.lock").exists()


def test_steps_that_outgrow_every_table_s_extent_read_back_exactly(tmp_path):
    """Each table keeps its dataspaces between writes and renews them when its extent grows: steps that grow
    every table several times (rows, scalars, names, the commit index) read back value for value."""
    w = MonitorWriter(tmp_path / "grow", 0, COLUMNS)
    rng = np.random.default_rng(0)
    want = []
    for step in range(300):
        n = int(rng.integers(1, 40))
        names = [f"s{step % 7}.p{i}" for i in range(n)]
        values = rng.standard_normal((n, 2))
        w.write_step(step, names, ["grad"] * n, values, {"loss": float(step), f"extra{step}": -1.0})
        want.append(values)
    w.close()
    m = mp.load_monitor(tmp_path / "grow")
    assert m.steps == list(range(300))
    got = m.stats.sort_values(["step"], kind="stable")[["norm", "numel"]].to_numpy()
    np.testing.assert_array_equal(got, np.concatenate(want))
    sc = m.scalars
    assert sc["loss"].tolist() == [float(i) for i in range(300)]
    assert [sc.loc[sc["step"] == k, f"extra{k}"].item() for k in (0, 150, 299)] == [-1.0] * 3


def test_a_step_with_the_last_step_s_names_but_other_kinds_keeps_its_kinds(tmp_path):
    """The writer reuses the last step's name and kind ids when they repeat; kinds that changed under the same
    names are written as they are."""
    w = MonitorWriter(tmp_path / "k", 0, COLUMNS)
    names = ["a.weight", "a.weight"]
    w.write_step(0, names, ["grad", "weight"], np.ones((2, 2)), {})
    w.write_step(1, names, ["weight", "exp_avg"], np.ones((2, 2)), {})
    w.write_step(2, list(names), ["weight", "exp_avg"], np.ones((2, 2)), {})
    w.close()
    st = mp.load_monitor(tmp_path / "k").stats
    assert st.groupby("step")["kind"].apply(list).to_dict() == {
        0: ["grad", "weight"], 1: ["weight", "exp_avg"], 2: ["weight", "exp_avg"]}


def test_a_step_cut_short_is_never_read_and_the_next_one_is(tmp_path, monkeypatch):
    w = MonitorWriter(tmp_path / "cut", 0, COLUMNS)
    _step(w, 0)
    real = monitor_store.DatasetWriter.write_at

    def failing(table, start, arr):
        if table.ds.name == "/index/steps" and arr[0, -1] == monitor_store.COMMIT_MAGIC:
            raise OSError(28, "No space left on device")
        real(table, start, arr)

    monkeypatch.setattr(monitor_store.DatasetWriter, "write_at", failing)
    with pytest.raises(OSError, match="No space"):
        w.write_step(1, ["new.name"], ["grad"], np.ones((1, 2)), {"loss": 1.0})  # its rows are in the file
    r = read_monitor(tmp_path / "cut")[0]
    assert r["steps"].tolist() == [0] and len(r["values"]) == 4 and "new.name" not in r["names"]
    monkeypatch.setattr(monitor_store.DatasetWriter, "write_at", real)
    w.write_step(2, ["new.name"], ["grad"], np.full((1, 2), 7.0), {"loss": 2.0})
    w.close()
    m = mp.load_monitor(tmp_path / "cut")
    assert m.steps == [0, 2]
    assert m.stats.loc[m.stats["step"] == 2, ["name", "norm"]].values.tolist() == [["new.name", 7.0]]


_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    import msprobe_nb as mp
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    # no torch.optim: its first step imports torch._dynamo, seconds of a short test (the hooks are tested elsewhere)
    mon = mp.Monitor(model, dump_path={path!r}, activations=True, signs=True, alerts=False)
    x, y = torch.randn(32, 16), torch.randn(32, 4)
    for step in range(100000):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 1e-3 * p.grad
        mon.step(loss=loss)
        model.zero_grad()
        print("done", step, flush=True)
""")


def test_a_run_killed_at_a_random_step_keeps_every_finished_step(tmp_path):
    kill_after = random.Random(18).randint(3, 60)  # seeded: the test is the same every run
    path = tmp_path / "killed"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "-c", _CHILD.format(repo=str(REPO), path=str(path))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        done = -1
        for line in p.stdout:
            done = int(line.split()[1])
            if done >= kill_after:
                os.kill(p.pid, signal.SIGKILL)  # lands in the next step: its compute or its write
                break
    finally:
        p.kill()
        p.wait()
    assert done == kill_after, p.stderr.read()
    m = mp.load_monitor(path)
    n = len(m.steps)
    assert m.steps == list(range(n)) and n >= kill_after + 1  # every finished step, maybe one more
    per_step = m.stats.groupby("step").size()
    assert per_step.nunique() == 1  # no step is partly there
    assert m.scalars["loss"].notna().all()
    signs, blob = m.signs(0)
    assert signs["step"].nunique() == n and int((signs["start"] + signs["nbytes"]).max()) <= len(blob)


def _broken_index(path: Path) -> None:
    with h5py.File(path, "r+") as f:
        row = f["index/steps"][1]
        row[1] += 1  # the rows extent, so the crc no longer matches
        f["index/steps"][1] = row


def test_a_damaged_file_is_an_error_naming_it(tmp_path):
    w = MonitorWriter(tmp_path / "d", 0, COLUMNS)
    for s in range(3):
        _step(w, s)
    w.close()
    f = tmp_path / "d" / "monitor_rank0.h5"
    _broken_index(f)
    with pytest.raises(mp.DumpFormatError, match=r"monitor_rank0\.h5.*index row 1 \(step 1\) fails its checksum"):
        mp.load_monitor(tmp_path / "d")
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 3])  # truncated
    with pytest.raises(mp.DumpFormatError, match=r"monitor_rank0\.h5"):
        mp.load_monitor(tmp_path / "d")
    with h5py.File(tmp_path / "other.h5", "w") as h:
        h.attrs["format"] = "something else"
    with pytest.raises(mp.DumpFormatError, match="not a monitor record"):
        mp.load_monitor(tmp_path / "other.h5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(mp.DumpFormatError, match="holds no monitor_rank<N>.h5"):
        mp.load_monitor(tmp_path / "empty")


def test_ranks_are_files_of_one_folder(tmp_path):
    for rank in (1, 0):
        w = MonitorWriter(tmp_path / "ddp", rank, COLUMNS)
        _step(w, 0)
        _step(w, 1)
        w.close()
    m = mp.load_monitor(tmp_path / "ddp")
    assert sorted(m.meta) == [0, 1] and m.stats.groupby("rank").size().tolist() == [8, 8]
    assert m.scalars[["step", "rank"]].values.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
