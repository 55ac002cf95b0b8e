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
