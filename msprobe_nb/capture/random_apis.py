"""The (family, op) names of the APIs that draw random numbers: a plain table, importable without torch.

Capture uses it to find the draws to record or redirect (``randomness``); analysis uses it to recognise
draws in msprobe dumps, which do not record the generator (``provenance``). It lives apart from
``randomness`` so that the analysis side can read it without loading torch.
"""
from __future__ import annotations

#: (family, op) pairs that draw random numbers, by kind of call.
FACTORIES = {("Torch", n) for n in ("rand", "randn", "randint", "randperm", "rand_like", "randn_like",
                                    "randint_like")}
TENSOR_ARG_DRAWS = {("Torch", n) for n in ("bernoulli", "multinomial", "poisson", "normal", "binomial",
                                           "_standard_gamma")} | {("Tensor", "bernoulli"), ("Tensor", "multinomial")}
INPLACE_DRAWS = {("Tensor", n) for n in ("uniform_", "normal_", "bernoulli_", "random_", "exponential_",
                                         "geometric_", "cauchy_", "log_normal_")}
INIT_DRAWS = {("Init", n) for n in ("uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_",
                                    "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")}
DROPOUTS = {("Functional", n) for n in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                                        "feature_alpha_dropout")} | {
    ("Torch", n) for n in ("dropout", "alpha_dropout", "feature_dropout", "feature_alpha_dropout",
                           "native_dropout")} | {("VF", n) for n in ("dropout", "feature_dropout")}
OTHER_DRAWS = {("Functional", n) for n in ("rrelu", "gumbel_softmax", "fractional_max_pool2d",
                                           "fractional_max_pool3d")} | {("Torch", "rrelu")}
RANDOM_APIS = FACTORIES | TENSOR_ARG_DRAWS | INPLACE_DRAWS | INIT_DRAWS | DROPOUTS | OTHER_DRAWS
#: APIs that draw only when asked to: attention with ``dropout_p > 0`` (its mask is drawn inside the kernel)
ATTENTION_DROPOUTS = {("Functional", "scaled_dot_product_attention")}
#: what the function mode hands to the random policy (RANDOM_APIS stays the list of APIs that always draw)
DRAWING_APIS = RANDOM_APIS | ATTENTION_DROPOUTS
#: the ``rng`` recorded for a dropout call that draws no mask (``p=0``, or not training): never a random source
NO_DRAW = "no draw"
#: the end of the ``rng`` of a draw that dropout_off or host_random left as drawn because it is recomputed outside
#: the function mode (activation checkpointing: capture/checkpoint_draws.py); the compare's advice reads it
LEFT_AS_DRAWN = " (left as drawn: checkpoint recompute)"
#: ``rng`` values of calls that drew nothing: not recorded as a draw, dropout switched off, or no mask drawn
NOT_DRAWN = frozenset({"", "dropout-off", NO_DRAW})
#: modules whose forward draws a mask (level L0 records modules only)
DROPOUT_MODULES = {("Module", n) for n in ("Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout",
                                           "FeatureAlphaDropout")}
#: aten operators that draw random numbers (level L2)
ATEN_DRAWS = {("Aten", n) for n in ("bernoulli", "bernoulli_", "native_dropout", "uniform_", "normal_", "normal",
                                     "rand", "randn", "randint", "randperm", "rand_like", "randn_like",
                                     "randint_like", "multinomial", "exponential_", "geometric_", "cauchy_",
                                     "log_normal_", "random_", "poisson", "_standard_gamma", "binomial",
                                     "rrelu_with_noise", "_fused_dropout")}
