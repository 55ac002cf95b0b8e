"""seed_all: an honest report, env vars, range checks (bitwise-reproducible runs: test_seeding_runs.py)."""
from __future__ import annotations

import os
import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from msprobe_nb.seeding import DETERMINISTIC_ENV, SeedReport, seed_all

ENV_VARS = ("PYTHONHASHSEED", *DETERMINISTIC_ENV)


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


class _FakeNpu:
    def __init__(self, available: bool) -> None:
        self.available, self.seeds = available, []

    def is_available(self) -> bool:
        return self.available

    def manual_seed(self, seed: int) -> None:
        self.seeds.append(("one", seed))

    def manual_seed_all(self, seed: int) -> None:
        self.seeds.append(("all", seed))


def _fake_torch_npu(monkeypatch: pytest.MonkeyPatch, npu: object | None, error: Exception | None = None) -> None:
    """torch_npu as importlib sees it: found, and importing it gives a module with ``npu`` or raises ``error``."""
    import importlib
    import importlib.util
    import types

    find, load = importlib.util.find_spec, importlib.import_module
    module = types.SimpleNamespace(npu=npu)

    def fake_find(name: str, *a: object) -> object:
        return object() if name == "torch_npu" else find(name, *a)

    def fake_import(name: str, *a: object) -> object:
        if name != "torch_npu":
            return load(name, *a)
        if error is not None:
            raise error
        return module

    monkeypatch.setattr(importlib.util, "find_spec", fake_find)
    monkeypatch.setattr(importlib, "import_module", fake_import)


@pytest.mark.usefixtures("clean_state")
@pytest.mark.parametrize("available", [True, False])
def test_torch_npu_present_is_seeded_and_says_whether_an_npu_is_there(monkeypatch: pytest.MonkeyPatch,
                                                                      available: bool) -> None:
    npu = _FakeNpu(available)
    _fake_torch_npu(monkeypatch, npu)
    report = seed_all(11, verbose=False)
    assert npu.seeds == [("one", 11), ("all", 11)]
    one, every = report["torch_npu.npu.manual_seed"], report["torch_npu.npu.manual_seed_all"]
    assert one.applied and every.applied and one.value == "11"
    if available:
        assert (one.note, every.note) == ("current NPU", "all NPUs")
    else:
        assert one.note == every.note == "torch_npu imported but no NPU available (seed queued for lazy init)"


@pytest.mark.usefixtures("clean_state")
def test_a_broken_torch_npu_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_torch_npu(monkeypatch, None, RuntimeError("libascendcl.so not found"))
    report = seed_all(12, verbose=False)
    for what in ("torch_npu.npu.manual_seed", "torch_npu.npu.manual_seed_all"):
        item = report[what]
        assert not item.applied and item.note == "torch_npu import failed: RuntimeError: libascendcl.so not found"
    assert report["torch.manual_seed"].applied  # the rest is still seeded


@pytest.mark.usefixtures("clean_state")
def test_the_summary_counts_and_groups_what_was_not_applied() -> None:
    report = SeedReport(1, False)
    report.add("a", 1, True)
    report.add("b", 2, False, "why one")
    report.add("c", 3, False, "why two")
    report.add("d", 4, False, "why one")
    assert report.applied == ["a"] and report.skipped == ["b", "c", "d"] and len(report) == 4
    assert report.summary() == ("seed_all(seed=1, mode=False): 1 of 4 items applied; not applied: why one (2), "
                                "why two (1)")
    done = SeedReport(2, True)
    done.add("x", "v", True)
    assert done.summary() == "seed_all(seed=2, mode=True): 1 of 1 items applied"


def test_the_report_as_text_and_html_lines_up_and_escapes() -> None:
    report = SeedReport(7, True)
    report.add("random.seed", 7, True, "note a")
    report.add("env <X>", "a&b", False, "skipped")
    lines = str(report).splitlines()
    assert lines[0] == "SeedReport(seed=7, mode=True)"
    assert lines[1].split() == ["item", "value", "applied", "note"]
    assert lines[2] == "random.seed  7      yes      note a"  # columns as wide as their widest cell
    assert lines[3] == "env <X>      a&b    no       skipped"
    html = report._repr_html_()
    assert "<code>env &lt;X&gt;</code>" in html and "<code>a&amp;b</code>" in html
    assert html.count("color:gray") == 1 and html.count("color:inherit") == 1
    assert html.count("&#10003;") == 1 and html.count("&mdash;") == 1
    assert html.startswith("<div><b>seed_all(seed=7, mode=True)</b><table>")
    assert list(report.to_frame()["applied"]) == [True, False]


