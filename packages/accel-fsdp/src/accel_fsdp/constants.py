"""The FSDP option names of Accelerate's ``accelerate.utils.constants``, in its order (frameworks validate their FSDP
settings against these lists: transformers' ``TrainingArguments`` indexes ``FSDP_AUTO_WRAP_POLICY[0]``).

The plugin accepts each of them (``FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD_ZERO2")``, or its
1-based position). No torch import.
"""

from __future__ import annotations

FSDP_SHARDING_STRATEGY = ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"]
FSDP_AUTO_WRAP_POLICY = ["TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"]
FSDP_BACKWARD_PREFETCH = ["BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"]
FSDP_STATE_DICT_TYPE = ["FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"]
