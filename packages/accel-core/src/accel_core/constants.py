"""The reference's public constants that are not file names (those are in ``accel_checkpoint.file_names``). No torch
import."""

from __future__ import annotations

TORCH_DISTRIBUTED_OPERATION_TYPES = [
    "DEEPSPEED", "MULTI_GPU", "FSDP", "MEGATRON_LM", "TP",
    "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_CPU", "MULTI_HPU", "MULTI_NEURON",
]  # fmt: skip
"""The distributed types whose collectives go through torch.distributed (all but XLA and NO)."""

TORCH_LAUNCH_PARAMS = [
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "role", "module", "m", "no_python", "run_path",
    "log_dir", "r", "redirects", "t", "tee", "node_rank", "master_addr", "master_port",
]  # fmt: skip
"""torch.distributed.run's own options (what a launcher must not forward to the script)."""

XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
"""The first PyTorch version whose profiler records XPU activity."""
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"
"""The first PyTorch version whose profiler records MTIA activity (the reference's spelling)."""
