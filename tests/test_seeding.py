"""seed_all: bitwise-reproducible runs, an honest report, env vars, range checks."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import msprobe_nb.config
from msprobe_nb.seeding import DETERMINISTIC_ENV, SeedReport, seed_all

REPO = Path(msprobe_nb.config.__file__).resolve().parents[1]
ENV_VARS = ("PYTHONHASHSEED", *DETERMINISTIC_ENV)

SCRIPT = textwrap.dedent("""
    import hashlib, random, subprocess, sys
    import numpy as np, torch
    from msprobe_nb.seeding import seed_all

    seed_all(int(sys.argv[1]), mode=True, verbose=False)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.5),
                                torch.nn.Linear(16, 4))
    x = torch.randn(32, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    order = [int(i) for b in torch.utils.data.DataLoader(range(10), batch_size=3, shuffle=True) for i in b]
    child = subprocess.run([sys.executable, "-c", "print(hash('msprobe'))"], capture_output=True, text=True)
    h = hashlib.sha256()
    for t in (x, loss.detach(), *(p.grad for p in model.parameters()), torch.rand(5)):
        h.update(t.contiguous().numpy().tobytes())
    h.update(np.random.rand(5).tobytes())
    h.update(repr((random.random(), order, child.stdout)).encode())
    print(h.hexdigest())
""")


@pytest.fixture
def clean_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unset the env vars seed_all writes (monkeypatch restores them) and restore torch/RNG globals after."""
    for name in ENV_VARS:
        monkeypatch.setenv(name, "placeholder")  # records the original value (or its absence) for undo
        monkeypatch.delenv(name)
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cudnn = torch.backends.cudnn
    flags = cudnn.deterministic, cudnn.benchmark, cudnn.enabled
    yield
    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])
    torch.use_deterministic_algorithms(False)
    cudnn.deterministic, cudnn.benchmark, cudnn.enabled = flags


def run_script(tmp_path: Path, seed: int) -> str:
    script = tmp_path / "train_step.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("PYTHONHASHSEED", None)
    out = subprocess.run([sys.executable, str(script), str(seed)], check=False, capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_two_runs_are_bitwise_identical(tmp_path: Path) -> None:
    first, second = run_script(tmp_path, 1234), run_script(tmp_path, 1234)
    assert len(first) == 64 and first == second
    assert run_script(tmp_path, 4321) != first  # the digest does depend on the seed


@pytest.mark.usefixtures("clean_state")
def test_report_lists_items_and_what_was_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    report = seed_all(99, mode=True)
    assert isinstance(report, SeedReport) and (report.seed, report.mode) == (99, True)
    assert capsys.readouterr().out.count("\n") == 1  # verbose: one line
    for what in ("env PYTHONHASHSEED", "random.seed", "numpy.random.seed", "torch.manual_seed",
                 "torch.use_deterministic_algorithms", "env CUBLAS_WORKSPACE_CONFIG", "env HCCL_DETERMINISTIC"):
        assert report[what].applied, what
    assert report["torch.manual_seed"].value == "99"
    if not torch.cuda.is_available():
        for what in ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all"):
            assert not report[what].applied and report[what].note == "CUDA not available"
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        assert not report["torch_npu.npu.manual_seed_all"].applied
        assert "torch_npu" in report["torch_npu.npu.manual_seed_all"].note
    assert not report["torch.backends.cudnn.enabled"].applied  # cuDNN is only disabled when asked
    assert "CUDA not available" in report.summary() or torch.cuda.is_available()
    with pytest.raises(KeyError):
        report["nothing"]


@pytest.mark.usefixtures("clean_state")
def test_report_views() -> None:
    report = seed_all(5, verbose=False)
    frame = report.to_frame()
    assert list(frame.columns) == ["what", "value", "applied", "note"] and len(frame) == len(report)
    assert frame["applied"].dtype == bool
    text = str(report)
    assert text.splitlines()[0] == "SeedReport(seed=5, mode=False)" and "numpy.random.seed" in text
    html = report._repr_html_()
    assert html.count("<tr") == len(report) + 1 and "torch.manual_seed" in html
    assert [i.what for i in report] == list(frame["what"])


@pytest.mark.usefixtures("clean_state")
def test_global_generators_are_seeded() -> None:
    seed_all(2024, verbose=False)
    a = (random.random(), np.random.rand(), torch.rand(3))
    seed_all(2024, verbose=False)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[:2] == b[:2] and torch.equal(a[2], b[2])


@pytest.mark.usefixtures("clean_state")
def test_mode_true_sets_env_and_determinism() -> None:
    report = seed_all(1, mode=True, verbose=False)
    assert os.environ["PYTHONHASHSEED"] == "1"
    for name, (value, _) in DETERMINISTIC_ENV.items():
        assert os.environ[name] == value and report[f"env {name}"].applied
    assert os.environ["HCCL_DETERMINISTIC"] == "true" and os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark


@pytest.mark.usefixtures("clean_state")
def test_mode_false_leaves_device_env_alone() -> None:
    torch.use_deterministic_algorithms(True)
    report = seed_all(1, mode=False, verbose=False)
    assert os.environ["PYTHONHASHSEED"] == "1"
    for name in DETERMINISTIC_ENV:
        assert name not in os.environ and not report[f"env {name}"].applied
    assert not torch.are_deterministic_algorithms_enabled()  # mode is applied either way, like msprobe


@pytest.mark.usefixtures("clean_state")
def test_warn_only_disable_cudnn_and_kept_cublas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    report = seed_all(3, mode=True, warn_only=True, disable_cudnn=True, verbose=False)
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.enabled is False and report["torch.backends.cudnn.enabled"].value == "False"
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and "kept" in report["env CUBLAS_WORKSPACE_CONFIG"].note


@pytest.mark.usefixtures("clean_state")
def test_numpy_integer_seed_and_bounds() -> None:
    assert seed_all(np.int64(7), verbose=False).seed == 7
    assert seed_all(0, verbose=False).seed == 0
    assert seed_all(2**32 - 1, verbose=False).seed == 2**32 - 1


@pytest.mark.parametrize("bad", [-1, 2**32, 1.5, "1234", True, None])
def test_bad_seed_raises(bad: object) -> None:
    with pytest.raises(ValueError, match=r"seed must be an int in 0\.\.4294967295"):
        seed_all(bad, verbose=False)  # type: ignore[arg-type]
