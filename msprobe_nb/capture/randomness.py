"""Random sources during recording: which generator each draw used, dropout off, host-side draws.

* Every random API call gets its generator (``rng``: device, ``custom`` when the user passed one) and a
  digest of the generator state before the draw (``rng_state``: initial seed and CRC-32 of the state), so
  a divergence can be traced back to the draw and reseeding shows up.
* ``dropout_off``: dropout APIs (and so ``nn.Dropout*``) run with ``p=0``, by rewriting the call's
  arguments in the function mode; no function object is replaced.
* Python ``random`` and ``numpy.random`` module-level draws and seed calls are recorded too (families
  ``Random`` and ``NumpyRandom``) by wrapping those module functions while recording; they are restored
  at stop. torch's own functions are never replaced: a ``torch.manual_seed`` shows up as a changed
  ``seed=`` in the next draw's ``rng_state``.
* ``host_random``: draws that use a default generator are made by the kit's own CPU generator, seeded
  from the config's seed, and moved to the target device. Two machines then draw identical numbers,
  whatever their device generators do, without any change to user code. Draws with a user-supplied
  ``generator=`` are left alone: the user seeded those on purpose.
"""
from __future__ import annotations

import functools
import random as _pyrandom
import sys
import warnings
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from msprobe_nb.capture.checkpoint_draws import HostStates, in_non_reentrant_region, reentrant_region_nodes
from msprobe_nb.capture.random_apis import (
    ATTENTION_DROPOUTS,
    DRAWING_APIS,
    DROPOUTS,
    FACTORIES,
    INIT_DRAWS,
    INPLACE_DRAWS,
    LEFT_AS_DRAWN,
    NO_DRAW,
    TENSOR_ARG_DRAWS,
)

if TYPE_CHECKING:
    from msprobe_nb.capture.recorder import Recorder

_DROPOUT_FAMILY_P = {op for _, op in DROPOUTS}
#: (module, function name, family, state digest, the function wrapped, its wrapper)
_Wrapping = tuple[ModuleType, str, str, Callable[[], str], Callable[..., Any], Callable[..., Any]]


