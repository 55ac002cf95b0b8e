"""Jupyter magics: ``%msprobe_start``, ``%msprobe_stop``, ``%msprobe_step`` and the ``%%msprobe`` cell magic.

They are thin shells over :class:`msprobe_nb.Debugger`: options map one to one onto config keys
(``--level mix`` is ``level="mix"``), ``--config`` reads an msprobe config.json, and the options win
over the file. The debugger being used is available as ``msprobe_nb.magics.current()``, and
``%msprobe_stop`` leaves the dump in the variable named by ``--as`` (default ``msprobe_dump``).
"""
from __future__ import annotations

import dataclasses
import shlex
import warnings
from pathlib import Path

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from msprobe_nb.config import ConfigError, unknown_flags
from msprobe_nb.debugger import Debugger
from msprobe_nb.options import argument_specs, overrides_from

_STATE: dict = {"debugger": None, "monitor": None}


def current() -> Debugger | None:
    """The debugger the magics started, if any."""
    return _STATE["debugger"]


def _parse(magic, line: str):
    """Parse a magic's line with its own parser (shlex, so that quoted paths with spaces work as in a shell).
    ``--help``/``-h`` prints the usage and gives None; an unknown flag is a UsageError with a did-you-mean."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse options {line!r}: {exc}") from None
    parser = magic.parser
    if "--help" in words or "-h" in words:
        print(parser.format_help())
        return None
    args, extra = parser.parse_known_args(words)
    if extra:
        raise UsageError(unknown_flags(extra, parser._option_string_actions))
    return args


def _print_notes(caught, dbg: Debugger) -> None:
    """The kit's warnings while setting up, as plain lines: a dump folder that had to move is said once, by the
    "recording ... -> path" line, not as a UserWarning pointing at the kit's own source."""
    for w in caught:
        text = str(w.message)
        if "msprobe_nb" not in str(w.filename).replace("\\", "/"):  # not the kit's: shown as it came
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
        elif dbg.dump_dir is None or "writing to" not in text or str(dbg.dump_dir) not in text:
            print(f"msprobe_nb: note: {text}")


def _where(dbg: Debugger) -> str:
    """Where the dump goes, and why when it is not the folder asked for."""
    asked = dbg.config.dump_path
    if dbg.dump_dir is None or Path(dbg.dump_dir) == Path(asked):
        return str(dbg.dump_dir or asked)
    return f"{dbg.dump_dir} ({asked} holds a dump already or is in use; --on-exists overwrite replaces it)"


def _why_empty(dbg: Debugger, asked: list[int], last: int) -> str:
    """Why a recording holds no row, from its options and the step it stopped in."""
    cfg = dbg.config
    rank = getattr(dbg._recorder, "rank", 0)
    if asked and last < min(asked):
        return (f"--step {','.join(map(str, asked))} asks for step(s) the run never reached (it stopped in step "
                f"{last}; steps count from 0 and %msprobe_step ends one)")
    if cfg.rank and rank not in cfg.rank:
        return f"--rank {','.join(map(str, cfg.rank))} leaves out this process (rank {rank})"
    if cfg.scope or cfg.list:
        return "no call matched --scope / --list"
    return "no torch call ran while recording"


def _options(func):
    """The recording options shared by ``%msprobe_start`` and ``%%msprobe``, from the option table."""
    opts = [argument("--config", "-c", help="msprobe-style config.json; the options below override it")]
    opts += [argument(*flags, **kw) for flags, kw in argument_specs()]
    opts.append(argument("--model", "-m", help="name of the model variable (gives modules their msprobe names)"))
    for opt in reversed(opts):
        func = opt(func)
    return magic_arguments()(func)


