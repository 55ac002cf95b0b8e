"""The recording API: :class:`Debugger` (start / stop / step) and the :func:`record` context manager.

Both are thin over the capture layer: they build a :class:`~msprobe_nb.capture.recorder.Recorder`, push
the modes and install the hooks the level needs, and hand each finished step to the HDF5 writer. Several
debuggers may exist (no process-wide singleton), but only one records at a time.
"""
from __future__ import annotations

import atexit
import dataclasses
import gc
import os
import platform
import socket
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from msprobe_nb.capture.api_mode import ApiMode
from msprobe_nb.capture.compiled import CompileWatch
from msprobe_nb.capture.dispatch_mode import AtenMode
from msprobe_nb.capture.module_hooks import ModuleHooks
from msprobe_nb.capture.randomness import RandomPolicy
from msprobe_nb.capture.recorder import Recorder
from msprobe_nb.config import DumpConfig, load_config

if TYPE_CHECKING:
    from msprobe_nb.capture.setup_record import SetupWatch
    from msprobe_nb.seeding import SeedReport
    from msprobe_nb.store.hdf5_writer import DumpLock, DumpWriter

_LIVE: weakref.WeakSet = weakref.WeakSet()
_RECORDING: list = []  # the debugger recording now, if any
#: young-generation gc threshold while recording (see Debugger._attach)
GC_THRESHOLD_WHILE_RECORDING = 50_000


def _rank() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


def _world_size() -> int:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _device_type() -> str:
    try:
        import torch_npu  # noqa: F401
        return "npu"
    except ImportError:
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"


