"""The report of ``bench_recording.py``: the table, the tensor-mode bytes, the dump growth, missed targets.

Its arithmetic is pure (results in, text out) and tested on made-up timings (``tests/test_benchmarks.py``):
a configuration measured in several processes reports the median of their ratios, with their range.
"""
from __future__ import annotations

import statistics

from .configs import KIT_CONFIGS, MEM_CONFIGS, MEM_TARGET, MS_CONFIGS, MS_TWIN, TIME_TARGETS

__all__ = ["fmt_bytes", "mean_ratio", "med", "merge_runs", "print_report", "summarize", "time_ratio",
           "wall_ratio"]


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


def time_ratio(r: dict) -> float:
    """The configuration's slowdown: the median of its processes' ratios (see ``--repeat``)."""
    if r.get("ratios"):
        return med(r["ratios"])
    return med(r["with_ms"]) / med(r["base_ms"])


def mean_ratio(r: dict) -> float:
    """The slowdown of the mean step: mean(recorded) / mean(plain) over the pooled steps. The median ratio
    leaves out the steps that carry rarer work (a full chunk of the calls table compressed and written, every
    few steps of a small model), which a run's total time pays; this one counts them."""
    if not r.get("with_ms") or not r.get("base_ms"):
        return float("nan")
    return statistics.fmean(r["with_ms"]) / statistics.fmean(r["base_ms"])


def wall_ratio(r: dict) -> float:
    """The same in wall-clock time."""
    if r.get("wall_ratios"):
        return med(r["wall_ratios"])
    return med(r["with_wall_ms"]) / med(r["base_wall_ms"])


def merge_runs(runs: list[dict]) -> dict:
    """One configuration measured in several processes: each process's ratio is kept (their median is
    reported, with their range), the step times are pooled, and the peak RSS is the median peak."""
    r = dict(runs[0])
    if len(runs) > 1:
        r["ratios"] = [time_ratio(x) for x in runs]
        r["wall_ratios"] = [wall_ratio(x) for x in runs]
        for key in ("base_ms", "with_ms", "base_wall_ms", "with_wall_ms"):
            r[key] = [v for x in runs for v in x[key]]
        r["peak_rss_kib"] = med([x["peak_rss_kib"] for x in runs])
    return r


