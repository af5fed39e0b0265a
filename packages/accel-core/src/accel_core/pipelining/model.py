"""``PipelinedModel``: what ``prepare`` returns for a model split over the ``pp`` ranks.

It holds this rank's stage module(s) (each already through the rest of the transform chain:
tensor parallel, data parallel...) and the schedule running them. Training goes through
``accelerator.forward_backward``; a forward in training mode is refused (forward and backward of
different micro-batches interleave across stages, so ``loss = model(x)`` cannot exist). In
evaluation mode, ``model(x)`` runs the schedule forward-only and returns the last stage's output
on every pipeline rank (broadcast), so ``gather_for_metrics`` works as in any evaluation loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

if TYPE_CHECKING:
    from ..parallel.dims import MeshGroup
    from .schedule import PipelineLayout

_TRAINING_FORWARD = (
    "This model is split into pipeline stages (pp_size={pp}): a forward in training mode cannot return a loss to "
    "backpropagate, because micro-batches of different stages interleave. Run the training step with "
    "`loss = accelerator.forward_backward(model, inputs, targets, loss_fn)`; call model.eval() for a forward-only pass."
)


def as_call_arguments(inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Positional and keyword arguments of the model from ``inputs``: a tuple is the positional arguments, a dict
    (a ``Mapping``) the keyword ones, anything else the one positional argument."""
    if isinstance(inputs, tuple):
        return inputs, {}
    if isinstance(inputs, Mapping):
        return (), dict(inputs)
    return (inputs,), {}


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    leaves, _ = tree_flatten((args, kwargs))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.dim() > 0:
            return leaf.shape[0]
    raise ValueError("A pipelined model needs at least one tensor input with a batch dimension to split.")


def _pad_batch(tree: Any, size: int, padded: int) -> Any:
    """Every tensor of ``tree`` with ``size`` rows, lengthened to ``padded`` rows by repeating its last row."""
    leaves, spec = tree_flatten(tree)
    grown = [
        torch.cat([t, t[-1:].expand(padded - size, *t.shape[1:])])
        if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == size
        else t
        for t in leaves
    ]
    return tree_unflatten(grown, spec)


def units_under_one_root(stages: Sequence[nn.Module]) -> nn.Module:
    """One module whose submodules are the units the ``stages`` kept, at their paths in the whole model (``embed``,
    ``layers.2``...): the stages' parameters and buffers under the whole model's names, no tensor copied. Units a
    stage replaced with ``nn.Identity`` (other stages' units) are left out."""
    from .split import chain_units

    root = nn.Module()
    for stage in stages:
        for unit in chain_units(stage):
            module = stage.get_submodule(unit)
            if isinstance(module, nn.Identity):
                continue
            parent = root
            *path, leaf = unit.split(".")
            for name in path:
                if name not in parent._modules:
                    parent.add_module(name, nn.Module())
                parent = parent.get_submodule(name)
            parent.add_module(leaf, module)
    return root