@pytest.mark.usefixtures("clean_state")
def test_the_last_report_is_kept_for_the_setup_record() -> None:
    import msprobe_nb.seeding as seeding

    report = seed_all(8, verbose=False)
    assert seeding.last_report is report


@pytest.mark.usefixtures("clean_state")
def test_unsigned_numpy_seed_at_the_top_of_the_range_and_mode_reported() -> None:
    report = seed_all(np.uint32(2**32 - 1), mode=True, verbose=False)
    assert report.seed == 2**32 - 1 and isinstance(report.seed, int)
    item = report["torch.use_deterministic_algorithms"]
    assert item.value == "True, warn_only=False" and item.note == "ops without a deterministic kernel raise"
    report = seed_all(1, mode=0, warn_only=True, verbose=False)  # type: ignore[arg-type]
    assert report.mode is False and report["torch.use_deterministic_algorithms"].value == "False"
    assert report["torch.use_deterministic_algorithms"].note == "off: nondeterministic kernels allowed"
    report = seed_all(1, mode=True, warn_only=True, verbose=False)
    assert report["torch.use_deterministic_algorithms"].note == "ops without a deterministic kernel warn"
    assert not seed_all(2, verbose=False)["env CUBLAS_WORKSPACE_CONFIG"].applied


@pytest.mark.usefixtures("clean_state")
def test_an_unrecognised_cublas_setting_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    report = seed_all(3, mode=True, verbose=False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and report["env CUBLAS_WORKSPACE_CONFIG"].applied
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert "kept" in seed_all(3, mode=True, verbose=False)["env CUBLAS_WORKSPACE_CONFIG"].note


@pytest.mark.usefixtures("clean_state")
def test_the_defaults_and_the_cudnn_flags_as_reported() -> None:
    enabled = torch.backends.cudnn.enabled
    report = seed_all(verbose=False)
    assert report.seed == 1234 and report.mode is False
    assert torch.backends.cudnn.enabled == enabled  # cuDNN stays as it was unless asked
    assert report["torch.backends.cudnn.deterministic"].value == "True"
    assert report["torch.backends.cudnn.benchmark"].value == "False"
    assert torch.backends.cudnn.deterministic is True and torch.backends.cudnn.benchmark is False


@pytest.mark.usefixtures("clean_state")
def test_a_kept_cublas_setting_counts_as_applied_and_only_cublas_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    monkeypatch.setenv("ATB_LLM_LCOC_ENABLE", ":16:8")  # a cuBLAS-looking value elsewhere is not kept
    monkeypatch.setenv("HCCL_DETERMINISTIC", ":4096:8")
    report = seed_all(4, mode=True, verbose=False)
    assert report["env CUBLAS_WORKSPACE_CONFIG"].applied
    assert os.environ["ATB_LLM_LCOC_ENABLE"] == "0" and os.environ["HCCL_DETERMINISTIC"] == "true"
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    report = seed_all(4, mode=True, verbose=False)
    if not torch.cuda.is_available():  # the note says nothing of an initialised CUDA
        assert report["env CUBLAS_WORKSPACE_CONFIG"].note == DETERMINISTIC_ENV["CUBLAS_WORKSPACE_CONFIG"][1]


@pytest.mark.usefixtures("clean_state")
def test_torch_npu_without_is_available_counts_as_no_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    class Bare:
        def manual_seed(self, seed: int) -> None:
            pass

        def manual_seed_all(self, seed: int) -> None:
            pass

    _fake_torch_npu(monkeypatch, Bare())
    note = seed_all(5, verbose=False)["torch_npu.npu.manual_seed"].note
    assert note == "torch_npu imported but no NPU available (seed queued for lazy init)"


def test_the_html_greys_what_was_not_applied() -> None:
    report = SeedReport(7, True)
    report.add("random.seed", 7, True, "note a")
    report.add("env X", "v", False, "skipped")
    html = report._repr_html_()
    assert "<tr style='color:inherit'><td><code>random.seed</code></td><td><code>7</code></td><td>&#10003;</td>" in html
    assert "<tr style='color:gray'><td><code>env X</code></td><td><code>v</code></td><td>&mdash;</td>" in html