def summarize(results: dict, sizes, ms_note: str, kernel_note: str = "") -> tuple[str, list[str]]:
    """The printed report and the list of missed targets."""
    lines, missed = [], []
    head = (f"{'size':5} {'config':12} {'calls':>5} {'w/o ms':>7} {'with ms':>8} {'ratio':>7} {'runs':>9} "
            f"{'target':>7} {'time':6} {'wall':>6} {'µs/call':>7} {'msprobe':>8} {'bytes/step':>10} {'1st step':>9} "
            f"{'peak RSS':>8} {'RSS Δ':>7} {'imports':>7} {'mem':5}")
    lines.append(head)
    lines.append("-" * len(head))
    for size in sizes:
        res = results.get(size, {})
        none, ms_none = res.get("none"), res.get("ms-none")
        for name in list(KIT_CONFIGS) + list(MS_CONFIGS):
            r = res.get(name)
            if r is None:
                continue
            b, w = med(r["base_ms"]), med(r["with_ms"])
            if name == "imported" and res.get("_none_meds"):
                # cross-process: an import cannot be undone, so compare with the "none" processes
                b, w = med(res["_none_meds"]), med(res["_imported_meds"])
            ratio = time_ratio(r) if name != "imported" else w / b
            wall = wall_ratio(r)
            spread = f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}" if r.get("ratios") else ""
            if name == "imported" and res.get("_none_walls"):
                wall = med(res["_imported_walls"]) / med(res["_none_walls"])
            target = TIME_TARGETS.get(name)
            tstatus = "" if target is None else ("ok" if ratio <= target else "MISSED")
            if target is not None and ratio > target:
                missed.append(f"{size} {name}: time {ratio:.2f}x > target {target:g}x "
                              f"(missed by {ratio / target:.2f}x)")
            ref = ms_none if name.startswith("ms-") else none
            ref_kib = ref["peak_rss_kib"] if ref else None
            d_kib = r["peak_rss_kib"] - ref_kib if ref_kib else None
            mstatus = ""
            if name in MEM_CONFIGS and ref_kib:
                pct = d_kib / ref_kib
                mstatus = "ok" if pct <= MEM_TARGET else "MISS"
                if pct > MEM_TARGET:
                    imp = r.get("import_kib", 0)
                    missed.append(f"{size} {name}: peak RSS {r['peak_rss_kib'] / 1024:.0f} MB = {pct * 100:+.1f}% "
                                  f"over 'none' ({ref_kib / 1024:.0f} MB) > target +{MEM_TARGET * 100:.0f}% (missed by "
                                  f"{(pct - MEM_TARGET) * 100:.1f} points; {imp / 1024:.0f} MB of the "
                                  f"{d_kib / 1024:.0f} MB are the imports, {(d_kib - imp) / ref_kib * 100:+.1f}% "
                                  f"without them)")
            twin = res.get(MS_TWIN.get(name, ""))
            vs = f"{ratio / time_ratio(twin):.2f}x" if twin is not None else ""
            steps = r.get("steps_written") or 0
            per_step = (r["bytes_total"] / steps if steps else 0) if "bytes_total" in r else None
            first = r.get("bytes_first") if "bytes_first" in r else None
            tgt = f"≤{target:g}x" if target is not None else "-"
            per_call = f"{(w - b) * 1e3 / r['calls']:.0f}" if r.get("calls") else ""
            rss_d = "" if d_kib is None else f"{d_kib / ref_kib * 100:+.1f}%"
            imp = r.get("import_kib")
            lines.append(
                f"{size:5} {name:12} {r.get('calls', '') or '':>5} {b:7.2f} {w:8.2f} {ratio:6.2f}x {spread:>9} "
                f"{tgt:>7} {tstatus:6} {wall:5.2f}x {per_call:>7} {vs:>8} {fmt_bytes(per_step):>10} "
                f"{fmt_bytes(first):>9} {r['peak_rss_kib'] / 1024:6.0f}MB {rss_d:>7} "
                f"{'' if not imp else f'{imp / 1024:.0f}MB':>7} {mstatus:5}")
        lines.append("")
    if any("pt_bytes" in results.get(size, {}).get("tensor-L1", {}) for size in sizes):
        lines.append("Tensor mode, bytes of one recorded step:")
    for size in sizes:
        res = results.get(size, {})
        t = res.get("tensor-L1")
        if t is None or "pt_bytes" not in t:
            continue
        kit_step = t["bytes_total"] / max(t.get("steps_written") or 1, 1)
        lines.append(f"  {size}: kit HDF5 {fmt_bytes(kit_step)}/step ({t['unique_tensors']} distinct tensors stored "
                     f"once, uncompressed) vs msprobe's layout {fmt_bytes(t['pt_bytes'])} in {t['pt_files']} "
                     ".pt files "
                     f"(torch.save of each recorded tensor, one file per row): kit/msprobe = "
                     f"{kit_step / t['pt_bytes']:.2f}; raw data {fmt_bytes(4 * t['tensor_bytes'])}")
        m = res.get("ms-tensor-L1")
        if m is not None and m.get("pt_bytes"):
            lines.append(f"  {size}: msprobe itself wrote {fmt_bytes(m['bytes_last'])} for its last step, "
                         f"{fmt_bytes(m['pt_bytes'])} of it in {m['pt_files']} .pt files")
    g = results.get("_growth")
    if g:
        sz = g["sizes"]
        per_row = g["rows"] / max(len(sz) - 1, 1)
        marks = [k for k in (1, 5, 10, 25, 50, 100, 200, 500) if k <= len(sz) - 1]
        lines.append("")
        lines.append(f"Dump growth, statistics L1, {g['size']} model, one Debugger started once and step() per step, "
                     f"{len(sz) - 1} steps, {per_row:.0f} rows/step:")
        parts, prev = [], (0, 0)
        for k in marks:
            rate = (sz[k - 1] - prev[1]) / (k - prev[0])
            parts.append(f"after {k}: {fmt_bytes(sz[k - 1])} ({fmt_bytes(rate)}/step since {prev[0]})")
            prev = (k, sz[k - 1])
        lines.append("  " + "; ".join(parts))
        lines.append(f"  closed: {fmt_bytes(sz[-1])} = {sz[-1] / g['rows']:.0f} bytes per row; "
                     f"step time {med(g['with_ms']):.2f} ms (median, wall)")
        rss = g["rss"]
        lines.append("  resident memory (RSS) while recording: " + "; ".join(
            f"after {k}: {rss[k] / 1024:.0f} MB" for k in [0] + marks)
            + f" -> {(rss[marks[-1]] - rss[marks[0]]) / max(marks[-1] - marks[0], 1):.0f} KB/step after step "
            f"{marks[0]}")
    lines.append("")
    lines.append("'none' times the same step in both arms (A/A): its ratio is the measurement noise.")
    lines.append(f"msprobe: {ms_note}")
    if kernel_note:
        lines.append(f"msprobe_nb: {kernel_note}")
    return "\n".join(lines), missed



def print_report(title: str, report: str, missed: list[str]) -> None:
    """The title, the report and the missed targets (or that every target was met)."""
    print(title)
    print(report)
    print()
    if missed:
        print("Targets missed:")
        for m in missed:
            print("  - " + m)
    else:
        print("All targets met.")
