"""The reference's public file-name constants (``accelerate.utils.SAFE_WEIGHTS_NAME``, ...), same values.

accel writes these names too: ``save_model`` writes ``model.safetensors`` (or ``pytorch_model.bin``),
sharded as ``model-00001-of-00002.safetensors`` with ``model.safetensors.index.json``; a checkpoint
folder holds ``optimizer.bin``, ``scheduler.bin``, ``scaler.pt`` and ``random_states_<rank>.pt``.

Example::

    from accel.utils import SAFE_WEIGHTS_NAME
    state_dict = safetensors.torch.load_file(os.path.join(folder, SAFE_WEIGHTS_NAME))
"""

from __future__ import annotations

SCALER_NAME = "scaler.pt"
"""The GradScaler's state file inside a checkpoint folder."""
MODEL_NAME = "pytorch_model"
"""Stem of torch-pickle model files (``pytorch_model.bin``)."""
SAFE_MODEL_NAME = "model"
"""Stem of safetensors model files (``model.safetensors``)."""
RNG_STATE_NAME = "random_states"
"""Stem of the per-process RNG state files (``random_states_<rank>.pt``)."""
OPTIMIZER_NAME = "optimizer"
"""Stem of optimizer state files (``optimizer.bin``)."""
SCHEDULER_NAME = "scheduler"
"""Stem of LR scheduler state files (``scheduler.bin``)."""
SAMPLER_NAME = "sampler"
"""Stem of sampler / dataloader position files."""
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
"""File name of a profiler trace; ``suffix`` is the process index."""
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
"""A whole model as one torch-pickle file."""
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
"""A torch-pickle model shard; ``suffix`` is ``-00001-of-00002``."""
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
"""The index of a sharded torch-pickle model (which tensor is in which shard)."""
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
"""A whole model as one safetensors file (what ``save_model`` writes by default)."""
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
"""A safetensors model shard; ``suffix`` is ``-00001-of-00002``."""
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
"""The index of a sharded safetensors model (which tensor is in which shard)."""
