"""Builds msprobe_nb's optional C extensions; everything else about the package is in pyproject.toml.

* ``msprobe_nb.capture._fused_stats``: a float32 CPU tensor's max, min, sum and norm in one pass;
* ``msprobe_nb.capture._stack_keys``: the key of a call's stack (CPython 3.11+);
* ``msprobe_nb.capture._row_builder``: the recorder's rows of plain tensors, None and values;
* ``msprobe_nb.capture._api_handler``: the L1 mode's handler of a recorded API call (CPython 3.11+);
* ``msprobe_nb.capture._api_backward``: a recorded call's backward rows and node hooks (built with it);
* ``msprobe_nb.capture._module_hooks``: the global module hooks' work (L0, mix, and L1's module stack);
* ``msprobe_nb.store._chunk_codec``: a calls-table column's whole chunk encoded as its HDF5 filters would store it;
* ``msprobe_nb.store._nullable_ints``: a nullable integer column given as floats (NaN: none) made int64 in one pass;
* ``msprobe_nb.store._column_ids``: a string or shape column's ids, the last step's where a row holds the same value.

All are optional: where no C compiler is found the install goes on without them, and the same results
come from torch's reductions, a Python frame walk, Python row building and the Python handler and hooks, the
chunks go through HDF5's filters, the nullable columns through numpy and every string row to its table (slower
recording).
"""
import sys

from setuptools import Extension, setup

ARGS = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing"]

HEADERS = ["msprobe_nb/capture/_stats_pass.h"]  # the kernel both statistics extensions include
SLOTS = "msprobe_nb/capture/_slot_attrs.h"  # slot reads at their offsets (the recorders' per-call state)
NAMES = "msprobe_nb/capture/_dotted_names.h"  # the calls', rows' and paths' dotted names
NEW_CALL = "msprobe_nb/capture/_new_call.h"  # a Call made without its Python __init__
EXTENSIONS = [Extension("msprobe_nb.capture._fused_stats", ["msprobe_nb/capture/_fused_stats.c"], depends=HEADERS,
                        extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.capture._row_builder", ["msprobe_nb/capture/_row_builder.c"],
                        depends=[*HEADERS, SLOTS, NAMES], extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.capture._mode_floor", ["msprobe_nb/capture/_mode_floor.c"],
                        extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.capture._recorder_lock", ["msprobe_nb/capture/_recorder_lock.c"],
                        extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.store._chunk_codec", ["msprobe_nb/store/_chunk_codec.c"],
                        extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.store._nullable_ints", ["msprobe_nb/store/_nullable_ints.c"],
                        extra_compile_args=ARGS, optional=True),
              Extension("msprobe_nb.store._column_ids", ["msprobe_nb/store/_column_ids.c"],
                        extra_compile_args=ARGS, optional=True)]
if sys.version_info >= (3, 11) and sys.implementation.name == "cpython":
    EXTENSIONS.append(Extension("msprobe_nb.capture._stack_keys", ["msprobe_nb/capture/_stack_keys.c"],
                                extra_compile_args=ARGS, optional=True))
    # the two halves of L1 recording and the module hooks, sharing _api_calls.h
    for name in ("_api_handler", "_api_backward", "_module_hooks"):
        EXTENSIONS.append(Extension(f"msprobe_nb.capture.{name}", [f"msprobe_nb/capture/{name}.c"],
                                    depends=["msprobe_nb/capture/_api_calls.h", SLOTS, NAMES, NEW_CALL],
                                    extra_compile_args=ARGS,
                                    optional=True))

setup(ext_modules=EXTENSIONS)
