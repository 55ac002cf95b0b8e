"""Per-tensor summaries computed on the tensor's own device, read back once per step.

Why: a ``.item()`` per call synchronises an accelerator with the host, which slows the run and can change
its results (seed FAQ, "model computation result change"). On accelerators every summary stays a small
device tensor until :meth:`Summarizer.materialize`; on the CPU there is nothing to synchronise, so values
are read at once. The recorder reuses the summary of a tensor seen again unchanged (same object, same
version counter): the output of one call is usually the input of the next.

On the CPU, a float32 tensor is summarised in one pass by the optional C kernel ``_fused_stats`` (built by
setup.py where a compiler is found), read along its strides when it is a view that is not contiguous;
otherwise, and for other tensors, by torch reductions, small float32 ones in batches (:class:`_Batches`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from msprobe_nb.capture import c_contract
from msprobe_nb.capture.dtensors import is_wrapper, local_shard
from msprobe_nb.capture.host_arrays import numpy_copy, numpy_view
from msprobe_nb.store.checksums import crc32

# optional C kernel (setup.py): one pass instead of four torch reductions and their dispatch; None where it is not
# built (torch's reductions give the same statistics) or built for another ABI (capture/c_contract.py)
_kernel = c_contract.fused_stats()
_fused_at = _kernel.stats_at if _kernel is not None else None
_norms_into = _kernel.norms_into if _kernel is not None else None
_int_at = _kernel.int_stats_at if _kernel is not None else None
_strided_at = _kernel.strided_stats_at if _kernel is not None else None
_counted_at = _kernel.counted_stats_at if _kernel is not None else None
_pack_stats = getattr(_kernel, "pack_stats", None)  # a step's list of 7-tuples into one array, in one pass
#: a summary entry whose statistics the C row builder wrote into the summarizer's flat buffer (capture/_row_builder.c)
FLAT = Ellipsis

NAN = float("nan")
_F32, _STRIDED, _TENSOR, _PARAMETER = torch.float32, torch.strided, torch.Tensor, torch.nn.Parameter
_EMPTY = (NAN, NAN, NAN, NAN, 0.0, 0.0, 0.0)
_HALF = (torch.float16, torch.bfloat16)
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
                                         "float8_e8m0fnu") if hasattr(torch, n))


def _float_view(t: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
    """The tensor to reduce and the accumulation dtype for mean/norm."""
    dt = t.dtype
    if dt.is_complex:
        return t.abs(), None
    if dt == torch.bool:
        return t, None
    if dt in _FP8:
        return t.to(torch.float32), None
    if dt in _HALF:
        return t, torch.float32
    if dt.is_floating_point:
        return t, None
    return t, torch.float64  # integers: exact min/max, mean and norm in float64


#: tensor types whose ``data_ptr()`` is their own memory (a subclass may wrap others, or have no storage)
PLAIN_TENSORS = (_TENSOR, _PARAMETER)


def _plain_cpu(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements lie at ``data_ptr()`` as they are, along its strides: a plain tensor or a
    Parameter (not a subclass), on the CPU, not a negative view."""
    return type(t) in PLAIN_TENSORS and t.is_cpu and not t.is_neg()


def _plain_memory(t: torch.Tensor) -> bool:
    """:func:`_plain_cpu`, and contiguous (not a transpose): the elements one after another."""
    return _plain_cpu(t) and t.is_contiguous()


def kernel_readable(t: torch.Tensor) -> bool:
    """Whether the C kernels may read ``t`` at ``data_ptr()`` as plain float32 values."""
    return t.dtype is _F32 and _plain_memory(t)


def norms_kernel() -> Any:
    """The C kernel ``norms_into(addresses, counts, out)``: writes into ``out`` (a float32 numpy array) the
    float32 L2 norm of each run of float32 values at tensors' ``data_ptr()`` (the caller checks they are
    contiguous float32 CPU tensors and holds them), in one call; None where the extension was not built."""
    return _norms_into


