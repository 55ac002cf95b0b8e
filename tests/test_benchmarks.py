"""The benchmark report's arithmetic (benchmarks/recording/report.py): pooled processes, median ratios, missed targets.

The benchmark itself runs for minutes in subprocesses; here its report is fed made-up timings.
"""
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
bench = pytest.importorskip("recording.report")


def _run(base_ms, with_ms, rss_kib=300_000):
    return {"base_ms": base_ms, "with_ms": with_ms, "base_wall_ms": base_ms, "with_wall_ms": with_ms,
            "peak_rss_kib": rss_kib, "calls": 10, "import_kib": 1024}


def test_processes_are_merged_into_a_median_ratio_with_its_range():
    runs = [_run([2.0] * 5, [8.0] * 5), _run([2.0] * 5, [6.0] * 5, 310_000), _run([2.0] * 5, [7.0] * 5, 320_000)]
    merged = bench.merge_runs(runs)
    assert merged["ratios"] == [4.0, 3.0, 3.5]
    assert bench.time_ratio(merged) == 3.5  # the median process, not the ratio of pooled medians
    assert len(merged["with_ms"]) == 15 and merged["peak_rss_kib"] == 310_000
    assert bench.time_ratio(bench.merge_runs(runs[:1])) == 4.0  # one process: its own ratio


def test_report_shows_the_range_and_lists_missed_targets():
    none = _run([2.0] * 5, [2.0] * 5)
    l1 = bench.merge_runs([_run([2.0] * 5, [8.0] * 5), _run([2.0] * 5, [6.0] * 5), _run([2.0] * 5, [7.0] * 5)])
    l0 = _run([2.0] * 5, [3.0] * 5, 400_000)
    report, missed = bench.summarize({"small": {"none": none, "stat-L1": l1, "stat-L0": l0}}, ["small"], "skipped")
    line = next(x for x in report.splitlines() if " stat-L1 " in x)
    assert "3.50x" in line and "3.00-4.00" in line and "MISSED" in line
    assert any(m.startswith("small stat-L1: time 3.50x > target 3x") for m in missed)
    assert any(m.startswith("small stat-L0: peak RSS") for m in missed)  # +33 % memory
    assert not any(m.startswith("small stat-L0: time") for m in missed)  # 1.5x is within 2x


# ---------------------------------------------------------------- bench_real_models.py: report and a smoke run
real = pytest.importorskip("bench_real_models")


def _real(base, with_, rss=300_000, calls=100):
    return {"base_ms": [base] * 3, "with_ms": [with_] * 3, "peak_rss_kib": rss, "calls": calls}


def test_real_model_report_gives_each_target_its_ratio_and_miss():
    results = {"kit": {"gpt2": {"none": _real(10, 10), "stat-L0": _real(10, 14), "stat-L1": _real(10, 60, 340_000),
                                "stat-mix": _real(10, 29), "tensor-L1": _real(10, 90)},
                       "vit": {"none": _real(10, 10), "stat-L1": _real(10, 20)}}}
    table, markdown, missed = real.summarize(results, ["kit"])
    row = next(x for x in table.splitlines() if " gpt2 " in x)
    assert "1.40x" in row and "6.00x" in row and "2.90x" in row and "9.00x" in row and "1.133x" in row
    assert "| gpt2 | 10.0 | 1.40x | 6.00x | 2.90x | 9.00x | 6.00x | 1.133x | 100 |" in markdown
    assert "kit gpt2 L1: 6.00x > target 3x (missed by 2.00x)" in missed
    assert "kit gpt2 tensor L1: 9.00x > target 8x (missed by 1.12x)" in missed
    assert any(m.startswith("kit gpt2 peak memory (L1): 1.133x") and "3.3 points" in m for m in missed)
    assert not any("L0" in m or "mix" in m or "vit" in m for m in missed)  # 1.4x, 2.9x, 2.0x are within
    lines = real.targets_report(results, ["kit"])
    l1 = next(x for x in lines if " L1 " in x and "tensor" not in x)
    assert "2.00x-6.00x" in l1 and "MISSED by 2.00x (worst: gpt2)" in l1
    assert any(" L0 " in x and x.endswith("met") for x in lines)
    assert any(" L1 mean " in x and x.endswith("2.00x-6.00x") for x in lines)


def test_real_model_report_gives_the_mean_step_beside_the_median():
    """A step in three that writes a chunk: the median ratio leaves it out, the mean one counts it."""
    spiky = {"base_ms": [10, 10, 10], "with_ms": [30, 30, 90], "peak_rss_kib": 300_000, "calls": 100}
    results = {"kit": {"vit": {"none": _real(10, 10), "stat-L1": spiky}}}
    table, markdown, _ = real.summarize(results, ["kit"])
    assert "| vit | 10.0 | - | 3.00x | - | - | 5.00x | 1.000x | 100 |" in markdown
    assert any(" L1 mean " in x and x.endswith("5.00x-5.00x") for x in real.targets_report(results, ["kit"]))


