"""``msprobe-nb`` command line: compare, info, export, config (a thin shell over the Python API).

    msprobe-nb compare NPU BENCH [-o result.csv] [--fuzzy] [--mapping FILE] [--mode auto|statistics|tensor]
                       [--workers N | --scheduler ADDRESS]   (many ranks: rank by rank on Dask)
    msprobe-nb compare -i compare.json [-o DIR]      (msprobe's legacy input file)
    msprobe-nb info DUMP
    msprobe-nb export DUMP -o DIR [--format msprobe] [--no-tensors] [--allow-outside]
    msprobe-nb config [config.json] [--level mix ...] [--json]   (check what a config records)
    msprobe-nb acc-check DUMP [-o pre.csv] [--device cpu] [--target DEV] [--api NAME] [--skip NAME]
    msprobe-nb acc-compare NPU_PRE.csv GPU_PRE.csv [-o cmp.csv]   (which APIs the NPU does worse)
    msprobe-nb setup-check A B [--rank N] [-o diff.csv] [--fail]   (what differs between two runs' set-ups)
    msprobe-nb demo [--out DIR]    (the randomness demo);  msprobe-nb --version

Exit codes: 0 done, 1 ``--fail-on`` matched, 2 bad input (message on stderr, no traceback), 3 compare: most
rows of either dump found no partner (different models or steps? the comparison says little).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

PROG = "msprobe-nb"
#: compare's exit code when most rows of either dump found no partner: the dumps may be of different models
EXIT_UNMATCHED = 3


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


def _parse_pairs(text: str | None, what: str) -> dict[int, int] | None:
    """'1:0,2:0' -> {1: 0, 2: 0}."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        a, sep, b = item.partition(":")
        try:
            out[int(a)] = int(b)
        except ValueError:
            raise UsageError(f"--{what}: expected NPU:BENCH pairs like 1:0,2:0, got {item!r}") from None
        if not sep:
            raise UsageError(f"--{what}: expected NPU:BENCH pairs like 1:0,2:0, got {item!r}")
    return out


def _legacy_input(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"-i: compare input file not found: {p}")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"-i {p}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict) or not cfg.get("npu_path") or not cfg.get("bench_path"):
        raise UsageError(f"-i {p}: needs the keys npu_path and bench_path")
    return cfg


def _output_file(out: str | None) -> Path | None:
    """-o: a .csv file, or a folder that receives compare_result_<timestamp>.csv (msprobe's naming)."""
    if not out:
        return None
    p = Path(out)
    if p.suffix.lower() == ".csv":
        return p
    return p / f"compare_result_{time.strftime('%Y%m%d%H%M%S')}.csv"


def cmd_compare(a: argparse.Namespace) -> int:
    from msprobe_nb.analysis.compare import compare
    from msprobe_nb.analysis.grading import Thresholds

    npu, bench, verbose = a.npu or a.target_path, a.bench or a.golden_path, not a.quiet
    if a.input:
        if npu or bench:
            raise UsageError("give either NPU BENCH paths or -i compare.json, not both")
        cfg = _legacy_input(a.input)
        npu, bench = cfg["npu_path"], cfg["bench_path"]
        verbose = verbose and bool(cfg.get("is_print_compare_log", True))
        stack = cfg.get("stack_path")
        if stack and Path(stack).resolve().parent != Path(npu).resolve().parent and verbose:
            print(f"note: stack_path {stack} ignored: stacks are read from the NPU dump folder")
    if not npu or not bench:
        raise UsageError("compare needs two dumps: msprobe-nb compare NPU BENCH (or -i compare.json)")
    th = Thresholds()
    if a.diverge_rtol is not None:
        th = Thresholds(diverge_rtol=a.diverge_rtol)
    if a.msprobe_levels:
        th = Thresholds.msprobe(diverge_rtol=th.diverge_rtol)
    options = dict(mode=a.mode, fuzzy=a.fuzzy, mapping=a.mapping, thresholds=th,
                   rank_map=_parse_pairs(a.rank_map, "rank-map"), step_map=_parse_pairs(a.step_map, "step-map"),
                   progress=None if verbose else False)
    if a.workers is not None or a.scheduler:
        return _compare_on_dask(a, npu, bench, options, verbose)
    res = compare(npu, bench, **options)
    out = _output_file(a.output)
    if out is not None:
        res.to_msprobe_csv(out, include_bench_only=not a.no_bench_only)
    if verbose:
        print(res.summary())
        _print_random_trace(res)
        if out is not None:
            print(f"wrote {out}")
    if res.mostly_unmatched:
        return EXIT_UNMATCHED
    return _fail_code(res.counts(), a.fail_on)


