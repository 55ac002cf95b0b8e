"""Mutation testing of the core rules with cosmic-ray (issue 36): each module is mutated with only its mapped,
fast test files as the test command (the full suite takes minutes per mutant). cosmic-ray edits the files it
mutates in place, so it works on a copy of the package outside the repository, never on the shared tree.

    pip install -e '.[mutation]'   # cosmic-ray, pinned
    nice python tools/mutation.py [--modules analysis/rank_order.py ...] [--out benchmarks/results/mutation.md]

Writes a table per module: mutants, killed, survived, equivalent (survivors listed in ``EQUIVALENT`` with their
reason), timed out, incompetent (the mutant does not import), and the score killed / (all - equivalent -
incompetent). Survivors are listed by line and operator so that each gets a test or an entry in ``EQUIVALENT``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module (under msprobe_nb/) -> the fast test files that judge it
MODULES: dict[str, list[str]] = {
    "analysis/rank_order.py": ["test_ranks.py"],
    "analysis/overflow.py": ["test_overflow.py"],
    "analysis/metrics.py": ["test_metrics.py"],
    "analysis/divergence.py": ["test_divergence.py"],
    "analysis/grading.py": ["test_compare_msprobe.py", "test_divergence.py"],
    "analysis/matching.py": ["test_compare_msprobe.py"],
    "analysis/provenance.py": ["test_root_cause.py"],
    "store/hdf5_index.py": ["test_writer_safety.py", "test_store_hdf5.py"],
    "store/monitor_rules.py": ["test_monitor_alerts.py"],
    "store/msprobe_reader.py": ["test_msprobe_format.py"],
}

#: (module, line, operator) -> why the surviving mutant cannot change a result
EQUIVALENT: dict[tuple[str, int, str], str] = {}


def _config(module: str, tests: list[str], timeout: float) -> str:
    cmd = " ".join([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                    *[str(ROOT / "tests" / t) for t in tests]])
    return (f'[cosmic-ray]\nmodule-path = "msprobe_nb/{module}"\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{cmd}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def run_module(module: str, tests: list[str], timeout: float) -> dict:
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        shutil.copytree(ROOT / "msprobe_nb", work / "msprobe_nb", ignore=shutil.ignore_patterns("__pycache__"))
        (work / "cr.toml").write_text(_config(module, tests, timeout))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.time()
        for step in (["init", "cr.toml", "s.sqlite"], ["exec", "cr.toml", "s.sqlite"]):
            subprocess.run([sys.executable, "-m", "cosmic_ray.cli", *step], cwd=work, env=env, check=True)
        took = time.time() - t0
        out = dict(module=module, seconds=took, mutants=0, killed=0, survived=0, equivalent=0, timeout=0,
                   incompetent=0, survivors=[])
        with use_db(str(work / "s.sqlite"), WorkDB.Mode.open) as db:
            for item, result in db.completed_work_items:
                out["mutants"] += 1
                m = item.mutations[0]
                where = (module, int(m.start_pos[0]), m.operator_name)
                if result.test_outcome == TestOutcome.KILLED and (result.output or "").strip() == "timeout":
                    out["timeout"] += 1
                elif result.test_outcome == TestOutcome.KILLED:
                    out["killed"] += 1
                elif result.test_outcome == TestOutcome.INCOMPETENT or result.worker_outcome != WorkerOutcome.NORMAL:
                    out["incompetent"] += 1
                elif where in EQUIVALENT:
                    out["equivalent"] += 1
                else:
                    out["survived"] += 1
                    out["survivors"].append(f"line {where[1]}: {m.operator_name} {m.occurrence}")
    return out


def report(rows: list[dict]) -> str:
    lines = ["| module | mutants | killed | survived | equivalent | timeout | incompetent | score | time |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        judged = r["mutants"] - r["equivalent"] - r["incompetent"]
        score = f"{100 * (r['killed'] + r['timeout']) / judged:.1f} %" if judged else "-"
        lines.append(f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['survived']} | {r['equivalent']} | "
                     f"{r['timeout']} | {r['incompetent']} | {score} | {r['seconds']:.0f} s |")
    for r in rows:
        if r["survivors"]:
            lines += ["", f"Survivors in {r['module']}:"] + [f"- {s}" for s in r["survivors"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modules", nargs="*", default=list(MODULES), help="modules under msprobe_nb/ to mutate")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per mutant's test run")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "mutation.md")
    a = p.parse_args(argv)
    rows = []
    for m in a.modules:
        if m not in MODULES:
            raise SystemExit(f"{m!r} is not a mapped module: {sorted(MODULES)}")
        rows.append(run_module(m, MODULES[m], a.timeout))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report(rows))  # after each module: a long run stopped early keeps what it did
        print(report(rows[-1:]), flush=True)


if __name__ == "__main__":
    main()