def _fused_stats(t: torch.Tensor, n: int) -> tuple[float, ...] | None:
    """Statistics of the float32 CPU tensor ``t`` (``n`` > 0 elements) from the C kernel, or None where it
    does not apply: no kernel, a negative view, a layout the strided kernel does not read. The kernel reads
    the tensor's memory at ``data_ptr()``, so every condition that makes that address hold plain float32
    values is checked here; a view that is not contiguous (a transpose, a slice: attention heads, a split
    projection) is read along its strides. A tensor with NaN or inf (a mask, an overflow) is read once more,
    element by element, for torch's max, min, sum and norm of it and the counts torch's path makes."""
    if _fused_at is None or t.dtype is not _F32 or not _plain_cpu(t):
        return None
    if t.is_contiguous():
        mx, mn, s, norm = _fused_at(t.data_ptr(), n)
    else:
        got = _strided_at(t.data_ptr(), t.shape, t.stride()) \
            if _strided_at is not None and t.layout is _STRIDED else None
        if got is None:
            return None
        mx, mn, s, norm = got
    if math.isfinite(mx) and math.isfinite(mn):
        return (mx, mn, s / n, norm, 0.0, 0.0, 0.0)
    counted = _counted_at(t.data_ptr(), t.shape, t.stride()) \
        if _counted_at is not None and t.layout is _STRIDED else None
    if counted is None:
        return None
    mx, mn, s, norm, nan_c, pinf, ninf = counted
    return (mx, mn, s / n, norm, nan_c, pinf, ninf)


#: integer and bool views that are not contiguous, up to this many elements, are copied for the C kernel
INT_COPY_MAX_NUMEL = 1 << 20
#: the integer kernel's code of each dtype it reads (capture/_fused_stats.c, int_stats_at); 5 is bool
_INT_CODES = {torch.int64: 0, torch.int32: 1, torch.int16: 2, torch.int8: 3, torch.uint8: 4, torch.bool: 5}
#: those dtypes in code order (the row builder's context: capture/_row_builder.c reads them itself)
INT_DTYPES = tuple(sorted(_INT_CODES, key=_INT_CODES.__getitem__))


def _int_stats(t: torch.Tensor, n: int) -> tuple[float, ...] | None:
    """Statistics of the integer or bool CPU tensor ``t`` (``n`` > 0 elements) from the C kernel, or None where
    it does not apply (no kernel, another dtype, a subclass, a negative view, a large view that is not
    contiguous). A small such view (expanded position ids, a slice of a mask) is copied contiguous first: one
    torch call against the four reductions and reads back of torch's path. The same numbers as
    :func:`_cpu_stats`: exact max and min, mean and norm from float64 sums (up to summation order)."""
    code = _INT_CODES.get(t.dtype)
    if code is None or _int_at is None or not _plain_cpu(t):
        return None
    if not t.is_contiguous():
        if n > INT_COPY_MAX_NUMEL or t.layout is not _STRIDED:
            return None
        t = t.contiguous()
    mx, mn, s, q = _int_at(t.data_ptr(), n, code)
    if code == 5:  # bool: the first value is the count of true elements
        return (float(mx > 0), float(mx == n), mx / n, math.sqrt(mx), 0.0, 0.0, 0.0)
    return (mx, mn, s / n, math.sqrt(q), 0.0, 0.0, 0.0)


#: float16 / bfloat16 CPU tensors up to this many elements are widened for the C kernel (a float32 copy of
#: at most 4 MiB lives for the length of one summary); larger ones take torch's reductions
HALF_WIDEN_MAX_NUMEL = 1 << 20


def _half_stats(t: torch.Tensor, n: int) -> tuple[float, ...]:
    """Statistics of the float16 / bfloat16 CPU tensor ``t`` (``n`` > 0 elements) from one widening copy to
    float32 and the C kernel. Torch reduces a half tensor the same way (every element widened exactly to
    float32; mean and norm accumulated in float32), so the result is torch's up to summation order, like
    the float32 kernel's; max and min are exact. With a NaN or inf in it, torch's path counts them."""
    got = _fused_stats(t.to(torch.float32, memory_format=torch.contiguous_format), n)
    return got if got is not None else _cpu_stats(t)


