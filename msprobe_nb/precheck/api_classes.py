"""Which standard grades an API: a plain table of op names by kind of computation (torch-free).

An op that moves, selects or compares values must reproduce them bit for bit (``binary``); an elementwise
function is held to a few units in the last place (``ulp``), or, where libraries legitimately differ near the
zeros of the function, to an absolute threshold for small values and a relative one elsewhere (``absolute``);
an op that accumulates (matmul, reductions, norms, softmax, attention) is graded by the ``benchmark`` method
(its error against the fp64 bench compared with the error a same-dtype reference kernel makes). Dropouts get
the zero-ratio check (``dropout``), other draws cannot be compared (``random``), casts are graded exactly but
are of limited value (``cast``, the pre-check FAQ). An integer or bool output is always ``binary``.
"""
from __future__ import annotations

from dataclasses import dataclass

from msprobe_nb.capture.random_apis import DROPOUTS, RANDOM_APIS

__all__ = ["ApiClass", "BENCHMARK_LEVELS", "classify"]


@dataclass(frozen=True)
class ApiClass:
    """How one API is graded: ``standard`` (binary, ulp, absolute, benchmark, dropout, random, cast) and,
    for the benchmark method, the op's ``level`` (tight, normal, loose: how far its error may exceed the
    reference kernel's)."""

    standard: str
    level: str = "normal"


#: ops whose result is a copy, selection, rearrangement or comparison of their inputs' values
_BINARY = frozenset({
    "__getitem__", "__setitem__", "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "t", "mT",
    "contiguous", "clone", "detach", "flatten", "unflatten", "squeeze", "unsqueeze", "expand", "expand_as",
    "broadcast_to", "repeat", "repeat_interleave", "tile", "cat", "concat", "concatenate", "stack", "hstack",
    "vstack", "split", "chunk", "unbind", "narrow", "select", "index_select", "gather", "take", "masked_select",
    "masked_fill", "masked_fill_", "where", "flip", "roll", "movedim", "swapaxes", "swapdims", "tril", "triu",
    "diag", "diagonal", "embedding", "one_hot", "pad", "zero_", "fill_", "zeros_like", "ones_like", "full_like",
    "zeros", "ones", "full", "arange", "eye", "linspace", "copy_", "relu", "relu_", "relu6", "hardtanh", "neg",
    "__neg__", "abs", "sign", "clamp", "clamp_", "clip", "clamp_min", "clamp_max", "maximum", "minimum", "max",
    "min", "amax", "amin", "argmax", "argmin", "sort", "argsort", "topk", "kthvalue", "floor", "ceil", "round",
    "trunc", "eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
    "isnan", "isinf", "isfinite", "logical_and", "logical_or", "logical_not", "logical_xor", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "__and__", "__or__", "__xor__", "__invert__", "any", "all",
    "nonzero", "unique", "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
    "pixel_shuffle", "pixel_unshuffle", "unfold", "fold", "index_put", "index_put_", "scatter", "scatter_",
    "masked_scatter", "new_zeros", "new_ones", "new_full", "tensor", "as_tensor", "set_", "__iand__", "__ior__",
    "__ixor__", "zero_pad2d", "channel_shuffle", "native_channel_shuffle", "identity",
})
#: ops in _BINARY whose backward accumulates (a sum over repeated indices or broadcast positions)
ACCUMULATING_BACKWARD = frozenset({
    "embedding", "__getitem__", "index_select", "gather", "take", "expand", "expand_as", "broadcast_to", "repeat",
    "repeat_interleave", "tile", "masked_select", "unfold", "fold", "max_pool1d", "max_pool2d", "max_pool3d",
})
#: casts: exact where rounding is round-to-nearest-even, of limited value all the same (FAQ)
_CASTS = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "short",
                    "bool", "byte", "char", "cpu", "cuda", "npu", "_to_copy"})
