"""A hash of a tensor's values, the same on every device: the set-up record's parameter, buffer and data hashes.

Two sums over the tensor's bytes read as 64-bit words (the last few bytes zero-padded to one more word), one
plain, one weighted by position (``2 * (i % 65521) + 1``), both modulo 2**64. Integer sums modulo 2**64 do not
depend on the order of reduction, so a CPU, GPU and NPU give the same hash for the same values. Each tensor is
hashed where it lives: on the host by numpy (column sums over rows of one period: one read at memory speed;
threads do not make it faster, the read is bound by memory), on an accelerator by torch, whose results come to
the host in one copy per device.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from msprobe_nb.capture.host_arrays import numpy_view
from msprobe_nb.capture.stats import has_storage

__all__ = ["HASH_SCHEME", "tensor_hashes"]

#: marks this kit's hash of a tensor (64-bit words); a hash without it is the first version's (32-bit words)
HASH_SCHEME = "w64:"
_PERIOD = 65521  # the position weights repeat with this period
_MASK = (1 << 64) - 1
_WEIGHTS: dict[Any, Any] = {}


def _weights(device: Any) -> Any:
    """The position weights of one period (numpy uint64 for the host, an int64 tensor on ``device``)."""
    w = _WEIGHTS.get(device)
    if w is None:
        w = np.arange(_PERIOD, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        w = _WEIGHTS[device] = w if device == "numpy" else torch.from_numpy(w.view(np.int64)).to(device)
    return w


def _words(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tensor's bytes (values, not memory: views resolved, row-major) as 64-bit words, and the last
    ``numel % 8`` bytes apart, zero-padded to one more word (empty when the bytes fill whole words)."""
    flat = t.detach()
    if flat.is_complex():
        flat = torch.view_as_real(flat.resolve_conj())
    flat = flat.resolve_neg().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    raw = flat.view(torch.uint8)
    whole = raw.numel() - raw.numel() % 8
    body = raw[:whole]
    try:
        words = body.view(torch.int64)
    except RuntimeError:  # a storage offset that is not a multiple of 8 bytes
        words = body.clone().view(torch.int64)
    tail = raw[whole:]
    if tail.numel():
        tail = torch.cat([tail, tail.new_zeros(8 - tail.numel())]).view(torch.int64)
    else:
        tail = raw.new_zeros(0).view(torch.int64)
    return words, tail


def _sums_host(words: np.ndarray) -> tuple[int, int]:
    """The two sums on the host: the words' column sums over rows of one period, then the weights applied
    once to those."""
    words = words.view(np.uint64)
    n = words.size
    w = _weights("numpy")
    if n < _PERIOD:
        return int(np.add.reduce(words, dtype=np.uint64)), int(np.dot(words, w[:n]))
    full = n - n % _PERIOD
    cols = np.add.reduce(words[:full].reshape(-1, _PERIOD), axis=0, dtype=np.uint64)
    cols[:n - full] += words[full:]
    return int(np.add.reduce(cols, dtype=np.uint64)), int(np.dot(cols, w))


def _sums_device(words: torch.Tensor) -> torch.Tensor:
    """The same two sums on the tensor's device, as a 2-element int64 tensor (no host copy; int64 sums wrap
    like uint64 ones)."""
    n, w = words.numel(), _weights(words.device)
    if n < _PERIOD:
        return torch.stack([words.sum(), (words * w[:n]).sum()])
    full = n - n % _PERIOD
    cols = words[:full].view(-1, _PERIOD).sum(0)
    if n > full:
        cols[:n - full] += words[full:]
    return torch.stack([cols.sum(), (cols * w).sum()])


def _with_tail(a: int, b: int, n: int, tail: Any) -> tuple[int, int]:
    """The sums with the zero-padded last word (at position ``n``) added, when there is one."""
    for t in tail:
        t = int(t) & _MASK
        a, b = a + t, b + t * (2 * (n % _PERIOD) + 1)
    return a, b


def _hex(a: int, b: int) -> str:
    return f"{HASH_SCHEME}{a & _MASK:016x}{b & _MASK:016x}"


def tensor_hashes(tensors: list[torch.Tensor]) -> list[str]:
    """A hash of each tensor's values (``"unhashable"`` for one without storage); DTensors hash their local
    shard. The hash is the same for the same values on every device and for every memory layout."""
    out: list[str] = [""] * len(tensors)
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    host: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    with torch.no_grad():
        for i, t in enumerate(tensors):
            local = t.to_local() if hasattr(t, "to_local") else t  # DTensor: this rank's shard
            if not isinstance(local, torch.Tensor) or not has_storage(local):
                out[i] = "unhashable"
                continue
            words, tail = _words(local)
            if words.device.type == "cpu":
                host.append((i, words, tail))
            else:  # the padded last word joins the rest: a copy on the device, for odd sizes only
                whole = torch.cat([words, tail]) if tail.numel() else words
                by_device.setdefault(words.device, []).append((i, _sums_device(whole)))
        for i, words, tail in host:
            a, b = _sums_host(numpy_view(words))
            out[i] = _hex(*_with_tail(a, b, words.numel(), numpy_view(tail).view(np.uint64)))
        for items in by_device.values():
            sums = torch.stack([s for _, s in items]).cpu().tolist()
            for (i, _), (a, b) in zip(items, sums, strict=True):
                out[i] = _hex(a, b)
    return out