def test_real_model_report_of_repeated_processes_gives_their_median_and_range():
    """--repeat: three processes of a cell, the median of their ratios, and a miss names their range."""
    from recording.report import merge_runs

    def run(base, with_):
        return dict(_real(base, with_), base_wall_ms=[base] * 3, with_wall_ms=[with_] * 3)

    l1 = merge_runs([run(10, 32), run(10, 45), run(10, 38)])
    results = {"kit": {"gpt2": {"none": merge_runs([run(10, 10)] * 3), "stat-L1": l1}}}
    table, markdown, missed = real.summarize(results, ["kit"])
    assert "| gpt2 | 10.0 | - | 3.80x | - | - | 3.83x |" in markdown
    assert "kit gpt2 L1: 3.80x > target 3x (missed by 1.27x, runs 3.20-4.50x)" in missed
    with pytest.raises(SystemExit, match="--repeat: expected at least 1"):
        real.main(["--repeat", "0", "--no-msprobe"])


def test_real_model_benchmark_runs_a_recorded_step_of_a_real_model(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the bench extra)")
    from recording.child import child

    out = child({"name": "stat-L1", "tool": "kit", "opts": {"level": "L1", "task": "statistics"}, "size": "gpt2",
                 "steps": 1, "block": 1, "warmup": 1, "tmp": str(tmp_path), "workloads": "recording.real_models"})
    assert out["errors"] == 0 and out["calls"] > 100  # the forward, backward and AdamW calls of GPT-2
    assert len(out["base_ms"]) == len(out["with_ms"]) == 1 and out["peak_rss_kib"] > 0
    r = {"kit": {"gpt2": {"none": dict(out, base_ms=out["base_ms"], with_ms=out["base_ms"]), "stat-L1": out}}}
    assert "gpt2" in real.summarize(r, ["kit"])[1]
    # AdamW's foreach path (the GPU and NPU default): a few multi-tensor calls instead of a loop per parameter
    fe = child({"name": "stat-L1", "tool": "kit", "opts": {"level": "L1", "task": "statistics"}, "size": "gpt2",
                "steps": 1, "block": 1, "warmup": 1, "tmp": str(tmp_path), "workloads": "recording.real_models",
                "build": {"foreach": True}})
    assert fe["errors"] == 0 and 100 < fe["calls"] < out["calls"] - 100
    assert real.OPTIMIZERS == {"loop": (False,), "foreach": (True,), "both": (False, True)}


# ---------------------------------------------------------------- accelerator_check.py on the CPU
accel = pytest.importorskip("accelerator_check")


