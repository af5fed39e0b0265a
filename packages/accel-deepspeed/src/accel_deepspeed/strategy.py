"""The ``deepspeed`` strategy: DeepSpeed ZeRO 1/2/3 behind the Accelerator's usual questions.

What it does differently from the base Strategy (see ``accel_core.strategies.base``):
``setup_environment`` (processes join through ``deepspeed.init_distributed``), ``prepare_objects``
(model + optimizer + scheduler go through one ``deepspeed.initialize``; the micro batch size comes
from the prepared dataloaders), ``owns_optimizer_step`` (the engine scales the loss by the
accumulation steps and steps at its boundaries), ``accepts_object`` (DeepSpeed's LR schedule objects
may be prepared); and the optional interface ``ShardedCheckpointing`` (the engine's own checkpoints).
A whole-engine strategy: DeepSpeed shards over all processes itself, so a layout with tensor, context
or pipeline parallelism, or with both replicas and shards, is refused.

Example::

    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True))
    with accelerator.strategy.zero3_init_context():
        model = BigModel()                     # built already partitioned over the processes
    model, optimizer, loader = accelerator.prepare(model, torch.optim.AdamW(model.parameters()), loader)
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from accel_core import environment as env
from accel_core.compat.env_utils import patch_environment
from accel_core.enums import DistributedType
from accel_core.parallel.config import ParallelismConfig
from accel_core.precision.modes import Precision, PrecisionContext
from accel_core.strategies import (
    JointResult,
    PreparedObjects,
    Strategy,
    StrategyContext,
)

from ._deepspeed import ds_accelerator, import_deepspeed
from .ops import SHM_COMM, load_op, without_loaded_op_message
from .plugin import DeepSpeedPlugin
from .precision import DeepSpeedPrecision

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from accel_core.checkpointing import CheckpointIO
    from accel_core.prepared_model import PreparedModel
    from accel_core.settings import RunSettings

    from .preparation import PreparedEngine

logger = logging.getLogger(__name__)


class DeepSpeedStrategy(Strategy):
    """Trains one model with a DeepSpeed engine; frozen models prepared with it are only placed on the device.

    After ``prepare``: ``engine`` is the DeepSpeed engine, ``deepspeed_config`` the config it was
    built with (every "auto" filled), ``frozen_models`` the models only placed, ``mixed_precision``
    what DeepSpeed computes in. The strategy keeps what ``prepare_jointly`` returned (a
    ``PreparedEngine``) until ``teardown`` (``free_memory``, or at exit) releases it.
    """

    name: ClassVar[str] = "deepspeed"
    supported_precisions: ClassVar[tuple[str, ...]] = ("no", "fp16", "bf16")
    data_parallel_dim: ClassVar[str] = "dp_shard"
    owns_optimizer_step: ClassVar[bool] = True  # the engine steps, zeroes and scales for accumulation

    def __init__(self, plugin: DeepSpeedPlugin | None = None) -> None:
        super().__init__()
        # Built by a script itself without a plugin: the ACCEL_DEEPSPEED_* of this process's settled record
        # (DeepSpeedPlugin.from_env settles it); the Accelerator's from_plugin hands over its own record's instead.
        self.plugin = plugin if plugin is not None else DeepSpeedPlugin.from_env()
        self._prepared: PreparedEngine | None = None  # set from what prepare_jointly returns; None after teardown
        self.frozen_models: list[torch.nn.Module] = []
        self.mixed_precision = "no"
        self._warned_clipping = False

    @classmethod
    def from_plugin(cls, plugin: Any, handlers: dict[type, Any], settings: RunSettings) -> DeepSpeedStrategy:
        """Built by accel-core: the user's ``deepspeed_plugin``, or one read from the settled ``ACCEL_DEEPSPEED_*``."""
        if plugin is None:
            return cls(DeepSpeedPlugin.from_env(settings.environ))
        if not isinstance(plugin, DeepSpeedPlugin):
            raise TypeError(
                f"`deepspeed_plugin` must be an accel_deepspeed.DeepSpeedPlugin, got {type(plugin).__name__}: "
                "from accel_deepspeed import DeepSpeedPlugin."
            )
        return cls(plugin)

    @property
    def distributed_type(self) -> DistributedType:
        return DistributedType.DEEPSPEED

    # -- what prepare built (read-only: only prepare_objects and teardown change it) ------------
    @property
    def engine(self) -> Any:
        """The DeepSpeed engine (None before ``prepare`` and after ``teardown``)."""
        return self._prepared.engine if self._prepared is not None else None

    @property
    def deepspeed_config(self) -> dict[str, Any] | None:
        """The config the engine was built with, every "auto" filled (None without an engine)."""
        return self._prepared.config if self._prepared is not None else None

    @property
    def steps_in_backward(self) -> bool:
        """Whether ``backward`` steps the engine (a config optimizer the script has no handle on)."""
        return self._prepared is not None and self._prepared.steps_in_backward

    @property
    def engine_owns_scheduler(self) -> bool:
        """Whether the engine steps the LR scheduler itself (and its checkpoint holds it)."""
        return self._prepared is not None and self._prepared.owns_scheduler

    def check_parallelism(self, config: ParallelismConfig) -> None:
        """DeepSpeed partitions over all processes itself: only a purely data-parallel layout fits."""
        refused = [f"{dim}_size={config.size(dim)}" for dim in ("tp", "cp", "pp") if config.size(dim) > 1]
        if config.dp_replicate_enabled and config.dp_shard_enabled:
            refused.append(
                f"dp_replicate_size={config.size('dp_replicate')} with dp_shard_size={config.size('dp_shard')}"
            )
        if refused:
            raise ValueError(
                f"The DeepSpeed strategy cannot honour {', '.join(refused)}: DeepSpeed ZeRO partitions over all "
                "processes with its own groups. Drop parallelism_config (or the --tp-size/--cp-size/... flags) with "
                "DeepSpeed, or use FSDP2 (fsdp_plugin) for tensor / context parallelism and HSDP on the mesh."
            )

    def make_precision(self, name: str, context: PrecisionContext) -> Precision:
        """What DeepSpeed computes in (the config's fp16/bf16 section wins over ``mixed_precision``): the engine
        applies it, so the Precision is a pass-through named after it."""
        self.mixed_precision = self.plugin.set_mixed_precision(name)
        return DeepSpeedPrecision(self.mixed_precision)

    # -- processes --------------------------------------------------------------------------
    def setup_environment(self, settings: RunSettings, **kwargs: Any) -> None:
        """Joins (or adopts) the process group through deepspeed.comm; a lone ``python train.py`` gets a group of
        one. The settled record places the process (torchrun's ``env://``, or rank 0's address for a job srun or
        mpirun started).

        DeepSpeed reads two variables itself, and only from ``os.environ``; they are written here and nowhere else
        (the strategy reads the record only: a ``DS_ACCELERATOR`` the user exported is in it, and wins).
        ``DS_ACCELERATOR=cpu`` (``ACCEL_USE_CPU``): deepspeed picks its accelerator once, when it is imported, so
        the variable is set for that import only and then restored. ``LOCAL_RANK`` (the record's, when the
        launcher did not set it: srun, mpirun, a lone process): the engine asserts it is there and ZeRO-3 reads
        it whenever it places a partition, so it stays set.
        """
        if settings.flag(env.USE_CPU) and "deepspeed" not in sys.modules and "DS_ACCELERATOR" not in settings.environ:
            with patch_environment(DS_ACCELERATOR="cpu"):
                deepspeed = import_deepspeed()
                ds_accelerator()  # chosen now, while the variable is set; deepspeed keeps the choice
        deepspeed = import_deepspeed()
        backend = kwargs.get("backend") or ds_accelerator().communication_backend_name()
        # deepspeed.comm builds its shared-memory op on the CPU the first time (minutes): announced, built once.
        load_op(SHM_COMM)
        os.environ.setdefault(env.LOCAL_RANK, str(settings.local_rank))  # DeepSpeed's engine and ZeRO-3 read it
        with without_loaded_op_message():
            self._init_distributed(deepspeed, backend, kwargs, settings)

    def _init_distributed(
        self, deepspeed: Any, backend: str | None, kwargs: dict[str, Any], settings: RunSettings
    ) -> None:
        """``deepspeed.init_distributed``: adopting a started group, joining the job's, or a group of one."""
        timeout = kwargs.get("timeout") or timedelta(minutes=30)
        if torch.distributed.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, verbose=False)
            return
        names = (env.RANK, env.WORLD_SIZE, env.MASTER_ADDR, env.MASTER_PORT)
        if settings.launcher == "torchrun" and all(name in settings.environ for name in names):
            deepspeed.init_distributed(  # torchrun's env:// (its agent's store), as torchrun set it
                dist_backend=backend,
                auto_mpi_discovery=False,
                timeout=timeout,
                init_method=kwargs.get("init_method"),
                verbose=False,
            )
        elif settings.rendezvous_url is not None:  # srun / mpirun / a PyTorchJob: the record's ranks, not env://
            deepspeed.init_distributed(
                dist_backend=backend,
                auto_mpi_discovery=False,
                timeout=timeout,
                init_method=kwargs.get("init_method") or settings.rendezvous_url,
                rank=settings.rank,
                world_size=settings.world_size,
                verbose=False,
            )
        else:
            deepspeed.init_distributed(
                dist_backend=backend,
                auto_mpi_discovery=False,
                timeout=timeout,
                verbose=False,
                init_method=f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
            )

    def setup(self, context: StrategyContext) -> None:
        super().setup(context)
        ds_device = torch.device(str(ds_accelerator().device_name(None))).type
        if ds_device != context.device.type:
            raise ValueError(
                f"DeepSpeed runs on {ds_device} but the Accelerator chose {context.device.type}. Pick one: "
                f"set DS_ACCELERATOR={context.device.type} (or ACCEL_USE_CPU=true for the CPU) before starting."
            )

    # -- preparation ------------------------------------------------------------------------
    def prepare_objects(self, objects: list[Any], prepare_separately: Callable[[list[Any]], list[Any]]) -> JointResult:
        """``deepspeed.initialize``: model, optimizer and scheduler in one engine (never one by one)."""
        from .preparation import prepare_jointly

        prepared = prepare_jointly(self.context, self.plugin, self._prepared, objects)
        if prepared.engine is not None:
            self._prepared = prepared.engine
        self.frozen_models = [*self.frozen_models, *prepared.frozen_models]
        return prepared.result

    def accepts_object(self, obj: Any) -> bool:
        """DeepSpeed's LR schedule objects (WarmupLR, OneCycle, ...) may be prepared."""
        from .preparation import is_deepspeed_scheduler

        return is_deepspeed_scheduler(obj)

    def prepare_model(self, model: torch.nn.Module, device_placement: bool) -> torch.nn.Module:
        raise ValueError(
            "With DeepSpeed, pass the model to accelerator.prepare() together with its optimizer (and scheduler and "
            "dataloaders): DeepSpeed builds the model and optimizer together."
        )

    def unwrap_model(self, model: torch.nn.Module) -> torch.nn.Module:
        engine_class = _engine_class()
        if engine_class is not None and isinstance(model, engine_class):
            return _engine_module(model)
        return model

    def listed_model(self, prepared: PreparedModel) -> torch.nn.Module:
        """The engine itself (DeepSpeed compiles it in place), as the reference lists it in ``_models`` and gives it to
        the save-state hooks; a frozen model as it is."""
        return prepared.wrapped

    # -- the training step ------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """The engine's backward: scales by the accumulation steps; reduces gradients at the boundary."""
        engine = self._require_engine()
        # The Accelerator decides the boundary (every N micro-steps, and at the end of the data).
        engine.set_gradient_accumulation_boundary(self.context.sync_gradients)
        engine.backward(loss, **kwargs)
        if self.steps_in_backward:
            engine.step()

    def clip_grad_norm_(
        self, parameters: Iterable[torch.nn.Parameter], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor | None:
        """DeepSpeed clips inside its step, to the config's ``gradient_clipping``; returns None (the norm is not known
        yet).

        Warns once when ``max_norm`` differs from the configured value, since it cannot be changed here.
        """
        configured = self.engine.gradient_clipping() if self.engine is not None else None
        if not self._warned_clipping and (not configured or float(configured) != float(max_norm) or norm_type != 2.0):
            self._warned_clipping = True
            logger.warning(
                "DeepSpeed clips gradients inside its step to its config's gradient_clipping (%s, L2 norm); "
                "clip_grad_norm_(max_norm=%s, norm_type=%s) cannot change that. Set "
                "DeepSpeedPlugin(gradient_clipping=%s) "
                'or "gradient_clipping" in the DeepSpeed config.',
                configured,
                max_norm,
                norm_type,
                max_norm,
            )
        return None

    def clip_grad_value_(self, parameters: Iterable[torch.nn.Parameter], clip_value: float) -> None:
        raise ValueError(
            "DeepSpeed does not support `clip_grad_value_`. Use `clip_grad_norm_` instead (set gradient_clipping)."
        )

    # -- state ------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, Any]:
        """The full state dict. Under ZeRO-3 it is gathered (collective: call it on every process) and
        returned on the main process, ``{}`` elsewhere."""
        engine_class = _engine_class()
        if self.engine is not None and model is self.engine.module:
            model = self.engine  # the unwrapped module: under ZeRO-3 only the engine can gather it
        if engine_class is None or not isinstance(model, engine_class):
            return model.state_dict()
        if model.zero_optimization_partition_weights():
            if not model.zero_gather_16bit_weights_on_model_save():
                raise ValueError(
                    "Cannot get 16bit model weights because `stage3_gather_16bit_weights_on_model_save` in DeepSpeed "
                    "config is False. To save the model weights in 16bit, set "
                    "`stage3_gather_16bit_weights_on_model_save` to True in DeepSpeed config file or set "
                    "`zero3_save_16bit_model=True` in DeepSpeedPlugin (ACCEL_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL=true). "
                    "To save the full checkpoint, use accelerator.save_state() and recover the weights with "
                    "DeepSpeed's zero_to_fp32.py."
                )
            state_dict = model._zero3_consolidated_16bit_state_dict()
            return dict(state_dict) if state_dict is not None else {}
        return _engine_module(model).state_dict()

    def save_sharded(self, prepared: PreparedObjects, folder: str, *, io: CheckpointIO, **kwargs: Any) -> Any:
        """``ShardedCheckpointing``: the engine's ``save_checkpoint`` (frozen models as plain files). Collective."""
        from .checkpointing import save_sharded

        state = self.context.state
        return save_sharded(self.engine, self.engine_owns_scheduler, state.is_main_process, prepared, folder, **kwargs)

    def load_sharded(
        self,
        prepared: PreparedObjects,
        folder: str,
        *,
        io: CheckpointIO,
        allow_unsafe_pickle: bool | None = None,
        **kwargs: Any,
    ) -> None:
        """Restores what ``save_sharded`` wrote (through a universal checkpoint for another process count), reading
        through ``io`` (its ``allow_unsafe_pickle`` is the resolved opt-in). Collective."""
        from .checkpointing import load_sharded

        load_sharded(self.engine, self.context.state.is_local_main_process, prepared, folder, io)

    # -- ZeRO-3 -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def zero3_init_context(self, enable: bool | None = None) -> Iterator[None]:
        """Modules built inside are partitioned over the processes as they are created (``deepspeed.zero.Init``).

        Active with ZeRO stage 3 and ``zero3_init_flag=True`` (or ``enable=True``); otherwise it does
        nothing, so the same script runs with any config.
        """
        enabled = self.plugin.zero3_init_flag if enable is None else enable
        if not enabled or not self.plugin.is_zero3:
            if enable and not self.plugin.is_zero3:
                logger.warning(
                    "zero3_init_context(enable=True) needs ZeRO stage 3 (this config: %s): not partitioning.",
                    self.plugin.zero_stage,
                )
            yield
            return
        deepspeed = import_deepspeed()
        with deepspeed.zero.Init(config_dict_or_path=self.plugin.zero3_init_config()):
            yield

    # -- lifecycle --------------------------------------------------------------------------
    def teardown(self) -> None:
        """Releases the engine: DeepSpeed's ``destroy`` (ZeRO's hooks and buffers), then CPU Adam's native state.

        Called by the Accelerator from ``free_memory`` and once at exit (``Strategy.teardown``); a
        second call finds nothing to release. The script may still hold the engine (its globals:
        ``model, optimizer, ... = accelerator.prepare(...)`` at module level), which Python frees only
        while finalizing modules, after every exit hook: the CPU Adam extension's C++ state destroyed
        then can abort the process (SIGABRT, "terminate called without an active exception") after a
        run that succeeded, so it is destroyed here, while the interpreter is whole.
        """
        prepared, self._prepared = self._prepared, None
        self.frozen_models = []
        if prepared is None:
            return
        prepared.engine.destroy()
        _destroy_native_optimizer_state(prepared.engine.optimizer)
        del prepared
        gc.collect()

    def _require_engine(self) -> Any:
        if self.engine is None:
            raise ValueError(
                "No DeepSpeed engine yet: accelerator.prepare() the model (with trainable parameters) and its "
                "optimizer before accelerator.backward()."
            )
        return self.engine

    def __repr__(self) -> str:
        return f"DeepSpeedStrategy(zero_stage={self.plugin.zero_stage}, mixed_precision={self.mixed_precision!r})"


def _destroy_native_optimizer_state(optimizer: Any) -> None:
    """Destroys the C++ state of DeepSpeed's CPU Adam inside ``optimizer`` (ZeRO's optimizer wraps the basic one)."""
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:
        seen.add(id(optimizer))
        # Not declared by DeepSpeed: DeepSpeedCPUAdam's native handle, and ZeRO's wrapped optimizer.
        native = getattr(optimizer, "ds_opt_adam", None)
        if native is not None:
            native.destroy_adam(optimizer.opt_id)
            del optimizer.ds_opt_adam  # its __del__ must not destroy it twice
        optimizer = getattr(optimizer, "optimizer", None)


def _engine_module(engine: DeepSpeedEngine) -> torch.nn.Module:
    # The engine keeps the user's model in ``module`` (set in its __init__, so typed through nn.Module.__getattr__).
    return cast(torch.nn.Module, engine.module)


def _engine_class() -> type[DeepSpeedEngine] | None:
    module = sys.modules.get("deepspeed")
    return getattr(module, "DeepSpeedEngine", None) if module is not None else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