#: elementwise functions correctly rounded or nearly so in every library: graded by ULP error
_ULP = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "true_divide", "__add__", "__radd__", "__iadd__",
    "__sub__", "__rsub__", "__isub__", "rsub", "__mul__", "__rmul__", "__imul__", "__truediv__", "__rtruediv__",
    "__itruediv__", "__div__", "sqrt", "rsqrt", "reciprocal", "exp", "exp2", "sigmoid", "tanh", "silu",
    "mish", "erf", "erfc", "softplus", "elu", "selu", "celu", "leaky_relu", "hardswish", "hardsigmoid",
    "logsigmoid", "square", "sinh", "cosh", "silu_", "glu", "threshold",
    "prelu", "hardshrink", "softshrink", "frac", "fmod", "remainder", "__mod__", "square_",
    "sqrt_", "exp_", "sigmoid_", "tanh_",
})
#: elementwise functions whose implementations differ near their zeros: small values by an absolute threshold
_ABSOLUTE = frozenset({
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "arctan2", "log", "log2", "log10", "log1p", "expm1",
    "float_power", "xlogy", "sinc", "logit", "digamma", "lgamma", "erfinv",
    "asinh", "acosh", "atanh", "hypot", "cumprod",
})
#: accumulating ops by how tightly their error must follow the reference kernel's
BENCHMARK_LEVELS = {
    "tight": frozenset({"matmul", "__matmul__", "mm", "bmm", "linear", "addmm", "addbmm", "baddbmm", "addmv",
                        "mv", "dot", "einsum", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                        "conv_transpose2d", "conv_transpose3d", "bilinear", "tensordot", "inner", "outer"}),
    "normal": frozenset({"softmax", "log_softmax", "_softmax", "layer_norm", "group_norm", "batch_norm",
                         "instance_norm", "rms_norm", "local_response_norm", "normalize", "sum", "mean", "nansum",
                         "nanmean", "var", "std", "var_mean", "std_mean", "norm", "cumsum", "logsumexp", "prod",
                         "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                         "binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity",
                         "pairwise_distance", "cdist", "avg_pool1d", "avg_pool2d", "avg_pool3d",
                         "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
                         "scaled_dot_product_attention", "interpolate", "upsample", "grid_sample", "lstm", "gru",
                         "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
                         "embedding_bag", "gelu", "gelu_", "lerp", "tanhshrink", "addcmul", "addcdiv", "addcmul_",
                         "addcdiv_", "lerp_", "pow", "__pow__", "__rpow__", "pow_",
                         "linalg_vector_norm", "vector_norm", "matrix_norm", "dist",
                         "npu_fusion_attention", "npu_rms_norm", "npu_rotary_mul", "npu_swiglu",
                         "npu_scaled_masked_softmax", "npu_scaled_masked_softmax_backward", "fast_gelu",
                         "npu_fast_gelu", "npu_layer_norm_eval", "npu_geglu", "npu_add_rms_norm"}),
    "loose": frozenset({"trapz", "trapezoid", "fft_fft", "fft_ifft", "fft_rfft", "stft", "istft"}),
}
_LEVEL_OF = {op: level for level, ops in BENCHMARK_LEVELS.items() for op in ops}
_INT_DTYPES = ("torch.int", "torch.uint", "torch.bool", "torch.long", "torch.short", "torch.char", "torch.byte")


def classify(family: str, op: str, out_dtype: str = "", scaled: bool = False) -> ApiClass:
    """The standard ``family.op`` is graded by; ``out_dtype`` ("torch.int64", ...) makes integer and bool
    outputs binary whatever the op; ``scaled``: the call had an ``alpha`` other than 1 (``p.add_(g,
    alpha=-lr)`` rounds twice, so a correct kernel is not within a few ULP where the terms cancel: benchmark
    method). An op in no table is graded by the benchmark method (it compares the device with a kernel of the
    same dtype, so it holds for any op)."""
    key = (family, op)
    if key in DROPOUTS:
        return ApiClass("dropout")
    if key in RANDOM_APIS:
        return ApiClass("random")
    name = op.rsplit(".", 1)[-1]
    if name in _CASTS:
        return ApiClass("cast")
    if out_dtype.startswith(_INT_DTYPES) or name in _BINARY:
        return ApiClass("binary")
    if name in _ULP:
        return ApiClass("benchmark") if scaled else ApiClass("ulp")
    if name in _ABSOLUTE:
        return ApiClass("absolute")
    return ApiClass("benchmark", _LEVEL_OF.get(name, "normal"))


def backward_class(family: str, op: str, forward: ApiClass) -> ApiClass:
    """The standard of a call's backward: exact where the forward only moves values and its gradient does
    not accumulate, else the benchmark method (a gradient is a product of several elementwise steps, or a sum)."""
    if forward.standard == "binary" and op.rsplit(".", 1)[-1] not in ACCUMULATING_BACKWARD:
        return ApiClass("binary")
    return ApiClass("benchmark", _LEVEL_OF.get(op.rsplit(".", 1)[-1], "normal"))
