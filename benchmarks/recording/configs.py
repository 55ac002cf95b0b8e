"""What ``bench_recording.py`` measures: the configurations of both tools, the block sizes and the targets."""
from __future__ import annotations

import os

#: the benchmarks folder (``models.py`` lives there) and the command line the children are started with
BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(BENCH_DIR, "bench_recording.py")
#: timed steps per block of each arm (after one untimed step): see child.child()
BLOCK_STEPS = {"small": 5, "large": 2}
RESULT_TAG = "BENCH_RESULT "

# name -> (tool, options). tool: none | imported | kit | msprobe | msprobe-none
KIT_CONFIGS = {
    "none": ("none", {}),
    "imported": ("imported", {}),
    "idle": ("kit", {"level": "L1", "task": "statistics", "step": [10**9]}),
    "stat-L1": ("kit", {"level": "L1", "task": "statistics"}),
    "stat-L0": ("kit", {"level": "L0", "task": "statistics"}),
    "stat-mix": ("kit", {"level": "mix", "task": "statistics"}),
    "stat-L2": ("kit", {"level": "L2", "task": "statistics"}),
    "md5-L1": ("kit", {"level": "L1", "task": "statistics", "summary_mode": "md5"}),
    "tensor-L1": ("kit", {"level": "L1", "task": "tensor"}),
}
MS_CONFIGS = {
    "ms-none": ("msprobe-none", {}),
    "ms-idle": ("msprobe", {"level": "L1", "task": "statistics", "step": [10**6]}),
    "ms-stat-L1": ("msprobe", {"level": "L1", "task": "statistics"}),
    "ms-stat-L0": ("msprobe", {"level": "L0", "task": "statistics"}),
    "ms-stat-mix": ("msprobe", {"level": "mix", "task": "statistics"}),
    "ms-md5-L1": ("msprobe", {"level": "L1", "task": "statistics", "summary_mode": "md5"}),
    "ms-tensor-L1": ("msprobe", {"level": "L1", "task": "tensor"}),
}
# time ratio targets (with / without) and the memory target for statistics configs
TIME_TARGETS = {"imported": 1.05, "idle": 1.05, "stat-L1": 3.0, "stat-L0": 2.0, "stat-mix": 4.0,
                "tensor-L1": 10.0}
MEM_TARGET = 0.10  # peak RSS at most +10 % over the run without the kit (statistics configs)
MEM_CONFIGS = ("imported", "idle", "stat-L1", "stat-L0", "stat-mix", "stat-L2", "md5-L1")
MS_TWIN = {"idle": "ms-idle", "stat-L1": "ms-stat-L1", "stat-L0": "ms-stat-L0", "stat-mix": "ms-stat-mix",
           "md5-L1": "ms-md5-L1", "tensor-L1": "ms-tensor-L1"}
