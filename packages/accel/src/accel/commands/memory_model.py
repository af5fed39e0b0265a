"""The arithmetic of ``accel estimate-memory``: bytes one process holds for a model's parameters,
gradients and optimizer state under each strategy. Pure: parameter shapes in, byte counts out (no torch).

What each strategy keeps on the largest process (rank 0), counted the way torch lays it out:

- ``ddp``: everything whole on every process (DDP's reducer adds gradient buckets, not counted).
- ``fsdp`` (FSDP2, ``fully_shard``): every parameter split along its first dimension in
  ``ceil(rows / processes)`` rows per process (rank 0 holds a full chunk); its gradient and
  optimizer state the same; the optimizer's step counter whole (one 4-byte scalar per tensor).
- ``zero1`` / ``zero2`` / ``zero3`` (DeepSpeed): parameters whole (ZeRO-3: a ``ceil(count /
  processes)`` partition), gradients whole (ZeRO-2/3: partitioned), and the optimizer's partition
  as DeepSpeed keeps it: an fp32 master copy plus the optimizer's states in fp32. Alignment padding
  and communication buckets are not counted.
- tensor parallelism (``tp``): a parameter the model's ``tp_plan`` splits holds ``1 / tp`` of the
  split dimension; then ``ddp`` or ``fsdp`` over the remaining ``processes / tp`` processes.

The optimizer's per-parameter states (AdamW: ``exp_avg``, ``exp_avg_sq``) take the parameter's
dtype, as ``torch.optim`` creates them with ``zeros_like``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# Quantized weights (Accelerate's `--dtypes int8 int4`): bits per parameter. They are loaded for inference or under
# a trained adapter, never trained themselves, so only their parameters are counted.
QUANTIZED_BITS = {"int8": 8, "int4": 4}
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
# Strategies that compose with tensor parallelism over the rest of the processes.
TP_STRATEGIES = ("ddp", "fsdp")
STEP_COUNTER_BYTES = 4  # torch.optim's float32 scalar `step` tensor, one per parameter tensor
MASTER_BYTES = 4  # DeepSpeed's fp32 copy of its partition (and its optimizer states)


@dataclass(frozen=True)
class ParameterShape:
    """One parameter tensor: its shape, whether it trains, and the dimension tensor parallelism splits."""

    name: str
    shape: tuple[int, ...]
    trainable: bool = True
    tp_dim: int | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class OptimizerKind:
    """How much state an optimizer keeps per parameter: ``states`` tensors of its size, a step counter."""

    name: str
    states: int
    step_counter: bool


OPTIMIZERS = {
    "adamw": OptimizerKind("AdamW", 2, True),
    "adam": OptimizerKind("Adam", 2, True),
    "sgd": OptimizerKind("SGD", 0, False),
    "sgd-momentum": OptimizerKind("SGD with momentum", 1, False),
}


@dataclass(frozen=True)
class RankBytes:
    """Bytes one process holds."""

    parameters: int
    gradients: int
    optimizer_state: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state


def _tp_local_shape(param: ParameterShape, tp_size: int) -> tuple[int, ...]:
    if tp_size == 1 or param.tp_dim is None:
        return param.shape
    shape = list(param.shape)
    if shape[param.tp_dim] % tp_size:
        raise ValueError(
            f"tp size {tp_size} does not divide {param.name}'s dimension {param.tp_dim} ({shape[param.tp_dim]}), "
            "which the model's tp_plan splits: choose a tp size that divides it."
        )
    shape[param.tp_dim] //= tp_size
    return tuple(shape)


def _fsdp_local_numel(shape: tuple[int, ...], processes: int) -> int:
    """Rank 0's chunk of ``torch.chunk(rows, processes)``: fully_shard's split along the first dimension."""
    if not shape:
        return 1
    return math.ceil(shape[0] / processes) * math.prod(shape[1:])


def estimate(
    parameters: list[ParameterShape],
    strategy: str,
    processes: int,
    dtype_bytes: int,
    optimizer: OptimizerKind,
    tp_size: int = 1,
) -> RankBytes:
    """Bytes the largest process holds with ``strategy`` over ``processes`` (``tp_size`` of them per TP group)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}.")
    if processes < 1 or processes % tp_size:
        raise ValueError(f"tp size {tp_size} must divide the {processes} processes.")
    if tp_size > 1 and strategy not in TP_STRATEGIES:
        raise ValueError(f"tensor parallelism composes with {' or '.join(TP_STRATEGIES)} here, not {strategy}.")
    trainable = [p for p in parameters if p.trainable]
    counters = len(trainable) * STEP_COUNTER_BYTES if optimizer.step_counter else 0
    if strategy in ("ddp", "fsdp"):
        replicas = processes // tp_size

        def local(param: ParameterShape) -> int:
            shape = _tp_local_shape(param, tp_size)
            return _fsdp_local_numel(shape, replicas) if strategy == "fsdp" else math.prod(shape)

        held = sum(local(p) for p in parameters)
        trained = sum(local(p) for p in trainable)
        return RankBytes(held * dtype_bytes, trained * dtype_bytes, trained * optimizer.states * dtype_bytes + counters)
    # DeepSpeed ZeRO: flat buffers partitioned evenly over the processes.
    total = sum(p.numel for p in parameters)
    trained = sum(p.numel for p in trainable)
    partition = math.ceil(trained / processes)
    params = math.ceil(total / processes) if strategy == "zero3" else total
    grads = partition if strategy in ("zero2", "zero3") else trained
    state = partition * (MASTER_BYTES + optimizer.states * MASTER_BYTES)
    return RankBytes(params * dtype_bytes, grads * dtype_bytes, state)


def estimate_quantized(
    parameters: list[ParameterShape], strategy: str, processes: int, bits: int, tp_size: int = 1
) -> RankBytes:
    """Bytes the largest process holds for ``parameters`` quantized to ``bits`` each: laid out by ``strategy`` as
    frozen parameters are (no gradients, no optimizer state), a partition's bits rounded up to whole bytes."""
    frozen = [ParameterShape(p.name, p.shape, False, p.tp_dim) for p in parameters]
    held = estimate(frozen, strategy, processes, 1, OPTIMIZERS["sgd"], tp_size)  # one byte a parameter: the count
    return RankBytes(math.ceil(held.parameters * bits / 8), 0, 0)
