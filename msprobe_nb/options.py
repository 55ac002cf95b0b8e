"""The recording options, described once: name, kind, allowed values, help and command-line flag.

``DumpConfig`` (config.py) coerces and checks its fields by the kind given here; the magics
(``%msprobe_start``, ``%%msprobe``) and the command line (``msprobe-nb config``) build their arguments and
help from the same table, so an option or an allowed value added here reaches all three. The keys'
meanings are in docs/config.md (a test checks every option is documented there).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TASKS = ("statistics", "tensor", "md5", "structure", "overflow_check", "acc_check")
LEVELS = ("L0", "L1", "mix", "L2")
DATA_MODES = ("all", "forward", "backward", "input", "output")
SUMMARY_MODES = ("statistics", "md5", "xor", "crc32")
ON_EXISTS = ("new", "error", "overwrite")
FRAMEWORKS = ("pytorch",)
COMPILE_MODES = ("compiled", "eager")

#: kinds of value, and how a command line writes them
KINDS = ("choice", "bool", "ids", "names", "data_mode", "seed", "path")


@dataclass(frozen=True)
class Option:
    """One recording option (a ``DumpConfig`` field)."""

    name: str
    kind: str
    help: str
    choices: tuple[str, ...] = ()
    short: str = ""       #: one-letter flag, e.g. ``-l``
    flag: str = ""        #: the command-line flag when it is not ``--<name with dashes>``
    shell: bool = True    #: offered by the magics and the command line (not: msprobe's compatibility keys)

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The attribute argparse stores the flag's value under."""
        return self.cli_flag.lstrip("-").replace("-", "_")

    @property
    def negated(self) -> bool:
        """A bool option on by default, switched off by its flag (``--no-stack``)."""
        return self.kind == "bool" and self.cli_flag.startswith("--no-")

    def help_text(self) -> str:
        if self.kind == "data_mode":
            return f"{self.help}: {' | '.join(self.choices)} (a comma list of forward, backward, input, output)"
        return f"{self.help}: {' | '.join(self.choices)}" if self.choices else self.help


OPTIONS: tuple[Option, ...] = (
    Option("task", "choice", "what each tensor becomes", TASKS, short="-t"),
    Option("dump_path", "path", "where the dump goes (spaces and non-ASCII are fine)", short="-o"),
    Option("rank", "ids", "ranks to record: 0,1 or 0-3 (default: all)"),
    Option("step", "ids", "steps to record: 0,1 or 0-3 (default: all)"),
    Option("level", "choice", "L0 modules, L1 APIs, mix both, L2 aten ops", LEVELS, short="-l"),
    Option("seed", "seed", "apply seed_all(seed) when recording starts (none: no seeding)"),
    Option("is_deterministic", "bool", "deterministic algorithms (with --seed)", flag="--deterministic"),
    Option("async_dump", "bool", "accepted for msprobe compatibility; changes nothing", shell=False),
    Option("scope", "names", "two call names: first,last"),
    Option("list", "names", "call names or substrings to record, comma separated"),
    Option("data_mode", "data_mode", "which rows to record", DATA_MODES),
    Option("summary_mode", "choice", "statistics, or content hashes beside them", SUMMARY_MODES),
    Option("tensor_list", "names", "statistics task: call-name substrings whose whole tensors are saved too"),
    Option("dropout_off", "bool", "every dropout drops nothing (p=0, attention's dropout_p=0)"),
    Option("host_random", "bool", "draw random numbers on the host and move them to the device"),
    Option("on_exists", "choice", "when dump-path holds a dump already", ON_EXISTS),
    Option("stack", "bool", "do not keep user stacks", flag="--no-stack"),
    Option("compress_tensors", "bool", "tensor task: compress the whole-tensor buffers (bitshuffle + LZ4)"),
    Option("compile", "choice", "a torch.compile'd model: keep its compiled numerics (each graph one call), or run "
           "it eagerly while recording for per-call rows", COMPILE_MODES),
    Option("framework", "choice", "msprobe's framework key", FRAMEWORKS, shell=False),
)
BY_NAME = {o.name: o for o in OPTIONS}


def argument_specs() -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """(flags, argparse keyword arguments) of every shell option, for ``add_argument`` and the magics'
    ``argument`` decorator alike. Bool flags store True (``--no-stack`` stores False into ``stack``)."""
    specs: list[tuple[tuple[str, ...], dict[str, Any]]] = []
    for o in OPTIONS:
        if not o.shell:
            continue
        flags: tuple[str, ...] = (o.cli_flag, o.short) if o.short else (o.cli_flag,)
        kw: dict[str, Any] = {"dest": o.name, "help": o.help_text(), "default": None}
        if o.kind == "bool":
            kw["action"] = "store_const"
            kw["const"] = not o.negated
        specs.append((flags, kw))
    return specs


def overrides_from(args: Any) -> dict[str, Any]:
    """The options given on a parsed command line, as ``load_config`` keywords (None: not given)."""
    return {o.name: getattr(args, o.name) for o in OPTIONS
            if o.shell and getattr(args, o.name, None) is not None}