def _print_random_trace(res) -> None:
    """After the first divergence: the random draws behind it, their lines and the fix (as the notebook shows)."""
    if res.first_divergence() is None:
        return
    from msprobe_nb.analysis.provenance import trace_randomness

    trace = trace_randomness(res)
    if trace.found:
        print(trace)


def _fail_code(counts: dict, fail_on: str | None) -> int:
    """``--fail-on``: 1 when a row is graded ``fail_on`` or worse (``counts`` holds the error and warning rows)."""
    if not fail_on:
        return 0
    return 1 if counts["error"] + (counts["warning"] if fail_on == "warning" else 0) else 0


def _compare_on_dask(a: argparse.Namespace, npu: str, bench: str, options: dict, verbose: bool) -> int:
    """compare --workers N / --scheduler ADDRESS: rank by rank on Dask; -o gathers the rows to write the CSV."""
    from msprobe_nb.analysis.dask_compare import DaskUnavailable, compare_on_dask

    if a.workers is not None and a.workers < 1:
        raise UsageError(f"--workers: expected a number of workers >= 1, got {a.workers}")
    out = _output_file(a.output)
    try:
        res = compare_on_dask(npu, bench, workers=a.workers or 2, scheduler=a.scheduler, rows=out is not None,
                              **options)
    except DaskUnavailable as e:
        raise UsageError(str(e)) from None
    if out is not None:
        res.result.to_msprobe_csv(out, include_bench_only=not a.no_bench_only)
    if verbose:
        print(res.summary_text())
        if out is not None:
            print(f"wrote {out}")
    if res.mostly_unmatched:
        return EXIT_UNMATCHED
    return _fail_code(res.counts(), a.fail_on)


def cmd_info(a: argparse.Namespace) -> int:
    import pandas as pd

    from msprobe_nb.store.dump import load

    d = load(a.dump)
    print(repr(d))
    print(f"task {d.task or '?'}, level {d.level or '?'}, steps {d.steps}, ranks {d.ranks}")
    with pd.option_context("display.width", 160, "display.max_rows", 200):
        print(d.summary().to_string(index=False))
        if a.calls:
            c = d.calls.drop_duplicates(["step", "rank", "call"])
            print(c[["step", "rank", "call_index", "call"]].head(a.calls).to_string(index=False))
    return 0


def cmd_export(a: argparse.Namespace) -> int:
    from msprobe_nb.store.dump import load

    if a.format != "msprobe":
        raise UsageError(f"unknown export format {a.format!r} (supported: msprobe)")
    out = load(a.dump, allow_outside=a.allow_outside).export_msprobe(a.output, tensors=not a.no_tensors)
    print(f"wrote {out}")
    return 0


def cmd_config(a: argparse.Namespace) -> int:
    """Check a config (file and options, as recording would read them) and print what it records."""
    from msprobe_nb.config import ConfigError, load_config
    from msprobe_nb.options import overrides_from

    try:
        cfg = load_config(a.config, **overrides_from(a))
    except ConfigError as e:
        raise UsageError(str(e)) from None
    print(f"records {cfg.describe()}")
    if a.json:
        print(json.dumps(cfg.to_dict(), indent=2, ensure_ascii=False))
    return 0


def cmd_acc_check(a: argparse.Namespace) -> int:
    """Pre-check a dump's APIs on this machine's bench; print the failures, write every row with -o."""
    from msprobe_nb.precheck.acc_check import acc_check

    pre = acc_check(a.dump, device=a.device, target=a.target, backward=not a.no_backward, apis=a.api or None,
                    skip=a.skip or None)
    if a.output:
        pre.to_csv(a.output)
    if not a.quiet:
        c = pre.counts()
        print(f"{c['apis']} APIs, {c['rows']} outputs: {c['pass']} pass, {c['warning']} warning, {c['error']} error, "
              f"{c['unchecked']} unchecked" + (f"; wrote {a.output}" if a.output else ""))
        for note in pre.notes:
            print(f"note: {note}")
        for r in pre.failures().itertuples(index=False):
            print(f"error {r.api} output {r.output}: {r.reasons}")
    return _fail_code(pre.counts(), a.fail_on)


