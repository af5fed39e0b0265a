"""The ``xla`` strategy: data parallelism over XLA replicas (TPU cores, or any device of torch-xla's PJRT runtime).

What it does differently from the base Strategy, and the optional interfaces it implements (see
``accel_core.strategies.base``):

- ``setup_environment``: processes started by torchrun join torch.distributed's ``xla`` backend
  (``init_method="xla://"``, the way torch-xla documents torchrun; one process needs nothing), and
  ordinal, replica count, local ordinal and device come from the PJRT runtime (the placement it
  returns), with accel's gather / reduce / broadcast / barrier going through XLA collectives
  (``XlaCollectives``).
- ``BatchTransfer``: prepared dataloaders are read through torch-xla's ``MpDeviceLoader``
  (``XlaDeviceLoader``), which uploads batches ahead and marks an XLA step per batch.
- ``ReducesGradients``: the gradients are averaged over the replicas (``xm.all_reduce``) right
  before each real optimizer step, as ``xm.optimizer_step`` does; clipping reduces first, once.
- ``ShardedCheckpointing``: ``save_state`` writes models and optimizers with ``xm.save`` (moved to
  the CPU, written by the master ordinal) into the checkpoint's ``sharded/`` folder, with each
  process's XLA RNG seed (``xm.get_rng_state``).

SPMD sharding: a layout with ``dp_shard`` or ``tp`` above 1 switches torch-xla to SPMD mode, one
process driving every device (``accel_xla.spmd``): parameters sharded over an ``xs.Mesh`` (FSDPv2
over ``dp_shard``, the ``tp_plan``'s layers split over ``tp``), batches split along their first
dimension as they are uploaded; checkpoints hold whole tensors.

Moving a model to the XLA device creates new parameter objects; an optimizer built before
``prepare`` is rebuilt on them by core (matched by name). Mixed precision: ``bf16`` (autocast on
the XLA device); ``downcast_bf16`` (``accel launch --downcast-bf16``) also stores float32 tensors
as bfloat16 on the device (torch-xla's ``XLA_DOWNCAST_BF16``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from accel_core import environment as env
from accel_core.enums import DistributedType
from accel_core.parallel.config import ParallelismConfig
from accel_core.placement import ProcessPlacement
from accel_core.precision.choice import default_precision
from accel_core.precision.modes import Precision, PrecisionContext
from accel_core.settings import RunSettings, settle
from accel_core.strategies import PreparedObjects, Strategy, StrategyContext
from accel_core.strategies.base import on_device

from .collectives import XlaCollectives
from .loader import XlaDeviceLoader
from .runtime import TorchXla, require_torch_xla
from .spmd import SpmdMesh, check_one_process, process_layout, resolve_spmd_layout, spmd_requested

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from accel_core.checkpointing import CheckpointIO

DOWNCAST_BF16 = "ACCEL_XLA_DOWNCAST_BF16"
"""Set by ``accel launch --downcast-bf16`` (Accelerate's ``ACCELERATE_DOWNCAST_BF16`` is read too)."""
DEVICE = "ACCEL_XLA_DEVICE"
"""The PJRT device (TPU, CPU, CUDA) from ``accel launch --xla-device`` or the config file's ``xla: device:``."""
COMPILED_PREFIX = "_orig_mod."
"""The prefix ``torch.compile``'s wrapper puts before its module's keys."""
RNG_FILE = "xla_rng_state_{process}.json"
"""In the checkpoint's ``sharded/`` folder: one process's XLA RNG seed (``xm.get_rng_state``)."""


def downcast_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for bf16 downcasting (``ACCEL_XLA_DOWNCAST_BF16`` or Accelerate's variable)."""
    environ = os.environ if environ is None else environ
    return env.parse_flag(environ.get(DOWNCAST_BF16)) or bool(environ.get("ACCELERATE_DOWNCAST_BF16"))


def _tree_to_cpu(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.detach().cpu()
    if isinstance(data, dict):
        return {k: _tree_to_cpu(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(_tree_to_cpu(v) for v in data)
    return data


class XlaStrategy(Strategy):
    """Replicas of the model on every XLA device, gradients averaged by XLA collectives.

    downcast_bf16: with ``mixed_precision="bf16"``, store float32 tensors as bfloat16 on the
        device too (default: ``ACCEL_XLA_DOWNCAST_BF16``).

    Attributes:
        spmd: the SPMD mesh and the shardings marked on it when the layout shards (``dp_shard`` /
            ``tp`` above 1), else None.

    Example::

        accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
        # SPMD: one process, parameters sharded over 4 devices (FSDPv2), 2 x 2 with tensor parallelism
        accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan=plan))
    """

    name: ClassVar[str] = "xla"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "bf16")

    def __init__(self, downcast_bf16: bool | None = None, xla: TorchXla | None = None) -> None:
        super().__init__()
        self.downcast_bf16 = downcast_requested() if downcast_bf16 is None else bool(downcast_bf16)
        self._xla = xla
        # Gradients already averaged since the last optimizer step (by clipping), by identity.
        self._reduced: set[int] = set()
        self._spmd_layout: ParallelismConfig | None = None
        self.spmd: SpmdMesh | None = None

    @property
    def xla(self) -> TorchXla:
        """torch_xla's modules (imported on first use, with the install command when missing)."""
        if self._xla is None:
            self._xla = require_torch_xla()
        return self._xla

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> XlaStrategy:
        """The xla strategy takes no plugin; ``downcast_bf16`` comes from the settled variables."""
        if plugin is not None:
            raise TypeError(f"The xla strategy takes no plugin, got {type(plugin).__name__}.")
        return cls(downcast_bf16=downcast_requested(settings.environ))

    # -- layout and precision ------------------------------------------------------------------
    def parallelism(
        self, requested: ParallelismConfig | None, settings: RunSettings
    ) -> tuple[ParallelismConfig, DeviceMesh | None]:
        """Replicas over processes; or, when ``dp_shard`` / ``tp`` is above 1, SPMD: this one process drives every
        device, the device layout is kept here (``spmd``) and core sees one process reading whole batches.

        SPMD starts the runtime in SPMD mode (``xr.use_spmd()``) to count the devices (``CPU_NUM_DEVICES`` on XLA's
        CPU device), before anything is placed on them."""
        if not spmd_requested(requested, settings.environ):
            return super().parallelism(requested, settings)
        check_one_process(settings.world_size)
        self._prepare_runtime_environment(settings)
        xr = self.xla.xr
        xr.use_spmd()
        devices = int(xr.global_runtime_device_count())
        self._spmd_layout = resolve_spmd_layout(requested, devices, settings.world_size, settings.environ)
        return process_layout(requested), None

    def check_parallelism(self, config: ParallelismConfig) -> None:
        """The replica layout (one replica per process): ``dp_replicate`` only. ``dp_shard`` / ``tp`` run as SPMD
        (``parallelism``); ``cp`` and ``pp`` have no XLA form here."""
        others = [f"{dim}_size={config.size(dim)}" for dim in ("dp_shard", "cp", "tp", "pp") if config.size(dim) > 1]
        if others:
            raise ValueError(
                f"{', '.join(others)}: over processes the xla strategy runs replicas only (dp_replicate); dp_shard and "
                "tp run as SPMD in one process driving every device (ParallelismConfig(dp_shard_size=..., tp_size=...) "
                "with one process), and cp / pp are not available in accel-xla. Drop those sizes."
            )

    def make_precision(self, name: str, context: PrecisionContext) -> Precision:
        """Core's precisions; ValueError when ``downcast_bf16`` is asked for without ``mixed_precision="bf16"``."""
        if self.downcast_bf16 and name != "bf16":
            raise ValueError("Can only use `downcast_bf16` when using `mixed_precision='bf16'` and on a TPU")
        return default_precision(name, context)

    # -- processes ------------------------------------------------------------------------------
    def _prepare_runtime_environment(self, settings: RunSettings) -> None:
        """Sets what torch-xla reads when its runtime starts, so before anything touches the device:
        ``PJRT_DEVICE`` from ``ACCEL_XLA_DEVICE`` (the config file's ``xla: device:``; the --xla-device flag sets
        ``PJRT_DEVICE`` itself) and ``XLA_DOWNCAST_BF16`` when downcasting.

        The one place accel-xla writes ``os.environ``: torch-xla reads both only from there (its own
        ``runtime.set_device_type`` writes ``PJRT_DEVICE`` the same way), and they must outlast the set-up (the
        runtime starts at the first device use)."""
        device = settings.environ.get(DEVICE)
        if device and not settings.environ.get("PJRT_DEVICE"):
            os.environ["PJRT_DEVICE"] = device.upper()
        if self.downcast_bf16:
            os.environ["XLA_DOWNCAST_BF16"] = "1"

    def setup_environment(self, settings: RunSettings, **kwargs: Any) -> ProcessPlacement:
        """Joins the ``xla`` group where torchrun started several processes; PJRT places this process."""
        self.init_process_group(settings, **kwargs)
        return self.process_placement()

    def init_process_group(self, settings: RunSettings | None = None, **kwargs: Any) -> None:
        """Joins torch.distributed's ``xla`` backend when torchrun started several processes.

        settings: the run's settled record (settled here from the environment when not given). Sets
        ``XLA_DOWNCAST_BF16`` first when downcasting, before the runtime creates any tensor.
        """
        settings = settings if settings is not None else settle(os.environ)
        self._prepare_runtime_environment(settings)
        _ = self.xla  # a missing or mismatched torch-xla fails here, before any process joins
        if settings.world_size > 1:
            import torch.distributed as dist

            if not dist.is_initialized():
                import importlib

                importlib.import_module("torch_xla.distributed.xla_backend")  # registers the "xla" backend
                dist.init_process_group("xla", init_method="xla://", **kwargs)

    def process_placement(self) -> ProcessPlacement:
        """This process's place as PJRT reports it, with XLA collectives."""
        xr = self.xla.xr
        device = self.xla.torch_xla.device()
        local_world = max(int(xr.local_process_count()), 1)
        return ProcessPlacement(
            device=device,
            world_size=int(xr.world_size()),
            rank=int(xr.global_ordinal()),
            local_rank=int(xr.local_ordinal()),
            local_world_size=max(local_world * int(xr.addressable_device_count()), 1),
            backend="xla",
            collectives=XlaCollectives(self.xla),
        )

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.XLA

    def setup(self, context: StrategyContext) -> None:
        """Builds the SPMD mesh when the layout shards."""
        super().setup(context)
        if self._spmd_layout is not None:
            self.spmd = SpmdMesh.create(self._spmd_layout, self.xla)

    # -- models -----------------------------------------------------------------------------------
    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        """Places the model on the XLA device; under SPMD also marks its shardings (and wraps it in FSDPv2 when
        ``dp_shard > 1``): shardings live on device tensors, so the model is placed even without device placement."""
        model = super().prepare_model(model, device_placement)
        if self.spmd is None:
            return model
        if not on_device(model, self.context.device):
            model = model.to(self.context.device)
        return self.spmd.shard_model(model)

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module (inside FSDPv2 under SPMD with ``dp_shard > 1``)."""
        if self.spmd is not None and self.spmd.layout.dp_shard_enabled:
            import importlib

            fsdp = importlib.import_module("torch_xla.experimental.spmd_fully_sharded_data_parallel")
            if isinstance(model, fsdp.SpmdFullyShardedDataParallel):
                inner = model.module
                assert isinstance(inner, torch.nn.Module)  # FSDPv2's property, typed loosely by its __getattr__
                return inner
        return model

    # -- steps ------------------------------------------------------------------------------------
    def mark_step(self) -> None:
        """Runs the XLA graph recorded so far (``torch_xla.sync()``)."""
        self.xla.torch_xla.sync()

    def wrap_dataloader(self, dataloader: Any) -> XlaDeviceLoader:
        """The prepared loader read through torch-xla's ``MpDeviceLoader`` onto this process's device (under SPMD,
        each batch split along its first dimension over the ``dp_shard`` devices as it is uploaded)."""
        if self.spmd is None:
            return XlaDeviceLoader(dataloader, self.context.device, self.xla)
        return XlaDeviceLoader(dataloader, self.context.device, self.xla, input_sharding=self.spmd.batch_sharding())

    def _reduce(self, gradients: list[torch.Tensor]) -> None:
        pending = [g for g in gradients if id(g) not in self._reduced]
        world = self.state.num_processes
        if pending and world > 1:
            # In place on a list (xm.all_reduce of a single tensor would return a new one).
            self.xla.xm.all_reduce("sum", pending, scale=1.0 / world)
        self._reduced.update(id(g) for g in pending)

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Averages over the replicas the gradients of ``optimizer``'s parameters not averaged yet (clipping does
        it first); called by the prepared optimizer right before a real step."""
        gradients = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._reduce(gradients)
        self._reduced.clear()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """Averages the gradients over the replicas first (the norm is the global one), then clips."""
        parameters = list(parameters)
        self._reduce([p.grad for p in parameters if p.grad is not None])
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        """Averages the gradients over the replicas first, then clips each value."""
        parameters = list(parameters)
        self._reduce([p.grad for p in parameters if p.grad is not None])
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # -- state ------------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The state dict of the user's module (as ``model``'s record holds it: outside FSDPv2 and ``torch.compile``'s
        wrapper, so its own keys) on the CPU; the pending step runs first."""
        self.mark_step()
        return _tree_to_cpu(self.context.prepared.record_for(model, self.unwrap_model).module.state_dict())

    def save_sharded(
        self, prepared: PreparedObjects, folder: str, *, io: CheckpointIO, **kwargs: Any
    ) -> Collection[str]:
        """Writes ``model_<i>.bin`` and ``optimizer_<i>.bin`` into ``folder`` with ``xm.save`` (CPU copies, by the
        master ordinal of the whole job; whole tensors under SPMD), after running the pending step, and each
        process's XLA RNG seed. A model's file holds its record's module (the user's module, outside FSDPv2 and
        ``torch.compile``'s wrapper): the model's own keys, loadable whether or not the next run compiles it.
        ``io`` (accel-checkpoint's services) is not needed: torch-xla writes the files."""
        if kwargs:
            raise TypeError(f"save_state: the xla strategy takes no save options, got {sorted(kwargs)}.")
        self.mark_step()
        xm = self.xla.xm
        if self.state.is_main_process:
            os.makedirs(folder, exist_ok=True)
        for i, record in enumerate(prepared.records):
            xm.save(record.module.state_dict(), os.path.join(folder, f"model_{i}.bin"), global_master=True)
        for i, optimizer in enumerate(prepared.optimizers):
            xm.save(optimizer.state_dict(), os.path.join(folder, f"optimizer_{i}.bin"), global_master=True)
        self.state.wait_for_everyone()
        # Last: every step marked advances XLA's seed, so it is read after the steps saving marks.
        rng_file = os.path.join(folder, RNG_FILE.format(process=self.state.process_index))
        with open(rng_file, "w") as handle:
            json.dump({"seed": int(xm.get_rng_state(self.context.device))}, handle)
        return {"models", "optimizers"}

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Loads what ``save_sharded`` wrote: weights into the models, state into the optimizers (onto the device,
        sharded again under SPMD), and this process's XLA RNG seed (when the checkpoint has it).

        allow_unsafe_pickle: read the files with full pickle (``load_state(..., allow_unsafe_pickle=True)``);
            by default only tensors and plain values load.
        """
        safe = not allow_unsafe_pickle
        for i, record in enumerate(prepared.records):
            state = torch.load(os.path.join(folder, f"model_{i}.bin"), map_location="cpu", weights_only=safe)
            # Checkpoints of a compiled model written before accel-xla read the record hold its keys under
            # torch.compile's "_orig_mod." prefix: read as the module's own keys, they load into either form.
            consume_prefix_in_state_dict_if_present(state, COMPILED_PREFIX)
            record.module.load_state_dict(state)
        for i, optimizer in enumerate(prepared.optimizers):
            state = torch.load(os.path.join(folder, f"optimizer_{i}.bin"), map_location="cpu", weights_only=safe)
            optimizer.load_state_dict(state)
            if self.spmd is not None:
                self.spmd.reshard_optimizer_state(optimizer)
        self.mark_step()
        # After the step marked above (it advances XLA's seed), so the next draw is the one after save_state.
        rng_file = os.path.join(folder, RNG_FILE.format(process=self.state.process_index))
        if os.path.isfile(rng_file):  # checkpoints written before accel-xla saved it have none
            with open(rng_file) as handle:
                self.xla.xm.set_rng_state(int(json.load(handle)["seed"]), self.context.device)
