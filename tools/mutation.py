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
import ast
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: module (under msprobe_nb/) -> the fast test files that judge it
MODULES: dict[str, list[str]] = {
    "analysis/rank_order.py": ["test_rank_order_rules.py", "test_ranks.py"],
    "analysis/overflow.py": ["test_overflow.py"],
    "analysis/metrics.py": ["test_metrics_rules.py", "test_metrics.py"],
    "analysis/divergence.py": ["test_divergence_rules.py", "test_divergence.py"],
    # -x: the rules file kills most mutants first; only its survivors pay for test_divergence.py (~2 s)
    "analysis/grading.py": ["test_grading_rules.py", "test_divergence.py"],
    "analysis/matching.py": ["test_matching_rules.py"],
    "analysis/provenance.py": ["test_provenance_rules.py"],
    "store/hdf5_index.py": ["test_hdf5_index_rules.py"],
    "store/monitor_rules.py": ["test_monitor_rules.py"],
    # the store's round trips without its kill tests (a subprocess each, seconds per mutant)
    "store/hdf5_writer.py": ["test_hdf5_writer_rules.py", *[f"test_store_hdf5.py::{t}" for t in (
        "test_every_column_round_trips",
        "test_missing_columns_get_schema_defaults_and_none_strings_become_empty",
        "test_numpy_inputs_and_many_chunk_boundaries",
        "test_tensors_round_trip_bit_exact",
        "test_numpy_arrays_handed_as_tensors_read_back_as_torch_tensors",
        "test_side_tables_meta_and_construct",
        "test_several_ranks_concatenate_sort_and_remap_stacks",
        "test_bad_input_is_rejected_before_writing_and_the_writer_keeps_working",
        "test_empty_dump_reads_as_an_empty_table",
        "test_read_while_the_writer_is_open_in_this_process",
        "test_an_uncommitted_index_row_is_ignored",
        "test_coded_columns_repeat_their_values_by_code_and_bad_codes_are_refused",
        "test_columns_repeated_from_the_last_step_reuse_its_ids_but_never_a_failed_steps",
    )]],
    # the reader's integrity checks of ids (SCOPES), then the round trips that decode every column
    "store/hdf5_reader.py": ["test_hdf5_reader_rules.py", *[f"test_store_hdf5.py::{t}" for t in (
        "test_every_column_round_trips", "test_missing_columns_get_schema_defaults_and_none_strings_become_empty")]],
    "store/msprobe_reader.py": ["test_msprobe_reader_rules.py", "test_msprobe_format.py", "test_hostile_input.py"],
    "store/msprobe_writer.py": ["test_msprobe_writer_rules.py", "test_msprobe_format.py", "test_hostile_input.py"],
    "precheck/standards.py": ["test_standards_rules.py"],
    "analysis/monitor_compare.py": ["test_monitor_compare_rules.py"],
    "seeding.py": ["test_seeding.py"],
}

#: modules mutated only in part: module -> (what the part is, the functions in it). The issue names the HDF5
#: writer's numbering and commit; its column conversions (a separate job, tested in test_hdf5_writer_rules.py)
#: are left out, so that the run fits a session on 2 cores. Mutants elsewhere are neither run nor counted.
SCOPES: dict[str, tuple[str, tuple[str, ...]]] = {
    "store/hdf5_writer.py": ("numbering and commit", (
        "__init__", "_create", "_intern", "_shape_id", "_rollback", "write_step", "_prepare", "_write",
        "_reserve_index", "_append_index", "mark_dropped", "_flush_drops", "_write_drops", "close", "_release")),
    # the integrity checks of ids and tensor bytes; the commit index's own checks are store/hdf5_index.py
    "store/hdf5_reader.py": ("integrity checks", ("_check_tensor_index", "_check_ids", "column")),
}
OUT_OF_SCOPE = "out of scope"

#: the output given to mutants inside annotations, never evaluated under ``from __future__ import annotations``
#: (counted equivalent, not run)
ANNOTATION = "annotation"