@magics_class
class MsprobeMagics(Magics):
    """Recording magics; see the module docstring."""

    def _model(self, name):
        if not name:
            return None
        try:
            return self.shell.user_ns[name]
        except KeyError:
            raise UsageError(f"--model {name!r}: no such variable in the notebook") from None

    def _begin(self, line: str) -> Debugger | None:
        """A started Debugger for the options in ``line`` (None: ``--help`` was asked for)."""
        args = _parse(self._start_parser_owner, line)
        if args is None:
            return None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                dbg = Debugger(args.config, model=self._model(args.model), **overrides_from(args))
            except (ConfigError, FileNotFoundError) as exc:
                raise UsageError(str(exc)) from None
            dbg.start()
        _print_notes(caught, dbg)
        return dbg

    @_options
    @line_magic
    def msprobe_start(self, line=""):
        """Start recording every torch API and module call until ``%msprobe_stop``."""
        dbg = current()
        if dbg is not None and dbg.recording:
            raise UsageError("already recording; run %msprobe_stop first")
        dbg = self._begin(line)
        if dbg is None:
            return
        _STATE["debugger"] = dbg
        what = dataclasses.replace(dbg.config, dump_path=_where(dbg)).describe()
        print(f"msprobe_nb: recording {what}")

    _start_parser_owner = msprobe_start

    @magic_arguments()
    @argument("--as", dest="var", default="msprobe_dump", help="variable that receives the loaded dump")
    @line_magic
    def msprobe_stop(self, line=""):
        """Stop recording, write and close the dump, and load it into a variable."""
        args = _parse(self.msprobe_stop, line)
        if args is None:
            return
        dbg = current()
        if dbg is None:
            raise UsageError("not recording; run %msprobe_start first")
        dbg.close()
        _STATE["debugger"] = None
        last = dbg.current_step  # the step the run was in when it stopped
        asked = sorted(dbg.config.step)
        if dbg.dump_dir is None or not any(Path(dbg.dump_dir).glob("rank*.h5")):
            print(f"msprobe_nb: stopped; nothing was recorded: {_why_empty(dbg, asked, last)}; "
                  f"`{args.var}` is not set")
            return
        dump = dbg.load()
        self.shell.user_ns[args.var] = dump
        print(f"msprobe_nb: {len(dump.calls)} rows, steps {list(dump.steps)} -> {dbg.dump_dir} "
              f"(loaded as `{args.var}`)")
        missing = [s for s in asked if s not in set(dump.steps)]
        if missing:
            print(f"msprobe_nb: step(s) {', '.join(map(str, missing))} asked for by --step were not recorded: "
                  f"the run stopped in step {last} (%msprobe_step ends a step)")
        if dbg.errors:
            print(f"msprobe_nb: {len(dbg.errors)} recording errors (the model was unaffected): {dbg.errors[0]}")

    @line_magic
    def msprobe_step(self, line=""):
        """End a training step (msprobe's ``debugger.step()``): write it and restart the per-step counters."""
        if line.strip() in ("--help", "-h"):
            print("%msprobe_step: end the training step being recorded (write it, restart the counters); "
                  "no options")
            return
        if line.strip().startswith("-"):
            raise UsageError(f"%msprobe_step takes no options, got {line.strip()!r}")
        dbg = current()
        if dbg is None:
            raise UsageError("not recording; run %msprobe_start first")
        dbg.step()
        print(f"msprobe_nb: step {dbg.current_step}")

    @_options
    @cell_magic
    def msprobe(self, line="", cell=""):
        """Record this cell only: ``%%msprobe --level mix -o runs/npu``; the dump lands in ``msprobe_dump``."""
        if current() is not None and current().recording:
            raise UsageError("%msprobe_start is recording; %%msprobe would nest")
        dbg = self._begin(line)
        if dbg is None:
            return
        _STATE["debugger"] = dbg
        try:
            self.shell.run_cell(cell)
        finally:
            self.msprobe_stop("")

    @magic_arguments()
    @argument("model", nargs="?", help="name of the model variable")
    @argument("optimizer", nargs="?", help="name of the optimizer variable (optional)")
    @argument("--dump-path", "-o", default="monitor", help="folder of the record (monitor_rank<N>.h5 per rank)")
    @argument("--on-exists", default="new", choices=["new", "error", "overwrite"])
    @argument("--activations", action="store_true", help="also every module's output and its gradient")
    @argument("--signs", action="store_true", help="gradient sign bitmaps (direction similarity)")
    @argument("--as", dest="var", default="monitor", help="variable that receives the Monitor")
    @argument("--close", action="store_true", help="close the monitor the magic started")
    @line_magic
    def msprobe_monitor(self, line=""):
        """Start a training monitor: ``%msprobe_monitor model opt -o runs/mon``; call ``monitor.step(loss=...)``
        each step and ``%msprobe_monitor --close`` at the end (``msprobe_nb.Monitor``, docs/monitor.md)."""
        args = _parse(self.msprobe_monitor, line)
        if args is None:
            return
        mon = _STATE["monitor"]
        if args.close:
            if mon is None:
                raise UsageError("no monitor to close; start one with %msprobe_monitor MODEL [OPTIMIZER]")
            mon.close()
            _STATE["monitor"] = None
            print(f"msprobe_nb: monitor closed after {mon.step_index} step(s) -> {mon.dump_path}")
            return
        if not args.model:
            raise UsageError("name the model variable: %msprobe_monitor MODEL [OPTIMIZER] [-o PATH]")
        if mon is not None:
            mon.close()  # one monitor from the magic at a time: the previous one's steps are on disk
        from msprobe_nb.monitor import Monitor

        opt = self._model(args.optimizer) if args.optimizer else None
        try:
            mon = Monitor(self._model(args.model), opt, dump_path=args.dump_path, on_exists=args.on_exists,
                          activations=args.activations, signs=args.signs)
        except (ValueError, FileExistsError) as exc:
            raise UsageError(str(exc)) from None
        _STATE["monitor"] = mon
        self.shell.user_ns[args.var] = mon
        print(f"msprobe_nb: monitoring -> {mon.dump_path}; call `{args.var}.step(loss=loss)` once per step")


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(MsprobeMagics)


def unload_ipython_extension(ipython) -> None:
    """Stop and close any recording; the modes and hooks go with it."""
    dbg = current()
    if dbg is not None:
        dbg.close()
        _STATE["debugger"] = None
    if _STATE["monitor"] is not None:
        _STATE["monitor"].close()
        _STATE["monitor"] = None
    for kind, names in (("line", ("msprobe_start", "msprobe_stop", "msprobe_step", "msprobe_monitor")),
                        ("cell", ("msprobe",))):
        for name in names:
            ipython.magics_manager.magics[kind].pop(name, None)

