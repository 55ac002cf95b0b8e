"""The precision model's vocabulary: each dtype's unit roundoff, each op's class and what a correct kernel of
that class may add to its output's error (docs/compare.md, "Precision model"). Torch-free: names, not objects."""
from __future__ import annotations

import numpy as np
import pandas as pd

#: unit roundoff (half the spacing of numbers at 1) of each floating dtype
UNIT_ROUNDOFF = {"torch.float64": 2.0 ** -53, "torch.float32": 2.0 ** -24, "torch.float16": 2.0 ** -11,
                 "torch.bfloat16": 2.0 ** -8, "torch.float8_e4m3fn": 2.0 ** -4, "torch.float8_e5m2": 2.0 ** -3}
SHORT = {"torch.float64": "fp64", "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
         "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}

_CLASSES: dict[str, tuple[str, ...]] = {
    "movement": ("view", "reshape", "transpose", "permute", "contiguous", "clone", "expand", "expand_as",
                 "__getitem__", "getitem", "split", "chunk", "unsqueeze", "squeeze", "flatten", "unflatten",
                 "narrow", "select", "index_select", "gather", "cat", "concat", "stack", "pad", "embedding",
                 "dropout", "Dropout", "t", "repeat", "repeat_interleave", "roll", "flip", "masked_fill",
                 "where", "max_pool2d", "max_pool1d", "adaptive_max_pool2d", "unbind", "tile", "detach",
                 "masked_fill_", "copy_", "__setitem__", "index", "movedim", "swapaxes", "as_strided"),
    "cast": ("to", "float", "half", "bfloat16", "double", "type", "type_as", "_to_copy"),
    "additive": ("add", "__add__", "__radd__", "__iadd__", "add_", "sub", "__sub__", "__rsub__", "__isub__",
                 "sub_", "neg", "__neg__", "addcmul", "addcdiv", "lerp", "avg_pool2d", "adaptive_avg_pool2d",
                 "avg_pool1d", "clamp", "clip", "abs", "relu", "relu_", "hardtanh", "leaky_relu"),
    "multiplicative": ("mul", "__mul__", "__rmul__", "__imul__", "mul_", "div", "__truediv__", "__rtruediv__",
                       "__itruediv__", "div_", "true_divide", "square", "pow", "__pow__", "reciprocal"),
    "matmul": ("linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm", "einsum",
               "conv1d", "conv2d", "conv3d", "conv_transpose2d", "Conv1D", "scaled_dot_product_attention"),
    "activation": ("gelu", "silu", "tanh", "sigmoid", "elu", "selu", "mish", "softplus", "hardswish",
                   "hardsigmoid", "erf", "sin", "cos", "logsigmoid", "glu"),
    "exponential": ("exp", "exp2", "expm1"),
    "root": ("rsqrt", "sqrt"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "logsumexp"),
    "normalisation": ("layer_norm", "native_layer_norm", "rms_norm", "group_norm", "batch_norm",
                      "instance_norm", "normalize", "native_batch_norm", "_fused_rms_norm"),
    "reduction": ("sum", "mean", "var", "std", "norm", "cumsum", "prod", "amax", "amin", "max", "min",
                  "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy",
                  "binary_cross_entropy_with_logits", "smooth_l1_loss", "kl_div", "var_mean", "linalg_vector_norm"),
}
OP_CLASS = {op: c for c, ops in _CLASSES.items() for op in ops}
#: roundings a correct kernel of each class may add to its output, in units of u (per side)
OWN_ROUNDINGS = {"movement": 0.0, "cast": 1.0, "additive": 1.0, "multiplicative": 1.0, "matmul": 1.0,
                 "activation": 2.0, "exponential": 2.0, "root": 2.0, "softmax": 3.0, "normalisation": 3.0,
                 "reduction": 2.0, "other": 2.0}
#: the error a part of a tensor may show beyond its whole's statistics, in roundings of the working precision
MOVEMENT_SAMPLING = 4.0
DESCRIBE = {"movement": "a data movement", "cast": "a cast", "additive": "an addition", "matmul": "a matmul",
             "multiplicative": "a product", "activation": "an activation", "exponential": "an exponential",
             "root": "a square root", "softmax": "a softmax", "normalisation": "a normalisation",
             "reduction": "a reduction", "other": "this op"}


def op_class(op: str, call: str = "") -> str:
    """The class of an API (``composite`` for module calls, whose own error is their children's)."""
    if call.startswith(("Module.", "Cell.")):
        return "composite"
    return OP_CLASS.get(op, OP_CLASS.get(op.rstrip("_"), "other"))


def unit_roundoff(dtype: np.ndarray) -> np.ndarray:
    """u of each dtype name (NaN for non-floating dtypes)."""
    codes, uniq = pd.factorize(np.asarray(dtype, dtype=object))
    return np.array([UNIT_ROUNDOFF.get(u, np.nan) for u in uniq] + [np.nan])[codes]
