"""Which environment variables the set-up record keeps: those that change numerics or determinism (plain data,
importable without torch: the set-up check filters msprobe's config_check packs by it too)."""
from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENV_NAMES", "ENV_PREFIXES", "numerics_env"]

#: environment variables recorded: every name with one of these prefixes, and the names in ENV_NAMES
ENV_PREFIXES = ("HCCL_", "NCCL_", "LCCL_", "CUBLAS_", "CUBLASLT_", "CUDNN_", "CUDA_", "NVIDIA_TF32", "ASCEND_",
                "ACL_", "ATB_", "NPU_", "PYTORCH_", "TORCH_", "TORCHINDUCTOR_", "OMP_", "MKL_", "KMP_", "XLA_")
#: single variables that change numerics or determinism
ENV_NAMES = ("CUDA_LAUNCH_BLOCKING", "CLOSE_MATMUL_K_SHIFT", "INF_NAN_MODE_ENABLE", "TASK_QUEUE_ENABLE",
             "COMBINED_ENABLE", "MULTI_STREAM_MEMORY_REUSE", "PYTHONHASHSEED", "WORLD_SIZE",
             "TOKENIZERS_PARALLELISM", "HF_DETERMINISTIC")
_VALUE_MAX = 1000


def numerics_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``environ`` the record keeps, sorted, each value cut to 1000 characters."""
    return {k: str(v)[:_VALUE_MAX] for k, v in sorted(environ.items())
            if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
