"""Which stages a rank holds, and the ``torch.distributed.pipelining`` schedule that runs them.

Stage ``s`` of ``pp x v`` stages lives on pipeline rank ``s % pp`` (the looped layout interleaved
schedules expect): with ``v = 2`` virtual stages on 2 ranks, rank 0 holds stages 0 and 2, rank 1
stages 1 and 3. GPipe and 1F1B run one stage per rank; interleaved 1F1B several.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..parallel.config import ParallelismConfig
    from ..parallel.dims import MeshGroup

SINGLE_STAGE = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineLayout:
    """The pipeline part of the job's layout.

    pp: pipeline ranks. stages_per_rank: virtual stages per rank. schedule: its name (``PP_SCHEDULES``).
    microbatches: micro-batches each batch is split into. rank: this process's pipeline rank.
    """

    pp: int
    stages_per_rank: int
    schedule: str
    microbatches: int
    rank: int

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    @property
    def local_stages(self) -> list[int]:
        """Indices of this rank's stages, in order."""
        return [self.rank + i * self.pp for i in range(self.stages_per_rank)]


def resolve_layout(config: ParallelismConfig, rank: int) -> PipelineLayout:
    """The pipeline layout ``config`` asks for; raises ValueError naming the fix for a combination torch cannot run."""
    schedule = (config.pp_schedule or "1f1b").lower()
    stages_per_rank = config.pp_stages_per_rank or (2 if schedule == "interleaved_1f1b" else 1)
    if schedule in SINGLE_STAGE and stages_per_rank != 1:
        raise ValueError(
            f"pp_schedule={schedule!r} runs one stage per rank, but pp_stages_per_rank={stages_per_rank}: use "
            "pp_schedule='interleaved_1f1b' for several virtual stages per rank."
        )
    pp = config.size("pp")
    microbatches = config.pp_microbatches or pp * stages_per_rank
    if schedule == "1f1b" and microbatches < pp:
        raise ValueError(
            f"1F1B needs at least as many micro-batches as stages: pp_microbatches={microbatches} < pp_size={pp}. "
            "Raise pp_microbatches (or use pp_schedule='gpipe')."
        )
    return PipelineLayout(pp, stages_per_rank, schedule, microbatches, rank)


def build_schedule(
    layout: PipelineLayout,
    parts: Sequence[nn.Module],
    group: MeshGroup,
    device: torch.device,
    loss_fn: Callable[[Any, Any], torch.Tensor],
) -> tuple[Any, list[Any]]:
    """The schedule and its ``PipelineStage`` s, one per part of ``parts`` (this rank's stages, in
    ``layout.local_stages`` order).

    Gradients are not scaled by the schedule (``scale_grads=False``): ``loss_fn`` divides each
    micro-batch's loss instead, which keeps gradients accumulated over several steps intact.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    stages: list[Any] = [
        PipelineStage(part, index, layout.num_stages, device, group=group.group)
        for part, index in zip(parts, layout.local_stages, strict=True)
    ]
    if layout.schedule == "interleaved_1f1b":
        return ScheduleInterleaved1F1B(stages, layout.microbatches, loss_fn=loss_fn, scale_grads=False), stages
    cls = ScheduleGPipe if layout.schedule == "gpipe" else Schedule1F1B
    return cls(stages[0], layout.microbatches, loss_fn=loss_fn, scale_grads=False), stages
