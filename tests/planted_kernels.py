"""Bad CPU kernels planted through ``torch.library`` for the pre-check's tests, and removed again.

``planted_kernels(names)`` overrides the CPU kernel of each aten operator named (``_softmax`` computing in
bf16, ``gelu`` with the tanh formula, ``native_layer_norm`` with 100 times its eps, ``sigmoid`` through bf16
but in float64) for the ``with`` block,
and removes the overrides on exit whatever happens inside.
"""
from __future__ import annotations

import contextlib
import math
import warnings

import torch


def _bf16_softmax(x, dim, half_to_float):
    xb = x.to(torch.bfloat16)
    e = (xb - xb.amax(dim, keepdim=True)).exp()
    return (e / e.sum(dim, keepdim=True)).to(x.dtype)


def _tanh_gelu(x, approximate="none"):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)))


def _wrong_eps_layer_norm(x, normalized_shape, weight, bias, eps):
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    mean = x.mean(dims, keepdim=True)
    rstd = torch.rsqrt(((x - mean) ** 2).mean(dims, keepdim=True) + eps * 100)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean, rstd


def _bf16_sigmoid_below_fp64(x):
    """Sigmoid through bfloat16 for every dtype but float64, which is computed right: a device kernel that is
    wrong while the float64 bench on the same CPU is not (the online task's case)."""
    if x.dtype == torch.float64:
        return 1 / (1 + torch.exp(-x))
    return (1 / (1 + torch.exp(-x.to(torch.bfloat16)))).to(x.dtype)


PLANTED = {"_softmax": _bf16_softmax, "gelu": _tanh_gelu, "native_layer_norm": _wrong_eps_layer_norm,
           "sigmoid": _bf16_sigmoid_below_fp64}


@contextlib.contextmanager
def planted_kernels(names=("_softmax", "gelu", "native_layer_norm")):
    """Override the CPU kernels of ``names``; removed on exit, whatever happens inside."""
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for name in names:
                lib.impl(name, PLANTED[name], "CPU")
        yield
    finally:
        lib._destroy()
