"""Big-model loading: run a model larger than one device, with parts on GPUs, the CPU and the disk.

- ``init.py``: ``init_empty_weights`` / ``init_on_device`` (build a model without allocating it);
- ``sizes.py``: module sizes, free memory, tied weights;
- ``device_map.py``: ``infer_auto_device_map`` (which part goes where);
- ``offload.py``: offloaded weights (CPU memory or safetensors files) and tensor placement;
- ``hooks.py``: the forward hooks that move inputs and load offloaded weights just in time;
- ``model_hooks.py``: Accelerate's ``ModelHook`` objects (``add_hook_to_module``, ``AlignDevicesHook``,
  ``CpuOffload``, ``cpu_offload_with_hook``) that frameworks attach themselves;
- ``loading.py``: ``load_checkpoint_in_model`` (a checkpoint into a model, onto its devices);
- ``dispatch.py``: ``dispatch_model``, ``cpu_offload``, ``disk_offload``, ``load_checkpoint_and_dispatch``.

The public names and arguments are the reference's (``accelerate.big_modeling``); disk offload
writes safetensors files (the reference writes raw ``.dat`` arrays).

Example::

    from accel import init_empty_weights, load_checkpoint_and_dispatch

    with init_empty_weights():
        model = MyModel()
    model = load_checkpoint_and_dispatch(model, "weights/", device_map="auto", offload_folder="offload")
"""

from __future__ import annotations

from .cpu_offload_hook import CpuOffload, UserCpuOffloadHook, cpu_offload_with_hook
from .device_map import check_device_map, clean_device_map, infer_auto_device_map
from .dispatch import cpu_offload, disk_offload, dispatch_model, load_checkpoint_and_dispatch
from .hooks import align_module_device, get_state_dict_from_offload, has_offloaded_params, remove_hook_from_submodules
from .init import init_empty_weights, init_on_device
from .loading import load_checkpoint_in_model, load_state_dict
from .model_hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_align_device_hook_on_blocks,
    attach_execution_device_hook,
    remove_hook_from_module,
)
from .offload import (
    OffloadedWeightsLoader,
    PrefixedDataset,
    extract_submodules_state_dict,
    load_offloaded_weights,
    offload_state_dict,
    offload_weight,
    save_offload_index,
    set_module_tensor_to_device,
)
from .sizes import (
    CustomDtype,
    calculate_maximum_sizes,
    check_tied_parameters_in_config,
    check_tied_parameters_on_same_device,
    compute_module_sizes,
    convert_file_size_to_int,
    dtype_byte_size,
    find_tied_parameters,
    get_balanced_memory,
    get_max_layer_size,
    get_max_memory,
    named_module_tensors,
    retie_parameters,
)

__all__ = [
    "AlignDevicesHook",
    "CpuOffload",
    "CustomDtype",
    "ModelHook",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
    "SequentialHook",
    "UserCpuOffloadHook",
    "add_hook_to_module",
    "align_module_device",
    "attach_align_device_hook",
    "attach_align_device_hook_on_blocks",
    "attach_execution_device_hook",
    "calculate_maximum_sizes",
    "check_device_map",
    "check_tied_parameters_in_config",
    "check_tied_parameters_on_same_device",
    "clean_device_map",
    "compute_module_sizes",
    "convert_file_size_to_int",
    "cpu_offload",
    "cpu_offload_with_hook",
    "disk_offload",
    "dispatch_model",
    "dtype_byte_size",
    "extract_submodules_state_dict",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_layer_size",
    "get_max_memory",
    "get_state_dict_from_offload",
    "has_offloaded_params",
    "infer_auto_device_map",
    "init_empty_weights",
    "init_on_device",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "load_offloaded_weights",
    "load_state_dict",
    "named_module_tensors",
    "offload_state_dict",
    "offload_weight",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
    "retie_parameters",
    "save_offload_index",
    "set_module_tensor_to_device",
]
