"""Builds msprobe_nb's one optional C extension; everything else about the package is in pyproject.toml.

``msprobe_nb.capture._fused_stats`` computes a float32 CPU tensor's max, min, sum and norm in one pass.
It is optional: where no C compiler is found the install goes on without it, and statistics use torch's
reductions instead (same values, slower recording).
"""
import sys

from setuptools import Extension, setup

ARGS = [] if sys.platform == "win32" else ["-O3", "-fno-strict-aliasing"]

setup(ext_modules=[Extension("msprobe_nb.capture._fused_stats", ["msprobe_nb/capture/_fused_stats.c"],
                             extra_compile_args=ARGS, optional=True)])
