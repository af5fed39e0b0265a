"""Megatron's parallel groups (``megatron.core.parallel_state``) and RNG streams, set up for one run."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from accel_core.parallel.dims import ParallelDims

    from .plugin import MegatronLMPlugin


def import_megatron() -> None:
    """Imports megatron.core without its warnings that Transformer-Engine / Apex are missing: this
    strategy uses Megatron's plain-torch paths (``tensor_parallel`` layers), which need neither."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")
        import megatron.core.tensor_parallel  # noqa: F401


# Megatron's group getters are untyped; their inferred type admits "not a member" (-100) and None, which
# they never return once ``initialize`` built the groups. Callers get the ProcessGroup they use.
def tensor_parallel_group() -> ProcessGroup:
    """Megatron's tensor-parallel group of this process."""
    from megatron.core import parallel_state

    return cast("ProcessGroup", parallel_state.get_tensor_model_parallel_group())


def model_parallel_group() -> ProcessGroup:
    """Megatron's model-parallel group (tensor x pipeline) of this process."""
    from megatron.core import parallel_state

    return cast("ProcessGroup", parallel_state.get_model_parallel_group())


def pipeline_parallel_group() -> ProcessGroup:
    """Megatron's pipeline-parallel group of this process."""
    from megatron.core import parallel_state

    return cast("ProcessGroup", parallel_state.get_pipeline_model_parallel_group())


def data_parallel_group() -> ProcessGroup:
    """Megatron's data-parallel group of this process."""
    from megatron.core import parallel_state

    return cast("ProcessGroup", parallel_state.get_data_parallel_group())


def initialize(plugin: MegatronLMPlugin, world_size: int) -> None:
    """Builds the TP / DP groups over the ``world_size`` processes, or adopts matching ones. Collective.

    Groups that another Accelerator or the user built with other sizes are refused rather than
    rebuilt: layers created under them would keep talking to the old groups.
    """
    import_megatron()
    from megatron.core import parallel_state

    plugin.check_world_size(world_size)
    if parallel_state.model_parallel_is_initialized():
        current = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
            parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1,
        )
        if current != (plugin.tp_degree, plugin.pp_degree, plugin.vp_degree):
            raise ValueError(
                f"Megatron's parallel groups already exist with tp={current[0]}, pp={current[1]}, vp={current[2]}, but "
                f"MegatronLMPlugin asks for tp_degree={plugin.tp_degree}, pp_degree={plugin.pp_degree}, "
                f"vp_degree={plugin.vp_degree}. Call "
                "megatron.core.parallel_state.destroy_model_parallel() first (and rebuild the model), or use the same "
                "degrees."
            )
        return
    # No extra gloo copies of the DP groups: only Megatron's distributed optimizer uses them.
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=plugin.tp_degree,
        pipeline_model_parallel_size=plugin.pp_degree,
        virtual_pipeline_model_parallel_size=plugin.vp_degree if plugin.vp_degree > 1 else None,
        create_gloo_process_groups=False,
    )


def check_same_ranks(dims: ParallelDims) -> None:
    """Megatron's DP, TP and PP groups hold the same ranks as the job mesh's ``dp``, ``tp`` and ``pp`` (data is
    sharded over the mesh's ``dp``, gradients averaged over Megatron's DP group: they must agree)."""
    import torch.distributed as dist

    for name, theirs in (
        ("dp", data_parallel_group()),
        ("tp", tensor_parallel_group()),
        ("pp", pipeline_parallel_group()),
    ):
        ours = dims.group(name)
        if ours.size == 1:
            mine = [dims.rank]
        else:
            mine = list(range(dims.world_size)) if ours.group is None else dist.get_process_group_ranks(ours.group)
        megatron = dist.get_process_group_ranks(theirs)
        if sorted(mine) != sorted(megatron):
            raise RuntimeError(
                f"Megatron's {name} group {sorted(megatron)} differs from the mesh's {sorted(mine)}: Megatron's rank "
                "order changed (accel expects tensor parallel innermost, as megatron-core's default 'tp-cp-ep-dp-pp')."
            )
