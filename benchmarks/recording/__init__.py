"""The pieces of ``benchmarks/bench_recording.py`` (the command line), by role.

``configs``: what is measured and the targets; ``child``: one configuration, inside its own subprocess;
``runner``: the parent side (finding msprobe, starting the children, the whole run); ``report``: the table
and its arithmetic (median ratios, missed targets); ``profilers``: ``--profile`` (cProfile, the phases of a
recorded step, the per-call components). Every module imports only the standard library at import time:
the child also runs under msprobe's interpreter, which may lack msprobe_nb.
"""