def _cpu_stats(t: torch.Tensor) -> tuple[float, ...]:
    if t.numel() == 0:
        return _EMPTY
    if t.dtype == torch.bool:
        n_true = int(t.sum())
        n = t.numel()
        return (float(n_true > 0), float(n_true == n), n_true / n, math.sqrt(n_true), 0.0, 0.0, 0.0)
    r, acc = _float_view(t)
    if acc is None and r.dtype.is_floating_point:
        # one read back of all four (a stack and a tolist instead of four .item()); the mean as sum / n in
        # Python, like the batched path; amax + amin beat aminmax's single pass on large CPU tensors
        n = r.numel()
        if n > STAGE_MAX_NUMEL:
            mx, mn = r.amax(), r.amin()
        else:
            mn, mx = torch.aminmax(r)
        mx_f, mn_f, s, norm_f = torch.stack((mx, mn, r.sum(), torch.linalg.vector_norm(r))).tolist()
        mean_f = s / n
    else:
        mn, mx = torch.aminmax(r)
        if acc is torch.float64 and not r.dtype.is_floating_point:
            r64 = r.to(torch.float64)
            mean, norm = r64.mean(), torch.linalg.vector_norm(r64)
        else:
            mean = r.mean(dtype=acc)
            norm = torch.linalg.vector_norm(r, dtype=acc)
        mx_f, mn_f, mean_f, norm_f = mx.item(), mn.item(), mean.item(), norm.item()
    if math.isfinite(mx_f) and math.isfinite(mn_f):
        nan_c = pinf = ninf = 0.0
    else:
        nan_c = float(torch.isnan(r).sum()) if r.dtype.is_floating_point else 0.0
        pinf = float(torch.isposinf(r).sum()) if r.dtype.is_floating_point else 0.0
        ninf = float(torch.isneginf(r).sum()) if r.dtype.is_floating_point else 0.0
    return (float(mx_f), float(mn_f), mean_f, norm_f, nan_c, pinf, ninf)


def _device_stats(t: torch.Tensor) -> torch.Tensor:
    """Seven float64 values on the tensor's device; no host synchronisation."""
    if t.numel() == 0:
        return torch.tensor(_EMPTY, dtype=torch.float64, device=t.device)
    if t.dtype == torch.bool:
        n_true = t.sum(dtype=torch.float64)
        zero = torch.zeros((), dtype=torch.float64, device=t.device)
        return torch.stack([t.any().to(torch.float64), t.all().to(torch.float64), n_true / t.numel(),
                            n_true.sqrt(), zero, zero, zero])
    r, acc = _float_view(t)
    mn, mx = torch.aminmax(r)
    if acc is torch.float64 and not r.dtype.is_floating_point:
        r = r.to(torch.float64)
        acc = None
    mean = r.mean() if acc is None else r.mean(dtype=acc)
    norm = torch.linalg.vector_norm(r) if acc is None else torch.linalg.vector_norm(r, dtype=acc)
    parts = [mx, mn, mean, norm]
    if r.dtype.is_floating_point:
        parts += [torch.isnan(r).sum(), torch.isposinf(r).sum(), torch.isneginf(r).sum()]
    else:
        parts += [torch.zeros((), device=t.device)] * 3
    return torch.stack([p.to(torch.float64) for p in parts])


#: float32 CPU tensors up to this many elements are summarised in batches (see :class:`_Batches`).
STAGE_MAX_NUMEL = 1 << 14  # measured in a recorded step: batching 32k-element tensors too made it ~4 % slower
#: bytes of the first batch buffer of an element count (at least two rows of it)
STAGE_FIRST_BYTES = 1 << 15
#: a buffer that fills up is doubled, up to this many bytes (and 256 rows)
STAGE_BYTES = 1 << 19
#: bytes of all batch buffers together (they stay allocated from step to step); sizes seen once the
#: budget is spent are summarised one tensor at a time, and buffers stop growing.
STAGE_BUDGET = 1 << 21


