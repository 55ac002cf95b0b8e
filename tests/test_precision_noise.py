"""Precision noise is not a divergence; a wrong kernel is, wherever it sits (issue 30).

Both runs under bf16 autocast (or an fp32 bench); the NPU run's compute calls carry about one bf16 ulp of
noise, forward and backward (tests/noise_harness.py). A clean pair must be quiet: no first divergence, no
row graded ``error``. A planted wrong kernel must be named exactly, API and counter.
"""
from __future__ import annotations

import warnings

import pytest

from msprobe_nb.analysis.compare import CompareError, compare
from msprobe_nb.analysis.precision_model import ANOMALOUS, Precision

pytest.importorskip("transformers", reason="transformers is not installed")
import noise_harness as H  # noqa: E402

_CACHE: dict = {}


def dumps(tmp_path_factory, name, level, plant=None, plant_backward=None, fp32_bench=False, task="statistics"):
    """(npu, bench) dumps, each recorded once per session."""
    base = tmp_path_factory.getbasetemp()
    bkey = (name, level, fp32_bench, task)
    if bkey not in _CACHE:
        _CACHE[bkey] = H.record(base / f"bench_{name}_{level}_{int(fp32_bench)}_{task}", name, level=level,
                                task=task, autocast=not fp32_bench)
    nkey = (name, level, plant, plant_backward, task)
    if nkey not in _CACHE:
        tag = f"{plant}_{plant_backward}".replace(" ", "").replace("'", "").replace(",", "-")
        _CACHE[nkey] = H.record(base / f"npu_{name}_{level}_{tag}_{task}", name, level=level, task=task,
                                noise=H.DeviceNoise(plant=plant, plant_backward=plant_backward))
    return _CACHE[nkey], _CACHE[bkey]


def run(npu, bench, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return compare(npu, bench, **kw)


@pytest.mark.parametrize("level", ["mix", "L1"])
@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "cnn"])
def test_a_clean_noisy_pair_is_within_precision(tmp_path_factory, name, level):
    r = run(*dumps(tmp_path_factory, name, level))
    assert r.first_divergence() is None
    assert (r["result"] != "error").all(), r[r["result"] == "error"][["name", "reasons"]]
    assert not (r["verdict"] == ANOMALOUS).any()
    assert r.precision_summary().startswith("every call within bf16 precision; largest output error")
    assert "precision model: every call within bf16 precision" in r.summary()
    assert (r["msprobe_result"] != "pass").any()  # msprobe's own grades are kept beside


def test_without_the_precision_model_the_noise_is_a_divergence(tmp_path_factory):
    """The exact rule alone (precision=False) names the first noisy call: what the model fixes."""
    npu, bench = dumps(tmp_path_factory, "gpt2", "mix")
    d = run(npu, bench, precision=False).first_divergence()
    assert d is not None and d.call == "Functional.layer_norm.0.forward"


SOFTMAX = ("softmax", 1)
PLANTS = {
    "gpt2": [(SOFTMAX, "Functional.softmax.1.forward"), (("gelu", 1), "Functional.gelu.1.forward"),
             (("layer_norm", 2), "Functional.layer_norm.2.forward"), (("addmm", 3), "Torch.addmm.3.forward")],
    "llama": [(SOFTMAX, "Functional.softmax.1.forward"), (("silu", 1), "Functional.silu.1.forward"),
              (("rsqrt", 2), "Torch.rsqrt.2.forward"), (("linear", 3), "Functional.linear.3.forward")],
    "bert": [(SOFTMAX, "Functional.softmax.1.forward"), (("gelu", 1), "Functional.gelu.1.forward"),
             (("layer_norm", 2), "Functional.layer_norm.2.forward"), (("linear", 3), "Functional.linear.3.forward")],
    "cnn": [(("relu", 1), "Functional.relu.1.forward"), (("linear", 0), "Functional.linear.0.forward")],
}
BACKWARD = {"gpt2": ("gelu", 0), "llama": ("silu", 0), "bert": ("gelu", 0), "cnn": ("relu", 0)}
LEVEL = {"gpt2": "mix", "llama": "L1", "bert": "mix", "cnn": "L1"}  # each model at one level, both covered
CASES = [(m, LEVEL[m], p, None, want) for m, ps in PLANTS.items() for p, want in ps] + \
    [(m, LEVEL[m], None, b, f"Functional.{b[0]}.{b[1]}.backward") for m, b in BACKWARD.items()]


@pytest.mark.parametrize("name,level,plant,plant_backward,want", CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[4]}" for c in CASES])
def test_a_wrong_kernel_among_the_noise_is_named(tmp_path_factory, name, level, plant, plant_backward, want):
    r = run(*dumps(tmp_path_factory, name, level, plant, plant_backward))
    d = r.first_divergence()
    assert d is not None and d.call == want, (d, r.precision_summary())
    assert d.message.startswith("anomalous: own error") and "allows for" in d.message


@pytest.mark.parametrize("plant,plant_backward,want", [
    (None, None, None), (SOFTMAX, None, "Functional.softmax.1.forward"),
    (("layer_norm", 2), None, "Functional.layer_norm.2.forward"),
    (None, ("gelu", 0), "Functional.gelu.0.backward")])
def test_an_fp32_bench_against_a_bf16_run(tmp_path_factory, plant, plant_backward, want):
    """Autocast on the NPU side only: its dtypes differ by design, so a dtype difference is not a root."""
    r = run(*dumps(tmp_path_factory, "gpt2", "mix", plant, plant_backward, fp32_bench=True))
    d = r.first_divergence()
    assert (d.call if d else None) == want, d
    if want is None:
        assert (r["result"] != "error").all()
        assert (r["npu_dtype"] != r["bench_dtype"]).any()


@pytest.mark.parametrize("plant,plant_backward,want", [
    (None, None, None), (("layer_norm", 2), None, "Functional.layer_norm.2.forward"),
    (None, ("gelu", 0), "Functional.gelu.0.backward")])
def test_the_tensor_task_too(tmp_path_factory, plant, plant_backward, want):
    """Tensor dumps of bf16 runs compare (whole tensors) and the verdicts hold the same."""
    r = run(*dumps(tmp_path_factory, "gpt2", "L1", plant, plant_backward, task="tensor"))
    assert r.mode == "tensor" and r["rel_l2_err"].notna().any()
    d = r.first_divergence()
    assert (d.call if d else None) == want, d
    if want is None:
        assert (r["result"] != "error").all()


def test_precision_options_are_checked(tmp_path_factory):
    npu, bench = dumps(tmp_path_factory, "cnn", "L1")
    assert Precision.of({"tolerance": 8}).tolerance == 8
    with pytest.raises(CompareError, match="tolerance"):
        run(npu, bench, precision={"tolerance": -1})
    with pytest.raises(CompareError, match="unknown precision options"):
        run(npu, bench, precision={"tol": 3})
    # a tolerance far under 1 calls the noise itself anomalous
    assert run(npu, bench, precision={"tolerance": 0.05}).first_divergence() is not None


def test_the_viewer_opens_on_the_within_precision_summary(tmp_path_factory):
    pytest.importorskip("ipywidgets")
    from msprobe_nb.viewers.compare_viewer import CompareViewer
    r = run(*dumps(tmp_path_factory, "cnn", "L1"))
    assert "every call within bf16 precision" in CompareViewer(r).answer_html()
    r = run(*dumps(tmp_path_factory, "cnn", "L1", ("relu", 1)))
    html = CompareViewer(r).answer_html()
    assert "Functional.relu.1.forward" in html and "anomalous: own error" in html
