"""Pipeline parallelism over the mesh's ``pp`` dimension with ``torch.distributed.pipelining``.

``prepare`` splits a model into stages (``split``: by ``pp_split_points``, evenly over its blocks,
or one part per child of an ``nn.Sequential`` of ``model_parts``), keeps this rank's stage(s),
runs each through the strategy's chain (``Strategy.parallelize``: tensor parallel over ``tp``, FSDP2 /
DDP over ``dp``), and builds the schedule (``schedule``: GPipe, 1F1B, interleaved 1F1B). The result is a
``PipelinedModel`` (``model``), trained with ``accelerator.forward_backward``.

A model built on the meta device (``with torch.device("meta"): model = Model()``) is materialised
stage by stage: each rank allocates and initialises only its stage's parameters (with each
module's ``reset_parameters()``, see ``transforms.meta_init``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from .model import PipelinedModel, StagedModel, as_call_arguments
from .schedule import PipelineLayout, build_schedule, resolve_layout
from .split import chain_units, parameter_bytes, split_model, stage_boundaries

if TYPE_CHECKING:
    from ..prepared_model import ModelParts
    from ..strategies.context import StrategyContext


def prepare_pipeline(
    model: nn.Module,
    context: StrategyContext,
    finish: Callable[[nn.Module], ModelParts],
) -> PipelinedModel:
    """Splits ``model`` over the ``pp`` ranks, runs ``finish`` (the strategy's chain) on each local stage, and builds
    the schedule. Collective over the mesh (the strategy's chain is)."""
    require_pipelines_on(context.device)
    dims = context.dims
    group = dims.group("pp")
    layout = resolve_layout(dims.config, group.rank)
    stage_modules = split_model(model, layout.num_stages, layout.local_stages, dims.config.pp_split_points)
    finished = [finish(stage) for stage in stage_modules]
    runs = [parts.runs for parts in finished]
    return PipelinedModel(
        runs,
        [parts.module for parts in finished],
        layout,
        group,
        context.device,
        lambda loss_fn: build_schedule(layout, runs, group, context.device, loss_fn),
    )


# torch releases before 2.12 fail a pipeline over gloo (the CPU's backend): 2.9 and 2.10 abort in the schedule's
# first send between stages ("Received data size doesn't match expected size"), 2.11 refuses a non-contiguous input
# (stride mismatch). Found by CI's floors lane; nccl (GPUs) is not concerned.
_PIPELINE_ON_CPU_FROM = "2.12"


def require_pipelines_on(device: torch.device) -> None:
    """Refuses, on every rank alike, a pipeline on the CPU with a torch that cannot run one there."""
    if device.type == "cpu" and torch.__version__ < _PIPELINE_ON_CPU_FROM:
        raise RuntimeError(
            f"Pipeline parallelism on the CPU (gloo) needs torch>={_PIPELINE_ON_CPU_FROM}; this environment has torch "
            f"{torch.__version__}, whose pipeline schedules fail between stages over gloo. Upgrade it "
            f'(pip install "torch>={_PIPELINE_ON_CPU_FROM}"), or run the pipeline on GPUs.'
        )


__all__ = [
    "PipelineLayout",
    "PipelinedModel",
    "StagedModel",
    "as_call_arguments",
    "build_schedule",
    "chain_units",
    "parameter_bytes",
    "prepare_pipeline",
    "resolve_layout",
    "split_model",
    "stage_boundaries",
]
