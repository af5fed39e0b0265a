"""SPMD sharding: accel's ``dp_shard`` / ``tp`` axes as one ``xs.Mesh`` over the XLA devices of one process.

Under torch-xla's SPMD mode one process drives every device; the compiler (GSPMD) splits each
operation following the shardings marked on tensors. accel's layout maps onto it as:

- ``dp_shard`` -> the mesh axis ``"fsdp"`` (the name torch-xla's FSDPv2,
  ``SpmdFullyShardedDataParallel``, requires): every parameter is sharded along its largest
  dimension (FSDPv2's rule), and each batch along its first dimension;
- ``tp`` -> the mesh axis ``"tp"``: the Linear / Embedding layers of the tensor-parallel plan are
  split column- or row-wise (the ``tp_plan`` style accel uses for DTensor tensor parallelism), and
  also sharded over ``"fsdp"`` along their other dimension (2-D sharding).

The device layout is resolved against the number of devices, not of processes: the process
layout accel's core sees stays one process reading whole batches (``dp_replicate=1``).

Only the layout and the partition specs live here without torch-xla (pure, unit-tested anywhere);
``SpmdMesh`` is the runtime half.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from accel_core import environment as env
from accel_core.parallel.config import ENV_VARS, ParallelismConfig
from accel_core.transforms.tensor_parallel import plan_targets

from .runtime import TorchXla

FSDP_AXIS = "fsdp"
TP_AXIS = "tp"
MESH_AXES = (FSDP_AXIS, TP_AXIS)
"""The ``xs.Mesh`` axis names, outermost first: ``dp_shard`` is FSDPv2's ``"fsdp"``, ``tp`` is ``"tp"``."""

COLWISE = "colwise"
ROWWISE = "rowwise"
# Style names of accel's tp_plan that split a weight; "colwise_rep" differs from "colwise" only in the layout of its
# output, which GSPMD chooses itself.
_STYLE_NAMES = {"colwise": COLWISE, "colwise_rep": COLWISE, "rowwise": ROWWISE}

PartitionSpec = tuple[str | None, ...]


def _given(config: ParallelismConfig | None, dim: str, environ: Mapping[str, str]) -> int | None:
    """The size asked for ``dim`` (argument, else ``ACCEL_<DIM>_SIZE``), None when neither says."""
    value = getattr(config, f"{dim}_size") if config is not None else None
    if value is None:
        value = env.get_int(ENV_VARS[f"{dim}_size"], None, environ)
    return None if value is None else int(value)


