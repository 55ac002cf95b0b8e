"""Reference implementations of the fused ops a bench cannot run as they are, and the user's own.

torch_npu's fused kernels (``npu_fusion_attention``, ``npu_rms_norm``, ``npu_rotary_mul``, ``npu_swiglu``,
``npu_scaled_masked_softmax``, ...) exist only on an NPU; here each is written out in plain torch ops from
its documented meaning, so the bench can run it in higher precision (and in the device's dtype, for the
benchmark method's reference kernel). A reference may return fewer outputs than the op: the outputs it does
not produce (a kernel's internal softmax statistics, its RNG seed) are listed as not compared.

``register_reference(op, fn)`` adds one for a ``torch.library`` op of the user's (``"mylib.fused_gelu"``,
``torch.ops.mylib.fused_gelu``) or replaces a built-in one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["REFERENCES", "lookup", "register_reference", "unregister_reference"]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def npu_rotary_mul(x, r1, r2, rotary_mode: str = "half"):
    """RoPE: ``x * cos + rotate_half(x) * sin`` (r1 the cos, r2 the sin table); the interleaved mode swaps
    neighbouring pairs instead of halves."""
    if rotary_mode == "interleave":
        pairs = x.unflatten(-1, (-1, 2))
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
        return x * r1 + rotated * r2
    return x * r1 + _rotate_half(x) * r2


def npu_rms_norm(x, gamma, epsilon: float = 1e-6):
    """RMSNorm: ``x / sqrt(mean(x^2) + eps) * gamma`` over the last dims gamma covers; returns (y, rstd)."""
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return x * rstd * gamma, rstd


def npu_add_rms_norm(x1, x2, gamma, epsilon: float = 1e-6):
    """``x = x1 + x2``, then RMSNorm of x; returns (y, rstd, x)."""
    x = x1 + x2
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y, rstd, x


def npu_swiglu(x, dim: int = -1):
    """SwiGLU: the first half along ``dim`` through SiLU, times the second half."""
    a, b = x.chunk(2, dim=dim)
    return F.silu(a) * b


def npu_fast_gelu(x):
    """Fast GELU: ``x * sigmoid(1.702 x)``."""
    return x * torch.sigmoid(1.702 * x)


def npu_scaled_masked_softmax(x, mask, scale: float = 1.0, fixed_triu_mask: bool = False):
    """Softmax of ``x * scale`` over the last dim, positions where ``mask`` is True (or, with
    fixed_triu_mask, above the diagonal) left out."""
    if fixed_triu_mask:
        n, m = x.shape[-2], x.shape[-1]
        mask = torch.ones(n, m, dtype=torch.bool, device=x.device).triu(1)
    scores = (x * scale).masked_fill(mask.to(torch.bool), float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


_LAYOUTS = {"BNSD": "bnsd", "BSND": "bsnd", "BSH": "bsh", "SBH": "sbh"}


def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    if layout == "BSH":
        b, s, h = t.shape
        return t.reshape(b, s, heads, h // heads).transpose(1, 2)
    s, b, h = t.shape  # SBH
    return t.reshape(s, b, heads, h // heads).permute(1, 2, 0, 3)


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return t
    if layout == "BSND":
        return t.transpose(1, 2)
    b, n, s, d = t.shape
    if layout == "BSH":
        return t.transpose(1, 2).reshape(b, s, n * d)
    return t.permute(2, 0, 1, 3).reshape(s, b, n * d)


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale: float = 1.0, keep_prob: float = 1.0, pre_tockens: int = 2147483647,
                         next_tockens: int = 2147483647, inner_precise: int = 0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode: int = 0, gen_mask_parallel: bool = True,
                         sync: bool = False, **_: Any):
    """Attention ``softmax(q k^T * scale + pse, masked) v`` in the layouts BNSD, BSND, BSH, SBH, key/value
    heads repeated for grouped-query attention; returns the attention output only (the kernel's softmax
    max/sum, seed and offset are not reproduced). Dropout (keep_prob < 1), variable-length packing and
    sparse modes other than 0 are not replayable."""
    if input_layout not in _LAYOUTS:
        raise NotImplementedError(f"npu_fusion_attention reference: layout {input_layout!r} (supported: "
                                  f"{', '.join(_LAYOUTS)})")
    if keep_prob < 1.0:
        raise NotImplementedError("npu_fusion_attention reference: keep_prob < 1 drops at random")
    if actual_seq_qlen is not None or actual_seq_kvlen is not None or sparse_mode not in (0,) or prefix is not None:
        raise NotImplementedError("npu_fusion_attention reference: packed sequences and sparse modes are not "
                                  "written out")
    q = _to_bnsd(query, input_layout, head_num)
    kv_heads = key.shape[-1] // (query.shape[-1] // head_num) if input_layout in ("BSH", "SBH") else None
    k = _to_bnsd(key, input_layout, kv_heads or key.shape[1 if input_layout == "BNSD" else 2])
    v = _to_bnsd(value, input_layout, kv_heads or value.shape[1 if input_layout == "BNSD" else 2])
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if pse is not None:
        scores = scores + pse
    if atten_mask is not None:
        scores = scores.masked_fill(atten_mask.to(torch.bool), float("-inf"))
    sq, sk = scores.shape[-2], scores.shape[-1]
    if pre_tockens < sk or next_tockens < sk:
        i = torch.arange(sq, device=scores.device)[:, None]
        j = torch.arange(sk, device=scores.device)[None, :]
        scores = scores.masked_fill((j > i + next_tockens) | (j < i - pre_tockens), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (_from_bnsd(torch.matmul(probs, v), input_layout),)


#: (family, op) -> reference implementation
REFERENCES: dict[tuple[str, str], Callable] = {
    ("NPU", "npu_fusion_attention"): npu_fusion_attention, ("NPU", "npu_rms_norm"): npu_rms_norm,
    ("NPU", "npu_add_rms_norm"): npu_add_rms_norm, ("NPU", "npu_rotary_mul"): npu_rotary_mul,
    ("NPU", "npu_swiglu"): npu_swiglu, ("NPU", "npu_scaled_masked_softmax"): npu_scaled_masked_softmax,
    ("NPU", "npu_fast_gelu"): npu_fast_gelu, ("NPU", "fast_gelu"): npu_fast_gelu,
}
_BUILTIN = dict(REFERENCES)


def _key(op: Any) -> tuple[str, str]:
    """(family, op) as the dump names it, from ``"mylib.fused_gelu"``, ``"mylib::fused_gelu"``,
    ``"NPU.npu_rms_norm"`` or a ``torch.ops`` packet / overload."""
    if isinstance(op, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = op._qualified_op_name if isinstance(op, torch._ops.OpOverloadPacket) else op._schema.name
    elif isinstance(op, str):
        name = op
    else:
        raise TypeError(f"register_reference: op must be a name ('mylib.op') or a torch.ops op, got {op!r}")
    ns, sep, rest = name.partition("::")
    if not sep:
        ns, sep, rest = name.partition(".")
    if not sep or not ns or not rest:
        raise ValueError(f"register_reference: {name!r} is not 'namespace.op' (e.g. 'mylib.fused_gelu')")
    if ns in ("npu", "torch_npu", "_C_ascend"):
        ns = "NPU"
    elif ns == "aten":
        ns = "Aten"
    return ns, rest.split(".")[0] if ns not in ("Functional", "Torch", "Tensor") else rest


def register_reference(op: Any, fn: Callable) -> None:
    """Replay ``op`` with ``fn`` (same arguments, plain torch ops) on the bench: for a ``torch.library``
    op the bench lacks a kernel for, or to replace a built-in reference."""
    if not callable(fn):
        raise TypeError(f"register_reference: fn must be callable, got {fn!r}")
    REFERENCES[_key(op)] = fn


def unregister_reference(op: Any) -> None:
    """Forget the user's reference for ``op`` (a built-in one comes back)."""
    key = _key(op)
    if key in _BUILTIN:
        REFERENCES[key] = _BUILTIN[key]
    else:
        REFERENCES.pop(key, None)


def lookup(family: str, op: str) -> Callable | None:
    """The reference for ``family.op``, or None."""
    return REFERENCES.get((family, op))