def cmd_acc_compare(a: argparse.Namespace) -> int:
    """Two pre-checks' CSVs (first device, second device): the outputs the first does worse."""
    from msprobe_nb.precheck.compare_prechecks import compare_prechecks

    t = compare_prechecks(a.first, a.second)
    if a.output:
        t.to_csv(a.output, index=False)
    worse = t[t["verdict"] == "error"]
    print(f"{len(t)} outputs, {len(worse)} worse on the first device" + (f"; wrote {a.output}" if a.output else ""))
    for r in worse.itertuples(index=False):
        print(f"worse {r.api} output {r.output}: {r.reasons}")
    return 0


def cmd_monitor(a: argparse.Namespace) -> int:
    """Summarise a monitor record: steps, ranks, last scalars, anomalies; with --compare, where two part."""
    from msprobe_nb.analysis.monitor_frame import load_monitor

    m = load_monitor(a.folder)
    steps = m.steps
    print(f"{a.folder}: {len(steps)} step(s)" + (f" ({steps[0]}..{steps[-1]})" if steps else "")
          + f", rank(s) {sorted(m.meta)}, {m.stats['name'].nunique()} name(s), aggregates {', '.join(m.columns)}")
    if len(m.scalars):
        last = m.scalars.iloc[-1]
        print("last step: " + ", ".join(f"{c} {last[c]:.6g}" for c in m.scalars.columns
                                        if c not in ("step", "rank") and last[c] == last[c]))
    an = m.anomalies()
    print(f"{len(an)} anomal{'y' if len(an) == 1 else 'ies'}")
    for r in an.head(a.anomalies).itertuples(index=False):
        print(f"  step {r.step} rank {r.rank} {r.rule}: {r.message}")
    if a.compare:
        from msprobe_nb.analysis.monitor_compare import compare_monitors

        fd = compare_monitors(a.folder, a.compare, norm_tolerance=a.norm_tolerance).first_divergence()
        print(f"first divergence from {a.compare}: {fd if fd else 'none'}")
    return 0


def cmd_setup_check(a: argparse.Namespace) -> int:
    """Two runs' set-ups (dump folders, monitor folders, setup_rank<N>.json files): every difference."""
    import pandas as pd

    from msprobe_nb.analysis.setup_compare import compare_setups

    t = compare_setups(a.a, a.b, rank=a.rank, rank_b=a.rank_b)
    if a.output:
        t.to_csv(a.output, index=False)
    causes, expected = t[~t["expected"]], t[t["expected"]]
    print(f"{len(causes)} set-up difference(s), {len(expected)} expected" + (f"; wrote {a.output}" if a.output else ""))
    with pd.option_context("display.width", 200, "display.max_colwidth", 60, "display.max_rows", 500):
        for title, part in (("differences", causes), ("expected (not causes)", expected)):
            if len(part):
                print(f"{title}:\n" + part.drop(columns="expected").to_string(index=False))
    return 1 if a.fail and len(causes) else 0


