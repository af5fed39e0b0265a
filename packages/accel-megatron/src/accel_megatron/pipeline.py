"""Megatron-core's pipeline schedules behind ``accelerator.forward_backward``.

With ``MegatronLMPlugin(pp_degree > 1)``, ``prepare`` cuts the user's model into ``pp_degree x
vp_degree`` stages with accel-core's split (``accel_core.pipelining.split``: a chain of units,
parameter names kept), keeps this rank's chunk(s) (stages ``rank, rank + pp_degree, ...``), and
returns a ``MegatronPipelinedModel``. Its ``train_step`` runs the schedule that
``megatron.core.pipeline_parallel.get_forward_backward_func()`` picks: 1F1B, or interleaved 1F1B
with ``vp_degree > 1`` chunks per rank (Megatron's virtual pipeline stages). With ``num_micro_batches > 1`` and
no pipeline stages, the whole model is the one chunk and the schedule is ``forward_backward_no_pipelining``
(Megatron's gradient accumulation: forward and backward of each micro-batch in turn).

What travels between stages is one tensor of 3 dimensions (Megatron sends 3-dimensional
activations; ``[batch, sequence, hidden]`` here, any order works): its shape is sent ahead of it
(Megatron's ``variable_seq_lengths``), so neither the sequence length nor the hidden size has to be
declared.

Megatron-core (0.16) makes CUDA calls in these schedules that no setting avoids (``CUDA_CALLS``),
so they run on GPUs only; on another device ``train_step`` raises naming them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from accel_core.pipelining import StagedModel, as_call_arguments, split_model

# The calls of megatron-core 0.16's pipeline schedules that need CUDA, whatever the config says.
CUDA_CALLS = (
    'megatron/core/pipeline_parallel/schedules.py: `total_num_tokens = torch.zeros([], dtype=torch.int, device="cuda")`'
    " at the start of every schedule (forward_backward_no_pipelining, forward_backward_pipelining_without_interleaving"
    " / _with_interleaving)",
    "megatron/core/pipeline_parallel/p2p_communication.py: P2PCommunicator._communicate and _communicate_shapes "
    "allocate their receive buffers with `device=torch.cuda.current_device()`",
    "the same file: `torch.cuda.synchronize()` after each batched send / receive",
)

_NEEDS_CUDA = (
    "Megatron-core's schedules (MegatronLMPlugin(pp_degree > 1) or num_micro_batches > 1) run on GPUs only: "
    "megatron-core makes these CUDA calls whatever its config says: {calls}. This run's device is {device}. Run on "
    "GPUs, or use torch's pipeline schedules, which run on CPU / gloo: the ddp or fsdp strategy with "
    "ParallelismConfig(pp_size=...); without pipeline stages, gradient_accumulation_steps on the Accelerator "
    "accumulates micro-batches anywhere."
)


def check_device(device: torch.device) -> None:
    """Refuses to start a schedule whose CUDA calls (``CUDA_CALLS``) cannot run here. It asks
    ``torch.cuda.current_device()``, the call megatron-core makes for its receive buffers."""
    if device.type == "cuda":
        return
    try:
        buffers = torch.device(torch.cuda.current_device())
    except (RuntimeError, AssertionError) as err:  # no GPU, or torch built without CUDA
        raise RuntimeError(_NEEDS_CUDA.format(calls="; ".join(CUDA_CALLS), device=device)) from err
    if buffers.type != device.type:
        raise RuntimeError(_NEEDS_CUDA.format(calls="; ".join(CUDA_CALLS), device=device))


class MegatronStage(nn.Module):
    """One model chunk as Megatron's schedules call it: ``set_input_tensor`` (the activation received from the
    previous stage), ``config`` and ``model_type``. The first stage reads the batch, the others the activation.

    sends_activation: the chunk's output goes to another stage (every chunk but the model's last), so it
    leaves in ``config.pipeline_dtype``, the dtype of Megatron's receive buffers.
    """

    def __init__(self, module: nn.Module, config: Any, vp_stage: int | None, sends_activation: bool) -> None:
        from megatron.core.enums import ModelType

        super().__init__()
        self.module = module
        self.config = config
        self.model_type = ModelType.encoder_or_decoder
        self.vp_stage = vp_stage
        self.sends_activation = sends_activation
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, tensor: torch.Tensor | list[torch.Tensor | None] | None) -> None:
        self.input_tensor = tensor[0] if isinstance(tensor, list) else tensor

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.input_tensor is not None:
            return self._as_sent(self.module(self.input_tensor))
        return self._as_sent(self.module(*args, **kwargs))

    def _as_sent(self, output: Any) -> Any:
        # Under mixed precision the chunk's forward runs in the autocast wrapper, which returns fp32; the next
        # stage receives into buffers of pipeline_dtype (bf16), and point-to-point sends carry bytes, not dtypes:
        # an fp32 tensor there is garbage or a hang under NCCL. The cast is differentiable (grads come back bf16).
        dtype = self.config.pipeline_dtype
        if (
            self.sends_activation
            and dtype is not None
            and isinstance(output, torch.Tensor)
            and output.is_floating_point()
            and output.dtype != dtype
        ):
            return output.to(dtype)
        return output


def _split_batch(tree: Any, pieces: int) -> list[Any]:
    """``pieces`` micro-batches of ``tree``: every tensor split along dimension 0 (other values repeated)."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(tree)
    sizes = {leaf.shape[0] for leaf in leaves if isinstance(leaf, torch.Tensor) and leaf.dim() > 0}
    if len(sizes) != 1:
        raise ValueError(
            f"The batch's tensors have first dimensions {sorted(sizes)}: Megatron's pipeline splits every tensor "
            "of inputs and targets into micro-batches along one batch dimension, the same size for all."
        )
    (size,) = sizes
    if size % pieces:
        raise ValueError(
            f"The batch of {size} samples does not split into num_micro_batches={pieces} equal micro-batches: "
            "choose a batch size divisible by it (MegatronLMPlugin(num_micro_batches=...))."
        )
    columns = [leaf.chunk(pieces) if isinstance(leaf, torch.Tensor) and leaf.dim() > 0 else None for leaf in leaves]
    return [
        tree_unflatten(
            [column[i] if column is not None else leaf for column, leaf in zip(columns, leaves, strict=True)], spec
        )
        for i in range(pieces)
    ]


