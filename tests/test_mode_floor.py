"""The empty C mode handlers of benchmarks/bench_mode_floor.py: torch accepts them, and they only call the function."""
from __future__ import annotations

import types

import pytest
import torch
from torch.overrides import TorchFunctionMode

floor = pytest.importorskip("msprobe_nb.capture._mode_floor", reason="the C extension is not built (no compiler)")


class _FunctionMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.__torch_function__ = types.MethodType(floor.passthrough, self)


class _TypeMode(TorchFunctionMode):
    __torch_function__ = floor.Passthrough()


@pytest.mark.parametrize("mode", [_FunctionMode, _TypeMode], ids=["C function", "C type"])
def test_the_empty_c_handlers_compute_what_torch_computes(mode):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g)
    want = (torch.add(a, a, alpha=2), a @ b, torch.nn.functional.softmax(a, dim=-1), a.sum(dim=1, keepdim=True))
    with mode():
        got = (torch.add(a, a, alpha=2), a @ b, torch.nn.functional.softmax(a, dim=-1), a.sum(dim=1, keepdim=True))
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))


def test_bad_calls_are_type_errors():
    with pytest.raises(TypeError, match="passthrough"):
        floor.passthrough(None, torch.add)
    with pytest.raises(TypeError, match="tuple"):
        floor.passthrough(None, torch.add, (), [torch.ones(1)])
    with pytest.raises(TypeError, match="dict or None"):
        floor.passthrough(None, torch.add, (), (torch.ones(1), torch.ones(1)), [1])
