"""The monitor's contract, declared once: the kinds of rows, the aggregate columns, the scalars, the alert rules'
names and thresholds, and the columns of an anomaly table.

Plain data (no torch, no h5py, no numpy), like :mod:`msprobe_nb.store.schema` for the calls table: the capture
side fills the record by it, the store writes it, analysis and the viewers read it (docs/monitor.md). The
kind codes are stored in the files (the index into ``KINDS``), so ``KINDS`` only ever grows at its end.
"""
from __future__ import annotations

__all__ = ["ACT_KINDS", "ANOMALY_COLUMNS", "CAUSAL_ORDER", "COUNT_STATS", "DEFAULT_STATS", "FLOAT_STATS", "KINDS",
           "KIND_ROLE", "OPTIMIZER_KINDS", "PARAM_KINDS", "RULES", "SCALARS", "SPIKE_KINDS", "SPIKE_SCALARS",
           "STATS", "THRESHOLDS"]

#: what a row aggregates; stored as the index into this tuple (the file keeps its own copy in ``kinds``)
KINDS = ("weight", "grad", "exp_avg", "exp_avg_sq", "act", "act_grad", "local_grad")
#: kinds with one row per parameter (the rest have one per module)
PARAM_KINDS = ("weight", "grad", "exp_avg", "exp_avg_sq", "local_grad")
#: Adam's moment estimates (any optimizer whose state holds them)
OPTIMIZER_KINDS = ("exp_avg", "exp_avg_sq")
#: module outputs and their gradients
ACT_KINDS = ("act", "act_grad")
#: the order in which a step makes what a record holds: the weights its forward uses (read before the update),
#: the activations, their gradients, each rank's own gradients before DDP's reduction (``local_grad``,
#: opt-in), the parameters' final gradients, then the optimizer state the update writes.
#: Where two runs part within one step, the earliest kind in this order is what parted first.
CAUSAL_ORDER = ("weight", "act", "act_grad", "local_grad", "grad", "exp_avg", "exp_avg_sq")
#: what each kind is, in the words a divergence is reported in
KIND_ROLE = {"weight": "weight", "grad": "gradient", "exp_avg": "optimizer state", "exp_avg_sq": "optimizer state",
             "act": "activation", "act_grad": "activation gradient", "local_grad": "local gradient",
             "lr": "learning rate"}

#: aggregates computed in float32 (the norm in float32 whatever the tensor's dtype, so fp16 does not overflow)
FLOAT_STATS = ("norm", "min", "max", "mean")
#: aggregates counted exactly, in int64
COUNT_STATS = ("nan", "inf")
STATS = FLOAT_STATS + COUNT_STATS
#: the default: one read of each tensor. The counts are exact but only taken where the norm is not finite (a
#: finite norm means no NaN and no inf); min, max and mean are opt-in (``stats=``)
DEFAULT_STATS = ("norm", "nan", "inf")

#: the per-step scalars a record may hold (``lr/<i>``: parameter group i > 0)
SCALARS = ("loss", "grad_norm", "lr", "loss_scale", "micro_batches")
#: series the spike rule watches: the norms of these kinds (weights and optimizer state move slowly by design,
#: and a jump in them follows a gradient's) and these scalars
SPIKE_KINDS = ("grad", "act", "act_grad")
SPIKE_SCALARS = ("loss", "grad_norm")

#: the alert rules, most severe first (the order of ``anomalies()``)
RULES = ("nonfinite", "spike", "direction_drop")
#: the rules' thresholds and their defaults (Monitor arguments of the same names; docs/monitor.md says why):
#: ``warmup``: positive finite values a series needs before it is judged; ``window``: how many of its latest
#: values its typical change per step and their spread are taken from; a spike jumps from the previous value,
#: past that typical change, by more than ``spike_ratio`` x and by more than ``spike_z`` robust standard
#: deviations (1.4826 x the median absolute deviation) of the changes, to at least ``spike_floor`` x the
#: series' warm-up level; ``direction_drop``: a sign agreement that fell by this share of its previous value
#: (and ``spike_z`` robust deviations) is a drop, for gradients of ``direction_min_numel`` values or more
THRESHOLDS = {"warmup": 20, "window": 100, "spike_z": 8.0, "spike_ratio": 10.0, "spike_floor": 0.01,
              "direction_drop": 0.3, "direction_min_numel": 256}

#: the columns of ``MonitorFrame.anomalies()``: ``reference`` is what the series' previous value led to expect,
#: ``severity`` how far past the rule's bar the value is (1: at it; inf: a non-finite value)
ANOMALY_COLUMNS = ["step", "rank", "name", "layer", "kind", "rule", "value", "reference", "severity", "message"]