class MegatronPipelinedModel(StagedModel):
    """This rank's chunk(s) of a model split over Megatron's pipeline group, trained with
    ``accelerator.forward_backward`` (Megatron-core's 1F1B or interleaved schedule); or, without pipeline stages
    (``num_micro_batches > 1`` alone), the whole model as one chunk, trained through Megatron's no-pipelining
    schedule.

    finish_gradients: called after each schedule run (the strategy's data-parallel all-reduce,
        sequence-parallel reduction and clipping at accumulation boundaries).
    """

    def __init__(
        self,
        chunks: Sequence[nn.Module],
        config: Any,
        num_microbatches: int,
        device: torch.device,
        finish_gradients: Callable[[list[nn.Parameter]], None],
    ) -> None:
        from megatron.core import parallel_state

        super().__init__()
        vp = len(chunks)
        last_rank = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        self.chunks = nn.ModuleList(
            MegatronStage(
                chunk, config, index if vp > 1 else None, sends_activation=not (last_rank and index == vp - 1)
            )
            for index, chunk in enumerate(chunks)
        )
        self._stage_modules = list(chunks)
        # No pipeline stages (micro-batches only): the one chunk is the whole model, run by the no-pipelining schedule.
        self._whole_model = parallel_state.get_pipeline_model_parallel_world_size() == 1
        self.config = config
        self.num_microbatches = num_microbatches
        self._device = device
        self._finish_gradients = finish_gradients

    @property
    def stage_modules(self) -> list[nn.Module]:
        return list(self._stage_modules)

    # -- state dicts under the whole model's names ------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights (TP shards gathered, then the stages) on the first pipeline rank of each
        data-parallel replica, so on the main process; ``{}`` elsewhere. Collective over TP and PP."""
        from megatron.core import parallel_state

        from .groups import pipeline_parallel_group
        from .weights import full_state_dict

        local: dict[str, torch.Tensor] = {}
        for module in self._stage_modules:
            local.update({k: v.detach().cpu() for k, v in full_state_dict(module).items()})
        group = pipeline_parallel_group()
        first = parallel_state.get_pipeline_model_parallel_first_rank()
        gathered: list[Any] | None = [None] * dist.get_world_size(group) if dist.get_rank() == first else None
        dist.gather_object(local, gathered, dst=first, group=group)
        merged: dict[str, torch.Tensor] = {}
        for part in gathered or []:
            merged.update(part)
        return merged

    def load_full_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> Any:
        """Loads whole-model weights (the same on every process) into this rank's chunk(s); TP ranks keep their
        blocks. Keys of other stages are ignored; with ``strict`` every key of the local chunks must be there."""
        from .weights import load_full_state_dict

        for module in self._stage_modules:
            own = module.state_dict().keys()
            load_full_state_dict(module, {k: v for k, v in state_dict.items() if k in own}, strict=strict)
        return nn.modules.module._IncompatibleKeys([], [])

    # -- running the schedule ------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._whole_model:
            if not torch.is_grad_enabled():  # evaluation: the whole model is here, no schedule needed
                return self._stage_modules[0](*args, **kwargs)
            raise RuntimeError(
                "This model trains in Megatron micro-batches (MegatronLMPlugin(num_micro_batches > 1)): a plain "
                "forward would skip them and the data-parallel average that follows the schedule. Run the training "
                "step with `loss = accelerator.forward_backward(model, inputs, targets, loss_fn)`; a forward under "
                "`torch.no_grad()` (evaluation) runs the whole model."
            )
        raise RuntimeError(
            "This model is split into Megatron pipeline stages (MegatronLMPlugin(pp_degree > 1)): a plain forward "
            "cannot return a loss to backpropagate, because micro-batches of different stages interleave. Run the "
            "training step with `loss = accelerator.forward_backward(model, inputs, targets, loss_fn)`."
        )

    def train_step(
        self,
        inputs: Any,
        targets: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        divisor: int = 1,
        scale: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel import get_forward_backward_func

        from .groups import pipeline_parallel_group

        check_device(self._device)
        args, kwargs = as_call_arguments(inputs)
        micro = _split_batch((args, kwargs, targets), self.num_microbatches)
        # Every chunk sees every micro-batch, in order: one iterator per chunk (Megatron's interleaved contract).
        iterators: list[Iterator[Any]] = [iter(micro) for _ in self.chunks]

        def forward_step(data: Iterator[Any], stage: MegatronStage) -> tuple[Any, Callable[..., Any]]:
            micro_args, micro_kwargs, micro_targets = next(data)
            output = stage(*micro_args, **micro_kwargs)

            def loss_func(final: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
                loss = loss_fn(final, micro_targets)
                # Megatron divides what it backpropagates by the number of micro-batches; accumulation is ours.
                return loss / divisor, {"loss": loss.detach()}

            if isinstance(output, torch.Tensor) and output.dim() != 3 and stage.sends_activation:
                raise ValueError(
                    "A Megatron pipeline stage sends one 3-dimensional tensor to the next ([batch, sequence, "
                    f"hidden]); this stage returned a tensor of shape {tuple(output.shape)}. Reshape the activations "
                    "between "
                    "the units where stages begin."
                )
            return output, loss_func

        self.config.grad_scale_func = scale
        schedule = get_forward_backward_func()
        reports = schedule(
            forward_step_func=forward_step,
            data_iterator=iterators if len(self.chunks) > 1 else iterators[0],
            model=list(self.chunks),
            num_microbatches=self.num_microbatches,
            seq_length=1,  # unused: activation shapes are sent ahead (variable_seq_lengths)
            micro_batch_size=1,
            forward_only=False,
        )
        self._finish_gradients([p for chunk in self.chunks for p in chunk.parameters() if p.requires_grad])
        if reports:
            loss = torch.stack([report["loss"].float() for report in reports]).mean().to(self._device)
        else:
            loss = torch.zeros((), device=self._device)
        dist.broadcast(
            loss,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=pipeline_parallel_group(),
        )
        return loss


def schedule_config(tp_degree: int, pp_degree: int, vp_degree: int, dtype: torch.dtype, sequence_parallel: bool) -> Any:
    """The ``TransformerConfig`` Megatron's schedules read (their settings only: no layer is built from it)."""
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(
        num_layers=pp_degree * vp_degree,
        # Unused (shapes are sent ahead of the activations, no layer is built); TransformerConfig checks them vs TP.
        hidden_size=tp_degree,
        num_attention_heads=tp_degree,
        tensor_model_parallel_size=tp_degree,
        pipeline_model_parallel_size=pp_degree,
        virtual_pipeline_model_parallel_size=vp_degree if vp_degree > 1 else None,
        sequence_parallel=sequence_parallel,
        pipeline_dtype=dtype,
        variable_seq_lengths=True,
        # With 2 pipeline ranks the interleaved schedule sends forward and backward to the same peer in one batch,
        # where receives match sends by order only (measured: micro-batches mixed up). Megatron's unbatched path
        # sends the two directions over two different groups.
        batch_p2p_comm=not (pp_degree == 2 and vp_degree > 1),
        # No MoE here; TransformerConfig refuses variable_seq_lengths with its default ("allgather") dispatcher.
        moe_token_dispatcher_type="alltoall",
    )


def split_for_megatron(model: nn.Module, pp_degree: int, vp_degree: int) -> list[nn.Module]:
    """This rank's chunks of ``model``: stages ``rank, rank + pp_degree, ...`` of ``pp_degree x vp_degree``."""
    from megatron.core import parallel_state

    rank = parallel_state.get_pipeline_model_parallel_rank()
    local = [rank + k * pp_degree for k in range(vp_degree)]
    return split_model(model, pp_degree * vp_degree, local)