class StagedModel(nn.Module):
    """What ``prepare`` returns for a model split into pipeline stages: this rank's stage(s) and a schedule.

    The one type every package tests for "a pipelined model", and the contract they rely on
    (``forward_backward``, the optimizer rebuilt on the local stages, ``get_state_dict`` and ``save_state``
    through ``full_state_dict``, autocast per stage). ``PipelinedModel`` runs torch's schedules;
    accel-megatron's pipelined model runs Megatron-core's.
    """

    @property
    def stage_modules(self) -> list[nn.Module]:
        """The user's model pruned to each local stage, unwrapped (names as in the whole model)."""
        raise NotImplementedError

    def train_step(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        divisor: int = 1,
        scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the schedule; the batch's mean loss on every pipeline rank.

        divisor: gradient accumulation steps (each micro-batch's loss is divided by ``microbatches x divisor``).
        scale: the precision's loss scaling (fp16), applied to what is backpropagated only.
        """
        raise NotImplementedError

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """This rank's stage(s) state, under the whole model's names (other stages' keys are absent)."""
        merged: dict[str, Any] = {}
        for module in self.stage_modules:
            merged.update(module.state_dict(*args, **kwargs))
        return merged

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Loads this rank's keys from ``state_dict`` (a whole-model or a stage state dict); with ``strict``, every
        key of the local stage(s) must be present."""
        missing: list[str] = []
        for module in self.stage_modules:
            own = module.state_dict().keys()
            part = {k: v for k, v in state_dict.items() if k in own}
            result = module.load_state_dict(part, strict=False, assign=assign)
            missing.extend(result.missing_keys)
        if strict and missing:
            raise RuntimeError(f"Missing key(s) for this pipeline stage: {missing}.")
        return nn.modules.module._IncompatibleKeys(missing, [])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict, gathered over the stages onto the main process. Collective."""
        raise NotImplementedError

    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Loads a whole-model state dict (the same on every process) into this rank's stage(s); keys of other
        stages are ignored. strict: every key of the local stage(s) must be there."""
        raise NotImplementedError

    def checkpoint_module(self) -> nn.Module:
        """The module a sharded (DCP) checkpoint reads for this rank: its local stage(s) under the whole model's
        names."""
        return units_under_one_root(self.stage_modules)


class PipelinedModel(StagedModel):
    """This rank's pipeline stage(s) and their schedule (built by ``prepare`` when ``pp_size > 1``).

    stages_modules: the user's model pruned to each local stage (parameter names as in the whole model).
    parts: the same after the rest of the transform chain (DDP / FSDP2 / tensor parallel wrappers).

    Example::

        model.eval()
        with torch.no_grad():
            logits = model(tokens)                 # every pipeline rank: the last stage's logits
    """

    def __init__(
        self,
        parts: Sequence[nn.Module],
        stage_modules: Sequence[nn.Module],
        layout: PipelineLayout,
        group: MeshGroup,
        device: torch.device,
        build: Callable[[Callable[[Any, Any], torch.Tensor]], tuple[Any, list[Any]]],
    ) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self._stage_modules = list(stage_modules)
        self.layout = layout
        self._group = group
        self._device = device
        self._loss_fn: Callable[[Any, Any], torch.Tensor] | None = None
        self.schedule, self.stages = build(self._micro_loss)

    # -- where this rank stands -----------------------------------------------------------------
    @property
    def stage_modules(self) -> list[nn.Module]:
        """The user's model pruned to each local stage, unwrapped (names as in the whole model)."""
        return list(self._stage_modules)

    @property
    def is_first_stage(self) -> bool:
        """Whether this rank runs the first stage (the one that reads the inputs)."""
        return 0 in self.layout.local_stages

    @property
    def is_last_stage(self) -> bool:
        """Whether this rank runs the last stage (the one that computes the loss)."""
        return self.layout.num_stages - 1 in self.layout.local_stages

    def _last_rank(self) -> int:
        """The global rank of the pipeline rank holding the last stage (same data-parallel coordinates as this one)."""
        last = (self.layout.num_stages - 1) % self.layout.pp
        group = self._group.group
        return last if group is None else dist.get_global_rank(group, last)

    # -- state dicts under the whole model's names --------------------------------------------------
    def checkpoint_module(self) -> nn.Module:
        """The module ``torch.distributed.checkpoint`` reads for this rank: its stage's part, or with several local
        stages (interleaved schedules) one module holding their units under the whole model's names."""
        if len(self.parts) == 1:
            return self.parts[0]
        return units_under_one_root(self._stage_modules)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state dict on CPU, gathered over the stages onto the first pipeline rank of each
        data-parallel replica (so on the main process); ``{}`` on the other ranks. Collective over the mesh."""
        from torch.distributed.tensor import DTensor

        local: dict[str, torch.Tensor] = {}
        for module in self._stage_modules:
            for key, value in module.state_dict().items():
                full = value.full_tensor() if isinstance(value, DTensor) else value  # collective over the stage's mesh
                local[key] = full.detach().cpu()
        group = self._group.group
        first = 0 if group is None else dist.get_global_rank(group, 0)
        gathered: list[Any] | None = [None] * self.layout.pp if dist.get_rank() == first else None
        dist.gather_object(local, gathered, dst=first, group=group)
        merged: dict[str, torch.Tensor] = {}
        for part in gathered or []:
            merged.update(part)
        return merged

    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Loads a whole-model state dict (the same on every process) into this rank's stages; sharded
        (DTensor) parameters keep their pieces."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        missing: list[str] = []
        for module in self._stage_modules:
            own = module.state_dict().keys()
            absent = [k for k in own if k not in state_dict]
            missing.extend(absent)
            part = {k: state_dict[k] for k in own if k in state_dict}
            set_model_state_dict(module, part, options=StateDictOptions(full_state_dict=True, strict=False))
        if strict and missing:
            raise RuntimeError(f"Missing key(s) for this pipeline stage: {missing}.")
        return nn.modules.module._IncompatibleKeys(missing, [])

    # -- running the schedule ------------------------------------------------------------------------
    def _micro_loss(self, output: Any, target: Any) -> torch.Tensor:
        if self._loss_fn is None:  # forward-only (evaluation): nothing to backpropagate
            return torch.zeros((), device=self._device)
        return self._loss_fn(output, target)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Forward-only pass through the pipeline (evaluation mode); refused in training mode.

        A batch that does not split into ``pp_microbatches`` equal micro-batches (the last one of a
        dataset, say) is padded by repeating its last sample, and the outputs cut back to its size."""
        if self.training:
            raise RuntimeError(_TRAINING_FORWARD.format(pp=self.layout.pp))
        size = _batch_size(args, kwargs)
        padded = -(-size // self.layout.microbatches) * self.layout.microbatches
        if padded != size:
            args, kwargs = _pad_batch((args, kwargs), size, padded)
        dummy_target = torch.zeros(padded, device=self._device)
        first = self.is_first_stage
        output = self.schedule.eval(*(args if first else ()), target=dummy_target, **(kwargs if first else {}))
        output = self._broadcast_output(output)
        if padded != size:
            leaves, spec = tree_flatten(output)
            leaves = [
                t[:size] if isinstance(t, torch.Tensor) and t.dim() and t.shape[0] == padded else t for t in leaves
            ]
            output = tree_unflatten(leaves, spec)
        return output

    def train_step(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        divisor: int = 1,
        scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Forward and backward of one batch through the schedule; returns the batch's mean loss on every pipeline rank.

        divisor: gradient accumulation steps (each micro-batch's loss is divided by ``microbatches x divisor``).
        scale: the precision's loss scaling (fp16), applied to what is backpropagated only.
        """
        args, kwargs = as_call_arguments(inputs)
        self._check_batch(args, kwargs)
        # What the schedule backpropagates is divided and scaled; what it reports (``losses``) is mapped back to the
        # plain losses. (Its first step also calls the loss function to learn shapes: that call is not reported.)
        plain: dict[int, torch.Tensor] = {}
        denominator = self.layout.microbatches * divisor

        def micro_loss(output: Any, target: Any) -> torch.Tensor:
            loss = loss_fn(output, target)
            backpropagated = loss / denominator
            if scale is not None:
                backpropagated = scale(backpropagated)
            plain[id(backpropagated)] = loss.detach()
            return backpropagated

        reported: list[torch.Tensor] = []
        self._loss_fn = micro_loss
        try:
            first, last = self.is_first_stage, self.is_last_stage
            self.schedule.step(
                *(args if first else ()),
                target=targets if last else None,
                losses=reported,
                return_outputs=False,
                **(kwargs if first else {}),
            )
        finally:
            self._loss_fn = None
        if reported:
            loss = torch.stack([plain[id(value)] for value in reported]).float().mean()
        else:
            loss = torch.zeros((), device=self._device)
        loss = loss.to(self._device)
        dist.broadcast(loss, src=self._last_rank(), group=self._group.group)
        return loss

    def _check_batch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Every pipeline rank holds the same batch (they read it together), so they all raise or none does.
        size = _batch_size(args, kwargs)
        if size % self.layout.microbatches:
            raise ValueError(
                f"The batch of {size} samples does not split into pp_microbatches={self.layout.microbatches} equal "
                "micro-batches: choose a batch size divisible by it (or set ParallelismConfig(pp_microbatches=...))."
            )

    def _broadcast_output(self, output: Any) -> Any:
        """The last stage's output, sent to every pipeline rank: structure first, then each tensor on the device."""
        src, group = self._last_rank(), self._group.group
        leaves: list[Any] = []
        if self.is_last_stage:
            leaves, spec = tree_flatten(output)
            meta: list[Any] = [
                (spec, [(tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else ("value", t) for t in leaves])
            ]
        else:
            meta = [None]
        dist.broadcast_object_list(meta, src=src, group=group, device=self._device)
        spec, described = meta[0]
        result = []
        for i, item in enumerate(described):
            if item[0] == "value":
                result.append(item[1])
                continue
            if self.is_last_stage:
                tensor = leaves[i].contiguous()
            else:
                tensor = torch.empty(item[0], dtype=item[1], device=self._device)
            dist.broadcast(tensor, src=src, group=group)
            result.append(tensor)
        return tree_unflatten(result, spec)
