"""Statistics of integer and bool CPU tensors (token ids, masks, indices, routing choices) from the C kernel:
torch's numbers all the same, and torch's reductions where the kernel does not apply."""
from __future__ import annotations

import pytest
import torch

from msprobe_nb.capture import stats
from msprobe_nb.capture.stats import Summarizer

pytestmark = pytest.mark.skipif(stats._int_at is None, reason="msprobe_nb.capture._fused_stats is not built "
                                                              "(no C compiler at install): torch's path only")


def _cases():
    g = torch.Generator().manual_seed(5)
    return [
        torch.randint(0, 50_257, (4, 128), generator=g),  # token ids
        torch.randint(-(2 ** 40), 2 ** 40, (1001,), generator=g),  # an odd count: the kernel's tail loop
        torch.tensor([-(2 ** 63), 2 ** 63 - 1, 0]),  # int64's extremes: max and min exact, sums in float64
        torch.tensor(7),  # 0-d
        torch.randint(-5, 5, (3, 5), dtype=torch.int32, generator=g),
        torch.randint(-30_000, 30_000, (17,), dtype=torch.int16, generator=g),
        torch.randint(-128, 127, (9,), dtype=torch.int8, generator=g),
        torch.randint(0, 255, (70_000,), dtype=torch.uint8, generator=g),
        torch.rand(5, 6, generator=g) > 0.4,  # a mask
        torch.ones(3, dtype=torch.bool), torch.zeros(4, dtype=torch.bool),
        torch.randint(0, 9, (6, 4), generator=g).t(),  # not contiguous: copied for the kernel
        torch.arange(16).expand(3, 16),  # expanded position ids
        (torch.rand(8, 8, generator=g) > 0.5)[:, 2:5],  # a slice of a mask
        torch._neg_view(torch.arange(5.0)).to(torch.int64)[::2],  # a plain copy first, then every other one
        torch.arange(2 ** 21).reshape(2, -1).t(),  # too large to copy: torch's path
    ]


def _summaries(cases):
    s = Summarizer()
    idx = [s.summarize(t) for t in cases]
    values, _ = s.materialize()
    return [tuple(values[i]) for i in idx]


def test_integer_and_bool_tensors_get_torchs_statistics_through_the_kernel(monkeypatch):
    cases = _cases()
    want = [stats._cpu_stats(t) for t in cases]  # torch's reductions
    through_torch = []
    real = stats._cpu_stats
    monkeypatch.setattr(stats, "_cpu_stats", lambda t: through_torch.append(t) or real(t))
    got = _summaries(cases)
    for t, g, w in zip(cases, got, want):
        assert g[:2] == w[:2] and g[4:] == w[4:], (t.dtype, g, w)  # max, min, counts: exact
        for a, b in zip(g[2:4], w[2:4]):  # mean and norm: float64 sums in another order
            assert a == pytest.approx(b, rel=1e-12), (t.dtype, g, w)
    assert got[0][:2] == (float(cases[0].max()), float(cases[0].min()))
    assert got[8][2] == cases[8].sum().item() / 30
    assert len(through_torch) == 1 and through_torch[0].numel() == 2 ** 21  # only the large transpose


def test_without_the_kernel_torchs_path_gives_the_same_numbers(monkeypatch):
    cases = _cases()
    with_kernel = _summaries(cases)
    monkeypatch.setattr(stats, "_int_at", None)  # as where setup.py found no compiler
    without = _summaries(cases)
    for g, w in zip(with_kernel, without):
        assert g[:2] == w[:2] and g[4:] == w[4:]
        assert g[2:4] == pytest.approx(w[2:4], rel=1e-12)


def test_the_kernel_refuses_bad_arguments():
    t = torch.arange(4)
    with pytest.raises(ValueError):
        stats._int_at(t.data_ptr(), 0, 0)
    with pytest.raises(ValueError):
        stats._int_at(t.data_ptr(), 4, 6)
    with pytest.raises(ValueError):
        stats._int_at(0, 4, 0)
