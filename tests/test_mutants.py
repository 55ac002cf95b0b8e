"""A fixed set of one-line mutants of the core rules, each applied to a temporary copy of the package: the
tests mapped to it must fail (issue 36). tools/mutation.py runs the full tool; this keeps CI honest cheaply.
Each mutant's original text must occur exactly once, so that a refactor fails here loudly, not silently."""
from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
T = str(ROOT / "tests")

#: (id, module, original text, mutated text, test node ids that must fail on it)
MUTANTS = [
    ("crc-last-row", "store/hdf5_index.py", "    for i in range(len(index)):", "    for i in range(len(index) - 1):",
     [f"{T}/test_writer_safety.py::test_a_flipped_byte_in_the_last_committed_row_of_the_index_is_refused"]),
    ("collectives-before", "analysis/rank_order.py", "before = np.cumsum(is_c) - is_c", "before = np.cumsum(is_c)",
     [f"{T}/test_ranks.py::test_on_four_ranks_each_call_sits_between_the_collectives_that_bracket_it_on_its_rank"]),
    ("warmup-judged", "store/monitor_rules.py", "judge = np.flatnonzero(ok & (count >= self.warmup))",
     "judge = np.flatnonzero(ok & (count > self.warmup))",
     [f"{T}/test_monitor_alerts.py::test_a_spike_right_after_the_warm_up_is_the_first_alert_at_its_step"]),
    ("empty-tensor-overflow", "analysis/overflow.py", "is_float & (numel > 0) &", "is_float & (numel >= 0) &",
     [f"{T}/test_overflow.py::test_an_empty_tensor_without_statistics_is_not_an_overflow"]),
    ("one-thousandth-strict", "analysis/metrics.py", "np.count_nonzero(rel < ONE_THOUSANDTH)",
     "np.count_nonzero(rel <= ONE_THOUSANDTH)",
     [f"{T}/test_metrics.py::test_an_error_of_exactly_one_thousandth_is_not_within_one_thousandth"]),
    ("cosine-one-side-zero", "analysis/metrics.py", "elif na <= eps or nb <= eps:", "elif na <= eps and nb <= eps:",
     [f"{T}/test_metrics.py"]),
    ("rel-l2-zero-bench", "analysis/metrics.py",
     'res["rel_l2_err"] = dn / bn if bn > 0 else (0.0 if dn == 0 else math.inf)',
     'res["rel_l2_err"] = dn / bn if bn > 0 else 0.0', [f"{T}/test_metrics.py"]),
    ("one-thousandth-rule-strict", "analysis/grading.py", "(ratio < th.one_thousandth_output_error)",
     "(ratio <= th.one_thousandth_output_error)",
     [f"{T}/test_compare_msprobe.py::test_the_tensor_call_rules_are_strict_at_their_thresholds"]),
    ("cosine-drop-strict", "analysis/grading.py", "cin[c] - cos[i] > th.cosine_drop_warning",
     "cin[c] - cos[i] >= th.cosine_drop_warning",
     [f"{T}/test_compare_msprobe.py::test_the_tensor_call_rules_are_strict_at_their_thresholds"]),
    ("forced-only-when-stuck", "analysis/rank_order.py", "if remaining and not progressed:",
     "if remaining or not progressed:", [f"{T}/test_rank_order_rules.py::"
                                         "test_a_collective_unblocked_late_in_a_pass_is_still_met_by_all_its_ranks_at_once"]),
    ("forced-clock", "analysis/rank_order.py", "resolved[name] = last[r] + 1", "resolved[name] = last[r] + 2",
     [f"{T}/test_rank_order_rules.py::test_a_rank_waiting_at_a_collective_another_went_past_alone_meets_it_there"]),
    ("inf-against-zero-bench", "analysis/metrics.py", "(np.isinf(n) != np.isinf(b)), np.inf, e)",
     "(np.isinf(n) & np.isinf(b)), np.inf, e)", [f"{T}/test_metrics_rules.py::"
                                                 "test_inf_against_an_all_zero_bench_tensor_is_a_full_disagreement_and_the_first_divergence"]),
    ("every-tensor-message", "analysis/grading.py", "r.add(np.full(len(tmsg[i]), i, dtype=np.int64), 0, list(tmsg[i]))",
     "r.add(np.array([i]), 0, list(tmsg[i]))",
     [f"{T}/test_grading_rules.py::test_tensor_status_nodata_and_file_and_messages"]),
    ("inputs-agree-strict", "analysis/grading.py", "(row_in < th.norm_rel_input_ok)",
     "(row_in <= th.norm_rel_input_ok)",
     [f"{T}/test_grading_rules.py::test_an_output_far_off_while_the_inputs_agree_is_an_error_at_strict_thresholds"]),
    ("overflow-either-statistic", "analysis/overflow.py", "stat_bad = np.isinf(mx) | np.isinf(mn) | nan_stat",
     "stat_bad = np.isinf(mx) & np.isinf(mn) | nan_stat",
     [f"{T}/test_overflow.py::test_without_counts_either_statistic_being_inf_or_nan_is_an_overflow"]),
    ("overflow-every-receiver", "analysis/overflow.py", "received.setdefault(r, call)\n                continue",
     "received.setdefault(r, call)\n                break",
     [f"{T}/test_overflow.py::test_on_ten_ranks_every_rank_the_overflow_reached_is_named_and_the_report_lists_eight"]),
    ("index-rows-bound", "store/hdf5_index.py", "+ 2) * block", "+ 3) * block", [f"{T}/test_hdf5_index_rules.py::"
     "test_an_index_claiming_more_rows_than_the_file_can_hold_is_refused_and_its_bound_is_exact"]),
    ("index-step-int32", "store/hdf5_index.py", "(step >= 2 ** 31)", "(step > 2 ** 31)",
     [f"{T}/test_hdf5_index_rules.py::test_a_step_outside_int32_is_refused"]),
    ("alert-bar-strict", "store/monitor_rules.py", "hit = dev > bar  #", "hit = dev >= bar  #",
     [f"{T}/test_monitor_rules.py::test_a_constant_series_never_alerts_even_with_every_bar_at_zero"]),
    ("alert-floor-at-least", "store/monitor_rules.py", "hit &= x >= self._low[series]",
     "hit &= x > self._low[series]",
     [f"{T}/test_monitor_rules.py::test_a_spike_must_reach_the_floor_and_reaching_it_exactly_is_enough"]),
    ("ulp-limit-strict", "precheck/standards.py", "np.count_nonzero(err > info.ulp_limit)",
     "np.count_nonzero(err >= info.ulp_limit)",
     [f"{T}/test_standards_rules.py::test_ulp_limit_and_share_at_their_edges"]),
    ("benchmark-error-limit-strict", "precheck/standards.py", "        if ratio > e:", "        if ratio >= e:",
     [f"{T}/test_standards_rules.py::test_benchmark_a_ratio_exactly_at_the_error_limit_is_a_warning"]),
    ("dropout-negative-inputs", "precheck/standards.py", "live = (inp != 0) & np.isfinite(inp)",
     "live = (inp > 0) & np.isfinite(inp)",
     [f"{T}/test_standards_rules.py::test_dropout_counts_negative_inputs_and_checks_their_scale"]),
    ("loss-only-divergence", "analysis/monitor_compare.py", "if not differs.any() and loss_step is None:",
     "if not differs.any():",
     [f"{T}/test_monitor_compare_rules.py::test_the_loss_can_be_the_first_value_that_differs"]),
    ("band-edge-inside", "analysis/monitor_compare.py", "((lr < lo) | (lr > hi))", "((lr <= lo) | (lr >= hi))",
     [f"{T}/test_monitor_compare_rules.py::test_a_ratio_exactly_on_its_bands_edge_stays_inside"]),
    ("whole-ints-only", "store/hdf5_writer.py", "arr = np.asarray([exact_int(v) for v in vals], dtype=np.int64)",
     "arr = np.asarray([int(v) for v in vals], dtype=np.int64)",
     [f"{T}/test_hdf5_writer_rules.py::test_integer_columns_take_whole_floats_and_name_what_they_refuse"]),
    ("index-extent-blocks", "store/hdf5_writer.py", "(-(-end // INDEX_BLOCK) * INDEX_BLOCK,",
     "(-(-end // INDEX_BLOCK) | INDEX_BLOCK,", [f"{T}/test_hdf5_writer_rules.py::"
                                               "test_hundreds_of_steps_and_marks_keep_their_numbers_across_index_blocks"]),
    ("zero-bench-norm", "analysis/grading.py", 'np.abs(_arr(t, "norm_diff")) / np.abs(',
     'np.abs(_arr(t, "norm_diff")) % np.abs(', [f"{T}/test_grading_rules.py::"
                                                "test_an_output_against_an_all_zero_bench_is_wholly_off_when_the_inputs_agree"]),
    ("earliest-extra-call", "analysis/divergence.py", "if found is None or c < found:",
     "if found is None or c != found:",
     [f"{T}/test_divergence_rules.py::test_of_two_npu_only_producers_the_earlier_is_the_root"]),
    ("npu-only-argument", "analysis/divergence.py", '.map(first).to_numpy(dtype=np.int64)', '.map(first).to_numpy()',
     [f"{T}/test_divergence_rules.py::test_an_argument_passed_on_one_side_only_is_an_argument_that_differs"]),
    ("msprobe-outside-by-default", "store/msprobe_reader.py", "*, allow_outside: bool = False) -> DumpParts:",
     "*, allow_outside: bool = True) -> DumpParts:", [f"{T}/test_msprobe_reader_rules.py::"
                                                      "test_tensor_files_outside_the_dump_are_refused_by_default_and_the_switch_is_keyword_only"]),
    ("msprobe-kwargs-a-list", "store/msprobe_reader.py", '(kind is list and key != "input_kwargs")',
     '(kind is list and key <= "input_kwargs")',
     [f"{T}/test_msprobe_reader_rules.py::test_record_values_of_the_wrong_kind_are_refused"]),
    ("blame-own-difference", "analysis/provenance.py",
     'return ("output" in io and "input" not in io) or state_differs(call)',
     'return "output" in io or state_differs(call)', [f"{T}/test_provenance_rules.py::"
                                                     "test_a_dropout_fed_diverging_activations_passes_them_on_and_the_walk_goes_past_it"]),
    ("walk-diverging-inputs", "analysis/provenance.py", "bad = [p for name, p in rows if name in diverging and p]",
     "bad = [p for name, p in rows if p]",
     [f"{T}/test_provenance_rules.py::test_only_the_producers_of_diverging_inputs_are_walked"]),
    ("renumber-backward", "analysis/matching.py", '    bw = direction == "backward"', '    bw = direction == "forward"',
     [f"{T}/test_matching_rules.py::test_backward_calls_pair_by_their_order_among_the_same_apis_backward_calls"]),
    ("prefix-dot-boundary", "analysis/matching.py", 'rest.startswith(p + ".")', "rest.startswith(p)",
     [f"{T}/test_matching_rules.py::test_module_prefixes_are_renamed_on_dot_boundaries_longest_first"]),
    ("reserve-mark-and-commit", "store/hdf5_writer.py", "self._reserve_index(len(self._pending_drops) + 1)",
     "self._reserve_index(len(self._pending_drops) | 1)",
     [f"{T}/test_hdf5_writer_rules.py::test_a_waiting_mark_and_the_next_commit_across_an_index_block"]),
    ("string-id-minus-one", "store/hdf5_reader.py", "ids.min() < (-1 if allow_missing else 0)", "ids.min() < -1",
     [f"{T}/test_hdf5_reader_rules.py::test_a_string_column_naming_no_string_is_refused"]),
    ("export-statistics-no-tensors", "store/msprobe_writer.py",
     'if task == "tensor" and (calls["data_name"] != "").any():',
     'if task == "tensor" or (calls["data_name"] != "").any():', [f"{T}/test_msprobe_writer_rules.py::"
                                                                 "test_a_statistics_dump_writes_no_tensor_files_and_tensors_is_keyword_only"]),
    ("export-collision-names-rows", "store/msprobe_writer.py", 'f"records {first[1]!r}', 'f"records {first[0]!r}',
     [f"{T}/test_msprobe_writer_rules.py::test_two_tensors_meeting_in_one_file_name_are_refused_naming_both_rows"]),
]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """The package as it is, compiled extensions included, outside the repository."""
    d = tmp_path_factory.mktemp("pristine")
    shutil.copytree(ROOT / "msprobe_nb", d / "msprobe_nb", ignore=shutil.ignore_patterns("__pycache__"))
    return d


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """tools/mutation_server.py: numpy, pandas, h5py, torch and pytest imported once; each mutant's tests run in
    a forked child that imports msprobe_nb from its copy. None where fork or Unix sockets are missing: then a
    fresh interpreter per mutant."""
    if not hasattr(os, "fork") or not hasattr(socket, "AF_UNIX") or not hasattr(os, "pidfd_open"):
        yield None
        return
    sock = tmp_path_factory.mktemp("srv") / "s"
    srv = subprocess.Popen([sys.executable, str(ROOT / "tools" / "mutation_server.py"), "serve", str(sock),
                            "--preload", "numpy", "pandas", "pytest", "h5py", "torch"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not sock.exists():
            if srv.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mutation_server did not start: {srv.stderr.read() if srv.stderr else ''}")
            time.sleep(0.05)
        yield sock
    finally:
        srv.kill()
        srv.wait()


def _run(server: Path | None, copy: Path, nodes: list[str]) -> tuple[int, str]:
    """Run ``nodes`` against the package in ``copy``: (pytest's status, its output)."""
    args = ["-q", "-x", "-p", "no:cacheprovider", *nodes]
    if server is None:
        env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
        r = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=copy, env=env, capture_output=True,
                           text=True, timeout=300)
        return r.returncode, r.stdout + r.stderr
    return _server_client().ask(str(server), 300, args, cwd=str(copy), package=str(copy))


@functools.cache
def _server_client():
    """tools/mutation_server.py as a module, loaded once (tools/ is no package): the client of its protocol."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_server", ROOT / "tools" / "mutation_server.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _mutate(pristine: Path, tmp_path: Path, module: str, old: str, new: str) -> Path:
    copy = tmp_path / "pkg"
    shutil.copytree(pristine, copy)
    f = copy / "msprobe_nb" / module
    src = f.read_text()
    assert src.count(old) == 1, f"{module}: the mutant's text {old!r} occurs {src.count(old)} times, not once"
    f.write_text(src.replace(old, new))
    return copy


def test_the_copy_is_what_the_tests_import_and_unmutated_it_passes(pristine, server):
    where = pristine / "test_where.py"  # a test that fails unless msprobe_nb (and its analysis) is the copy's
    where.write_text("import msprobe_nb, msprobe_nb.analysis.grading as g\n"
                     "def test_where():\n"
                     f"    assert msprobe_nb.__file__ == {str(pristine / 'msprobe_nb' / '__init__.py')!r}\n"
                     f"    assert g.__file__.startswith({str(pristine)!r})\n")
    rc, out = _run(server, pristine, [str(where)])
    assert rc == 0, out[-3000:]
    rc, out = _run(server, pristine, [n for m in MUTANTS for n in m[4]])
    assert rc == 0, out[-3000:]


@pytest.mark.parametrize("name,module,old,new,nodes", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_the_mutant_is_killed(pristine, server, tmp_path, name, module, old, new, nodes):
    rc, out = _run(server, _mutate(pristine, tmp_path, module, old, new), nodes)
    assert rc == 1, f"mutant {name} in {module} survived (rc {rc}):\n{out[-3000:]}"