def cmd_demo(a: argparse.Namespace) -> int:
    from msprobe_nb.demo import main as demo

    return demo(["--out", a.out] if a.out else [])


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Compare, inspect and export msprobe_nb and msprobe dumps.")
    p.add_argument("-f", "--framework", choices=["pytorch"], help=argparse.SUPPRESS)  # msprobe's legacy flag
    p.add_argument("--debug", action="store_true", help="show tracebacks of internal errors")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command",
                           metavar="{compare,info,export,config,acc-check,acc-compare,monitor,setup-check,demo}")

    c = sub.add_parser("compare", help="compare an NPU dump with a bench dump",
                       description="Compare two dumps; write msprobe's compare CSV with -o.",
                       epilog="exit codes: 0 done; 1 --fail-on matched; 2 bad input; 3 most rows of either dump "
                              "found no partner (different models or steps?)")
    c.add_argument("npu", nargs="?", help="NPU (target) dump: .h5 file, msprobe dump folder or dump.json")
    c.add_argument("bench", nargs="?", help="bench (golden) dump")
    c.add_argument("-tp", "--target_path", help=argparse.SUPPRESS)
    c.add_argument("-gp", "--golden_path", help=argparse.SUPPRESS)
    c.add_argument("-i", "--input", help="msprobe legacy compare.json (npu_path, bench_path, stack_path, "
                                          "is_print_compare_log)")
    c.add_argument("-o", "--output", help="result CSV path, or a folder for compare_result_<time>.csv")
    c.add_argument("--mode", default="auto", choices=["auto", "statistics", "tensor", "md5"])
    c.add_argument("--fuzzy", "-fm", "--fuzzy_match", action="store_true", help="ignore call counters")
    c.add_argument("--mapping", "-dm", "--data_mapping", help="JSON/YAML name mapping (names:, modules:)")
    c.add_argument("--rank-map", help="pair NPU rank with bench rank, e.g. 1:0,2:0")
    c.add_argument("--step-map", help="pair NPU step with bench step, e.g. 5:3")
    c.add_argument("--diverge-rtol", type=float, help="relative error above which a row diverges (1e-3)")
    c.add_argument("--msprobe-levels", action="store_true", help="grade dtype differences as errors, like msprobe")
    c.add_argument("--no-bench-only", action="store_true", help="leave bench-only rows out of the CSV")
    c.add_argument("--fail-on", choices=["warning", "error"], help="exit 1 when a row is graded this or worse")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    c.add_argument("--workers", type=int, metavar="N", help="compare rank by rank on Dask, on a local cluster of N "
                                                             "worker processes (pip install 'msprobe_nb[dask]')")
    c.add_argument("--scheduler", metavar="ADDRESS", help="compare on the Dask scheduler at ADDRESS "
                                                          "(tcp://host:8786) instead of a local cluster")
    c.set_defaults(func=cmd_compare)

    i = sub.add_parser("info", help="describe a dump")
    i.add_argument("dump")
    i.add_argument("--calls", type=int, default=0, metavar="N", help="also list the first N calls")
    i.set_defaults(func=cmd_info)

    e = sub.add_parser("export", help="write a dump in another format")
    e.add_argument("dump")
    e.add_argument("-o", "--output", required=True, help="output folder")
    e.add_argument("--format", default="msprobe", help="msprobe (step{N}/rank{R}/dump.json ...)")
    e.add_argument("--no-tensors", action="store_true", help="do not copy tensor files")
    e.add_argument("--allow-outside", action="store_true",
                   help="read tensor files that symlinks or dump_data_dir place outside the dump folder "
                        "(only for a dump you trust)")
    e.set_defaults(func=cmd_export)

    from msprobe_nb.options import argument_specs

    g = sub.add_parser("config", help="check a recording config and say what it records",
                       description="Read an msprobe-style config.json and the options below as recording "
                                   "would (options win over the file), and print what it records.")
    g.add_argument("config", nargs="?", help="msprobe-style config.json (default: the kit's defaults)")
    for flags, kw in argument_specs():
        g.add_argument(*flags, **kw)
    g.add_argument("--json", action="store_true", help="also print every key as JSON")
    g.set_defaults(func=cmd_config)

    k = sub.add_parser("acc-check", help="pre-check every recorded API on a high-precision bench (docs/precheck.md)")
    k.add_argument("dump", help="a dump recorded at level L1 or mix (task tensor, or statistics: approximate)")
    k.add_argument("-o", "--output", help="write every graded output to this CSV")
    k.add_argument("--device", default="cpu", help="the bench device (default cpu)")
    k.add_argument("--target", help="statistics dumps: the device whose kernels are checked (default: the bench)")
    k.add_argument("--api", action="append", metavar="NAME", help="only calls whose name contains NAME (repeatable)")
    k.add_argument("--skip", action="append", metavar="NAME", help="leave out calls whose name contains NAME")
    k.add_argument("--no-backward", action="store_true", help="do not replay backward calls")
    k.add_argument("--fail-on", choices=["warning", "error"], help="exit 1 when an output is graded this or worse")
    k.add_argument("-q", "--quiet", action="store_true", help="print nothing")
    k.set_defaults(func=cmd_acc_check)

    m = sub.add_parser("acc-compare", help="compare two pre-checks: the APIs the first device does worse")
    m.add_argument("first", help="the first device's pre-check CSV (msprobe-nb acc-check -o)")
    m.add_argument("second", help="the second device's pre-check CSV")
    m.add_argument("-o", "--output", help="write the side-by-side table to this CSV")
    m.set_defaults(func=cmd_acc_compare)

    n = sub.add_parser("monitor", help="summarise a training monitor record (docs/monitor.md)")
    n.add_argument("folder", help="the Monitor's dump_path (monitor_rank<N>.h5 files)")
    n.add_argument("--compare", metavar="OTHER", help="another run's record: print where the two first part")
    n.add_argument("--norm-tolerance", type=float, default=0.01, help="norm ratio off 1 by more than this parts")
    n.add_argument("--anomalies", type=int, default=10, metavar="N", help="list the first N anomalies (10)")
    n.set_defaults(func=cmd_monitor)

    s = sub.add_parser("setup-check", help="what differs between two runs' set-ups (docs/setup_check.md)")
    s.add_argument("a", help="a dump folder, monitor folder, setup_rank<N>.json or msprobe config_check pack")
    s.add_argument("b", help="the other run's")
    s.add_argument("--rank", type=int, help="which rank's record (default 0)")
    s.add_argument("--rank-b", type=int, help="the rank of B's record (default: --rank)")
    s.add_argument("-o", "--output", help="write the differences to this CSV")
    s.add_argument("--fail", action="store_true", help="exit 1 when the set-ups differ (expected differences aside)")
    s.set_defaults(func=cmd_setup_check)

    d = sub.add_parser("demo", help="record, compare and fix the randomness demo (python -m msprobe_nb.demo)")
    d.add_argument("--out", help="folder for the dumps (default: a temporary folder, removed at the end)")
    d.set_defaults(func=cmd_demo)
    return p


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from msprobe_nb import __version__
    try:
        torch = version("torch")
    except PackageNotFoundError:
        torch = "not installed"
    return f"{PROG} {__version__} (torch {torch}, python {sys.version.split()[0]})"


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._subparsers._group_actions if parser._subparsers else ():
        choices = action.choices  # a subparsers action's: command name -> its parser
        if isinstance(choices, dict) and command in choices:
            return choices[command]
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_args, with a did-you-mean for each mistyped flag (``--levle``: ``--level``), as config keys get."""
    from msprobe_nb.config import unknown_flags

    a, extra = parser.parse_known_args(argv)
    if extra:
        sub = _subparser(parser, getattr(a, "command", None))
        sub.error(unknown_flags(extra, [*sub._option_string_actions, *parser._option_string_actions]))
    return a


def shadowing_folder(cwd: Path | None = None) -> Path | None:
    """A ``msprobe_nb`` folder in ``cwd`` that is not the package (the clone, seen from its parent folder): Python
    started there imports it as an empty namespace package, and ``msprobe_nb.record`` is missing."""
    folder = (cwd or Path.cwd()) / "msprobe_nb"
    try:
        if folder.is_dir() and not (folder / "__init__.py").is_file():
            return folder
    except OSError:
        return None
    return None


def _note(message, category, filename, lineno, file=None, line=None) -> None:
    """The kit's warnings, said once as plain notes (no source line of the kit's own code)."""
    print(f"{PROG}: note: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    folder = shadowing_folder()
    if folder is not None:
        print(f"{PROG}: note: {folder} is a folder without __init__.py (the clone, seen from its parent?): Python "
              "started in this folder imports it instead of the kit (\"module 'msprobe_nb' has no attribute "
              "'record'\"); work inside the clone or elsewhere", file=sys.stderr)
    parser = build_parser()
    a = _parse(parser, argv)
    if not getattr(a, "func", None):
        parser.print_help(sys.stderr)
        return 2
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        warnings.showwarning = _note
        return _run(a)


def _run(a: argparse.Namespace) -> int:
    from msprobe_nb.analysis.compare import CompareError

    try:
        return a.func(a)
    except (UsageError, CompareError, FileNotFoundError, NotADirectoryError, PermissionError, KeyError,
            ValueError) as e:
        if a.debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        print(f"{PROG}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # noqa: BLE001 - last resort: one line, the traceback only with --debug
        if a.debug:
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
