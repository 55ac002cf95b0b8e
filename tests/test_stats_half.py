"""Statistics of float16 / bfloat16 CPU tensors (autocast's activations): widened once for the C kernel,
torch's values all the same, and torch's reductions where the kernel does not apply."""
from __future__ import annotations

import pytest
import torch

from msprobe_nb.capture import stats
from msprobe_nb.capture.stats import Summarizer

pytestmark = pytest.mark.skipif(stats._fused_at is None, reason="msprobe_nb.capture._fused_stats is not built "
                                                                "(no C compiler at install): torch's path only")


def _cases(dtype):
    g = torch.Generator().manual_seed(3)
    big = torch.randn(70_000, generator=g) * 50
    bad = torch.randn(40, generator=g)
    bad[3], bad[17] = float("nan"), float("inf")
    return [torch.randn(4, 16, 32, generator=g).to(dtype), big.to(dtype), torch.tensor(2.5, dtype=dtype),
            torch.randn(64, 8, generator=g).to(dtype).t(),  # not contiguous: widened into a contiguous copy
            torch.randn(6, 5, generator=g).to(dtype).requires_grad_(), bad.to(dtype),
            torch.full((33,), 6e4 if dtype is torch.float16 else 3e38, dtype=dtype)]  # bf16: squares beyond float32


def _summaries(cases):
    s = Summarizer()
    idx = [s.summarize(t) for t in cases]
    values, _ = s.materialize()
    return [tuple(values[i]) for i in idx]


def _same(a, b) -> bool:
    """Equal, value by value, a NaN equal to a NaN."""
    return len(a) == len(b) and all((x != x and y != y) or x == y for x, y in zip(a, b))


def _agree(got, want):
    assert _same(got[:2], want[:2]) and _same(got[4:], want[4:]), (got, want)  # max, min, counts: exact
    for g, w in zip(got[2:4], want[2:4]):  # mean and norm: float32 accumulation, another summation order
        assert (g != g and w != w) or g == pytest.approx(w, rel=2e-6), (got, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_tensors_get_torchs_statistics_through_the_kernel(dtype, monkeypatch):
    cases = _cases(dtype)
    want = [stats._cpu_stats(t.detach()) for t in cases]  # torch's reductions
    through_torch = []
    real = stats._cpu_stats
    monkeypatch.setattr(stats, "_cpu_stats", lambda t: through_torch.append(t) or real(t))
    got = _summaries(cases)
    for g, w in zip(got, want):
        _agree(g, w)
    # none went to torch's path: the kernel counts the NaN and the inf of the tensor that has them
    assert through_torch == []
    assert got[5][4:] == (1.0, 1.0, 0.0)
    assert dtype is torch.float16 or got[6][3] == float("inf")  # bf16: the float32 sum of squares overflows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_tensors_without_the_kernel_or_too_large_take_torchs_path(dtype, monkeypatch):
    cases = _cases(dtype)
    want = [stats._cpu_stats(t.detach()) for t in cases]
    monkeypatch.setattr(stats, "_fused_at", None)  # as where setup.py found no compiler
    assert all(_same(g, w) for g, w in zip(_summaries(cases), want))
    monkeypatch.undo()
    monkeypatch.setattr(stats, "HALF_WIDEN_MAX_NUMEL", 100)  # the float32 copy would be too large
    called = []
    half = stats._half_stats
    monkeypatch.setattr(stats, "_half_stats", lambda t, n: called.append(n) or half(t, n))
    got = _summaries(cases)
    assert called and max(called) <= 100 and _same(got[1], want[1])


def test_a_recorded_autocast_step_is_unchanged_and_summarised(tmp_path):
    """Recording a bfloat16 autocast step changes no bit; its half-precision rows have statistics."""
    from msprobe_nb.debugger import Debugger
    from msprobe_nb.store.dump import load

    def step(path=None):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
        x = torch.randn(8, 16)
        dbg = Debugger(dump_path=str(path), level="L1", task="statistics") if path else None
        if dbg:
            dbg.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        if dbg:
            dbg.stop()
            dbg.close()
        return [loss.detach()] + [p.grad for p in model.parameters()]

    plain, recorded = step(), step(tmp_path / "d")
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded))
    calls = load(str(tmp_path / "d")).calls
    half = calls[calls["dtype"] == "torch.bfloat16"]
    assert len(half) > 4 and half["max"].notna().all() and half["norm"].notna().all()
