"""Jupyter magics: ``%msprobe_start``, ``%msprobe_stop``, ``%msprobe_step`` and the ``%%msprobe`` cell magic.

They are thin shells over :class:`msprobe_nb.Debugger`: options map one to one onto config keys
(``--level mix`` is ``level="mix"``), ``--config`` reads an msprobe config.json, and the options win
over the file. The debugger being used is available as ``msprobe_nb.magics.current()``, and
``%msprobe_stop`` leaves the dump in the variable named by ``--as`` (default ``msprobe_dump``).
"""
from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from msprobe_nb.config import ConfigError
from msprobe_nb.debugger import Debugger
from msprobe_nb.options import argument_specs, overrides_from

_STATE: dict = {"debugger": None, "monitor": None}


def current() -> Debugger | None:
    """The debugger the magics started, if any."""
    return _STATE["debugger"]


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

    def _new_debugger(self, line: str) -> Debugger:
        try:  # shlex, so that quoted paths with spaces work as in a shell
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"cannot parse options {line!r}: {exc}") from None
        args = self._start_parser_owner.parser.parse_args(words)
        try:
            dbg = Debugger(args.config, model=self._model(args.model), **overrides_from(args))
        except (ConfigError, FileNotFoundError) as exc:
            raise UsageError(str(exc)) from None
        return dbg

    @_options
    @line_magic
    def msprobe_start(self, line=""):
        """Start recording every torch API and module call until ``%msprobe_stop``."""
        dbg = current()
        if dbg is not None and dbg.recording:
            raise UsageError("already recording; run %msprobe_stop first")
        dbg = self._new_debugger(line)
        dbg.start()
        _STATE["debugger"] = dbg
        print(f"msprobe_nb: recording {dbg.config.describe()}")

    _start_parser_owner = msprobe_start

    @magic_arguments()
    @argument("--as", dest="var", default="msprobe_dump", help="variable that receives the loaded dump")
    @line_magic
    def msprobe_stop(self, line=""):
        """Stop recording, write and close the dump, and load it into a variable."""
        args = parse_argstring(self.msprobe_stop, line)
        dbg = current()
        if dbg is None:
            raise UsageError("not recording; run %msprobe_start first")
        dbg.close()
        _STATE["debugger"] = None
        if dbg.dump_dir is None:
            print("msprobe_nb: stopped; nothing was recorded")
            return
        dump = dbg.load()
        self.shell.user_ns[args.var] = dump
        print(f"msprobe_nb: {len(dump.calls)} rows, steps {list(dump.steps)} -> {dbg.dump_dir} "
              f"(loaded as `{args.var}`)")
        if dbg.errors:
            print(f"msprobe_nb: {len(dbg.errors)} recording errors (the model was unaffected): {dbg.errors[0]}")

    @line_magic
    def msprobe_step(self, line=""):
        """End a training step (msprobe's ``debugger.step()``): write it and restart the per-step counters."""
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
        dbg = self._new_debugger(line)
        _STATE["debugger"] = dbg
        dbg.start()
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
        args = parse_argstring(self.msprobe_monitor, line)
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