#: analysis/overflow.py: (line, operator) -> why the surviving mutant cannot change a result
_OVERFLOW_EQUIVALENT: dict[tuple[int, str], str] = {
    (23, 'core/AddNot'): 'imports Dump at run time too: a name used in annotations only, no import cycle',
    (60, 'core/ReplaceComparisonOperator_Eq_LtE'):
        "adds the 'none' rows (an argument that is None): no counts, statistics nor float dtype, never non-finite",
    (66, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'a count is never negative',
    (69, 'core/NumberReplacer'): 'fillna(2): only numel > 0 is read (fillna(0) is killed)',
    (73, 'core/ReplaceFalseWithTrue'): 'the dtype words hold no regex character',
    (76, 'core/ReplaceFalseWithTrue'): 'no tensor row at all: nan_stat is masked by `tensor` anyway',
    (77, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool (or * a Python bool) is the logical and',
    (77, 'core/ReplaceBinaryOperator_BitAnd_Add'):
        "col 22: + binds first, (tensor or float) & ..., and the result is masked by `tensor` again",
    (77, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'numel is never negative',
    (77, 'core/ReplaceBinaryOperator_BitOr_Add'): 'numpy adds bool arrays as a logical or',
    (78, 'core/ReplaceBinaryOperator_BitOr_Add'): 'numpy adds bool arrays as a logical or',
    (79, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (84, 'core/ReplaceFalseWithTrue'): 'itertuples(index=True) adds an Index field first; fields are read by name',
    (86, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'a count is never negative',
    (121, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (121, 'core/ReplaceBinaryOperator_BitAnd_FloorDiv'): 'bool // bool is their logical and (0 / 1; x // 0 is 0)',
    (122, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (122, 'core/ReplaceBinaryOperator_BitAnd_Div'):
        "adds only non-finite input rows (every io is an input or an output kind), whose call is skipped as in_bad; "
        "0 / 0 is NaN, which any() skips",
    (122, 'core/ReplaceBinaryOperator_BitAnd_FloorDiv'): 'bool // bool is their logical and (0 / 1; x // 0 is 0)',
    (122, 'core/ReplaceBinaryOperator_BitAnd_LShift'):
        "adds only non-finite input rows (every io is an input or an output kind), whose call is skipped as in_bad",
    (123, 'core/ReplaceFalseWithTrue'): 'per_call is read into a dict by key: its order is never used',
    (135, 'core/ReplaceFalseWithTrue'):
        "every (step, rank, call) of the order is in state: both come from the same rows, so the default is never "
        "used",
    (141, 'core/ReplaceComparisonOperator_NotEq_IsNot'):
        "adds the rank itself, whose inputs are finite there (in_bad calls were skipped)",
    (141, 'core/ReplaceFalseWithTrue'): 'participants are ranks that recorded the call: the default is never used',
    (146, 'core/ReplaceComparisonOperator_NotEq_Lt'):
        "never stops at the next step: _innermost skips other (step, rank) calls; only slower",
    (146, 'core/ReplaceComparisonOperator_NotEq_Gt'): 'steps come in ascending order: > is !=',
    (146, 'core/NumberReplacer'): 'made[-1] is the call just added: never stops early, only slower (made[1] is killed)',
    (147, 'core/ReplaceBreakWithContinue'): 'walks the later steps too, whose calls _innermost skips; only slower',
    (154, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (155, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (157, 'core/ReplaceComparisonOperator_Eq_LtE'):
        "kind is 'call', 'collective' or 'inputs': only 'call' is <= 'call'",
    (157, 'core/ReplaceComparisonOperator_Eq_Is'): "kind is always one of this module's (interned) string literals",
    (159, 'core/ReplaceComparisonOperator_Eq_LtE'):
        "kind is 'collective' or 'inputs' here: only 'collective' is <= 'collective'",
    (159, 'core/ReplaceComparisonOperator_Eq_Is'): "kind is always one of this module's (interned) string literals",
    (166, 'core/ReplaceComparisonOperator_NotEq_IsNot'):
        "ranks are ints from int(): below 257 the same objects; differs only for an answer's rank above 256 that "
        "also received a value before it made one",
    (180, 'core/NumberReplacer'): 'made[0:] adds the first call itself, no ancestor of itself (made[2:] is killed)',
    (183, 'core/NumberReplacer'): 'moves the depth cap (a guard against a damaged parent cycle) by one',
    (184, 'core/ReplaceComparisonOperator_Lt_NotEq'):
        "the depth cap against a parent cycle still stops the walk at 256",
    (184, 'core/ReplaceComparisonOperator_Lt_LtE'):
        "moves the depth cap (a guard against a damaged parent cycle) by one",
    (184, 'core/NumberReplacer'): 'moves the depth cap (a guard against a damaged parent cycle) by one',
    (188, 'core/NumberReplacer'):
        "depth + 2: the cap against a damaged parent cycle stops at 128 levels, no module tree is that deep (+ 0 is "
        "killed)",
    (187, 'core/ReplaceBreakWithContinue'):
        "after a match the walk goes on up the ancestors, none of which is the new call",
}

#: precheck/standards.py's equivalent survivors, by (line, operator)
_BOOL_OR = "numpy adds bool arrays as a logical or"
_BOOL_AND = "bool * bool, bool // bool and bool ** bool give the logical and (x // False is 0)"
_STANDARDS_EQUIVALENT: dict[tuple[int, str], str] = {
    (45, "core/NumberReplacer"): "float32's largest value +-1 is the same double (its ULP is 2**104)",
    (48, "core/NumberReplacer"): "bfloat16's largest value +-1 is the same double",
    (50, "core/NumberReplacer"): "float64's largest value +-1 is the same double",
    (58, "core/NumberReplacer"): "error 2 -> 3 keeps the order of the verdicts (pass -1 is killed)",
    (63, "core/ReplaceUnaryOperator_USub_Invert"): "an unknown verdict ranks -2 instead of -1: still below pass",
    (63, "core/NumberReplacer"): "an unknown verdict ranks -2 instead of -1: still below pass",
    (104, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (104, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (104, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND,
    (104, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "~(x ** y) & a on bools: x ** y is 0 only where x is False and y True, as the and it replaces needs",
    (104, "core/ReplaceBinaryOperator_BitOr_BitXor"): "dn ^ bn differs from dn | bn only where both are NaN, "
                                                        "where neither side is inf, so the term is 0 either way",
    (108, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (134, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (134, "core/ReplaceBinaryOperator_BitOr_BitXor"): "dev == bench and both NaN never hold together",
    (134, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (134, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND,
    (181, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (181, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND,
    (219, "core/NumberReplacer"): "no large values: np.zeros(2) has the same max and mean as np.zeros(1)",
    (224, "core/NumberReplacer"): "unreachable: benchmark() returns before an empty comparison",
    (228, "core/ReplaceBinaryOperator_Add_BitOr"): "the guard n_pos | n_neg is zero exactly when n_pos + n_neg is "
                                                     "(the divisor's | is killed)",
    (228, "core/ReplaceBinaryOperator_Add_BitXor"): "the guard is zero only where n_pos == n_neg, whose balance is 0",
    (228, "core/ReplaceBinaryOperator_Add_Sub"): "the guard is zero only where n_pos == n_neg, whose balance is 0",
    (265, "core/ReplaceComparisonOperator_Eq_Is"): "the names are the interned literals of the floors dict",
    (282, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (287, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (289, "core/NumberReplacer"): "p is a probability: p * (1 - p) is never below 0",
    (293, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (294, "core/ReplaceComparisonOperator_Lt_NotEq"): "p is a probability: p != 1 is p < 1",
}

#: store/hdf5_index.py: (line, operator) -> why the surviving mutant cannot change a result
_HDF5_INDEX_EQUIVALENT: dict[tuple[int, str], str] = {
    (60, 'core/ReplaceComparisonOperator_NotEq_IsNot'):
        'the version read is an int (plain_attr): equal small ints are one object',
    (81, 'core/ReplaceComparisonOperator_NotEq_IsNot'): 'column counts are small ints, one object when equal',
    (84, 'core/NumberReplacer'):
        'block 2 for an index stored whole: all its rows are stored, so the file always holds them (0 is killed)',
    (114, 'core/ReplaceComparisonOperator_NotEq_Lt'): 'layouts above 5 were refused by check_header: < is != here',
    (114, 'core/ReplaceComparisonOperator_NotEq_IsNot'):
        'the layout read is an int (plain_attr): equal small ints are one object',
    (140, 'core/ReplaceComparisonOperator_Lt_NotEq'): 'n is never above len(index)',
    (147, 'core/ReplaceBinaryOperator_BitOr_Add'): 'numpy adds bool arrays as a logical or',
    (147, 'core/ReplaceBinaryOperator_BitOr_BitXor'): 'a slot is never both 0 and 1',
    (161, 'core/ReplaceBinaryOperator_BitOr_Add'): 'numpy adds bool arrays as a logical or',
    (161, 'core/ReplaceBinaryOperator_BitOr_BitXor'): 'a step is never both below -2**31 and at or above 2**31',
    (164, 'core/ReplaceComparisonOperator_NotEq_Gt'): 'flags & FLAG_DROPPED is 0 or 1',
    (165, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (165, 'core/ReplaceBinaryOperator_BitAnd_FloorDiv'): 'bool // bool is their logical and (x // 0 is 0)',
    (165, 'core/ReplaceComparisonOperator_NotEq_Gt'): 'lengths that shrink were refused just before: != is > here',
    (183, 'core/ReplaceBinaryOperator_FloorDiv_Mul'):
        "a contiguous dataset's storage is all of it or none: x itemsize gives 0 or more than its extent, "
        'deciding and reporting alike',
    (183, 'core/ReplaceBinaryOperator_FloorDiv_Div'): 'the storage is a whole number of items: / gives the same count',
    (183, 'core/ReplaceBinaryOperator_FloorDiv_Pow'):
        "a contiguous dataset's storage is all of it or none: ** itemsize gives 0 or at least its extent",
    (183, 'core/ReplaceBinaryOperator_FloorDiv_LShift'):
        "a contiguous dataset's storage is all of it or none: << itemsize gives 0 or more than its extent",
    (183, 'core/NumberReplacer'): 'max(itemsize, 0): item sizes are 1 or more (max(itemsize, 2) is killed)',
    (184, 'core/NumberReplacer'): 'chunks[-1] of a 1-D dataset is chunks[0] (chunks[1] is killed)',
    (196, 'core/ReplaceComparisonOperator_Lt_LtE'):
        "no group's chunks are 1 row (GROUPS: 1024 rows or more); 0 is refused either way",
    (196, 'core/NumberReplacer'):
        "chunk < 2: no group's chunks are 1 row (GROUPS: 1024 rows or more); chunk < 0 is killed",
    (199, 'core/NumberReplacer'): 'shape[-1] of a 1-D dataset (checked just above) is shape[0]',
    (202, 'core/NumberReplacer'): 'shape[-1] of a 1-D dataset (checked above) is shape[0]',
    (206, 'core/NumberReplacer'): 'shape[-1] of a 1-D dataset (checked first) is shape[0]',
    (208, 'core/NumberReplacer'): "shape[-1] of a 1-D dataset (the message's only case that reads it) is shape[0]",
}

#: store/monitor_rules.py: (line, operator) -> why the surviving mutant cannot change a result
_MONITOR_RULES_EQUIVALENT: dict[tuple, str] = {
    (74, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'spike_floor is checked >= 0 in __init__: != 0 is > 0',
    (75, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (76, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (77, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (78, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (79, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (80, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (81, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (82, 'core/NumberReplacer'):
        'one spare zero row at the start, as _grow adds: rows are read by series id, the extra last one never',
    (90, 'core/ReplaceComparisonOperator_Gt_GtE'): 'grows when already long enough: spare rows, never read',
    (91, 'core/ReplaceBinaryOperator_Sub_Add'):
        'extra only needs to be >= n - len (rows for the new ids): this gives that or more, spare rows',
    (91, 'core/ReplaceBinaryOperator_Sub_LShift'):
        'extra only needs to be >= n - len (rows for the new ids): this gives that or more, spare rows',
    (91, 'core/ReplaceBinaryOperator_Sub_BitOr'):
        'extra only needs to be >= n - len (rows for the new ids): this gives that or more, spare rows',
    (91, 'core/ReplaceBinaryOperator_Sub_BitXor'):
        'extra only needs to be >= n - len (rows for the new ids): this gives that or more, spare rows',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_Add'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_Sub'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_Mul'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_Mod'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_Pow'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_RShift'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_LShift'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_BitOr'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_BitAnd'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/ReplaceBinaryOperator_FloorDiv_BitXor'):
        'the spare growth term: max() keeps n - len, enough rows for the new ids',
    (91, 'core/NumberReplacer'):
        'the spare growth term (len // 1 or // 3): max() keeps n - len, enough rows for the new ids',
    (106, 'core/NumberReplacer'): 'n[-1] where every n is n[0] (n[1] is killed)',
    (115, 'core/ReplaceComparisonOperator_Eq_LtE'):
        'refreshed series hold warmup values or more: <= warmup is == warmup',
    (116, 'core/ReplaceAndWithOr'):
        'sets _low of direction series too, which only the spike rule reads (their ids differ)',
    (124, 'core/ReplaceBinaryOperator_Sub_BitXor'):
        '(c ^ w) % 8 == 0 exactly when c and w agree in their low 3 bits, as (c - w) % 8 == 0',
    (124, 'core/ReplaceComparisonOperator_Eq_LtE'): '% REFRESH is never negative',
    (145, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'a count is never negative',
    (145, 'core/ReplaceComparisonOperator_Gt_GtE'):
        "the first value's change lands in ring slot window - 1, overwritten by the window-th change before any "
        'refresh reads that slot',
    (145, 'core/NumberReplacer'):
        "c > -1: the first value's change lands in ring slot window - 1, overwritten before it is read",
    (107, 'core/ReplaceComparisonOperator_Eq_Lt'): 'k is one of n: (n < k).all() is never true, the general case '
                                                  'selects the same rows',
    (107, 'core/ReplaceComparisonOperator_Eq_GtE'):
        'k goes up (n[0] alone, or np.unique, sorted): rows of a larger n are overwritten by their own k later',
    (107, 'core/AddNot'): 'series is never empty here: the general selection of the rows with n == k is taken',
    (136, 'core/ReplaceComparisonOperator_Gt_GtE'): "a bar of 0 with dev > 0: numpy's dev / 0 is inf too",
    (165, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (169, 'core/NumberReplacer'): 'the placeholder of values not ok, which are neither judged nor kept',
    (173, 'core/NumberReplacer'): 'count[-1] for count[0]: the steady case needs every count equal to it',
    (174, 'core/ReplaceComparisonOperator_GtE_Is'):
        'c0 is warmup only when equal (small ints): else the general case, which gives the same alerts',
    (174, 'core/ReplaceUnaryOperator_Delete_Not'):
        'out is only non-empty with a non-finite value, when ok.all() fails: the general case is taken either way',
    (176, 'core/ReplaceComparisonOperator_GtE_Is'):
        'a numpy int is never a Python int: the selection of judged rows is taken, selecting all of them',
    (179, 'core/ReplaceBinaryOperator_BitAnd_FloorDiv'): "bool // bool is their logical and (numpy's x // 0 is 0)",
    (184, 'core/ReplaceBinaryOperator_Sub_BitXor'):
        '(c ^ w) % 8 == 0 exactly when c and w agree in their low 3 bits, as (c - w) % 8 == 0',
    (184, 'core/ReplaceComparisonOperator_Eq_LtE'): '% REFRESH is never negative',
    (191, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (191, 'core/ReplaceComparisonOperator_Gt_NotEq', 7): 'dev > bar >= 0 already: dev != 0 there',
    (191, 'core/ReplaceComparisonOperator_Gt_GtE', 7): 'dev > bar >= 0 already: dev >= 0 there',
    (197, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'a bar is never negative: != 0 is > 0',
    (197, 'core/NumberReplacer', 67): "bar > -1 with a bar of 0 and dev > 0: numpy's dev / 0 is inf too",
    **{(ln, f'core/ReplaceComparisonOperator_Eq_{op}'): 'false at n[0] itself: the general case (np.unique), which '
       'selects the same rows; the shortcut is only quicker' for ln in (106, 107) for op in ('Gt', 'Lt', 'NotEq')},
    (136, 'core/NumberReplacer', 45): "bar > -1 with a bar of 0 and dev > 0: numpy's dev / 0 is inf too",
    (136, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'a bar is never negative: != 0 is > 0',
    (157, 'core/NumberReplacer', 54): 'grows one spare row: rows are read by series id, the extra one never',
    (163, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (163, 'core/ReplaceComparisonOperator_Lt_NotEq'): 'NaN fails values > 0 already: for the rest != inf is < inf',
    **{(174, f'core/ReplaceComparisonOperator_Eq_{op}'): 'false at count[0] itself: the general case, which gives '
       'the same alerts (the steady case is only quicker)' for op in ('Gt', 'Lt', 'NotEq')},
    (174, 'core/ReplaceComparisonOperator_GtE_Eq'):
        'the steady shortcut taken less often: the general case gives the same alerts',
    (174, 'core/ReplaceComparisonOperator_GtE_Gt'):
        'the steady shortcut taken less often: the general case gives the same alerts',
    (176, 'core/ReplaceComparisonOperator_GtE_Eq'):
        'the selection of judged rows taken more often, selecting all of them when every count is past warmup',
    (176, 'core/ReplaceComparisonOperator_GtE_Gt'):
        'the selection of judged rows taken more often, selecting all of them when every count is past warmup',
    (179, 'core/ReplaceBinaryOperator_BitAnd_Mul'): 'bool * bool is the logical and',
    (191, 'core/NumberReplacer', 65): 'dev > bar >= 0 already: dev > -1 there',
    (191, 'core/ReplaceBinaryOperator_BitAnd_FloorDiv'): "bool // bool is their logical and (numpy's x // 0 is 0)",
    (197, 'core/ReplaceComparisonOperator_Gt_GtE'): "a bar of 0 with dev > 0: numpy's dev / 0 is inf too",
    (213, 'core/NumberReplacer', 76): 'partitioned at h - 2 and h, the one element between them (h - 1) is in its '
                                      'sorted place too',
    (223, 'core/ReplaceComparisonOperator_Eq_GtE'):
        "the rules are 'nonfinite', 'spike' and 'direction_drop': only 'spike' is >= 'spike'",
}

#: seeding.py: reasons by (line, operator). "Needs CUDA" lines run only where torch.cuda is available (an
#: accelerator session): on this CPU-only machine they are not reached, so no test here can judge them
_CUDA = "needs CUDA (or cuDNN): not reached on a CPU-only machine; judged only where a GPU is lent"
_SEEDING_EQUIVALENT: dict[tuple[int, str], str] = {
    (23, "core/AddNot"): "the pandas import for annotations only: to_frame() imports it itself",
    (98, "core/NumberReplacer"): "only the first three widths are read",
    (177, "core/AddNot"): _CUDA, (178, "core/NumberReplacer"): _CUDA, (179, "core/AddNot"): _CUDA,
    (192, "core/AddNot"): _CUDA, (195, "core/AddNot"): _CUDA, (199, "core/AddNot"): _CUDA,
    (207, "core/ReplaceComparisonOperator_Eq_Is"): "the names are the interned literals of DETERMINISTIC_ENV",
    (210, "core/ReplaceComparisonOperator_Eq_NotEq"): _CUDA, (210, "core/ReplaceComparisonOperator_Eq_Lt"): _CUDA,
    (210, "core/ReplaceComparisonOperator_Eq_LtE"): _CUDA, (210, "core/ReplaceComparisonOperator_Eq_Gt"): _CUDA,
    (210, "core/ReplaceComparisonOperator_Eq_GtE"): _CUDA, (210, "core/ReplaceComparisonOperator_Eq_Is"): _CUDA,
    (210, "core/ReplaceComparisonOperator_Eq_IsNot"): _CUDA, (210, "core/AddNot"): _CUDA,
    (210, "core/ReplaceAndWithOr"): _CUDA,
}
#: analysis/monitor_compare.py's equivalent survivors, by (line, operator)
_MONITOR_COMPARE_EQUIVALENT: dict[tuple[int, str], str] = {
    (43, "core/NumberReplacer"): "the table is indexed by bytes, 0-255: an extra entry is never read",
    (85, "core/NumberReplacer"): "unreachable: an empty merge was skipped just before",
    (88, "core/ReplaceTrueWithFalse"): "the directions are merged by their columns: their index is never read",
    (100, "core/ReplaceBinaryOperator_BitAnd_Add"): "an or: a zero-sum histogram's NaN shares make the overlap NaN",
    (100, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (100, "core/ReplaceBinaryOperator_BitAnd_BitOr"): "a zero-sum histogram's shares are NaN, whose overlap is NaN",
    (114, "core/ReplaceComparisonOperator_Eq_LtE"): "the columns are 'lr' or 'lr/<i>': only 'lr' is <= 'lr'",
    (114, "core/NumberReplacer"): "the column is 'lr/<i>': a second split finds nothing more",
    (137, "core/ReplaceComparisonOperator_Eq_LtE"): "a norm is never negative",
    (137, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (137, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND,
    (139, "core/ReplaceTrueWithFalse"): "name and kind are columns of one table: always as long",
    (151, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (151, "core/ReplaceBinaryOperator_BitOr_BitXor"):
        "(fa != fb) and (fa & fb & ...) never hold together (the off ^ low one is killed)",
    (151, "core/ReplaceBinaryOperator_BitAnd_Add"): "(fa + fb) & x: where only one side is finite the row parts anyway",
    (151, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (187, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR, (187, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (188, "core/ReplaceComparisonOperator_Eq_LtE"): "no step comes before the first",
    (191, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (210, "core/ReplaceComparisonOperator_LtE_Lt"): "with exactly band_steps steps no step is past the early ones",
    (223, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (223, "core/ReplaceBinaryOperator_BitOr_BitXor"):
        "exclusive terms: one side non-finite makes the log ratio non-finite; no value is below lo and above hi",
    (229, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (229, "core/ReplaceComparisonOperator_Eq_LtE"): "step is the first step of any row outside: none is earlier",
    (233, "core/ReplaceComparisonOperator_NotEq_IsNot"): "numpy's two bools are singletons",
    (255, "core/ReplaceComparisonOperator_Eq_LtE"): "step is the first step: none is earlier",
    (256, "core/ReplaceOrWithAnd"): "the merged scalars hold loss_a and loss_b together or neither",
    (263, "core/ReplaceOrWithAnd"): "the merged scalars hold loss_a and loss_b together or neither",
    (259, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (259, "core/ReplaceBinaryOperator_BitOr_BitXor"): "a == b and both NaN never hold together",
    (259, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (266, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR, (266, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (292, "core/NumberReplacer"): "the score s is never negative: fmax(s, -1) is fmax(s, 0)",
    (73, "core/ReplaceBinaryOperator_BitAnd_BitOr"): "a rank with bitmaps on one side only merges to nothing",
    (77, "core/ReplaceTrueWithFalse"): "the kept index column is never read: columns are read by name",
    (134, "core/ReplaceComparisonOperator_NotEq_IsNot"): "'layer' is an interned literal, as the column names are",
    (172, "core/ReplaceComparisonOperator_Eq_LtE"): "first_lr is the least step of the rows: none is earlier",
    (187, "core/ReplaceBinaryOperator_BitOr_BitXor"): "na == nb and both NaN never hold together",
    (196, "core/ReplaceComparisonOperator_Lt_LtE"): "a loss step equal to the step sets the same step",
    (198, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (198, "core/ReplaceComparisonOperator_Eq_LtE"): "step is the least step that differs: none is earlier",
    (217, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (223, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND,
    (235, "core/ReplaceComparisonOperator_Lt_LtE"):
        "not equivalent, wording only: a row outside its band by its ratio whose direction sits exactly at the "
        "minimum is worded by its direction; the step, row and band are the same",
    (247, "core/NumberReplacer"): "_score's direction_min argument is not used",
    (259, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND,
    (266, "core/ReplaceBinaryOperator_BitOr_BitXor"): "a == b and both NaN never hold together",
}

#: analysis/grading.py's equivalent survivors, by (line, operator) (issue 36, group GD; older ones below)
_GRADING_EQUIVALENT: dict[tuple[int, str], str] = {
    (148, "core/ReplaceComparisonOperator_Eq_LtE"):
        "dtype <= bool (safely cast to bool) holds for bool masks only; the index arrays are int64",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND
       for ln in (207, 208, 215, 221, 224, 227, 231, 236, 237, 238, 245, 246, 249, 253, 257, 261, 262, 263, 265, 268,
                  247, 248, 270, 272, 276, 301, 331, 348, 351, 352, 356, 361, 375, 376, 379)},
    (348, "core/ReplaceComparisonOperator_Gt_NotEq"): "near & 8 is never negative: != 0 is > 0",
    (348, "core/NumberReplacer"): "near & 8 is 0 or 8: > 1 is > 0 (& 9 is killed)",
    (320, "core/NumberReplacer"): "initial=0 differs from -1 for an empty table only: a spare NaN entry (-2 is killed)",
    (314, "core/ReplaceBinaryOperator_Add_Sub"):
        "pair * m - cc with 0 <= cc < m is still one code per (pair, call) (- 1 in m is killed)",
    (260, "core/ReplaceComparisonOperator_Eq_LtE"):
        "mode is statistics, tensor or md5 (compare resolves auto first): only md5 is <= 'md5'",
    (301, "core/ReplaceComparisonOperator_Gt_NotEq"): "near & bit is never negative: != 0 is > 0",
    (337, "core/ReplaceComparisonOperator_NotEq_GtE"):
        "codes are sorted: >= marks every row; each code's last (extreme) row is assigned last and wins",
    (208, "core/ReplaceComparisonOperator_Eq_LtE"):
        "adds the kind 'none' and '' rows: no tensor there (no statistics, dtype, shape, hash or messages), no "
        "tensor rule fires",
    (257, "core/ReplaceComparisonOperator_Eq_LtE"):
        "adds the tensor and none rows, whose value text is the same on both sides (compare_table.py)",
    (329, "core/NumberReplacer"): "one spare 'no row' entry (an empty table, or + 2), never selected",
    (366, "core/NumberReplacer"): "a > -1: a is never negative; at a == 0 the growth is NaN, the a == 0 clause decides",
    (257, "core/ReplaceComparisonOperator_Eq_IsNot"):
        "array is not 'value' is True: adds the tensor rows, whose value text is '' on both sides (compare_table.py)",
    (320, "core/ReplaceUnaryOperator_USub_Not"):
        "initial=0 differs from -1 for an empty table only: one spare NaN entry, never read",
    (330, "core/NumberReplacer"): "-2 marks 'no row' as -1 did: callers test >= 0 (-0 is killed)",
    (361, "core/ReplaceBinaryOperator_BitAnd_Div"):
        "adds calls without inputs (or outputs): their a is NaN, so neither warning's condition holds",
    (366, "core/ReplaceComparisonOperator_Gt_GtE"): "at a == 0 the growth is NaN: the a == 0 clause decides",
    (375, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "adds only the outputs of skip_input_rules ops as their call's reference: the smallest output ratio and "
        "cosine then bound every output's, so neither rule fires",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND for ln in (351, 375)},
    (133, "core/ReplaceComparisonOperator_Eq_GtE"): "nothing is above inf",
    (322, "core/ReplaceComparisonOperator_Eq_LtE"): "how is 'max' or 'min': only 'max' is <= 'max'",
    (337, "core/ReplaceComparisonOperator_NotEq_Gt"): "the codes are sorted ascending: a change of code is an increase",
    (351, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "adds only the outputs of skip_input_rules ops as their call's reference: the largest output error then "
        "bounds every output's, so neither rule fires",
    (361, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "adds calls without inputs (or outputs): their a is NaN, so neither warning's condition holds",
    (91, "core/ReplaceComparisonOperator_Eq_Is"): "field names are identifiers, interned like the literal",
    (253, "core/ReplaceComparisonOperator_Is_Eq"):
        "nan_inf_match holds Python's True, False or None (metrics.py): == False is is False",
    (272, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "~(nodata ** ~bad_file) on 0/1 ints is -2 or -1: & ok keeps exactly ok & ~nodata & ~bad_file",
    (279, "core/ReplaceComparisonOperator_Eq_GtE"):
        "mode is statistics (the branch before), tensor or md5 here: only tensor is >= 'tensor'",
    (365, "core/ReplaceComparisonOperator_Gt_GtE"): "a == 0: the growth is not used, the a == 0 branch decides",
    (365, "core/NumberReplacer"):
        "a > -1: a is never negative; at a == 0 the growth is not used, the a == 0 branch decides (a > 1 is killed)",
    (101, "core/ReplaceComparisonOperator_Eq_LtE"): "no field name sorts before 'buffer_args'",
    (101, "core/ReplaceComparisonOperator_Eq_Is"): "field names are identifiers, interned like the literal",
    (227, "core/ReplaceComparisonOperator_NotEq_IsNot"): "bool() gives one of the two bool singletons",
    (361, "core/ReplaceBinaryOperator_BitAnd_LShift"):
        "adds the calls without inputs: their a is NaN, so neither warning's condition holds",
    (401, "core/NumberReplacer"):
        "-2.0: any negative stand-in ranks an unknown error below every known one (errors are >= 0; 0.0 is killed)",
    (236, "core/ReplaceBinaryOperator_BitAnd_Add"):
        "differs only where the NPU max, min and one bench statistic are NaN: both sides bad, no rule judges it",
    **{(ln, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR for ln in (234, 247)},
    (149, "core/ReplaceComparisonOperator_Eq_LtE"): "a length is never negative; an empty selection adds nothing",
    (211, "core/ReplaceComparisonOperator_Eq_GtE"):
        "match is matched, npu_only or bench_only (compare_table.py): only npu_only is >= 'npu_only'",
    (212, "core/ReplaceComparisonOperator_Eq_LtE"):
        "match is matched, npu_only or bench_only (compare_table.py): only bench_only is <= 'bench_only'",
    (261, "core/ReplaceComparisonOperator_NotEq_Gt"): "a hash is a string: > '' is != ''",
    (263, "core/ReplaceComparisonOperator_Eq_LtE"): "a string is <= '' exactly when it is ''",
    (335, "core/ReplaceUnaryOperator_USub_Invert"): "~idx is -idx - 1: the same order",
    **{(337, op): "codes are sorted: [:1] only adds a code's earlier rows, which its last (extreme) row overwrites"
       for op in ("core/ReplaceUnaryOperator_Delete_USub", "core/ReplaceUnaryOperator_USub_UAdd")},
    (365, "core/ReplaceComparisonOperator_Gt_NotEq"): "a is the largest input NormRelativeErr, never negative",
    (367, "core/ReplaceComparisonOperator_Gt_NotEq"): "a is the largest input NormRelativeErr, never negative",
    (149, "core/NumberReplacer"): "len(idx) == -1 never holds: an empty selection adds nothing anyway (== 1 is killed)",
    (149, "core/ReplaceComparisonOperator_Eq_Lt"): "a length is never negative; an empty selection adds nothing anyway",
    (332, "core/ReplaceComparisonOperator_Eq_LtE"): "a length is never negative",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND for ln in (272, 331, 361)},
    (257, "core/ReplaceComparisonOperator_Eq_GtE"): "kind is tensor, value, none or '': only 'value' is >= 'value'",
    (314, "core/NumberReplacer"):
        "the multiplier need only exceed the largest call code: initial=+-1 or + 2 keep one code per (pair, call)",
    (322, "core/ReplaceComparisonOperator_Eq_Is"): "how is one of this module's interned literals 'max' and 'min'",
    (334, "core/ReplaceComparisonOperator_Eq_Is"): "how is one of this module's interned literals 'max' and 'min'",
    (329, "core/ReplaceUnaryOperator_USub_Not"):
        "initial=0 differs from -1 for an empty table only: one spare 'no row' entry, never selected",
    (334, "core/ReplaceComparisonOperator_Eq_LtE"): "how is 'max' or 'min': only 'max' is <= 'max'",
    (348, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"):
        "near-zero masks are 4 bits (0-15): near // 8 > 0 exactly when bit 8 is set",
    (366, "core/ReplaceComparisonOperator_Gt_NotEq"):
        "a is the largest input NormRelativeErr, never negative (nor NaN there): != 0 is > 0",
    (366, "core/ReplaceComparisonOperator_Eq_LtE"): "a is the largest input NormRelativeErr, never negative",
    (289, "core/NumberReplacer"): "only an empty table has no labels: its codes are empty, the fallback is never read",
}

#: store/hdf5_writer.py: (line, operator[, occurrence]) -> why the surviving mutant cannot change a result
_HDF5_WRITER_EQUIVALENT: dict[tuple, str] = {
    (91, 'core/ReplaceFalseWithTrue'): 'the meta attribute is JSON, read back with json.loads: escaped or not alike',
    (146, 'core/ReplaceComparisonOperator_Gt_NotEq'): 'the widths are 1, 2, 4, 8: w != 1 is w > 1',
    (150, 'core/NumberReplacer', 22): 'an index created with a row of zeros: zeros are never a commit, and the '
                                      'first step reserves the same rows',
    (174, 'core/NumberReplacer', 32): "fill rows one row into each block: the block's chunk is allocated alike",
    (202, 'core/ReplaceUnaryOperator_Delete_USub'): 'a pending string is always in the table: the default is unread',
    (202, 'core/ReplaceUnaryOperator_USub_Invert'): 'a pending string is always in the table: the default is unread',
    (202, 'core/NumberReplacer'): 'a pending string is always in the table: the default is unread',
    (209, 'core/ReplaceUnaryOperator_USub_UAdd'): 'a pending shape is always in the table: the default is unread',
    (209, 'core/ReplaceUnaryOperator_USub_Not'): 'a pending shape is always in the table: the default is unread',
    (209, 'core/ReplaceUnaryOperator_USub_Invert'): 'a pending shape is always in the table: the default is unread',
    (209, 'core/NumberReplacer'): 'a pending shape is always in the table: the default is unread',
    (228, 'core/ReplaceComparisonOperator_LtE_IsNot'):
        'memoizes longer columns too: the same ids, only more memory held until the next step',
    (228, 'core/ReplaceComparisonOperator_LtE_Lt'): 'a column of exactly MEMO_ROWS rows is converted again: same ids',
    (287, 'core/ReplaceComparisonOperator_Eq_GtE'):
        "the only schema dtype >= 'object' not handled before is 'object' ('string' is taken first)",
    (305, 'core/ReplaceFalseWithTrue'): 'copy=True: the same values in a new array',
    (459, 'core/ReplaceComparisonOperator_Gt_GtE'): 'setting the extent it has changes nothing',
    (477, 'core/ReplaceComparisonOperator_Gt_NotEq'): '_rows only moves on (by one), never below i',
    (493, 'core/ReplaceComparisonOperator_Gt_NotEq'):
        'the extent is the least whole number of blocks for the rows so far, and end never falls a block below '
        'it: the extent set is the one it has',
    (493, 'core/ReplaceComparisonOperator_Gt_IsNot'): 'sets the extent it has when not greater: changes nothing',
    (496, 'core/NumberReplacer', 110): "two rows of zeros at a block's start, past every row written: the chunk is "
                                       'allocated alike',
    (112, 'core/NumberReplacer', 6): 'a chunk cache of one byte holds no chunk (the smallest is kilobytes): as none',
    (130, 'core/ReplaceComparisonOperator_Eq_Is'): "enc is one of ENCODINGS' (interned) literals: `is` is `==`",
    (144, 'core/NumberReplacer', 16): 'one unused element before the first tensor: tensors are read by offset and '
                                      'count, and the first tensor step sets the extent to whole chunks',
    (145, 'core/ReplaceBinaryOperator_FloorDiv_Div'):
        'TENSOR_CHUNK_BYTES is a multiple of every width: the same whole number, which h5py takes as the chunk',
    (145, 'core/ReplaceFalseWithTrue'): 'object times in the dataset header: no reader uses them',
    (151, 'core/ReplaceFalseWithTrue'): 'object times in the dataset header: no reader uses them',
    (162, 'core/ReplaceTrueWithFalse'):
        'the temporary file exists whenever this runs: made before the try, renamed as its last statement',
    (202, 'core/ReplaceUnaryOperator_USub_Not'): 'a pending string is always in the table: the default is unread',
    (202, 'core/ReplaceUnaryOperator_USub_UAdd'): 'a pending string is always in the table: the default is unread',
    (205, 'core/ReplaceComparisonOperator_Eq_LtE'): "a table's length is never negative",
    (209, 'core/ReplaceUnaryOperator_Delete_USub'): 'a pending shape is always in the table: the default is unread',
    (414, 'core/NumberReplacer'): "the default flags are never used: write_step always passes them",
    (446, 'core/ReplaceComparisonOperator_Eq_Is'):
        'the widths are 1, 2, 4, 8: small ints, of which CPython keeps one object each',
    (459, 'core/NumberReplacer', 103): 'the buffers are one-dimensional: shape[-1] is shape[0]',
    (459, 'core/ReplaceComparisonOperator_Gt_IsNot'):
        "may set the extent back to this step's end, above every committed byte: only a failed step's leftover "
        "bytes go, which nothing reads",
    (459, 'core/ReplaceComparisonOperator_Gt_NotEq'):
        "may set the extent back to this step's end, above every committed byte: only a failed step's leftover "
        "bytes go, which nothing reads",
    (468, 'core/NumberReplacer', 106): 'reserves one row more: reserved rows hold fill zeros until written, never a '
                                       'commit',
    (477, 'core/ReplaceComparisonOperator_Gt_IsNot'): '_rows is i itself or the new object i + 1: `is not` is `>`',
    (493, 'core/ReplaceComparisonOperator_Gt_GtE'): 'setting the extent it has changes nothing',
    (494, 'core/ReplaceUnaryOperator_USub_Invert', 14):
        'differs only when one reservation ends exactly on a block boundary past the extent (a block of marks '
        'waiting at once): one more empty block, never read',
    (516, 'core/ReplaceBinaryOperator_BitOr_Add'):
        'FLAG_DROPPED lies below bit 8 and the errno above it: disjoint bits, so + is |',
    (516, 'core/ReplaceBinaryOperator_BitOr_BitXor'):
        'FLAG_DROPPED lies below bit 8 and the errno above it: disjoint bits, so ^ is |',
}

#: store/hdf5_reader.py's equivalent survivors (its integrity checks, SCOPES), by (line, operator[, occurrence])
_ENC_LITERAL = "enc is one of ENCODINGS' (interned) literals: `is` is `==`"
_HDF5_READER_EQUIVALENT: dict[tuple, str] = {
    (196, "core/NumberReplacer", 37): "the buffers are one-dimensional: shape[-1] is shape[0]",
    (198, "core/NumberReplacer", 39): "no tensor of that width: a stop of -1 passes as 0 does (no end is negative)",
    **{(ln, "core/ReplaceComparisonOperator_Eq_Is"): "col comes from COLUMNS' (interned) literal keys: `is` is `==`"
       for ln in (212, 214)},
    **{(ln, "core/ReplaceComparisonOperator_Eq_Is"): _ENC_LITERAL for ln in (218, 221, 228, 230, 232)},
    **{(ln, "core/ReplaceComparisonOperator_Eq_GtE"): "of the encodings (string_id, int32, int64, float64, bool, "
       "nullable_int64, nullable_bool, shape_id) only this one and those taken by an earlier branch sort at or "
       "after it" for ln in (218, 221, 228, 230)},
    (224, "core/NumberReplacer", 52): "one more None slot at the end: id -1 still reads the last slot, None",
    (229, "core/ReplaceComparisonOperator_Eq_LtE"): "INT_NA is the least int64: <= INT_NA is == INT_NA",
    (229, "core/ReplaceFalseWithTrue"): "copy=True: the same values in a new array",
    (231, "core/ReplaceComparisonOperator_Eq_GtE"):
        "differs only for a stored value above 1, which no writer stores (-1, 0, 1): such a byte reads as a bool "
        "either way, unchecked",
    (232, "core/ReplaceComparisonOperator_Eq_LtE"): "no other encoding sorts at or before 'bool': <= is ==",
    (232, "core/ReplaceComparisonOperator_Eq_Lt"):
        "bool columns come back as their uint8 0/1, which coerce_calls casts to the schema's bool: the same column",
}

#: analysis/divergence.py's equivalent survivors, by (line, operator[, occurrence]) (issue 36, group GD)
_DIVERGENCE_EQUIVALENT: dict[tuple, str] = {
    (300, "core/ReplaceComparisonOperator_NotEq_IsNot"):
        "adds empty producer names, which name no call: code_of.get('') is None, skipped",
    (151, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR,
    (300, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    (302, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND for ln in (175, 176, 302, 458)},
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND for ln in (154, 300, 418, 419)},
    (154, "core/ReplaceBinaryOperator_BitAnd_BitXor"):
        "adds the NPU-side argument rows (given their own call's index) and bench-only rows dropped just after",
    (279, "core/NumberReplacer", 55): "moves the depth cap (a guard against a damaged parent cycle) by one",
    (283, "core/NumberReplacer", 56): "depth + 2: the cap against a parent cycle stops at 128 levels, no module tree "
                                      "is that deep",
    (358, "core/ReplaceComparisonOperator_NotEq_Gt"): "matched and npu_only sort after bench_only: > is != here",
    (279, "core/ReplaceComparisonOperator_Lt_LtE"): "moves the depth cap (a guard against a parent cycle) by one",
    (300, "core/ReplaceComparisonOperator_NotEq_GtE"):
        "adds the inputs without a producer: their '' names no call, code_of.get('') is None, skipped",
    (308, "core/ReplaceComparisonOperator_Lt_IsNot"):
        "no cap: the walk still ends when the queue empties (seen stops revisits); the cap bounds huge graphs only",
    (332, "core/NumberReplacer", 62): "moves the walk's cap (a guard against a damaged producer cycle) by one",
    (423, "core/ReplaceUnaryOperator_USub_UAdd"): "call indexes are int64 in compare tables: na_value is never used",
    (158, "core/ReplaceComparisonOperator_NotEq_Gt"): "matched and npu_only sort after bench_only: > is != here",
    (262, "core/NumberReplacer"): "-2 marks 'no parent' as -1 does: the walk stops at any negative code (0 is killed)",
    (268, "core/ReplaceUnaryOperator_USub_Invert"): "~1 is -2: the walk stops at any negative code",
    (288, "core/NumberReplacer"): "moves the walk's cap (a guard against a damaged producer cycle) by one",
    (300, "core/ReplaceBinaryOperator_BitAnd_LShift"):
        "adds the inputs without a producer: their '' names no call, code_of.get('') is None, skipped",
    (362, "core/ReplaceUnaryOperator_USub_UAdd"): "call indexes are int64 in compare tables: na_value is never used",
    (161, "core/ReplaceUnaryOperator_USub_Invert"): "call indexes are int64 in compare tables: na_value is never used",
    (297, "core/ReplaceComparisonOperator_NotEq_GtE"):
        "with every NPU state empty no state differs either: the walk returns None just after",
    (460, "core/ReplaceComparisonOperator_Eq_Lt"): "an empty idx walks nothing: the same empty chain",
    (367, "core/ReplaceComparisonOperator_Lt_NotEq"): "seen grows by one: != 256 stops where < 256 does",
    (368, "core/NumberReplacer"):
        "pop(-1): every reachable bench-only call is still visited, and the earliest (distinct call indexes) wins "
        "(pop(1) is killed)",
    (383, "core/ReplaceComparisonOperator_Gt_GtE"):
        "a matched call never shares the bench-only root's bench call index: >= is > here",
    (472, "core/ReplaceComparisonOperator_Eq_LtE"): "rows are walked in ascending code order: c <= last is c == last",
    (413, "core/ReplaceComparisonOperator_Eq_Is"): "side is one of this module's interned literals 'npu' and 'bench'",
    (240, "core/ReplaceComparisonOperator_NotEq_Lt"):
        "mode is statistics, tensor or md5 (compare resolves auto first): only tensor is not < 'tensor'",
    (384, "core/ReplaceUnaryOperator_Delete_USub"): "call indexes are int64 in compare tables: na_value is never used",
    (423, "core/NumberReplacer"): "call indexes are int64 in compare tables: na_value is never used",
    (418, "core/ReplaceComparisonOperator_Eq_GtE"):
        "only npu_only is >= 'npu_only'; >= 'bench_only' adds the NPU-only rows, whose bench producer is '' "
        "(compare_table.py): never the forward's name",
    (418, "core/ReplaceBinaryOperator_BitAnd_BitOr"):
        "adds the other side's one-sided rows, whose producer on this side is '' (compare_table.py): never the "
        "forward's name",
    (367, "core/NumberReplacer"): "moves the walk's cap (a guard against a damaged producer cycle) by one",
    (423, "core/ReplaceUnaryOperator_USub_Not"): "call indexes are int64 in compare tables: na_value is never used",
    (467, "core/NumberReplacer"): "chained calls come after the root (codes > c0 >= 0): no code is 0 or -1",
    (467, "core/ReplaceUnaryOperator_USub_Invert"): "chained calls come after the root (codes > c0 >= 0): none is -2",
    (467, "core/ReplaceUnaryOperator_USub_Not"): "chained calls come after the root (codes > c0 >= 0): no code is 0",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND
       for ln in (138, 139, 154, 168, 198, 300, 305, 328, 383, 414, 418, 419)},
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): _BOOL_AND for ln in (414, 458)},
    **{(ln, "core/ReplaceBinaryOperator_BitOr_Add"): _BOOL_OR for ln in (156, 177)},
    (73, "core/ReplaceComparisonOperator_Gt_NotEq"): "modules is not empty in this branch: != 1 is > 1",
    (96, "core/NumberReplacer", 14): "a frame holds one newline (its header, then its source line; stacks.py and "
                                     "msprobe's stack.json alike): maxsplit 2 is maxsplit 1",
    **{(ln, "core/ReplaceComparisonOperator_Eq_GtE"): "kinds are tensor, value or none (schema.py): only 'value' is "
       ">= 'value'" for ln in (138, 199)},
    (151, "core/ReplaceBinaryOperator_BitOr_BitXor"):
        "one-sided rows are never matched, so never diverge (diverging() needs a match): ^ is | here",
    (152, "core/ReplaceComparisonOperator_NotEq_Gt"): "matched and npu_only sort after bench_only: > is != here",
    **{(161, op): "every row left has a call index (NPU rows their own, bench-side argument rows their call's, "
       "other bench-only rows dropped): na_value is never used" for op in (
        "core/ReplaceUnaryOperator_USub_UAdd", "core/ReplaceUnaryOperator_USub_Not",
        "core/ReplaceUnaryOperator_Delete_USub", "core/NumberReplacer")},
    (178, "core/ReplaceComparisonOperator_Eq_LtE"): "a length is never negative",
    (460, "core/ReplaceComparisonOperator_Eq_LtE"): "a length is never negative",
    (460, "core/NumberReplacer", 89): "an empty idx walks nothing: the same empty chain",
    (189, "core/ReplaceOrWithAnd"):
        "a draw found behind the first diverging call comes before it, so its inputs agree and extra stays None; "
        "without a draw, _extra_behind finds nothing behind inputs that agree",
    **{(ln, "core/NumberReplacer", occ): "the rows of one call share its step, rank and call index: [-1] is [0]"
       for ln, occ in ((196, 25), (196, 27), (254, 39), (386, 75), (386, 77), (387, 79), (388, 81), (417, 85))},
    (197, "core/ReplaceComparisonOperator_Gt_NotEq"): "a call code is never negative",
    (228, "core/ReplaceComparisonOperator_Eq_LtE"): "a call code is never negative",
    **{(199, op): "own_args is read only when c0's inputs diverge, and then bad_in holds them (never empty)"
       for op in ("core/ReplaceComparisonOperator_Gt_NotEq", "core/ReplaceComparisonOperator_Gt_GtE")},
    (199, "core/NumberReplacer", 33): "own_args is read only when c0's inputs diverge, and then bad_in holds them",
    (262, "core/ReplaceUnaryOperator_USub_Invert"): "~1 is -2: the walk stops at any negative code",
    (268, "core/NumberReplacer", 42): "-2 marks an unknown parent as -1 does: the walk stops at any negative code",
    (268, "core/NumberReplacer", 44): "-2 marks no parent as -1 does: the walk stops at any negative code",
    (277, "core/NumberReplacer", 49): "hit[0] is the root itself: meeting it among its own parents sets root to it",
    (278, "core/NumberReplacer", 50): "moves the depth cap (a guard against a damaged parent cycle) by one",
    (278, "core/NumberReplacer", 51): "moves the depth cap (a guard against a damaged parent cycle) by one",
    (279, "core/NumberReplacer", 54): "moves the depth cap (a guard against a damaged parent cycle) by one",
    (279, "core/ReplaceComparisonOperator_Lt_NotEq"): "depth goes up by one from 0: != 256 stops where < 256 does",
    (297, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    **{(300, op): "adds output rows, whose producer is their own call (a call is expanded once, after it was seen: "
       "the self-loop adds nothing), and inputs without a producer ('' names no call)" for op in (
        "core/ReplaceBinaryOperator_BitAnd_Add", "core/ReplaceBinaryOperator_BitAnd_Div",
        "core/ReplaceBinaryOperator_BitAnd_Pow", "core/ReplaceBinaryOperator_BitAnd_BitOr")},
    **{(ln, op): "moves the walk's cap (a guard against huge or damaged producer graphs) by one or lifts it: the "
       "walk still ends when its queue empties" for ln in (308, 332, 367)
       for op in ("core/ReplaceComparisonOperator_Lt_NotEq", "core/ReplaceComparisonOperator_Lt_LtE")},
    (332, "core/NumberReplacer", 63): "moves the walk's cap (a guard against a damaged producer cycle) by one",
    (333, "core/NumberReplacer", 65): "pop(-1): every reachable NPU-only call is still visited, and the earliest "
                                      "code is kept",
    (338, "core/ReplaceComparisonOperator_Eq_GtE"): "of matched, npu_only and bench_only only npu_only is >= it",
    (340, "core/ReplaceComparisonOperator_Lt_LtE"): "a call is visited once (seen): c == found never happens",
    (343, "core/ReplaceAndWithOr"): "revisits producers already seen: the same calls, more work (a producer comes "
                                    "before its consumer, so there is no cycle and the walk ends)",
    (358, "core/ReplaceComparisonOperator_Eq_LtE"): "of matched, npu_only and bench_only only bench_only is <= it",
    (358, "core/ReplaceComparisonOperator_Eq_GtE"):
        "takes every row's bench call; the difference that follows removes those of matched and NPU rows: the "
        "same set",
    **{(362, op): "bci is read only for rows with a bench call (NPU-only rows have none): na_value is never used"
       for op in ("core/ReplaceUnaryOperator_USub_Invert", "core/ReplaceUnaryOperator_Delete_USub",
                  "core/ReplaceUnaryOperator_USub_Not", "core/NumberReplacer")},
    (370, "core/ReplaceComparisonOperator_Lt_LtE"):
        "distinct bench calls have distinct bench call indexes, and a call is visited once: <= is <",
    (383, "core/ReplaceComparisonOperator_Eq_GtE"):
        "adds the NPU-only rows, whose bench call index is -1 (none): never after the root",
    **{(384, op): "only matched rows are read (after), and they have a call index: na_value is never used"
       for op in ("core/ReplaceUnaryOperator_USub_UAdd", "core/ReplaceUnaryOperator_USub_Invert",
                  "core/ReplaceUnaryOperator_USub_Not", "core/NumberReplacer")},
    **{(ln, op): "side is this module's literal 'npu' or 'bench': >= 'npu' and `is` are == here"
       for ln in (407, 423, 436)
       for op in ("core/ReplaceComparisonOperator_Eq_GtE", "core/ReplaceComparisonOperator_Eq_Is")},
    (413, "core/ReplaceComparisonOperator_Eq_LtE"): "'bench' is <= 'bench' and 'npu' is not: the same test",
    (413, "core/ReplaceComparisonOperator_Eq_GtE"):
        "for the NPU side the forward's name is looked up in its own column: the same name; only an NPU-only "
        "forward has no matched row, and its backward is NPU-only too, never a diverging root",
    (414, "core/ReplaceComparisonOperator_Eq_LtE", 19):
        "adds bench-only rows named like the forward: a bench-only row holds its bench call in `call` "
        "(compare_table.py), so it is the forward's own bench call, of the same bench name",
    (418, "core/ReplaceBinaryOperator_BitAnd_Add"):
        "adds the other side's one-sided rows, whose producer on this side is '' (compare_table.py): never the "
        "forward's name",
    (418, "core/ReplaceComparisonOperator_Eq_LtE"):
        "adds matched rows (which the name test removes) and, for npu_only, bench-only rows, whose NPU producer "
        "is '': never the forward's name",
    (418, "core/ReplaceComparisonOperator_Eq_IsNot"):
        "adds the other side's one-sided rows (matched names are removed by the name test), whose producer on "
        "this side is '': never the forward's name",
    **{(423, op): "the rows hit are this side's own, which have its call index: na_value is never used"
       for op in ("core/ReplaceUnaryOperator_USub_Invert", "core/ReplaceUnaryOperator_Delete_USub")},
}

#: store/msprobe_reader.py's equivalent survivors, by (line, operator[, occurrence]) (issue 36, group RD)
_SLOW_SHAPE = "the fast path only skips work: the slow checks below refuse or accept the same shapes"
_ONLY_PAST_MAX = ("the slow path sees a list of non-negative ints only when its product is past 2**63 - 1: "
                  "it refuses it either way, with the same message")
_SAME_AS_124 = ("line 124 splits every name that line 121 takes the same way (len >= 3, a counter at -2): "
                "taking 121 more or less often changes nothing")
_CHECK_ANYWAY = "the check only runs more often; a value it accepts is accepted either way"
_MSPROBE_READER_EQUIVALENT: dict[tuple, str] = {
    **{(59, f"core/ReplaceComparisonOperator_NotEq_{o}"): "a dict never has more keys than the pairs it came from: "
       "the duplicate search only runs more often, and finds none" for o in ("Lt", "LtE", "IsNot")},
    (84, "core/NumberReplacer", 9): "_DuplicateKey carries the one key: args[-1] is args[0]",
    **{(101, f"core/ReplaceComparisonOperator_Lt_{o}"): "a length is never negative and '' is not digits"
       for o in ("NotEq", "LtE", "IsNot")},
    (101, "core/NumberReplacer", 13): "a length is never negative and '' is not digits",
    (118, "core/NumberReplacer", 39): "tail has one token: tail[-1] is tail[0]",
    (119, "core/NumberReplacer", 41): "tail has one token: tail[-1] is tail[0]",
    (121, "core/ReplaceComparisonOperator_GtE_Eq"): _SAME_AS_124,
    (121, "core/ReplaceComparisonOperator_GtE_Gt"): _SAME_AS_124,
    **{(121, op, 1): _SAME_AS_124 + " (only the direction test moves)" for op in (
        "core/ReplaceUnaryOperator_USub_UAdd", "core/ReplaceUnaryOperator_USub_Invert",
        "core/ReplaceUnaryOperator_USub_Not", "core/ReplaceUnaryOperator_Delete_USub")},
    **{(121, "core/NumberReplacer", occ): _SAME_AS_124 for occ in (42, 43, 44, 45, 47)},
    (140, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    (162, "core/ReplaceComparisonOperator_GtE_Eq"):
        "paths grow one key at a time from 1: any deeper container has an ancestor at exactly MAX_DEPTH",
    (162, "core/ReplaceComparisonOperator_GtE_Is"): "100 is a cached small int: is is ==, and == is >= here",
    (175, "core/ReplaceComparisonOperator_GtE_Eq"):
        "depths grow by one from at most MAX_DEPTH: any deeper container has an ancestor at exactly MAX_DEPTH",
    (175, "core/ReplaceComparisonOperator_GtE_Is"): "100 is a cached small int: is is ==, and == is >= here",
    (211, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    **{(214, f"core/ReplaceComparisonOperator_Lt_{o}"): _SLOW_SHAPE for o in ("NotEq", "LtE")},
    (214, "core/NumberReplacer", 76): _SLOW_SHAPE,
    (214, "core/ReplaceComparisonOperator_IsNot_NotEq"): "classes compare equal only when they are the same class",
    **{(218, f"core/ReplaceComparisonOperator_LtE_{o}"): _SLOW_SHAPE for o in ("Eq", "Lt", "Is")},
    (220, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    (223, "core/ReplaceComparisonOperator_Lt_LtE"):
        "a 0 reaches the slow path only beside a negative dimension (its product is 0): refused the same way",
    (223, "core/NumberReplacer", 78):
        "a 0 reaches the slow path only beside a negative dimension (its product is 0): refused the same way",
    (226, "core/NumberReplacer"): _ONLY_PAST_MAX,
    **{(229, f"core/ReplaceComparisonOperator_Gt_{o}"): _ONLY_PAST_MAX for o in ("NotEq", "GtE", "IsNot")},
    (259, "core/ReplaceTrueWithFalse"): "every call tuple has one value per _BASE_COLS column: strict never fires",
    (261, "core/ReplaceTrueWithFalse"): "every row tuple has one value per row and leaf column: strict never fires",
    (262, "core/ReplaceComparisonOperator_Eq_LtE"):
        "the other columns hold scalars: an object array of them is what np.asarray gives, coerce_calls types both",
    (262, "core/ReplaceComparisonOperator_Eq_GtE"):
        "the other columns hold scalars: an object array of them is what np.asarray gives, coerce_calls types both",
    (262, "core/ReplaceComparisonOperator_Eq_Is"): "col comes from this module's literals, interned like 'shape'",
    (294, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    (299, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    **{(305, f"core/ReplaceComparisonOperator_Is_{o}"): "a leaf dict always holds a string type name, so the test "
       "is true whenever it was, and _check_depth accepts a leaf without containers" for o in ("Eq", "NotEq", "IsNot")},
    (307, "core/ReplaceComparisonOperator_Eq_LtE"): "a dict holding both 'value' and 'type' has at least two keys",
    **{(336, f"core/ReplaceComparisonOperator_NotEq_{o}"): _CHECK_ANYWAY for o in ("Lt", "Gt", "Is")},
    (336, "core/ReplaceComparisonOperator_Is_Eq"): "classes compare equal only when they are the same class",
    (336, "core/ReplaceOrWithAnd"): _CHECK_ANYWAY,
    (341, "core/NumberReplacer", 93): "the list has one item: value[-1] is value[0]",
    (424, "core/NumberReplacer"): "moves the rank count from which a progress bar is drawn: display only (and never "
                                  "under pytest)",
}

#: analysis/provenance.py's equivalent survivors, by (line, operator[, occurrence]) (issue 36, group MP)
_KIND_LITERAL = "d.kind is one of divergence.py's interned literals 'call', 'argument', 'extra', 'inputs'"
_PROVENANCE_EQUIVALENT: dict[tuple, str] = {
    (20, "core/AddNot"): "imports CompareResult at run time too: a name used in annotations only, no import cycle",
    (86, "core/NumberReplacer"): "moves the default cap of the walk (a guard against huge graphs) by one",
    **{(ln, "core/ReplaceBinaryOperator_BitAnd_Mul"): _BOOL_AND for ln in (94, 96, 105)},
    (99, "core/ReplaceComparisonOperator_Eq_LtE"):
        "io is input, parameters, output or parameters_grad: only 'input' is <= 'input'",
    (199, "core/ReplaceComparisonOperator_Eq_LtE", 11): "i is an enumerate() position: never below 0",
    (199, "core/ReplaceComparisonOperator_Eq_Is"):
        "the path ends at the walk's own start object (parent maps it to None); no other call in it equals start",
    (206, "core/ReplaceComparisonOperator_Eq_LtE"): "of the divergence kinds only 'argument' is <= 'argument'",
    (206, "core/ReplaceComparisonOperator_Eq_Is"): _KIND_LITERAL,
    (209, "core/ReplaceComparisonOperator_Eq_LtE"): "kind is not 'argument' here: of the rest only 'call' is <= 'call'",
    (209, "core/ReplaceComparisonOperator_Eq_Is"): _KIND_LITERAL,
}

#: analysis/matching.py's equivalent survivors, by (line, operator[, occurrence]) (issue 36, group MP)
_UNIQUE_CODES = "a multiplier above the column's largest code still gives one code per combination"
_NOT_EMPTY = "the array is never empty here (a paired group has rows): initial= is not read"
_MATCHING_EQUIVALENT: dict[tuple, str] = {
    (140, "core/ReplaceComparisonOperator_Eq_GtE"): "rsplit('.', 2) gives at most 3 parts: >= 3 is == 3",
    (164, "core/ReplaceComparisonOperator_Lt_NotEq"):
        "the exact way at every size but 5000, where the fast path runs as before: the same suffixes, only slower",
    (164, "core/NumberReplacer"): "moves by one row the size from which the sampled fast path runs (a speed choice)",
    (169, "core/NumberReplacer"): "ac < len(au): ic * (len(au) + 0 or + 2) + ac is still one code per (io, arg)",
    (169, "core/ReplaceBinaryOperator_Add_Div"): "len(au) / 1 as a float: still one code per (io, arg) (ac < len(au))",
    (169, "core/ReplaceBinaryOperator_Add_Pow"): "len(au) ** 1 is len(au): still one code per (io, arg) (ac < len(au))",
    (176, "core/ReplaceBinaryOperator_Sub_Div"):
        "a row escapes the exact way only if len(name) / len(call) is its suffix's length (8 or more): never for "
        "call + suffix, whose ratio is below 2; else every row takes the exact way, only slower",
    (176, "core/ReplaceBinaryOperator_Sub_LShift"):
        "name << call lengths is never a suffix's length: every row is odd and takes the exact way, only slower",
    (198, "core/NumberReplacer"): "one step on each side: [-1] is [0] ([1] fails)",
    (199, "core/NumberReplacer"): "one step on each side: [-1] is [0] ([1] fails)",
    **{(285, "core/NumberReplacer", k): "fresh keys need only exceed every key (neither key array is empty): a "
       "larger start or step gives keys no row has, alike" for k in (64, 65, 66)},
    **{(290, f"core/ReplaceBinaryOperator_Add_{o}"):
       "rows given fresh keys are NPU rows whose key no bench row has: sharing one (// 1, ** 1) or skipping values "
       "(<< 1) leaves each unmatched alike" for o in ("FloorDiv", "Pow", "LShift")},
    **{(311, f"core/ReplaceBinaryOperator_Add_{o}"):
       "the tie-break among bench-only rows sharing an anchor: x - 1, * 1, / 1, // 1, ** 1 keep their bench order, "
       "x % 1 ties them and the stable lexsort keeps it; no NPU row shares a primary (x.5 or -inf)"
       for o in ("Sub", "Mul", "Div", "FloorDiv", "Pow", "Mod")},
    (314, "core/NumberReplacer"): "index -1 is read only where np.where discards it (pos < 0)",
    (327, "core/NumberReplacer", 88): _UNIQUE_CODES,
    (327, "core/NumberReplacer", 89): _NOT_EMPTY,
    (327, "core/ReplaceBinaryOperator_Add_Sub", 14): "pair * K - code with 0 <= code < K: one code per (pair, call)",
    (327, "core/ReplaceBinaryOperator_Add_LShift"):
        "max << 1 >= max + 1 from max 1 on; with one call name (max 0) the instances merged across groups are one "
        "call, numbered alike in each group",
    (328, "core/NumberReplacer", 92): _NOT_EMPTY,
    (328, "core/ReplaceUnaryOperator_USub_Not"): _NOT_EMPTY,
    (328, "core/ReplaceUnaryOperator_USub_Invert"): _NOT_EMPTY,
    (347, "core/ReplaceFalseWithTrue"):
        "cumcount numbers rows within their group in row order whatever the groups' order",
    (354, "core/NumberReplacer"): "every part has the same length: the last part's is the first's",
    (358, "core/NumberReplacer"): "the column's codes shift by one uniformly: the same combinations",
    (362, "core/ReplaceBinaryOperator_Add_Sub"): "key * K - col with 0 <= col < K: one code per (key, col)",
    (362, "core/NumberReplacer", 100): _UNIQUE_CODES,
    (362, "core/NumberReplacer", 101): _NOT_EMPTY,
    (362, "core/NumberReplacer", 102): _UNIQUE_CODES,
    (369, "core/ReplaceComparisonOperator_Eq_Lt"): "an empty key gives an empty cumcount anyway",
    (369, "core/NumberReplacer", 105): "an empty key gives an empty cumcount anyway",
    (164, "core/ReplaceComparisonOperator_Lt_LtE"): "moves by one row the size from which the sampled fast path runs",
    **{(169, f"core/ReplaceBinaryOperator_Add_{o}", 4): "ac < len(au) <= the multiplier (len | 1, len // 1, len << 1, "
       "len * 1): still one code per (io, arg)" for o in ("BitOr", "FloorDiv", "LShift", "Mul")},
    (169, "core/ReplaceBinaryOperator_Add_Mod", 4):
        "the code is the arg's alone: rows sharing it differ in io, and the io words (input, output, parameters, "
        "parameters_grad) differ in length, so the length check sends them the exact way",
    (169, "core/ReplaceBinaryOperator_Add_Sub", 5): "ic * K - ac with 0 <= ac < K: one code per (io, arg)",
    **{(176, f"core/ReplaceBinaryOperator_Sub_{o}"): why for o, why in (
        ("BitOr", "len(name) | len(call) >= len(call), longer than any row's suffix: every row takes the exact way"),
        ("RShift", "len(name) >> len(call) is 0 for names under 2 ** len(call) characters: every row takes the "
                   "exact way"),
        ("Pow", "len(name) ** len(call) is 1, 0 or beyond any suffix's length (or wraps far from it): the rows take "
                "the exact way"))},
    (177, "core/NumberReplacer", 37): "the pad is cut off by [:-1] before it is read",
    (178, "core/NumberReplacer", 45): "a sample of 1999 rows, not 2000, of the consistency check: a speed trade-off",
    (179, "core/ReplaceAndWithOr"): "any sampled row not odd (all but renamed ones) sends the table the exact way: "
                                    "the same suffixes, only slower",
    (233, "core/ReplaceFalseWithTrue"): "the groups' indices are looked up by key: their order is not read",
    (234, "core/ReplaceFalseWithTrue"): "the groups' indices are looked up by key: their order is not read",
    (285, "core/NumberReplacer", 63): _NOT_EMPTY,
    (290, "core/NumberReplacer", 69):
        "rows given fresh keys are NPU rows whose key no bench row has: sharing one leaves each unmatched alike",
    (290, "core/ReplaceBinaryOperator_Add_Mul"):
        "rows given fresh keys are NPU rows whose key no bench row has: sharing one leaves each unmatched alike",
    (311, "core/NumberReplacer"): "x + 0 or + 2 keeps the bench order of bench-only rows sharing an anchor; no NPU "
                                  "row shares a primary with one",
    **{(176, f"core/ReplaceBinaryOperator_Sub_{o}"): "len(name) + or * len(call) is above any suffix's length: every "
       "row takes the exact way, only slower" for o in ("Add", "Mul")},
    (176, "core/ReplaceBinaryOperator_Sub_FloorDiv"):
        "len(name) // len(call) is 1 for call + suffix, never a suffix's length (8 or more): those rows take the "
        "exact way; a renamed row escapes it only if its name is 8 times its call's length",
    (177, "core/NumberReplacer", 36): "the pad is cut off by [:-1] before it is read",
    (178, "core/NumberReplacer", 44): "a sample of 2001 rows, not 2000, of the consistency check: a speed trade-off",
    (179, "core/ReplaceComparisonOperator_NotEq_LtE"):
        "a sampled row equal to call + suffix (nearly all) sends the table the exact way: the same suffixes, slower",
    (179, "core/ReplaceComparisonOperator_NotEq_IsNot"):
        "call + suffix is a new string object: 'is not' is always true, so the table takes the exact way, slower",
    (100, "core/NumberReplacer"): "split(' #', 2)[0] is split(' #', 1)[0]",
    (285, "core/NumberReplacer", 62): "fresh keys need only exceed every key: a larger start gives keys no row has",
    (290, "core/NumberReplacer", 68): "fresh keys skip a value: still keys no row has",
    (290, "core/ReplaceBinaryOperator_Add_Div"):
        "rows given fresh keys are NPU rows whose key no bench row has: sharing one leaves each unmatched alike",
    (290, "core/ReplaceBinaryOperator_Add_BitOr"):
        "fresh | 1 is fresh or fresh + 1: fresh keys shared or new, NPU rows no bench row has, unmatched alike",
    (327, "core/NumberReplacer", 90): _UNIQUE_CODES,
    (328, "core/NumberReplacer", 93): _NOT_EMPTY,
    (341, "core/ReplaceFalseWithTrue"):
        "cumcount numbers rows within their group in row order whatever the groups' order",
    (369, "core/ReplaceComparisonOperator_Eq_LtE"): "a length is never negative: <= 0 is == 0",
    (371, "core/ReplaceFalseWithTrue"):
        "cumcount numbers rows within their group in row order whatever the groups' order",
}

#: store/msprobe_writer.py's equivalent survivors, by (line, operator[, occurrence]) (issue 36, group RD)
_ONE_CALL = "the rows of one call_index are one call: the last row's call and direction are the first's"
_BAR = "how many ranks or tensor files draw a progress bar: display only (and never under pytest)"
_MSPROBE_WRITER_EQUIVALENT: dict[tuple, str] = {
    (24, "core/AddNot"): "imports Dump at run time too: dump.py imports this module lazily, no import cycle",
    (50, "core/ReplaceComparisonOperator_Eq_LtE"): "an element count is never negative: <= 0 is == 0",
    (51, "core/ReplaceComparisonOperator_Eq_LtE"): "a NaN count is never negative: <= 0 is == 0",
    (123, "core/ReplaceComparisonOperator_Eq_LtE"):
        "'none' rows carry no value nor value_type: _value_out gives them None, as the none branch does",
    (132, "core/ReplaceComparisonOperator_NotEq_Gt"): "an ASCII digit is > '0' exactly when it is not '0'",
    (141, "core/ReplaceComparisonOperator_Eq_LtE"): "_assemble is never given an empty list (callers check first)",
    (70, "core/ReplaceTrueWithFalse"): "four statistics for the four keys: strict never fires",
    (142, "core/NumberReplacer", 27): "one item: items[-1] is items[0]",
    (141, "core/NumberReplacer", 23): "one item: items[-1] is items[0]",
    (123, "core/ReplaceComparisonOperator_Eq_GtE"): "kind is value or none here: only 'value' is >= 'value'",
    (132, "core/ReplaceComparisonOperator_Eq_LtE"): "a digit string is <= '0' only when it is '0'",
    (132, "core/ReplaceComparisonOperator_NotEq_IsNot"): "one-character strings are cached: is not is != here",
    **{(148, f"core/ReplaceComparisonOperator_LtE_{o}"): "an index of 9 or more digits is at least 10**8: a list "
       "only beside 6 million items, past 16 * n + 1024 otherwise (a dict either way)" for o in ("NotEq", "Lt")},
    (148, "core/NumberReplacer", 35): "an index of 9 or more digits is at least 10**8: a list only beside 6 million "
                                      "items, past 16 * n + 1024 otherwise (a dict either way)",
    (176, "core/NumberReplacer", 43): "one item: v[-1] is v[0]",
    (176, "core/NumberReplacer", 49): "one item: v[-1] is v[0]",
    (202, "core/NumberReplacer", 53): _ONE_CALL,
    (207, "core/NumberReplacer", 61): _ONE_CALL,
    (250, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    (292, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    (292, "core/ReplaceComparisonOperator_NotEq_GtE"):
        "the next line keeps only the rows whose data_name is not '': none, so no file, where the test was false",
    (242, "core/ReplaceTrueWithFalse"): "two columns of one frame: their lengths match, strict never fires",
    (263, "core/ReplaceComparisonOperator_Eq_LtE"):
        "tensor files end in .pt or .npy (msprobe_data_name): only .npy is <= '.npy'",
    (257, "core/ReplaceTrueWithFalse"): "two columns of one frame: their lengths match, strict never fires",
    (295, "core/ReplaceTrueWithFalse"): "two columns of one frame: their lengths match, strict never fires",
    (148, "core/NumberReplacer", 34): "a 10-digit index is at least 10**9, past 16 * n + 1024 for any table in memory",
    (176, "core/ReplaceComparisonOperator_Eq_LtE"): "every parameter's list holds at least one row",
    (178, "core/ReplaceFalseWithTrue"): "take() then finds nothing, and the loop below writes those rows under the "
                                        "same key, at the same place (is_kwarg is only set on input rows)",
    (185, "core/ReplaceFalseWithTrue"): "the loop below writes the parameters rows under the same key, last, as "
                                        "this branch does",
    (201, "core/ReplaceFalseWithTrue"): "rows are read by field name: an extra Index field changes none",
    (202, "core/ReplaceComparisonOperator_NotEq_Gt"): "rows are sorted by call_index: a later one differs exactly "
                                                      "when it is greater",
    **{(ln, "core/NumberReplacer", occ): _ONE_CALL for ln, occ in ((203, 55), (203, 57), (203, 59), (207, 63),
                                                                   (207, 65))},
    (227, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    (243, "core/NumberReplacer", 71): "-1 (no stack) is never a key of the stack side table",
    (292, "core/ReplaceComparisonOperator_Eq_GtE"): "_task gives 'statistics' or 'tensor': only 'tensor' is >= it",
    (293, "core/ReplaceComparisonOperator_NotEq_Gt"): "a string is > '' exactly when it is not ''",
    **{(320, f"core/ReplaceBinaryOperator_FloorDiv_{op}"): _BAR for op in (
        "Add", "Sub", "Mul", "Div", "Mod", "Pow", "RShift", "LShift", "BitOr", "BitAnd", "BitXor")},
    (320, "core/NumberReplacer"): _BAR,
}

#: (module, line, operator) -> why the surviving mutant cannot change a result; (module, line, operator,
#: occurrence) where only one of the operator's mutants on that line is equivalent
EQUIVALENT: dict[tuple, str] = {
    **{("analysis/divergence.py", *key): why for key, why in _DIVERGENCE_EQUIVALENT.items()},
    **{("store/msprobe_reader.py", *key): why for key, why in _MSPROBE_READER_EQUIVALENT.items()},
    **{("store/msprobe_writer.py", *key): why for key, why in _MSPROBE_WRITER_EQUIVALENT.items()},
    **{("analysis/grading.py", *key): why for key, why in _GRADING_EQUIVALENT.items()},
    **{("store/hdf5_index.py", *key): why for key, why in _HDF5_INDEX_EQUIVALENT.items()},
    **{("store/hdf5_writer.py", *key): why for key, why in _HDF5_WRITER_EQUIVALENT.items()},
    **{("store/hdf5_reader.py", *key): why for key, why in _HDF5_READER_EQUIVALENT.items()},
    **{("store/monitor_rules.py", *key): why for key, why in _MONITOR_RULES_EQUIVALENT.items()},
    **{("analysis/overflow.py", *key): why for key, why in _OVERFLOW_EQUIVALENT.items()},
    **{("analysis/provenance.py", *key): why for key, why in _PROVENANCE_EQUIVALENT.items()},
    **{("analysis/matching.py", *key): why for key, why in _MATCHING_EQUIVALENT.items()},
    **{("precheck/standards.py", *key): why for key, why in _STANDARDS_EQUIVALENT.items()},
    **{("seeding.py", *key): why for key, why in _SEEDING_EQUIVALENT.items()},
    **{("analysis/monitor_compare.py", *key): why for key, why in _MONITOR_COMPARE_EQUIVALENT.items()},
    ("analysis/rank_order.py", 35, "core/ReplaceUnaryOperator_Invert_USub"): "pandas negates a bool Series as ~",
    ("analysis/rank_order.py", 82, "core/ReplaceComparisonOperator_Eq_NotEq"):
        "the shortcut for identical orders gives what the general walk gives; this one always walks",
    ("analysis/rank_order.py", 82, "core/ReplaceComparisonOperator_Eq_Is"):
        "the shortcut for identical orders gives what the general walk gives; this one walks more often",
    ("analysis/rank_order.py", 83, "core/NumberReplacer"): "a clock past the rank's last collective is never read",
    ("analysis/rank_order.py", 106, "core/ReplaceComparisonOperator_Lt_NotEq"): "pos[q] never passes len(seqs[q])",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_BitXor"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_BitOr"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_BitAnd"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/NumberReplacer"):
        "last + 0: a forced clock <= last + 1 is never above what the later participants get (+ 2 is killed)",
    ("analysis/rank_order.py", 82, "core/ReplaceComparisonOperator_Eq_IsNot"):
        "rank 0's own order is its first: never 'is not', so the general walk always runs, with the same clocks",
    ("analysis/rank_order.py", 82, "core/ReplaceComparisonOperator_Eq_Lt"):
        "rank 0's own order is not < itself, so the general walk always runs, with the same clocks",
    ("analysis/rank_order.py", 114, "core/ReplaceBinaryOperator_Sub_BitXor"):
        "only whether anything remains is read: len ^ pos is 0 exactly when len - pos is",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_Mul"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_FloorDiv"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_Pow"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 132, "core/ReplaceTrueWithFalse"):
        "the ranks are sorted where their order matters (_collective_clocks); the clocks are set per rank",
    ("analysis/rank_order.py", 35, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/rank_order.py", 81, "core/NumberReplacer"):
        "ranks[-1]: any rank's order is a reference for 'all the same'; else the general walk runs",
    ("analysis/rank_order.py", 106, "core/ReplaceComparisonOperator_Lt_LtE"):
        "a member past its last collective has met this one, which is then resolved (the branch before)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_RShift"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 83, "core/ReplaceBinaryOperator_Add_LShift"):
        "clocks past the rank's last collective are never read",
    ("analysis/rank_order.py", 106, "core/ReplaceComparisonOperator_Lt_IsNot"):
        "a member past its last collective has met this one, which is then resolved (the branch before)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_Div"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_Sub"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 73, "core/ReplaceTrueWithFalse"): "the kept index column is dropped by [ORDER_COLUMNS]",
    ("analysis/rank_order.py", 82, "core/ReplaceComparisonOperator_Eq_Gt"):
        "rank 0's own order is not > itself, so the general walk always runs, with the same clocks",
    ("analysis/rank_order.py", 130, "core/ReplaceTrueWithFalse"): "each step's clocks are computed on their own",
    ("analysis/rank_order.py", 161, "core/ReplaceFalseWithTrue"): "the groups go into a dict: their order is not read",
    ("analysis/rank_order.py", 102, "core/ReplaceComparisonOperator_Lt_NotEq"): "pos[r] never passes len(seqs[r])",
    ("analysis/rank_order.py", 109, "core/ZeroIterationForLoop"):
        "unadvanced, each member then meets the collective through `resolved`, at max(last + 1, t) = t",
    ("analysis/rank_order.py", 116, "core/ReplaceComparisonOperator_Lt_NotEq"): "pos[q] never passes len(seqs[q])",
    ("analysis/rank_order.py", 118, "core/ReplaceBinaryOperator_Add_Mod"):
        "a forced clock <= last + 1 is never above what the later participants get (the rank is least advanced)",
    ("analysis/rank_order.py", 141, "core/NumberReplacer"): "index -1 is read only where np.where discards it",
    ("analysis/rank_order.py", 141, "core/ReplaceComparisonOperator_Gt_NotEq"): "a count is never negative",
    ("analysis/rank_order.py", 142, "core/NumberReplacer"):
        "evaluated only where the rank has collectives (len(cc) > 0); else only local calls, which np.where takes",
    ("analysis/rank_order.py", 146, "core/ReplaceTrueWithFalse"): "the kept index column is dropped by [ORDER_COLUMNS]",
    ("analysis/metrics.py", 41, "core/NumberReplacer"):
        "size == -1: an empty array has no finite element either, the next guard returns None (== 1 is killed)",
    ("analysis/metrics.py", 88, "core/ReplaceBinaryOperator_Div_FloorDiv"):
        "bench all zeros: |norm diff| = the NPU norm >= its largest magnitude, so the ratio is exactly 1 (or NaN)",
    ("analysis/metrics.py", 129, "core/ReplaceComparisonOperator_Eq_LtE"): "only bool casts safely to bool",
    ("analysis/metrics.py", 180, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/metrics.py", 75, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"):
        "bool // bool is their logical and (as int8 0/1), and the masks built from it keep their truth",
    ("analysis/metrics.py", 81, "core/ReplaceBinaryOperator_BitOr_BitXor"):
        "both true: bench 0 and an infinite diff, where |diff| / |b| is inf anyway",
    ("analysis/metrics.py", 99, "core/ReplaceBinaryOperator_BitAnd_Add"):
        "e is NaN only where one side is NaN, which is then not equal: the or and the and agree",
    ("analysis/metrics.py", 100, "core/NumberReplacer"): "err starts at 0: fmax with a NaN replaced by -1 keeps it",
    ("analysis/metrics.py", 201, "core/ReplaceUnaryOperator_USub_Invert"):
        "reshape(~1) is reshape(-2): numpy takes a negative size as the unknown one",
    ("analysis/metrics.py", 234, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 41, "core/ReplaceComparisonOperator_Eq_Lt"):
        "size < 0 never: an empty array has no finite element either, the next guard returns None",
    ("analysis/metrics.py", 95, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 99, "core/ReplaceComparisonOperator_NotEq_IsNot"):
        "e is NaN only where one side is NaN (then not equal): 'always one-sided' changes nothing",
    ("analysis/metrics.py", 191, "core/NumberReplacer"): "reshape(-2): numpy takes a negative size as the unknown one",
    ("analysis/metrics.py", 199, "core/ReplaceComparisonOperator_Eq_LtE"): "a norm is never negative",
    ("analysis/metrics.py", 234, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/metrics.py", 75, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/metrics.py", 95, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "~(equal ** x) on 0/1 ints keeps the truth of ~equal & x in its lowest bit",
    ("analysis/metrics.py", 99, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): "bool // bool is the logical and",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_GtE"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_Gt"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 121, "core/AddNot"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_IsNot"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 180, "core/ReplaceBinaryOperator_BitOr_BitXor"): "no element is both NaN and inf",
    ("analysis/metrics.py", 191, "core/ReplaceUnaryOperator_USub_Invert"):
        "reshape(~1) is reshape(-2): numpy takes a negative size as the unknown one",
    ("analysis/metrics.py", 141, "core/ReplaceBinaryOperator_Mul_Div"):
        "the signature's * made /: every caller passes npu, bench by position and near_zero_rtol by name",
    ("analysis/metrics.py", 41, "core/ReplaceComparisonOperator_Eq_LtE"): "a size is never negative",
    ("analysis/metrics.py", 45, "core/ReplaceComparisonOperator_Eq_LtE"): "a size is never negative",
    ("analysis/metrics.py", 81, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/metrics.py", 85, "core/ReplaceComparisonOperator_Eq_Is"): "CPython interns the literal 'norm' of STATS",
    ("analysis/metrics.py", 87, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 87, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): "bool // bool is the logical and",
    ("analysis/metrics.py", 91, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 91, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): "bool // bool is the logical and",
    ("analysis/metrics.py", 95, "core/ReplaceBinaryOperator_BitAnd_Add"):
        "with one side inf the error is inf or NaN, never finite: the or and the and agree",
    ("analysis/metrics.py", 95, "core/ReplaceComparisonOperator_NotEq_Gt"):
        "inf / inf arises from an NPU inf only; a bench inf makes the relative error inf, not NaN",
    ("analysis/metrics.py", 99, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 99, "core/ReplaceBinaryOperator_BitAnd_BitOr"):
        "e is NaN in max/min only where one side is NaN (then not equal): the or and the and agree",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_Is"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 132, "core/ReplaceUnaryOperator_USub_Not"):
        "axis=0 orders the real and imaginary parts otherwise: every metric is the same for a permutation",
    ("analysis/metrics.py", 202, "core/ReplaceComparisonOperator_Gt_NotEq"): "a relative error is never negative",
    ("analysis/grading.py", 218, "core/ReplaceFalseWithTrue"):
        "the default of a missing column: compare tables always carry comparable (compare_table.py)",
    ("analysis/grading.py", 219, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/grading.py", 233, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/grading.py", 330, "core/ReplaceUnaryOperator_USub_Invert"):
        "-2 marks 'no row' as -1 did: callers test >= 0, and summarize_calls' calls all have rows",
    ("analysis/metrics.py", 75, "core/ReplaceBinaryOperator_BitOr_BitXor"): "n == b and both NaN never hold together",
    ("analysis/metrics.py", 75, "core/ReplaceBinaryOperator_BitAnd_Mul"): "bool * bool is the logical and",
    ("analysis/metrics.py", 87, "core/ReplaceComparisonOperator_Eq_LtE"): "a largest magnitude is never negative",
    ("analysis/metrics.py", 88, "core/ReplaceBinaryOperator_Div_Mod"):
        "against an all-zero bench, max or min already give err 1 (or inf if not recorded); this e is at most 1",
    ("analysis/metrics.py", 95, "core/ReplaceBinaryOperator_BitAnd_FloorDiv"): "bool // bool is the logical and",
    ("analysis/metrics.py", 171, "core/ReplaceBinaryOperator_BitOr_Add"): "numpy adds bool arrays as a logical or",
    ("analysis/metrics.py", 199, "core/ReplaceComparisonOperator_Gt_NotEq"): "a norm is never negative",
    ("analysis/metrics.py", 55, "core/ReplaceBinaryOperator_Mul_Div"):
        "the signature's * made /: every caller passes npu, bench by position and the rest by name",
    ("analysis/metrics.py", 85, "core/ReplaceComparisonOperator_Eq_Gt"):
        "for the norm both branches agree: a bench norm is at least its largest magnitude, ~0 only if all is 0",
    ("analysis/metrics.py", 85, "core/ReplaceComparisonOperator_Eq_GtE"): "only 'norm' of STATS is >= 'norm'",
    ("analysis/metrics.py", 88, "core/ReplaceBinaryOperator_Div_Sub"):
        "against an all-zero bench, max or min already give err 1 (or inf if not recorded); this e is at most 1",
    ("analysis/metrics.py", 92, "core/ReplaceComparisonOperator_Gt_NotEq"):
        "a NaN floor (bench max/min not recorded) makes no row ~0, so the branch is not taken",
    ("analysis/metrics.py", 110, "core/NumberReplacer"): "masks are & 15: a 17th label is never read",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_Eq"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_Lt"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 121, "core/ReplaceComparisonOperator_NotEq_LtE"):
        "only CPU tensors reach it in the tests (no accelerator here): .cpu() of a CPU tensor is itself",
    ("analysis/metrics.py", 125, "core/ReplaceComparisonOperator_Eq_LtE"): "no float dtype has an itemsize under 1",
    ("analysis/metrics.py", 132, "core/NumberReplacer"):
        "axis=0 orders the real and imaginary parts otherwise: every metric is the same for a permutation",
    ("analysis/metrics.py", 153, "core/ReplaceComparisonOperator_Eq_LtE"): "a size is never negative",
    ("analysis/metrics.py", 206, "core/ReplaceComparisonOperator_Eq_LtE"): "ndim is never negative",
    ("analysis/metrics.py", 213, "core/ReplaceComparisonOperator_Eq_LtE"): "an empty tensor returned earlier",
    ("analysis/metrics.py", 99, "core/ReplaceBinaryOperator_BitAnd_Pow"):
        "~(equal ** x) on 0/1 ints keeps the truth of ~equal & x in its lowest bit (the other order is killed)",
    ("analysis/metrics.py", 201, "core/NumberReplacer"): "reshape(-2): numpy takes a negative size as the unknown one",
}


def _annotation_spans(src: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Where the annotations are, when ``from __future__ import annotations`` keeps them from being evaluated."""
    tree = ast.parse(src)
    if not any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations"
               for a in n.names) for n in tree.body):
        return []
    anns = [n.annotation for n in ast.walk(tree) if isinstance(n, (ast.arg, ast.AnnAssign)) and n.annotation]
    anns += [n.returns for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.returns]
    return [((a.lineno, a.col_offset), (a.end_lineno or a.lineno, a.end_col_offset or 0)) for a in anns]


def _scope_spans(module: str, src: str) -> list[tuple[tuple[int, int], tuple[int, int]]] | None:
    """Where the functions of ``SCOPES[module]`` are (None: the whole module is mutated)."""
    if module not in SCOPES:
        return None
    names = set(SCOPES[module][1])
    return [((n.lineno, 0), (n.end_lineno or n.lineno, 10 ** 6)) for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in names]


def _in_scope(spans: list | None, pos: tuple[int, int]) -> bool:
    return spans is None or any(a <= pos <= b for a, b in spans)


def _skip_annotations(db_path: Path, src: str, module: str = "") -> None:
    """Mark the mutants inside annotations as skipped (counted equivalent): a string never evaluated; and those
    outside the module's ``SCOPES`` (not counted)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import WorkerOutcome, WorkResult

    spans = _annotation_spans(src)
    scope = _scope_spans(module, src)
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item in list(db.pending_work_items):
            pos = tuple(item.mutations[0].start_pos)
            if any(a <= pos < b for a, b in spans):
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=ANNOTATION))
            elif not _in_scope(scope, pos):
                db.set_result(item.job_id, WorkResult(worker_outcome=WorkerOutcome.SKIPPED, output=OUT_OF_SCOPE))


def _test_command(tests: list[str], timeout: float, sock: Path | None) -> list[str]:
    # plain asserts: a mutant is judged by pass / fail, and rewriting the test modules each time costs
    pytest_args = ["-x", "-q", "-p", "no:cacheprovider", "--assert=plain", *[str(ROOT / "tests" / t) for t in tests]]
    if sock is None:
        return [sys.executable, "-m", "pytest", *pytest_args]
    # the fork server runs the tests and enforces ``timeout``
    return [sys.executable, str(ROOT / "tools" / "mutation_server.py"), "run", str(sock), str(timeout), *pytest_args]


def _config(module: str, tests: list[str], timeout: float, sock: Path | None) -> str:
    cmd = " ".join(_test_command(tests, timeout, sock))
    if sock is not None:
        timeout += 30  # cosmic-ray's own timeout is a backstop to the server's
    return (f'[cosmic-ray]\nmodule-path = "msprobe_nb/{module}"\ntimeout = {timeout}\nexcluded-modules = []\n'
            f'test-command = "{cmd}"\n\n[cosmic-ray.distributor]\nname = "local"\n')


def run_module(module: str, tests: list[str], timeout: float, server: bool = True,
               keep_db: Path | None = None, rejudge: bool = False) -> dict:
    """Mutate ``module``; with ``rejudge``, only run again the survivors of the session kept in ``keep_db``
    (after tests were added; the module's source must be the one that session mutated)."""
    tag = module.replace("/", "_")
    src = (ROOT / "msprobe_nb" / module).read_text()
    before = 0.0
    if rejudge:
        if keep_db is None or (keep_db / f"{tag}.src").read_text() != src:
            raise SystemExit(f"{module}: no kept session of this source to rejudge in {keep_db}")
        before = float((keep_db / f"{tag}.seconds").read_text())
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        shutil.copytree(ROOT / "msprobe_nb", work / "msprobe_nb", ignore=shutil.ignore_patterns("__pycache__"))
        sock = work / "tests.sock" if server else None
        (work / "cr.toml").write_text(_config(module, tests, timeout, sock))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")]),
               "PYTHONDONTWRITEBYTECODE": "1"}
        t0 = time.time()
        srv = None
        if sock is not None:  # tools/mutation_server.py: imports once, forks a child per mutant
            dotted = "msprobe_nb." + module.removesuffix(".py").replace("/", ".")
            srv = subprocess.Popen([sys.executable, str(ROOT / "tools" / "mutation_server.py"), "serve", str(sock),
                                    "--mutated", dotted, "--tests-dir", str(ROOT / "tests")], cwd=work, env=env)
            while not sock.exists():
                if srv.poll() is not None:
                    raise SystemExit(f"tools/mutation_server.py exited with {srv.returncode}")
                time.sleep(0.1)
        try:
            base = subprocess.run(_test_command(tests, timeout, sock), cwd=work, env=env, capture_output=True,
                                  text=True)
            if base.returncode != 0:  # every mutant would count as killed
                raise SystemExit(f"{module}: the unmutated tests fail:\n{base.stdout[-3000:]}{base.stderr[-2000:]}")
            cr = [sys.executable, "-m", "cosmic_ray.cli"]
            if rejudge and keep_db is not None:  # the survivors become pending again: exec runs only those
                shutil.copy(keep_db / f"{tag}.sqlite", work / "s.sqlite")
                with sqlite3.connect(work / "s.sqlite") as con:
                    # timed-out ones too: on a loaded machine a slow run is not a killed mutant; not those that
                    # EQUIVALENT explains
                    rows = con.execute("SELECT r.job_id, s.start_pos_row, s.operator_name, s.occurrence FROM "
                                       "work_results r JOIN "
                                       "mutation_specs s ON s.job_id = r.job_id WHERE r.test_outcome = 'SURVIVED' "
                                       "OR r.output = 'timeout'").fetchall()
                    con.executemany("DELETE FROM work_results WHERE job_id = ?", [
                        (j,) for j, line, op, occ in rows if not is_equivalent(module, int(line), op, int(occ))])
                _skip_annotations(work / "s.sqlite", src, module)  # a scope set since: its pending ones left out
            else:
                subprocess.run([*cr, "init", "cr.toml", "s.sqlite"], cwd=work, env=env, check=True)
                _skip_annotations(work / "s.sqlite", src, module)
            subprocess.run([*cr, "exec", "cr.toml", "s.sqlite"], cwd=work, env=env, check=True)
        finally:
            if srv is not None:
                srv.kill()
                srv.wait()
        took = before + time.time() - t0
        if keep_db is not None:  # to report again later (--from-db), e.g. with more EQUIVALENT entries
            keep_db.mkdir(parents=True, exist_ok=True)
            shutil.copy(work / "s.sqlite", keep_db / f"{tag}.sqlite")
            (keep_db / f"{tag}.seconds").write_text(f"{took:.0f}\n")
            (keep_db / f"{tag}.src").write_text(src)
        return tally(module, work / "s.sqlite", took)


def is_equivalent(module: str, line: int, operator: str, occurrence: int) -> bool:
    """Whether ``EQUIVALENT`` explains this surviving mutant (by line and operator, or by its occurrence too)."""
    return (module, line, operator) in EQUIVALENT or (module, line, operator, occurrence) in EQUIVALENT


def tally(module: str, db_path: Path, took: float) -> dict:
    """The counts of one module's finished session, survivors listed (EQUIVALENT read now)."""
    from cosmic_ray.work_db import WorkDB, use_db
    from cosmic_ray.work_item import TestOutcome, WorkerOutcome

    label = f"{module} ({SCOPES[module][0]})" if module in SCOPES else module
    out = dict(module=label, seconds=took, mutants=0, killed=0, survived=0, equivalent=0, timeout=0,
               incompetent=0, survivors=[])
    scope = _scope_spans(module, (ROOT / "msprobe_nb" / module).read_text())
    with use_db(str(db_path), WorkDB.Mode.open) as db:
        for item, result in db.completed_work_items:
            m = item.mutations[0]
            if result.output == OUT_OF_SCOPE or not _in_scope(scope, tuple(m.start_pos)):
                continue
            out["mutants"] += 1
            where = (module, int(m.start_pos[0]), m.operator_name)
            if result.test_outcome == TestOutcome.KILLED and (result.output or "").strip() == "timeout":
                out["timeout"] += 1
            elif result.test_outcome == TestOutcome.KILLED:
                out["killed"] += 1
            elif result.worker_outcome == WorkerOutcome.SKIPPED and result.output == ANNOTATION:
                out["equivalent"] += 1
            elif result.test_outcome == TestOutcome.INCOMPETENT or result.worker_outcome != WorkerOutcome.NORMAL:
                out["incompetent"] += 1
            elif is_equivalent(*where, int(m.occurrence)):
                out["equivalent"] += 1
            else:
                out["survived"] += 1
                plus = [ln[1:].strip() for ln in (result.diff or "").splitlines()
                        if ln.startswith("+") and not ln.startswith("+++")]
                out["survivors"].append(f"line {where[1]}: {m.operator_name} {m.occurrence}: `{' / '.join(plus)}`")
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
    p.add_argument("--no-server", action="store_true", help="a fresh pytest per mutant, not the fork server")
    p.add_argument("--keep-db", type=Path, help="keep each module's cosmic-ray session here")
    p.add_argument("--from-db", type=Path, help="no run: report the sessions kept here by --keep-db")
    p.add_argument("--rejudge", action="store_true",
                   help="run only the survivors and timed-out mutants of the --keep-db sessions again")
    a = p.parse_args(argv)
    rows = []
    for m in a.modules:
        if m not in MODULES:
            raise SystemExit(f"{m!r} is not a mapped module: {sorted(MODULES)}")
        if a.from_db is not None:
            tag = m.replace("/", "_")
            rows.append(tally(m, a.from_db / f"{tag}.sqlite", float((a.from_db / f"{tag}.seconds").read_text())))
        else:
            rows.append(run_module(m, MODULES[m], a.timeout, server=not a.no_server, keep_db=a.keep_db,
                                   rejudge=a.rejudge))
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(report(rows))  # after each module: a long run stopped early keeps what it did
        print(report(rows[-1:]), flush=True)


if __name__ == "__main__":
    main()