class Debugger:
    """Records the torch API and module calls of a training run into an HDF5 dump.

    ``config`` is an msprobe-style config.json path, a dict or a DumpConfig; keyword overrides win
    (``level="mix"``, ``dump_path="runs/npu"``, ``step=[0, 1]``...). ``start(model)`` records (the model
    gives modules their msprobe names; without it the first top-level module is the root), ``stop()``
    pauses and writes what the step recorded so far, ``step()`` ends a training step, ``close()`` ends
    the dump. Each step is durable on disk once written.
    """

    def __init__(self, config: Any = None, *, model: Any = None, **overrides: Any):
        self.config: DumpConfig = load_config(config, **overrides)
        self.model = model
        self.dump_dir: Path | None = None
        self._recorder: Recorder | None = None
        self._writer: DumpWriter | None = None
        self._api_mode: ApiMode | None = None
        self._aten_mode: AtenMode | None = None
        self._hooks: ModuleHooks | None = None
        self._random: RandomPolicy | None = None
        self._seed_report: SeedReport | None = None
        self._closed = False
        self._froze = False
        self._gc_threshold: tuple | None = None  # the user's gc thresholds while we record
        self._dropped: dict[int, str] = {}  # step -> why its rows could not be written
        self._unmarked: list[tuple[int, int | None]] = []  # dropped before the dump file existed
        self._stacks_owed: dict = {}  # stacks sent with a dropped step: the recorder will not send them again
        self._lock: DumpLock | None = None  # this rank's claim of the dump folder (DumpLock), from start() to close()
        self._made_dir = False  # start() created the dump folder
        self._online = None  # task acc_check: the OnlineAccCheck grading each step
        # torch.compile'd models: the compile option's stance, the warning, the dump's note
        self._compile = CompileWatch(self.config.compile, self.config.level)
        _LIVE.add(self)

    # ------------------------------------------------------------------ state
    @property
    def recording(self) -> bool:
        return bool(_RECORDING) and _RECORDING[0] is self

    @property
    def current_step(self) -> int:
        return self._recorder.step if self._recorder else 0

    @property
    def errors(self) -> list[str]:
        """Internal recording failures (the model always ran unaffected)."""
        return list(self._recorder.errors) if self._recorder else []

    @property
    def seed_report(self):
        """What ``seed_all`` set, when the config asked for a seed."""
        return self._seed_report

    def __repr__(self) -> str:
        state = "recording" if self.recording else ("closed" if self._closed else "idle")
        return f"<msprobe_nb.Debugger {state}, step {self.current_step}: {self.config.describe()}>"

    # ------------------------------------------------------------------ control
    def start(self, model: Any = None) -> Debugger:
        """Begin (or resume) recording. Idempotent."""
        if self._closed:
            raise RuntimeError("this Debugger is closed; create a new one to record again")
        if self.recording:
            return self
        if _RECORDING:
            raise RuntimeError(f"another Debugger is recording ({_RECORDING[0]!r}); stop it first")
        cfg = self.config
        first = self._recorder is None
        if first:
            self._claim_dump_dir()  # before anything else: an unusable or busy dump_path fails here
            if cfg.seed is not None:
                from msprobe_nb.seeding import seed_all
                self._seed_report = seed_all(cfg.seed, cfg.is_deterministic, verbose=False)
            elif cfg.is_deterministic:  # determinism without reseeding the user's generators
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.use_deterministic_algorithms(True)
            # the online pre-check records like the tensor task (whole pre-call inputs), then grades the step
            self._recorder = Recorder(dataclasses.replace(cfg, task="tensor") if cfg.task == "acc_check" else cfg,
                                      rank=_rank())
            self._random = RandomPolicy(cfg)
            self._random.recorder = self._recorder
        rec = self._recorder
        assert rec is not None, "built above on the first start()"
        if cfg.rank and rec.rank not in cfg.rank:
            return self  # this rank is not dumped: run untouched
        model = model if model is not None else self.model
        if model is not None:
            rec.register_model(model)
        if first and cfg.task != "acc_check":  # the set-up record (docs/setup_check.md), before any mode is on
            from msprobe_nb.setup_snapshot import start_setup
            self._setup: SetupWatch | None = start_setup(self.dump_dir, rec.rank, model, source="Debugger",
                                                         seed_report=self._seed_report, quiet=rec.working)
        _RECORDING.append(self)
        if rec.wants_step():
            self._attach()
        return self

    def _claim_dump_dir(self) -> None:
        """Pick the dump folder and claim this rank of it (``rank<N>.lock``), so that a second process
        recording to the same dump_path fails here, or goes to ``<path>_1`` with on_exists="new", instead of
        deleting this run's file or failing at its first step. With several ranks, rank 0 picks the folder
        and tells the others (a collective, so every rank calls ``start()``); otherwise the first rank's file
        would send the others to ``<path>_1``."""
        from msprobe_nb.store.hdf5_writer import DumpLock, claim_dump_dir
        cfg, rank = self.config, _rank()
        dumped = not cfg.rank or rank in cfg.rank
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            box: list = [None, None]
            if rank == 0:
                try:
                    path, lock, self._made_dir = claim_dump_dir(cfg.dump_path, on_exists=cfg.on_exists)
                except OSError as e:
                    box[1] = f"{type(e).__name__}: {e}"
                    dist.broadcast_object_list(box, src=0)
                    raise
                box[0] = str(path)
                if dumped:
                    self._lock = lock
                else:
                    lock.release()
            dist.broadcast_object_list(box, src=0)
            if box[1] is not None:
                raise OSError(f"rank 0 could not open the dump folder: {box[1]}")
            self.dump_dir = Path(box[0])
            if dumped and rank != 0:
                self._lock = DumpLock.claim(self.dump_dir, rank)
        elif dumped:
            self.dump_dir, self._lock, self._made_dir = claim_dump_dir(cfg.dump_path, on_exists=cfg.on_exists,
                                                                       rank=rank)

    def _release_dump_dir(self) -> None:
        """Give this rank of the folder back; a folder this Debugger created and left empty goes too."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        lock.release()
        if self._made_dir and self._writer is None and self.dump_dir is not None:
            (self.dump_dir / f"setup_rank{self._recorder.rank if self._recorder else _rank()}.json").unlink(
                missing_ok=True)  # no dump: its set-up record goes with the folder
            try:
                self.dump_dir.rmdir()  # only if empty: another rank's lock or file keeps it
            except OSError:
                return
            self.dump_dir = None

    def _attach(self) -> None:
        """Install what the level needs; a step the config filters out runs with nothing installed."""
        rec, cfg = self._recorder, self.config
        assert rec is not None and self._random is not None, "start() builds the recorder and the random policy"
        rec.resume()
        # The module hooks are global, so other threads' modules reach them too; the L1 mode is the starting
        # thread's alone (torch's mode stack is per thread), and so are the module calls recorded.
        rec.thread = threading.get_ident()
        if self._api_mode is not None or self._aten_mode is not None:
            rec.active = True
            return
        self._compile.enter()
        self._hooks = self._hooks or ModuleHooks(rec, self._compile)
        self._hooks.install()
        if cfg.level == "L2":
            self._aten_mode = AtenMode(rec)
            self._aten_mode.__enter__()
        record_apis = cfg.level in ("L1", "mix")
        if record_apis or cfg.dropout_off or cfg.host_random:
            self._api_mode = ApiMode(rec, self._random, record=record_apis)
            self._api_mode.__enter__()
        if record_apis:
            self._random.install()
        # Recording allocates many small objects; without this, the cyclic GC would rescan every object
        # torch and the model own (often 300,000) again and again. Frozen objects are only exempt from
        # scanning until stop() (nothing frozen if the user froze objects themselves).
        if not self._froze and gc.get_freeze_count() == 0:
            gc.freeze()
            self._froze = True
        # Each recorded call allocates a few objects the collector tracks (calls, hooks, cache entries);
        # at the default threshold (700) that means a young-generation collection every few dozen calls.
        # Collect every 50,000 allocations while recording instead (measured: 4 % of a large step);
        # stop() restores the user's thresholds once the step is written: by then the step's rows, calls and
        # hooks are freed, so the collection that follows has little left to look at.
        if self._gc_threshold is None:
            self._gc_threshold = gc.get_threshold()
            t0, *rest = self._gc_threshold
            if 0 < t0 < GC_THRESHOLD_WHILE_RECORDING:
                gc.set_threshold(GC_THRESHOLD_WHILE_RECORDING, *rest)
        rec.active = True

    def _restore_gc(self) -> None:
        if self._gc_threshold is not None:
            gc.set_threshold(*self._gc_threshold)
            self._gc_threshold = None

    def _detach(self) -> None:
        rec = self._recorder
        assert rec is not None, "only a started Debugger detaches"
        rec.active = False
        if self._froze:
            gc.unfreeze()
            self._froze = False
        for attr in ("_api_mode", "_aten_mode"):
            mode = getattr(self, attr)
            if mode is not None:
                mode.__exit__(None, None, None)
                setattr(self, attr, None)
        if self._hooks is not None:
            self._hooks.remove()
        self._compile.exit()
        if self._random is not None:
            self._random.uninstall()
        rec.remove_step_hooks()
        rec.module_stack.clear()

    def stop(self) -> None:
        """Pause recording and write what this step recorded so far. Idempotent.

        Called while an exception is being handled (from an ``except`` or ``finally`` block, or by
        ``record()`` / ``with Debugger`` left by an exception), the step is written flagged partial: it
        holds only what ran before the exception (``Dump.partial_steps``)."""
        if not self.recording:
            return
        partial = sys.exc_info()[1] is not None
        try:
            self._detach()
        finally:
            _RECORDING.clear()
        try:
            self._flush(partial=partial)
        finally:
            self._restore_gc()

    def step(self) -> None:
        """End a training step: write it, reset the per-step counters, move on (msprobe's ``step()``).

        The counter moves on even when writing fails (a full disk): that step is dropped and marked as such
        in the dump, the error says so, and the next step keeps its own number instead of merging into it.
        """
        if self._recorder is None:
            return
        try:
            self._flush()
        finally:
            self._next_step()

    def _next_step(self) -> None:
        rec = self._recorder
        assert rec is not None, "step() returns early without a recorder"
        rec.remove_step_hooks()
        rec.step += 1
        rec.reset_step()
        if not self.recording:
            return
        if self.config.step and rec.step > max(self.config.step):
            self.stop()  # every configured step is recorded
        elif rec.wants_step():
            self._attach()
        elif rec.active:
            self._detach()
            self._restore_gc()

    def close(self) -> None:
        """Stop, write and close the dump file. Idempotent; also run at interpreter exit."""
        if self._closed:
            return
        try:
            self.stop()
        finally:
            setup = getattr(self, "_setup", None)
            if setup is not None:
                setup.remove()
            if self._recorder is not None:
                self._recorder.remove_all_hooks()
            if self._writer is not None:
                self._writer.close()
            elif self._recorder is not None and self.config.task != "acc_check" and not self._dropped \
                    and (not self.config.rank or self._recorder.rank in self.config.rank):
                warnings.warn(f"msprobe_nb: no call was recorded, so no dump was written to "
                              f"{str(self.dump_dir or self.config.dump_path)!r} (level {self.config.level}: "
                              f"{_NOTHING_SEEN.get(self.config.level, '')}; steps {self.config.step or 'all'})",
                              UserWarning, stacklevel=2)
            self._release_dump_dir()
            self._closed = True

    def __enter__(self) -> Debugger:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ writing
    def _open_writer(self):
        from msprobe_nb.store.hdf5_writer import DumpWriter
        cfg = self.config
        if self._lock is None:
            self._claim_dump_dir()
        meta = {
            "task": cfg.task, "level": cfg.level, "framework": cfg.framework, "summary_mode": cfg.summary_mode,
            "config": cfg.to_dict(), "torch_version": torch.__version__, "device_type": _device_type(),
            "rank": self._recorder.rank, "world_size": _world_size(), "seed": cfg.seed,
            "hostname": socket.gethostname(), "python": platform.python_version(),
        }
        if self._seed_report is not None:
            meta["seed_report"] = str(self._seed_report)
        if self._compile.note() is not None:
            meta["compile_note"] = self._compile.note()
        self._writer = DumpWriter(self.dump_dir, rank=self._recorder.rank, meta=meta,
                                  tensor_compression="same" if cfg.compress_tensors else None, lock=self._lock)
        for step, code in self._unmarked:  # steps dropped before the file existed
            self._writer.mark_dropped(step, code)
        self._unmarked.clear()

    def _flush(self, partial: bool = False) -> None:
        rec = self._recorder
        if rec is None:
            return
        with rec.working():  # the kit's own torch calls (tensor copies, hashes) are never recorded
            stacks = None
            try:
                data = rec.materialize()
                if data is None:
                    return
                # the recorder sends each stack once: those of a dropped step go with the next one written
                stacks = {**self._stacks_owed, **data["stacks"]} if self._stacks_owed else data["stacks"]
                if self.config.task == "acc_check":  # verdicts and metrics only: no dump file, no tensors
                    self._online_check().check_step(rec.step, data)
                else:
                    if self._writer is None:
                        self._open_writer()
                    assert self._writer is not None, "_open_writer() opens it"
                    self._writer.write_step(rec.step, data["columns"], stacks, data["construct"], data["tensors"],
                                            partial=partial)
            except BaseException as exc:
                rec.flushed()  # dropped: kept, they would be written later under the next step's number
                if stacks is not None:
                    self._stacks_owed = stacks
                err = self._drop(rec.step, exc)
                if err is None:
                    raise
                raise err from exc
            self._stacks_owed = {}
        rec.flushed()

    def _drop(self, step: int, exc: BaseException):
        """Note that ``step``'s rows are lost, in the dump too; the error to raise (None: ``exc`` itself,
        with a note saying what was lost)."""
        from msprobe_nb.store.hdf5_writer import DumpWriteError
        code = exc.errno if isinstance(exc, OSError) else None
        why = f"{type(exc).__name__}: {os.strerror(code) if code else exc}"  # HDF5's full text is the __cause__
        self._dropped[step] = why
        if self._writer is not None:
            self._writer.mark_dropped(step, code)
        else:
            self._unmarked.append((step, code))  # no file yet: marked once one is created
        where = str(self._writer.path if self._writer is not None else self.dump_dir)
        msg = (f"msprobe_nb: step {step} could not be written to {where!r} and its rows are dropped "
               f"({why}); the dump marks the step as dropped (Dump.dropped_steps) and "
               "later steps keep their numbers")
        if isinstance(exc, OSError):
            return DumpWriteError(code, msg, step, where)
        if hasattr(exc, "add_note"):  # Python 3.11+; on 3.10 the error goes up as it came
            exc.add_note(msg)
        return None

    def _online_check(self):
        if self._online is None:
            from msprobe_nb.precheck.online import OnlineAccCheck
            self._online = OnlineAccCheck.from_config(self.dump_dir, self.config, rank=self._recorder.rank)
        return self._online

    @property
    def acc_check_result(self):
        """Task ``acc_check``: the pre-check of every step written so far (an ``AccCheckResult``), also in
        ``acc_check_rank<N>.csv`` in the dump folder."""
        if self._online is None:
            raise RuntimeError("no pre-check: record with task='acc_check' and end a step first")
        return self._online.result

    @property
    def dropped_steps(self) -> dict[int, str]:
        """Steps whose rows (some or all) could not be written, and why; the dump marks them too."""
        return dict(self._dropped)

    def load(self):
        """The dump written so far, as a :class:`msprobe_nb.Dump`."""
        from msprobe_nb.store.dump import load
        if self.dump_dir is None:
            raise RuntimeError("nothing has been written yet: record a step first")
        return load(self.dump_dir)


#: what a level records, for the warning that a recording saw nothing
_NOTHING_SEEN = {"L0": "module calls, seen by global module hooks", "L1": "torch API calls",
                 "mix": "module and torch API calls", "L2": "aten operators"}


@contextmanager
def record(config: Any = None, *, model: Any = None, **overrides: Any) -> Iterator[Debugger]:
    """Record everything inside the ``with`` block; the dump is written and closed on exit."""
    dbg = Debugger(config, model=model, **overrides)
    dbg.start()
    try:
        yield dbg
    finally:
        dbg.close()


@atexit.register
def _close_all() -> None:
    for dbg in list(_LIVE):
        try:
            dbg.close()
        except Exception as exc:  # at exit: report, never raise
            warnings.warn(f"msprobe_nb: could not close {dbg!r}: {exc}", RuntimeWarning, stacklevel=2)