def _first_tensor(args, kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a
    return None


def _target_device(args, kwargs) -> torch.device:
    dev = kwargs.get("device")
    if dev is not None:
        return torch.device(dev)
    t = _first_tensor(args, kwargs)
    if t is not None:
        return t.device
    return torch.get_default_device()


def _default_generator(device: torch.device):
    if device.type == "cpu":
        return torch.default_generator
    try:
        mod = torch.get_device_module(device.type)
        gens = getattr(mod, "default_generators", None)
        if gens:
            return gens[device.index if device.index is not None else mod.current_device()]
    except (AttributeError, RuntimeError, IndexError):
        pass
    return None


def generator_digest(gen) -> str:
    """``seed=<initial seed> state=<crc32>`` of a generator; cheap enough for every draw."""
    if gen is None:
        return ""
    try:
        state = gen.get_state()
        return f"seed={gen.initial_seed()} state={zlib.crc32(state.numpy().tobytes()):08x}"
    except (RuntimeError, AttributeError):
        return f"seed={gen.initial_seed()}"


class RandomPolicy:
    """Per-call decisions about random APIs, used by the function mode."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.dropout_off = cfg.dropout_off
        self.host_random = cfg.host_random
        self.host_generator = torch.Generator(device="cpu")
        self.host_generator.manual_seed(1234 if cfg.seed is None else cfg.seed)
        # set by an ApiMode that records (L1, mix): it pushes itself for a reentrant checkpoint's recompute
        self.replays_reentrant = False
        self.host_states = HostStates()
        self._warned_checkpoint = False

    recorder: Recorder | None = None  # set by the Debugger: where Python/numpy draws are recorded

    def install(self) -> None:
        """Wrap Python's and numpy's module-level random functions (torch draws need nothing: the mode sees them).

        The wrappers are made once and reused: recording starts and stops every step."""
        if getattr(self, "_saved", None):
            return
        wrappers = getattr(self, "_wrappers", None)
        if wrappers is None:
            self._wrappers: list[_Wrapping] = []
            wrappers = self._wrappers
            for module, family, names, digest in ((_pyrandom, "Random", PY_RANDOM, _python_digest),
                                                  (np.random, "NumpyRandom", NP_RANDOM, _numpy_digest)):
                for name in names:
                    orig = module.__dict__.get(name)
                    if orig is None or not callable(orig):
                        continue
                    wrappers.append((module, name, family, digest, orig, self._wrap(orig, family, name, digest)))
        self._saved = []
        for i, (module, name, family, digest, orig, wrapper) in enumerate(wrappers):
            now = module.__dict__.get(name)
            if now is not orig:  # replaced by someone else since the wrapper was made: wrap what is there
                if now is None or not callable(now):
                    continue
                orig, wrapper = now, self._wrap(now, family, name, digest)
                wrappers[i] = (module, name, family, digest, orig, wrapper)
            self._saved.append((module, name, orig))
            setattr(module, name, wrapper)

    def uninstall(self) -> None:
        """Put Python's and numpy's functions back."""
        for module, name, orig in getattr(self, "_saved", None) or []:
            setattr(module, name, orig)
        self._saved = []

    def _wrap(self, orig, family: str, name: str, digest):
        policy = self

        def draw(*args, **kwargs):
            rec = policy.recorder
            if rec is None or not rec.active or rec.busy:
                return orig(*args, **kwargs)
            with rec.working():
                c = rec.open_api(family, name, sys._getframe(1))
                c.rng, c.rng_state = ("python" if family == "Random" else "numpy"), digest()
                rec.add_rows(c, "forward", "input", [_as_tensor(a) for a in args])
                if kwargs:
                    rec.add_rows(c, "forward", "input", {k: _as_tensor(v) for k, v in kwargs.items()}, is_kwarg=True)
            out = orig(*args, **kwargs)
            with rec.working():
                rec.add_rows(c, "forward", "output", [_as_tensor(out)], set_producer=True)
            return out

        functools.update_wrapper(draw, orig, assigned=("__doc__",), updated=())  # sets __wrapped__ too
        draw.__name__ = getattr(orig, "__name__", name)
        return draw

    def before(self, c, func, args, kwargs):
        """Fill the call's rng columns and return (callable to run, args, kwargs)."""
        key = (c.family, c.op)
        if key not in DRAWING_APIS:
            return func, args, kwargs
        user_gen = kwargs.get("generator")
        device = _target_device(args, kwargs)
        if key in ATTENTION_DROPOUTS:
            return self._attention(c, func, args, kwargs, device)
        changes = (key in DROPOUTS and self.dropout_off) or (self.host_random and user_gen is None)
        left = changes and self._recompute_unreachable()
        if key in DROPOUTS and self.dropout_off and not left:
            args, kwargs = _zero_p(c.op, args, kwargs)
            c.rng = "dropout-off"
            return func, args, kwargs
        if key in DROPOUTS and not _dropout_draws(c.family, c.op, args, kwargs):
            c.rng = NO_DRAW  # p=0 or not training: the mask is never drawn, so no generator state to blame
            return func, args, kwargs
        if self.host_random and user_gen is None and not left:
            host = self.host_generator
            if self.replays_reentrant:  # the recompute of a reentrant region draws again from here
                self.host_states.note(reentrant_region_nodes(), host)
            c.rng = f"host (for {device})"
            c.rng_state = generator_digest(host)
            return _host_call(key, func, device, host), args, kwargs
        gen = user_gen if user_gen is not None else _default_generator(device)
        c.rng = f"custom ({gen.device})" if user_gen is not None else str(device) + (LEFT_AS_DRAWN if left else "")
        c.rng_state = generator_digest(gen)
        return func, args, kwargs

    def _recompute_unreachable(self) -> bool:
        """Whether a draw made now is recomputed outside the function mode (docs in capture/checkpoint_draws.py):
        then dropout_off and host_random leave it as drawn, so that the recompute repeats it; warned once."""
        if not (in_non_reentrant_region() or (not self.replays_reentrant and reentrant_region_nodes())):
            return False
        if not self._warned_checkpoint:
            self._warned_checkpoint = True
            warnings.warn(
                "msprobe_nb: dropout_off and host_random cannot reach the recompute of this activation "
                "checkpoint (torch.utils.checkpoint with use_reentrant=False, or any checkpoint at levels L0 and "
                "L2): its draws are left as drawn, so that the recompute repeats them and the gradients stay "
                "right; their rng column says 'left as drawn'. To change those draws too, record at L1 or mix "
                "with use_reentrant=True, or without activation checkpointing.", RuntimeWarning, stacklevel=2)
        return True


    def _attention(self, c, func, args, kwargs, device):
        """Attention draws its dropout mask inside the kernel, on the device's generator, when ``dropout_p``
        is above 0: recorded as a draw, and ``dropout_off`` sets ``dropout_p=0`` (host draws cannot reach
        into the kernel)."""
        p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        if not p:
            return func, args, kwargs
        left = self.dropout_off and self._recompute_unreachable()
        if self.dropout_off and not left:
            if "dropout_p" in kwargs:
                kwargs = dict(kwargs, dropout_p=0.0)
            else:
                args = tuple(args[:4]) + (0.0,) + tuple(args[5:])
            c.rng = "dropout-off"
            return func, args, kwargs
        gen = _default_generator(device)
        c.rng, c.rng_state = str(device) + (LEFT_AS_DRAWN if left else ""), generator_digest(gen)
        return func, args, kwargs


PY_RANDOM = ("seed", "random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss",
             "normalvariate", "getrandbits", "triangular", "betavariate", "expovariate", "lognormvariate")
NP_RANDOM = ("seed", "rand", "randn", "randint", "random", "random_sample", "choice", "shuffle", "permutation",
             "normal", "uniform", "standard_normal", "binomial", "poisson", "beta", "exponential")


def _python_digest() -> str:
    return f"state={zlib.crc32(repr(_pyrandom.getstate()).encode()):08x}"


def _numpy_digest() -> str:
    # legacy=True (the default) gives the tuple; numpy's stubs do not narrow the return type by it
    kind, keys, pos, *_ = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
    return f"state={zlib.crc32(keys.tobytes()):08x} pos={pos}"


def _as_tensor(x):
    """numpy arrays as tensors (for statistics); everything else unchanged."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "biufc":
        return torch.from_numpy(np.ascontiguousarray(x))
    if isinstance(x, np.generic):
        return x.item()
    return x


def _dropout_args(family: str, args, kwargs) -> dict:
    """A dropout call's arguments by name (input, p, training, inplace)."""
    names = ("input", "p", "train" if family != "Functional" else "training", "inplace")
    return dict(zip(names, args), **kwargs)


def _dropout_draws(family: str, op: str, args, kwargs) -> bool:
    """Whether a dropout call draws a mask: with ``p=0`` or outside training it returns its input as is."""
    bound = _dropout_args(family, args, kwargs)
    try:
        p = float(bound.get("p", 0.5))
    except (TypeError, ValueError):
        return True
    trains = not (family == "Functional" and "alpha" in op)  # F.alpha_dropout's training defaults to False
    training = bound.get("training", bound.get("train", trains))
    return bool(True if training is None else training) and p != 0


def _zero_p(op: str, args, kwargs):
    """Dropout with ``p=0``: keep every element, whatever the mode."""
    if "p" in kwargs:
        kwargs = dict(kwargs, p=0.0)
    elif len(args) > 1:
        args = (args[0], 0.0) + tuple(args[2:])
    else:
        kwargs = dict(kwargs, p=0.0)
    return args, kwargs


def _cpu(x):
    return x.cpu() if isinstance(x, torch.Tensor) else x


def _host_call(key, func, device: torch.device, gen: torch.Generator):
    """A callable that makes ``func``'s draw on the host generator and returns it on ``device``."""
    family, op = key

    def factory(*args, **kwargs):
        rg = kwargs.pop("requires_grad", False)
        kwargs.pop("pin_memory", None)
        kwargs = dict(kwargs, generator=gen, device="cpu")
        args = tuple(_cpu(a) for a in args)
        out = func(*args, **kwargs).to(device)
        return out.requires_grad_(True) if rg else out

    def tensor_arg(*args, **kwargs):
        args = tuple(_cpu(a) for a in args)
        kwargs = {k: _cpu(v) for k, v in kwargs.items()}
        return func(*args, generator=gen, **kwargs).to(device)

    def in_place(t, *args, **kwargs):
        tmp = torch.empty(t.shape, dtype=t.dtype)
        args = tuple(_cpu(a) for a in args)
        func(tmp, *args, generator=gen, **kwargs)
        with torch.no_grad():
            t.copy_(tmp)
        return t

    def dropout(*args, **kwargs):
        bound = _dropout_args(family, args, kwargs)
        x, p = bound["input"], float(bound.get("p", 0.5))
        training = bool(bound.get("training", bound.get("train", True)))
        inplace = bool(bound.get("inplace", False))
        if not training or p == 0:
            return func(*args, **kwargs)
        if p >= 1:
            return x.mul_(0) if inplace else x * 0
        shape = x.shape
        if op in ("dropout1d", "dropout2d", "dropout3d", "feature_dropout") and x.dim() >= 2:
            batched = x.dim() > {"dropout1d": 2, "dropout2d": 3, "dropout3d": 4}.get(op, 1)
            keep = x.dim() - (2 if batched else 1)
            shape = tuple(x.shape[: x.dim() - keep]) + (1,) * keep
        mask = torch.empty(shape, dtype=torch.float32).bernoulli_(1 - p, generator=gen)
        mask = mask.to(device=x.device, dtype=x.dtype) / (1 - p)
        return x.mul_(mask) if inplace else x * mask

    if key in FACTORIES:
        return factory
    if key in INPLACE_DRAWS or key in INIT_DRAWS:
        return in_place
    if key in TENSOR_ARG_DRAWS:
        return tensor_arg
    if key in DROPOUTS and op in ("dropout", "dropout1d", "dropout2d", "dropout3d", "feature_dropout"):
        return dropout
    return func  # alpha dropout, rrelu, gumbel...: drawn natively (rng columns still say which generator)
