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
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