class _Batches:
    """Statistics of small float32 CPU tensors, computed a few dozen at a time.

    Why: on small tensors the cost of :func:`_cpu_stats` is dispatching three torch reductions and four
    reads back, not the arithmetic. A tensor's values are copied into a row of a buffer for its element
    count (a copy, so a later in-place change cannot alter what was recorded); a full buffer, or the end
    of the step, reduces all its rows with one call per statistic along the row axis. Buffers start small
    and double each time they fill, so the budget goes to the sizes a model uses most (measured on the
    benchmark models: 2-4 % of a recorded step against fixed-size buffers under a 1 MiB budget).
    """

    def __init__(self, stage_bytes: int | None = None, budget: int | None = None, first_bytes: int | None = None):
        self._groups: dict[int, list] = {}  # numel -> [buffer (rows, numel), rows used, summary indices]
        self._allocated = 0
        self.stage_bytes = STAGE_BYTES if stage_bytes is None else stage_bytes
        self.budget = STAGE_BUDGET if budget is None else budget
        self.first_bytes = STAGE_FIRST_BYTES if first_bytes is None else first_bytes

    def add(self, a: np.ndarray, idx: int, values: list) -> bool:
        """Stage ``a`` as summary ``idx``; False when its size has no buffer (the budget is spent)."""
        n = a.size
        g = self._groups.get(n)
        if g is None:
            rows = max(2, min(256, self.first_bytes // (4 * n)))
            if self._allocated + rows * n * 4 > self.budget:
                return False
            self._allocated += rows * n * 4
            g = self._groups[n] = [np.empty((rows, n), np.float32), 0, []]
        buf, k, where = g
        buf[k] = a.ravel()  # a view when contiguous (cheaper than reshape(-1)); a copy otherwise
        where.append(idx)
        g[1] = k + 1
        if k + 1 == len(buf):
            self._reduce(g, values)
            rows = len(buf)
            more = rows * n * 4
            # growing stops at 3/4 of the budget: the rest is kept for the first buffers of sizes seen later
            if rows < 256 and 2 * more <= self.stage_bytes and self._allocated + more <= self.budget * 3 // 4:
                g[0] = np.empty((2 * rows, n), np.float32)
                self._allocated += more
        return True

    def flush(self, values: list) -> None:
        for g in self._groups.values():
            if g[1]:
                self._reduce(g, values)

    def clear(self) -> None:
        """Drop what is staged (the step was discarded)."""
        for g in self._groups.values():
            g[1], g[2] = 0, []

    @staticmethod
    def _reduce(g: list, values: list) -> None:
        buf, k, where = g
        x = torch.from_numpy(buf[:k])
        n = x.shape[1]
        mx = x.amax(dim=1).tolist()
        mn = x.amin(dim=1).tolist()
        sums = x.sum(dim=1).tolist()
        norms = torch.linalg.vector_norm(x, dim=1).tolist()
        for i, idx in enumerate(where):
            a, b = mx[i], mn[i]
            if math.isfinite(a) and math.isfinite(b):
                values[idx] = (a, b, sums[i] / n, norms[i], 0.0, 0.0, 0.0)
            else:
                row = x[i]
                values[idx] = (a, b, sums[i] / n, norms[i], float(torch.isnan(row).sum()),
                               float(torch.isposinf(row).sum()), float(torch.isneginf(row).sum()))
        g[1] = 0
        g[2] = []


def _crc32(t: torch.Tensor) -> str:
    # negative and conjugate views are materialized first: the hash is of the values, not of the memory
    flat = t.detach().resolve_neg().resolve_conj().contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = numpy_view(flat.view(torch.uint8)) if flat.numel() else np.zeros(0, np.uint8)
    return f"{crc32(memoryview(raw)):08x}"  # type: ignore[arg-type]  # numpy's stubs declare the buffer protocol for Python >= 3.12 only


#: dtypes whose CPU tensors the tensor task keeps as numpy copies (the writer stores them as these dtypes)
_NUMPY_HELD = frozenset((torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16, torch.int8,
                         torch.uint8, torch.bool))


#: up to this many bytes a numpy copy is cheaper than torch's clone; above, numpy's fresh allocation (and its
#: first-touch page faults) makes it slower (benchmarks/README.md, the tensor task)
NUMPY_COPY_MAX_BYTES = 1 << 16


def _host_copy(d: torch.Tensor) -> Any:
    """The tensor task's copy of the CPU tensor ``d`` (detached), in row-major order: for a small tensor of a
    dtype numpy holds, a numpy array (cheaper to make than a torch clone, and the writer views it as it is);
    else a contiguous torch clone (large tensors, bfloat16, complex, a negative or conjugate view)."""
    if d.dtype in _NUMPY_HELD and d.nbytes <= NUMPY_COPY_MAX_BYTES:
        try:
            return numpy_copy(d)
        except (RuntimeError, TypeError):  # a negative view and the like
            pass
    return d.clone(memory_format=torch.contiguous_format)


def has_storage(t: torch.Tensor) -> bool:
    """False for meta, fake and other tensors without data, whose values cannot be summarised."""
    if type(t) is not torch.Tensor and (not isinstance(t, torch.nn.Parameter) or is_wrapper(t)):
        return False  # fake, functional, DTensor and other wrapper tensors (also as an nn.Parameter)
    return not (t.is_meta or t.is_sparse or t.is_quantized)


class Summarizer:
    """Collects statistics, hashes and (tensor mode) copies for one step; indices point into its buffers."""

    # read by the C row builder for every summary it adds (_slot_attrs.h); the rest lives in the instance dict
    __slots__ = ("_values", "_flat", "tensors", "__dict__", "__weakref__")

    def __init__(self, stats: bool = True, hashes: bool = False, keep_tensors: bool = False):
        self.want_stats = stats
        self.want_hash = hashes
        self.keep_tensors = keep_tensors
        self._stats_only = stats and not hashes and not keep_tensors
        self._batches = _Batches()  # its buffers are kept from step to step
        self.reset()

    def reset(self) -> None:
        # per summary: a tuple of 7 floats (CPU), a device tensor of 7, None while staged, or FLAT: the C row
        # builder's, whose 7 doubles are row i of _flat (no Python objects a summary)
        self._values: list = []
        self._flat = bytearray()           # 7 float64 per summary, as long as the last FLAT entry
        self._hashes: list = []            # str, or a host copy awaiting its CRC
        self.tensors: list = []            # tensor mode: host copies
        self._batches.clear()

    def summarize(self, t: torch.Tensor) -> int:
        """Index of ``t``'s summary in this step's buffers (-1 when it has no data).

        Every call summarises ``t`` as it is now; :class:`~msprobe_nb.capture.recorder.Recorder` remembers
        which tensor objects (and versions) it has summarised already.
        """
        values = self._values
        # the common case first, with fewer checks: a plain float32 CPU tensor, statistics only
        if self._stats_only and t.dtype is _F32 and t.is_cpu and (type(t) is _TENSOR or type(t) is _PARAMETER) \
                and t.layout is _STRIDED:
            n = t.numel()
            if n:
                self._float32(t, n)
                return len(values) - 1
        if (local := local_shard(t)) is not None:  # a DTensor: this rank's shard (capture/dtensors.py)
            t = local
        if not has_storage(t):
            return -1
        # a detached tensor builds no autograd graph: no grad-mode switch needed
        d = t.detach() if t.requires_grad else t
        on_cpu = d.is_cpu
        if self.want_stats:
            n = d.numel()
            if on_cpu and d.dtype is _F32 and n:
                self._float32(d, n)
            elif on_cpu and d.dtype in _HALF and 0 < n <= HALF_WIDEN_MAX_NUMEL and _fused_at is not None:
                values.append(_half_stats(d, n))
            elif on_cpu and n and (got := _int_stats(d, n)) is not None:
                values.append(got)
            else:
                values.append(_cpu_stats(d) if on_cpu else _device_stats(d))
        else:
            values.append(_EMPTY)
        if self.want_hash:
            self._hashes.append(_crc32(d) if on_cpu else d.to("cpu", non_blocking=True))
        if self.keep_tensors:
            self.tensors.append(_host_copy(d) if on_cpu else d.to("cpu", non_blocking=True))
        return len(values) - 1

    def uses_kernel(self) -> bool:
        """Whether :meth:`summarize` gives contiguous float32 CPU tensors the C kernel's statistics (and
        nothing else): the recorder's C row builder then computes those itself (capture/_row_builder.c)."""
        return self._stats_only and _fused_at is not None

    def host_copies_in_c(self) -> tuple | None:
        """Where the recorder's C row builder may do :meth:`summarize`'s work for a small float32 tensor of the
        tensor task itself (statistics from the C kernel, then the host copy :func:`_host_copy` would make, a
        numpy array): ``(numpy.empty, float32, the largest such copy in bytes)``; None for other summarizers
        (hashes, no statistics, no kernel built)."""
        if self.keep_tensors and self.want_stats and not self.want_hash and _fused_at is not None:
            return np.empty, np.dtype(np.float32), NUMPY_COPY_MAX_BYTES
        return None

    def _float32(self, t: torch.Tensor, n: int) -> None:
        """Append the statistics of the float32 CPU tensor ``t`` (``n`` > 0 elements): from the C kernel,
        else staged in a batch (small tensors), else from torch's reductions."""
        got = _fused_stats(t, n)
        if got is not None:
            self._values.append(got)
        elif n <= STAGE_MAX_NUMEL:
            self._stage(t)
        else:
            self._values.append(_cpu_stats(t.detach()))

    def _stage(self, d: torch.Tensor) -> None:
        """Append the statistics of the small float32 CPU tensor ``d``: staged in its batch (filled when the
        batch is reduced), or computed at once when it cannot be (no buffer left, no numpy view).

        The tensor's values are read through :func:`numpy_view`, never ``Tensor.numpy()``, which would mark a
        user's storage not resizable (FSDP2 frees its parameters by resizing them)."""
        values = self._values
        try:
            a = numpy_view(d.detach() if d.requires_grad else d)
        except (RuntimeError, TypeError):  # conjugate / negative views and the like
            values.append(_cpu_stats(d.detach()))
            return
        values.append(None)
        if not self._batches.add(a, len(values) - 1, values):
            values[-1] = _cpu_stats(d.detach())

    def can_share(self, out: torch.Tensor, source: torch.Tensor) -> bool:
        """Whether ``out`` may reuse ``source``'s summary because it holds exactly the same elements (a
        reshape, transpose, contiguous copy...): max, min, mean, norm and the counts of a permutation of
        the same values are the same numbers (mean and norm up to the rounding of another summation order).
        Only in statistics mode: hashes and saved tensors depend on the memory layout."""
        return not (self.want_hash or self.keep_tensors) and out.dtype == source.dtype \
            and out.numel() == source.numel()

    def materialize(self, pad: bool = False) -> tuple[np.ndarray, list[str]]:
        """(n, 7) float64 array of max, min, mean, norm, nan, +inf, -inf, and the hashes: one sync per device.

        ``pad``: one more row, of NaN, at the end, so that index -1 ("no statistics") picks it."""
        self._batches.flush(self._values)
        n = len(self._values)
        device_rows: dict[torch.device, list[int]] = {}
        full = np.empty((n + 1 if pad else n, 7), dtype=np.float64)
        if pad:
            full[n] = np.nan
        out = full[:n] if pad else full
        try:  # all on the CPU: one conversion of the list of tuples (and the flat rows)
            packed = _pack_stats is not None and _pack_stats(self._values, self._flat, out)
            if not packed and not self._flat:  # no flat rows: numpy converts the tuples, if that is all there is
                out[:] = np.array(self._values, dtype=np.float64).reshape(n, 7)
                packed = True
        except (TypeError, ValueError):
            packed = False
        if not packed:  # device tensors among them (or flat rows without the kernel): entry by entry
            out[:] = np.nan
            flat = np.frombuffer(self._flat, dtype=np.float64).reshape(-1, 7)
            for i, v in enumerate(self._values):
                if isinstance(v, tuple):
                    out[i] = v
                elif v is FLAT:
                    out[i] = flat[i]
                else:
                    device_rows.setdefault(v.device, []).append(i)
        for _dev, rows in device_rows.items():
            out[rows] = torch.stack([self._values[i] for i in rows]).cpu().numpy()
        if device_rows or self.want_hash or self.keep_tensors:
            _sync_accelerators()
        hashes = [h if isinstance(h, str) else _crc32(h) for h in self._hashes]
        return full, hashes


def _sync_accelerators() -> None:
    """Wait for pending device-to-host copies (hash and tensor modes); once per step."""
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        acc.synchronize()