def spmd_requested(config: ParallelismConfig | None, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the layout asks for sharding over devices (``dp_shard`` or ``tp`` above 1)."""
    environ = os.environ if environ is None else environ
    return any((_given(config, dim, environ) or 1) > 1 for dim in ("dp_shard", "tp"))


def check_one_process(process_count: int) -> None:
    """Raises ValueError naming the fix when SPMD sharding is asked of several processes (checked before the
    runtime starts)."""
    if process_count > 1:
        raise ValueError(
            f"SPMD sharding (dp_shard / tp) on XLA runs in one process driving every device, but {process_count} "
            "processes were started: launch one process (accel launch --use-xla --num-processes 1), or drop "
            "dp_shard_size / tp_size for data parallelism over replicas. Multi-host SPMD is not built in accel-xla."
        )


def resolve_spmd_layout(
    config: ParallelismConfig | None,
    device_count: int,
    process_count: int = 1,
    environ: Mapping[str, str] | None = None,
) -> ParallelismConfig:
    """The device layout (``dp_shard x tp`` = ``device_count``) for ``config``; ValueError naming the fix.

    ``dp_shard`` left unset takes the devices ``tp`` leaves. Refused: several processes (multi-host
    SPMD is not built), ``dp_replicate``, ``cp`` and ``pp`` above 1.

    Example::

        resolve_spmd_layout(ParallelismConfig(tp_size=2), device_count=8).dp_shard_size   # 4
    """
    environ = os.environ if environ is None else environ
    check_one_process(process_count)
    others = [
        f"{dim}_size={size}" for dim in ("dp_replicate", "cp", "pp") if (size := _given(config, dim, environ) or 1) > 1
    ]
    if others:
        raise ValueError(
            f"{', '.join(others)}: accel-xla's SPMD sharding covers dp_shard and tp only (one mesh of the process's "
            "XLA devices); drop those sizes."
        )
    tp = _given(config, "tp", environ) or 1
    dp_shard = _given(config, "dp_shard", environ)
    if dp_shard is None:
        if device_count % tp:
            raise ValueError(
                f"tp_size={tp} must divide the {device_count} XLA devices of this process (CPU_NUM_DEVICES for XLA's "
                "CPU device): choose a tp_size that divides it."
            )
        dp_shard = device_count // tp
    if dp_shard * tp != device_count:
        raise ValueError(
            f"dp_shard_size={dp_shard} x tp_size={tp} = {dp_shard * tp}, but this process drives {device_count} XLA "
            f"devices: make the product {device_count} (or leave dp_shard_size unset to take the rest)."
        )
    base = config if config is not None else ParallelismConfig()
    return replace(base, dp_replicate_size=1, dp_shard_size=dp_shard, tp_size=tp, cp_size=1, pp_size=1)


def process_layout(config: ParallelismConfig | None) -> ParallelismConfig:
    """What accel's core sees of an SPMD job: one process that reads whole batches (every size 1).

    The settings that are not sizes (``tp_plan``, ``activation_checkpointing``...) are kept."""
    base = config if config is not None else ParallelismConfig()
    return replace(base, dp_replicate_size=1, dp_shard_size=1, tp_size=1, cp_size=1, pp_size=1)


# -- partition specs (pure) -------------------------------------------------------------------------------------------
def _style_name(value: Any, key: str) -> str:
    """``colwise`` / ``rowwise`` for a plan entry: a style name or torch's ``ColwiseParallel`` / ``RowwiseParallel``."""
    if isinstance(value, str) and value.lower() in _STYLE_NAMES:
        return _STYLE_NAMES[value.lower()]
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if isinstance(value, ColwiseParallel):
        return COLWISE
    if isinstance(value, RowwiseParallel):
        return ROWWISE
    raise ValueError(
        f"tp_plan[{key!r}] = {value!r}: on XLA (SPMD) a plan entry splits a Linear or Embedding weight, so use "
        f"'colwise' or 'rowwise' (or ColwiseParallel() / RowwiseParallel()); GSPMD places the activations itself, "
        "so sequence-parallel and input/output layout styles have no XLA form."
    )


def _tp_specs(name: str, module: nn.Module, style: str, tp: int) -> dict[str, PartitionSpec]:
    """Specs of one planned layer's parameters: split along ``tp`` as ``style`` says, along ``fsdp`` on the other
    dimension. Raises ValueError when ``tp`` does not divide the split dimension."""
    if isinstance(module, nn.Linear):
        # weight is (out_features, in_features): colwise splits the outputs, rowwise the inputs.
        split = ("out_features", module.out_features) if style == COLWISE else ("in_features", module.in_features)
        weight: PartitionSpec = (TP_AXIS, FSDP_AXIS) if style == COLWISE else (FSDP_AXIS, TP_AXIS)
        bias: PartitionSpec | None = (TP_AXIS,) if style == COLWISE else None
    elif isinstance(module, nn.Embedding):
        # weight is (num_embeddings, embedding_dim): colwise splits the embedding dimension, rowwise the vocabulary.
        split = (
            ("embedding_dim", module.embedding_dim) if style == COLWISE else ("num_embeddings", module.num_embeddings)
        )
        weight = (FSDP_AXIS, TP_AXIS) if style == COLWISE else (TP_AXIS, FSDP_AXIS)
        bias = None
    else:
        raise ValueError(
            f"tp_plan: {name} is a {type(module).__name__}; on XLA (SPMD) the plan splits nn.Linear and nn.Embedding "
            "layers only: name those (use * for one name part)."
        )
    if split[1] % tp:
        raise ValueError(
            f"tp_size={tp} must divide {name}.{split[0]}={split[1]} ({style} splits it): choose a tp_size that divides "
            f"it, or leave {name} out of the plan."
        )
    specs: dict[str, PartitionSpec] = {"weight": weight}
    if bias is not None and getattr(module, "bias", None) is not None:
        specs["bias"] = bias
    prefix = f"{name}." if name else ""
    return {prefix + key: spec for key, spec in specs.items()}


def fsdp_spec(shape: Iterable[int]) -> PartitionSpec:
    """FSDPv2's rule (``shard_maximal``): the largest dimension along ``fsdp``, the rest whole; () for a scalar."""
    shape = tuple(shape)
    if not shape:
        return ()
    largest = shape.index(max(shape))
    return tuple(FSDP_AXIS if i == largest else None for i in range(len(shape)))


def tensor_parallel_plan(model: nn.Module, layout: ParallelismConfig) -> Mapping[str, Any] | None:
    """The plan that splits ``model`` over ``tp``: ``ParallelismConfig.tp_plan``, else the model's ``tp_plan``
    attribute; None when ``tp`` is 1. Raises ValueError when ``tp > 1`` and there is no plan."""
    if not layout.tp_enabled:
        return None
    if layout.parallelize_fn is not None:
        raise ValueError(
            "parallelize_fn receives a torch DeviceMesh and applies DTensor tensor parallelism, which XLA's SPMD mode "
            "does not run: describe the split with ParallelismConfig(tp_plan={'layers.*.up': 'colwise', ...})."
        )
    plan = layout.tp_plan if layout.tp_plan is not None else getattr(model, "tp_plan", None)
    if not plan:
        raise ValueError(
            f"tp_size={layout.tp_size} but nothing says how to split {type(model).__name__} on XLA: pass "
            "ParallelismConfig(tp_plan={'layers.*.attn.q': 'colwise', 'layers.*.attn.o': 'rowwise', ...}) or give "
            "the model a tp_plan attribute (a parallelize(mesh) method takes a torch DeviceMesh: not on XLA)."
        )
    return plan


def partition_specs(model: nn.Module, layout: ParallelismConfig) -> dict[str, PartitionSpec]:
    """Each parameter's partition spec over the mesh axes ``("fsdp", "tp")``, by name in ``model``.

    Layers of the tensor-parallel plan get their 2-D spec; every other parameter FSDPv2's rule
    (largest dimension along ``fsdp``, which is whole when ``dp_shard`` is 1).
    """
    specs: dict[str, PartitionSpec] = {}
    for key, value in (tensor_parallel_plan(model, layout) or {}).items():
        style = _style_name(value, key)
        matches = plan_targets(model, key)
        for name, module in matches:
            specs.update(_tp_specs(name, module, style, layout.size("tp")))
    for name, param in model.named_parameters():
        specs.setdefault(name, fsdp_spec(param.shape))
    return specs


# -- the runtime half (torch-xla) -------------------------------------------------------------------------------------
class BatchSharding:
    """Shards every tensor of a batch along its first dimension over ``fsdp`` as it is uploaded (scalars whole).

    torch-xla's ``ShardingSpec`` fits tensors of one rank only (others are uploaded replicated), while a batch
    mixes ranks (inputs, 1-D labels). ``MpDeviceLoader(input_sharding=...)`` asks its ``input_sharding`` for
    ``xla_spec(tensor)`` and ``minibatch`` (``xm.send_cpu_data_to_device``): this answers with the spec of each
    tensor's rank.
    """

    minibatch = False  # the batch each process reads is the global batch (one process)

    def __init__(self, mesh: Any, xs: Any) -> None:
        self._mesh = mesh
        self._xs = xs
        self._by_rank: dict[int, Any] = {}

    def spec(self, rank: int) -> Any:
        """torch-xla's ``ShardingSpec`` for tensors of ``rank`` dimensions."""
        if rank not in self._by_rank:
            self._by_rank[rank] = self._xs.ShardingSpec(self._mesh, (FSDP_AXIS,) + (None,) * (rank - 1))
        return self._by_rank[rank]

    def xla_spec(self, tensor: torch.Tensor) -> Any:
        return self.spec(tensor.dim()).xla_spec(tensor) if tensor.dim() > 0 else None


@dataclass
class SpmdMesh:
    """The job's ``xs.Mesh`` (axes ``("fsdp", "tp")``, sizes ``(dp_shard, tp)``) and the shardings accel marked.

    Attributes:
        layout: the device layout (``resolve_spmd_layout``).
        mesh: torch-xla's ``xs.Mesh``, also set as its global mesh (``xs.get_global_mesh()``), so a
            script can mark its own tensors on it.
    """

    layout: ParallelismConfig
    mesh: Any
    xs: Any
    _specs: WeakIdKeyDictionary

    @classmethod
    def create(cls, layout: ParallelismConfig, xla: TorchXla) -> SpmdMesh:
        """Builds the mesh over every device of the runtime, in order. SPMD mode must be on (``xr.use_spmd()``)."""
        import numpy as np

        xs = importlib.import_module("torch_xla.distributed.spmd")
        shape = (layout.size("dp_shard"), layout.size("tp"))
        count = int(xla.xr.global_runtime_device_count())
        if shape[0] * shape[1] != count:  # resolve_spmd_layout saw another count: an internal error
            raise AssertionError(f"SPMD layout {shape} does not cover the {count} devices")
        mesh = xs.Mesh(np.arange(count), shape, MESH_AXES)
        xs.set_global_mesh(mesh)
        return cls(layout, mesh, xs, WeakIdKeyDictionary())

    def spec_of(self, tensor: torch.Tensor) -> PartitionSpec | None:
        """The partition spec accel marked on a parameter (None: not one of a prepared model)."""
        return self._specs.get(tensor)

    def shard_model(self, model: nn.Module) -> nn.Module:
        """Marks every parameter of ``model`` (on the XLA device) with its spec, then wraps it in FSDPv2 when
        ``dp_shard > 1`` (which shards the forward's output along the batch and keeps gradient syncs apart)."""
        specs = partition_specs(model, self.layout)
        for name, param in model.named_parameters():
            self.xs.mark_sharding(param, self.mesh, specs[name])
            self._specs[param] = specs[name]
        if not self.layout.dp_shard_enabled:
            return model
        fsdp = importlib.import_module("torch_xla.experimental.spmd_fully_sharded_data_parallel")
        # FSDPv2 leaves the parameters marked above as they are.
        return fsdp.SpmdFullyShardedDataParallel(model, mesh=self.mesh)

    def reshard_optimizer_state(self, optimizer: torch.optim.Optimizer) -> None:
        """Gives the optimizer's per-parameter state (loaded as whole tensors) its parameter's sharding again."""
        for group in optimizer.param_groups:
            for param in group["params"]:
                spec = self.spec_of(param)
                if spec is None:
                    continue
                for value in optimizer.state.get(param, {}).values():
                    if (
                        isinstance(value, torch.Tensor)
                        and value.device.type == "xla"
                        and value.shape == param.shape
                        and not sharding_of(value)
                    ):
                        self.xs.mark_sharding(value, self.mesh, spec)

    def batch_sharding(self) -> BatchSharding:
        """The loader's ``input_sharding``: batches split along their first dimension over ``fsdp``."""
        return BatchSharding(self.mesh, self.xs)


def sharding_of(tensor: torch.Tensor) -> str:
    """torch-xla's description of a tensor's sharding (``"{devices=[2,2]0,1,2,3}"``); ``""`` when it has none."""
    torch_xla = importlib.import_module("torch_xla")
    return str(torch_xla._XLAC._get_xla_sharding_spec(tensor))
