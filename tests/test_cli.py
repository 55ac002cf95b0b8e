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