def test_accelerator_check_on_cpu_checks_bits_and_skips_the_cuda_parts(capsys, monkeypatch):
    monkeypatch.setattr(accel.torch.cuda, "is_available", lambda: False)
    assert accel.main(["--skip-demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("skipped: no CUDA device") == 2  # the sync check and the GPU timings say why
    assert "ok   plain vs plain" in out and "ok   mix tensor" in out and "FAIL" not in out


def test_accelerator_check_sees_a_changed_bit(tmp_path, monkeypatch):
    a = [accel.torch.ones(3)]
    assert accel.same_bits(a, [accel.torch.ones(3)])
    assert not accel.same_bits(a, [accel.torch.ones(3) + 1e-7]) and not accel.same_bits(a, a * 2)
    record = accel._record

    def interfering(work, dump_path, opts, fn):  # a kit that nudged one weight while recording
        out = record(work, dump_path, opts, fn)
        return out[:1] + [out[1] + 1e-6] + out[2:]

    monkeypatch.setattr(accel, "_record", interfering)
    res = accel.check_bitwise(accel.torch.device("cpu"), str(tmp_path))
    assert res[0][1] and not any(ok for _, ok, _ in res[1:])


# ---------------------------------------------------------------- bench_fast_paths.py: a smoke run
def test_fast_paths_benchmark_times_every_arm_and_switches_the_c_paths_back(tmp_path):
    pytest.importorskip("transformers", reason="transformers is not installed (the bench extra)")
    fast = pytest.importorskip("bench_fast_paths")
    from msprobe_nb.capture import api_mode, grad_hooks, recorder, stacks, stats
    before = (recorder._build_rows, stacks._stack_key, stats._fused_at, api_mode._api_handler,
              grad_hooks._api_backward)
    ms = fast.measure("gpt2", "L1", rounds=1, warmup=0, tmp=str(tmp_path))
    assert set(ms) == set(fast.ARMS) and all(v > 0 for v in ms.values())
    assert (recorder._build_rows, stacks._stack_key, stats._fused_at, api_mode._api_handler,
            grad_hooks._api_backward) == before
    lines = fast.report({("gpt2", "L1"): ms})
    assert lines[2].startswith("| gpt2 | L1 |") and lines[2].count("x |") == len(fast.ARMS) - 1
    with warnings.catch_warnings(record=True) as seen:  # every arm records without a failure
        warnings.simplefilter("always")
        tensor = fast.measure("gpt2", "L1", rounds=1, warmup=0, tmp=str(tmp_path), task="tensor")
    assert not [str(w.message) for w in seen if "recording failed" in str(w.message)]
    assert list(tensor) == list(fast.TASK_ARMS["tensor"]) and all(v > 0 for v in tensor.values())
    assert (recorder._build_rows, stacks._stack_key, stats._fused_at, api_mode._api_handler,
            grad_hooks._api_backward) == before
    lines = fast.report({("gpt2", "L1"): tensor})
    assert "no C copies" in lines[0] and "without the C host copies" in lines[-1]


# ---------------------------------------------------------------- count_instructions.py
counting = pytest.importorskip("count_instructions")


def test_instruction_counts_say_so_where_valgrind_is_missing(capsys, monkeypatch):
    monkeypatch.setattr(counting.shutil, "which", lambda name: None)
    assert counting.main(["--models", "vit"]) == 0
    assert "valgrind (callgrind) is not installed: nothing counted" in capsys.readouterr().out


def test_the_counted_child_is_valid_python_that_steps_from_one_line():
    for only_stop in (False, True):
        code = counting.child_code("vit", "L1", 5, "/t/f", "/t", only_stop)
        compile(code, "child", "exec")
        assert code.count("w.train_step(") == 1 and "range(3 + steps)" in code  # warm-up and counted steps share it
        assert f"if {only_stop} else dbg.stop()" in code


def test_stop_alone_is_counted_inside_the_function_the_child_calls_it_through():
    """--stop-share: callgrind collects only inside sys.call_tracing, which the child wraps stop() in, and the
    split says what stop() and the rest add over the plain step."""
    assert counting.STOP_MARK == "sys_call_tracing"
    assert counting.valgrind_args("/t/o", only_stop=True)[-1] == "--toggle-collect=sys_call_tracing"
    assert not any(a.startswith("--toggle-collect") for a in counting.valgrind_args("/t/o"))
    line = counting.stop_share({"Ir": 54e6}, {"Ir": 12e6}, {"Ir": 18e6})
    assert line == ("of which stop() 12.00M (22.2%), the rest 42.00M; over the plain step: stop() +0.667x,"
                    " the rest 2.333x")


def test_each_count_has_its_own_handshake_files(tmp_path):
    """Two trees' counts of one model and level: the second child must not find the first one's files."""
    a, b = (counting.flag_path(str(tmp_path), "vit", "L1") for _ in range(2))
    assert a != b and os.path.dirname(a) != os.path.dirname(b)
    assert all(os.path.dirname(p).startswith(str(tmp_path)) for p in (a, b))


def test_the_cache_simulation_is_asked_for_parsed_and_weighed():
    """--cache-sim adds callgrind's cache simulation with the last level at the size asked, reads every event
    callgrind reports, and estimates cycles with KCachegrind's weights (10 a first-level miss, 100 a last-level
    one)."""
    plain = counting.valgrind_args("/t/o")
    assert "--cache-sim=yes" not in plain and "--instr-atstart=no" in plain
    assert counting.valgrind_args("/t/o", True, 512)[-2:] == ["--cache-sim=yes", "--LL=524288,8,64"]
    err = ("==1== Events    : Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw\n"
           "==1== Collected : 1000 400 200 30 20 10 3 2 1\n")
    ev = counting.parse_events(err)
    assert ev == {"Ir": 1000, "Dr": 400, "Dw": 200, "I1mr": 30, "D1mr": 20, "D1mw": 10, "ILmr": 3, "DLmr": 2,
                  "DLmw": 1}
    assert counting.estimated_cycles(ev) == 1000 + 10 * 60 + 100 * 6
    assert counting.parse_events("==1== Collected : 5000\n") == {"Ir": 5000}
    line = counting.describe({k: v / 2 for k, v in ev.items()}, {k: v / 4 for k, v in ev.items()})
    assert line.startswith("0.00M instructions a step  2.000x of none; misses a step: I1 0K")
    assert line.endswith("estimated cycles  2.000x of none")
