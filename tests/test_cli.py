"""The msprobe-nb command: compare, info, export, msprobe's legacy input, and clean errors (exit code 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from msprobe_nb.analysis.compare import MSPROBE_HEADERS
from msprobe_nb.cli import main

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"
TOY = SHARED / "interop" / "msprobe-cpu-toy-L1"
needs_toy = pytest.mark.skipif(not (TOY / "stat_L1_npu").is_dir(), reason=f"msprobe interop data not found under {TOY}")
NPU, BENCH = str(TOY / "stat_L1_npu"), str(TOY / "stat_L1_bench")


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


@needs_toy
def test_compare_writes_msprobe_csv(tmp_path, capsys):
    out = tmp_path / "result.csv"
    rc, text, _ = run(capsys, "compare", NPU, BENCH, "-o", str(out))
    assert rc == 0
    # 2 msprobe warnings; the diverging rows are warnings too, and the first divergence's are errors
    assert "366 rows, 346 pass, 18 warning, 2 error" in text and "first divergence: Torch.softmax.0.forward" in text
    df = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert list(df.columns[:28]) == MSPROBE_HEADERS["statistics"] and len(df) == 366


@needs_toy
def test_compare_output_folder_and_aliases(tmp_path, capsys):
    rc, _, _ = run(capsys, "compare", "-tp", NPU, "-gp", BENCH, "-o", str(tmp_path / "outdir"), "-q")
    assert rc == 0
    assert len(list((tmp_path / "outdir").glob("compare_result_*.csv"))) == 1


@needs_toy
def test_legacy_compare_json(tmp_path, capsys):
    cfg = {"npu_path": f"{NPU}/dump.json", "bench_path": f"{BENCH}/dump.json",
           "stack_path": f"{NPU}/stack.json", "is_print_compare_log": True}
    (tmp_path / "compare.json").write_text(json.dumps(cfg))
    rc, text, _ = run(capsys, "-f", "pytorch", "compare", "-i", str(tmp_path / "compare.json"),
                      "-o", str(tmp_path), "--fail-on", "warning")
    assert rc == 1  # warnings (msprobe's two, and the diverging rows)
    assert "mode statistics" in text and list(tmp_path.glob("compare_result_*.csv"))
    cfg["is_print_compare_log"] = False
    (tmp_path / "quiet.json").write_text(json.dumps(cfg))
    rc, text, _ = run(capsys, "compare", "-i", str(tmp_path / "quiet.json"), "--fail-on", "error")
    assert rc == 1 and text == ""  # the first divergence is an error


@needs_toy
def test_compare_options(tmp_path, capsys):
    mapping = tmp_path / "m.json"
    mapping.write_text(json.dumps({"names": {}}))
    rc, text, _ = run(capsys, "compare", NPU, BENCH, "--fuzzy", "--mapping", str(mapping), "--mode", "statistics",
                      "--rank-map", "0:0", "--diverge-rtol", "0.5", "--msprobe-levels")
    assert rc == 0 and "no divergence" in text and "fuzzy" in text


@needs_toy
def test_info_and_export(tmp_path, capsys):
    rc, text, _ = run(capsys, "info", NPU, "--calls", "2")
    assert rc == 0 and "task statistics, level L1" in text and "Functional.embedding.0.forward" in text
    rc, text, _ = run(capsys, "export", NPU, "-o", str(tmp_path / "exp"))
    assert rc == 0 and (tmp_path / "exp" / "step0" / "rank0" / "dump.json").is_file()
    rc, _, err = run(capsys, "export", NPU, "-o", str(tmp_path / "x"), "--format", "parquet")
    assert rc == 2 and "unknown export format" in err


@pytest.mark.parametrize("argv, message", [
    (["compare", "/no/such/npu", "/no/such/bench"], "NPU dump not found"),
    (["compare"], "compare needs two dumps"),
    (["compare", "a", "b", "-i", "c.json"], "either NPU BENCH paths or -i"),
    (["compare", "-i", "/no/such/compare.json"], "compare input file not found"),
    (["compare", "a", "b", "--rank-map", "x"], "--rank-map"),
    (["info", "/no/such/dump"], "no such file"),
])
def test_bad_input_exits_2_without_traceback(capsys, argv, message):
    rc, _, err = run(capsys, *argv)
    assert rc == 2 and err.startswith("msprobe-nb: error:") and message in err


def test_bad_legacy_json(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{not json")
    rc, _, err = run(capsys, "compare", "-i", str(tmp_path / "bad.json"))
    assert rc == 2 and "not valid JSON" in err
    (tmp_path / "keys.json").write_text(json.dumps({"npu_path": "x"}))
    rc, _, err = run(capsys, "compare", "-i", str(tmp_path / "keys.json"))
    assert rc == 2 and "npu_path and bench_path" in err


@needs_toy
def test_mode_and_mapping_errors(tmp_path, capsys):
    rc, _, err = run(capsys, "compare", NPU, BENCH, "--mode", "tensor")
    assert rc == 2 and "tensor mode needs tensor dumps" in err
    rc, _, err = run(capsys, "compare", NPU, BENCH, "--mapping", str(tmp_path / "none.yaml"))
    assert rc == 2 and "mapping file not found" in err
    (tmp_path / "dump.json").write_text("{broken")
    rc, _, err = run(capsys, "compare", str(tmp_path / "dump.json"), BENCH)
    assert rc == 2 and "error" in err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "compare" in capsys.readouterr().err


def test_python_dash_m():
    p = subprocess.run([sys.executable, "-m", "msprobe_nb.cli", "--help"], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0 and "compare" in p.stdout
    p = subprocess.run([sys.executable, "-m", "msprobe_nb.cli", "compare", "/no/a", "/no/b"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "not found" in p.stderr


def _cli(*argv, cwd=REPO):
    """The installed command, as a user runs it: a subprocess (stdout, stderr, exit code)."""
    p = subprocess.run([sys.executable, "-m", "msprobe_nb.cli", *argv], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    return p.returncode, p.stdout, p.stderr


def test_version_and_did_you_mean():
    rc, out, err = _cli("--version")
    assert rc == 0 and out.startswith("msprobe-nb 0.") and "torch" in out, (out, err)
    rc, _, err = _cli("config", "--levle", "mix")
    assert rc == 2 and "--levle (did you mean '--level'?)" in err and "Traceback" not in err, err
    rc, _, err = _cli("compare", "a", "b", "--fuzy")
    assert rc == 2 and "did you mean '--fuzzy'?" in err, err


def test_notes_are_plain_lines_not_userwarnings(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"task": "statistics", "level": "L1", "risk_level": "high"}))
    rc, out, err = _cli("config", str(cfg))
    assert rc == 0 and "records statistics L1" in out, (out, err)
    assert "msprobe-nb: note: risk_level='high' ignored" in err and "Warning" not in err, err
    assert err.count("risk_level") == 1, err


@pytest.fixture(scope="module")
def random_dumps(tmp_path_factory):
    """The randomness tutorial's two dumps (the demo's first step)."""
    from msprobe_nb.demo import training_step

    out = tmp_path_factory.mktemp("demo")
    training_step(out / "npu", "npu")
    training_step(out / "bench", "bench")
    return out


def test_compare_prints_the_divergence_its_trace_and_its_fix(random_dumps):
    rc, out, err = _cli("compare", str(random_dumps / "npu" / "rank0.h5"), str(random_dumps / "bench" / "rank0.h5"))
    assert rc == 0, err
    assert "first divergence: Torch.randint.0.forward" in out, out
    assert "random draw Torch.randint.0.forward" in out and "demo.py" in out, out
    assert "fix: randint: draw it on the host" in out and "--host-random" in out, out


def test_monitor_folder_points_to_the_monitor_readers(tmp_path):
    import torch

    import msprobe_nb as mp

    model = torch.nn.Linear(3, 3)
    mon = mp.Monitor(model, dump_path=tmp_path / "mon")
    model(torch.randn(2, 3)).sum().backward()
    mon.step(loss=1.0)
    mon.close()
    with pytest.raises(FileNotFoundError, match=r"training monitor record.*load_monitor.*msprobe-nb monitor"):
        mp.load(tmp_path / "mon")
    for target in (tmp_path / "mon", tmp_path / "mon" / "monitor_rank0.h5"):
        rc, _, err = _cli("info", str(target))
        assert rc == 2 and "load_monitor(" in err and "msprobe-nb monitor" in err, err


def test_the_clone_s_parent_folder_is_named(tmp_path):
    """Run where a `msprobe_nb/` folder without __init__.py (the clone, seen from its parent) would shadow the
    package for Python started there: the command says so."""
    (tmp_path / "msprobe_nb" / "msprobe_nb").mkdir(parents=True)
    env_cwd = tmp_path
    p = subprocess.run([str(Path(sys.executable).with_name("msprobe-nb")), "--version"], cwd=env_cwd,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "no attribute 'record'" in p.stderr and "work inside the clone" in p.stderr, p.stderr
    rc, _, err = _cli("--version")
    assert "no attribute 'record'" not in err, err


def test_demo_removes_its_folder_and_says_what_next(tmp_path):
    env = {**__import__("os").environ, "TMPDIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "msprobe_nb.demo"], cwd=REPO, capture_output=True, text=True,
                       timeout=180, env=env)
    assert p.returncode == 0, p.stderr
    assert not list(tmp_path.glob("msprobe_nb_demo_*")), list(tmp_path.iterdir())
    assert "removed the demo's temporary folder" in p.stdout and "next: " in p.stdout, p.stdout
    assert "03_randomness" in p.stdout, p.stdout
