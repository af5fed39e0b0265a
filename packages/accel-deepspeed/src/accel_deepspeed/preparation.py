"""Joint preparation: sort what ``prepare`` got, check it, complete the config, ``deepspeed.initialize``.

Everything that can be wrong with the objects or the config is checked before DeepSpeed is
called, and the checks only read what every process has, so a mistake raises the same error on
every process instead of leaving some of them waiting in a collective.

``prepare_jointly`` reads the strategy's context, plugin and current engine and returns what it
prepared (``JointPreparation``); it writes no field of the strategy, which keeps the engine record
it is handed. (It fills the plugin's DeepSpeed config in place, as the reference does: scripts and
transformers read the settled values from ``state.deepspeed_plugin.deepspeed_config``.)
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from accel_core.optimizer import AcceleratedOptimizer
from accel_core.optimizer_rebuild import track_step_calls
from accel_core.scheduler import AcceleratedScheduler
from accel_core.strategies import JointResult

from ._deepspeed import import_deepspeed
from .config import get_value, is_auto, is_enabled, remaining_auto
from .dummy import DummyOptim, DummyScheduler
from .ops import CPU_ADAM, load_op
from .wrappers import DeepSpeedOptimizerWrapper, DeepSpeedSchedulerWrapper

if TYPE_CHECKING:
    from accel_core.strategies import StrategyContext

    from .plugin import DeepSpeedPlugin

logger = logging.getLogger(__name__)

_SEVERAL_MODELS = (
    "You can't use same `Accelerator()` instance with multiple models when using DeepSpeed: one DeepSpeed engine "
    "trains one model. Models without trainable parameters (a frozen teacher) may be prepared alongside it. To train "
    "several models (a GAN), make them one torch.nn.Module with one optimizer (one parameter group per part)."
)


def is_deepspeed_scheduler(obj: Any) -> bool:
    """DeepSpeed's own LR schedule classes (WarmupLR, OneCycle, ...), which are not torch LRSchedulers."""
    if isinstance(obj, (LRScheduler, DummyScheduler)):
        return False
    module = type(obj).__module__ or ""
    if not module.startswith("deepspeed."):
        return False
    return type(obj).__name__ in import_deepspeed().runtime.lr_schedules.VALID_LR_SCHEDULES


def is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (LRScheduler, DummyScheduler)) or is_deepspeed_scheduler(obj)


def _trainable(model: torch.nn.Module) -> bool:
    return any(p.requires_grad for p in model.parameters())


@dataclass
class Sorted:
    """Indices of each kind of object in the list given to ``prepare``."""

    models: list[int] = field(default_factory=list)
    optimizers: list[int] = field(default_factory=list)
    schedulers: list[int] = field(default_factory=list)
    dataloaders: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class PreparedEngine:
    """What one ``deepspeed.initialize`` built; the strategy keeps it until its ``teardown``.

    engine: the DeepSpeed engine. config: the config it was built with (every "auto" filled; a copy).
    steps_in_backward: the optimizer came from the config and the script has no handle on it, so
        the strategy's ``backward`` steps the engine (nobody calls ``optimizer.step()``).
    owns_scheduler: the engine steps the LR scheduler itself (its checkpoint holds the scheduler).
    """

    engine: Any
    config: dict[str, Any]
    steps_in_backward: bool
    owns_scheduler: bool


@dataclass(frozen=True)
class JointPreparation:
    """What ``prepare_jointly`` returns.

    result: for the Accelerator (the replacements, and a config optimizer to register).
    engine: the engine built by this call; None when it built none (only frozen models were given).
    frozen_models: the models of this call that are only placed on the device (no trainable parameter).
    """

    result: JointResult
    engine: PreparedEngine | None
    frozen_models: tuple[torch.nn.Module, ...]


def sort_objects(objects: list[Any]) -> Sorted:
    found = Sorted()
    for i, obj in enumerate(objects):
        if isinstance(obj, torch.nn.Module):
            found.models.append(i)
        elif isinstance(obj, torch.optim.Optimizer):
            found.optimizers.append(i)
        elif is_scheduler(obj):
            found.schedulers.append(i)
        elif isinstance(obj, torch.utils.data.DataLoader):
            found.dataloaders.append(i)
    return found


def prepare_jointly(
    context: StrategyContext, plugin: DeepSpeedPlugin, current: PreparedEngine | None, objects: list[Any]
) -> JointPreparation:
    """The DeepSpeed strategy's ``prepare_objects``: one ``deepspeed.initialize`` (see the module docstring).

    ``current`` is the engine the strategy already holds (None before the first engine, and after its
    ``teardown``: ``free_memory``); a second trainable model next to it is refused."""
    engine_now = current.engine if current is not None else None
    result = list(objects)
    found = sort_objects(result)
    if found.optimizers or found.schedulers:
        if engine_now is not None:
            raise ValueError(
                "A DeepSpeed engine was already prepared: its optimizer and scheduler must be passed to the same "
                "prepare() call as its model."
            )
        if not found.models:
            raise ValueError(
                "DeepSpeed prepares a model together with its optimizer and scheduler: pass the model, optimizer and "
                "scheduler to the same prepare() call."
            )
    if len(found.optimizers) > 1 or len(found.schedulers) > 1:
        raise ValueError(
            f"Got {len(found.optimizers)} optimizers and {len(found.schedulers)} schedulers: a DeepSpeed engine has "
            f"one of each. {_SEVERAL_MODELS}"
        )
    trainable = [i for i in found.models if _trainable(result[i])]
    engine_index = _pick_engine_model(engine_now, result, found, trainable)

    if engine_index is None:
        frozen = _place_frozen(context, result, found.models)
        return JointPreparation(JointResult(result), None, frozen)

    optimizer = result[found.optimizers[0]] if found.optimizers else None
    scheduler = result[found.schedulers[0]] if found.schedulers else None
    config = build_config(context, plugin, result, found, result[engine_index], optimizer, scheduler)
    engine, ds_optimizer, ds_scheduler, optimizer = _initialize(config, result[engine_index], optimizer, scheduler)

    frozen = _place_frozen(context, result, [i for i in found.models if i != engine_index])
    result[engine_index] = engine
    wrapper = None
    extra: list[Any] = []
    if ds_optimizer is not None:
        wrapper = DeepSpeedOptimizerWrapper(ds_optimizer, engine)
        if found.optimizers:
            result[found.optimizers[0]] = wrapper
        else:
            extra.append(wrapper)  # a config optimizer: the script has no handle on it
    if found.schedulers:
        optimizers: list[AcceleratedOptimizer] = [wrapper] if wrapper is not None else []
        if ds_scheduler is not None:
            prepared: Any = DeepSpeedSchedulerWrapper(ds_scheduler, optimizers)
        else:
            prepared = AcceleratedScheduler(
                scheduler,
                optimizers,
                context.step_scheduler_with_optimizer,
                steps_per_optimizer_step=context.scheduler_steps_per_optimizer_step,
            )
        result[found.schedulers[0]] = prepared

    if context.plan.dynamo_backend != "no":
        engine.compile(backend=context.plan.dynamo_backend)
    prepared_engine = PreparedEngine(
        engine=engine,
        config=config,
        # A config optimizer that the script has no handle on: stepped from backward, as nobody calls step().
        steps_in_backward=ds_optimizer is not None and not found.optimizers,
        owns_scheduler=ds_scheduler is not None,
    )
    return JointPreparation(JointResult(result, extra_optimizers=extra), prepared_engine, frozen)


def _place_frozen(
    context: StrategyContext, objects: list[Any], model_indices: list[int]
) -> tuple[torch.nn.Module, ...]:
    """Frozen models are only placed on the device (the Accelerator registers every model in ``prepare`` order);
    returns them."""
    for i in model_indices:
        if context.device_placement:
            objects[i] = objects[i].to(context.device)
    return tuple(objects[i] for i in model_indices)


def _pick_engine_model(engine: Any, objects: list[Any], found: Sorted, trainable: list[int]) -> int | None:
    """Which model becomes the engine (None: only frozen models here); raises before anything is built.

    ``engine``: the one already prepared (None if none)."""
    if engine is not None and trainable:
        raise ValueError(_SEVERAL_MODELS)
    if found.optimizers:
        optimizer = objects[found.optimizers[0]]
        owned = {id(p) for p in _optimizer_params(optimizer)}
        owners = [i for i in found.models if any(id(p) in owned for p in objects[i].parameters())]
        if not owners:
            raise ValueError(
                "The optimizer's parameters belong to none of the models passed to prepare(): build the optimizer "
                "on model.parameters() of the model you prepare with it."
            )
        engine_index = owners[0]
    elif len(trainable) == 1:
        engine_index = trainable[0]
    elif not trainable:
        return None
    else:
        engine_index = trainable[0]
    if any(i != engine_index for i in trainable):
        raise ValueError(_SEVERAL_MODELS)
    return engine_index


def _optimizer_params(optimizer: Any) -> list[Any]:
    if isinstance(optimizer, DummyOptim):
        params: list[Any] = []
        for item in optimizer.params:
            params.extend(item["params"] if isinstance(item, dict) else [item])
        return params
    return [p for group in optimizer.param_groups for p in group["params"]]


def build_config(
    context: StrategyContext,
    plugin: DeepSpeedPlugin,
    objects: list[Any],
    found: Sorted,
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
) -> dict[str, Any]:
    """The engine's config: the plugin's, checked against the objects, with its "auto" values filled (in the
    plugin's config, as the reference does); returns a copy for the engine."""
    config = plugin.deepspeed_config
    _check_optimizer_and_scheduler(config, optimizer, scheduler)

    micro = _micro_batch_size(context, plugin, objects, found, config)
    steps = context.gradient_state.num_steps
    configured_steps = config.get("gradient_accumulation_steps")
    if not is_auto(configured_steps) and configured_steps is not None and int(configured_steps) != steps:
        logger.warning(
            "Updating DeepSpeed's gradient accumulation steps to %d (the Accelerator's) from %s (the DeepSpeed "
            "config). Pass Accelerator(gradient_accumulation_steps=%s) to keep the config's value.",
            steps,
            configured_steps,
            configured_steps,
        )
    config["gradient_accumulation_steps"] = steps
    values: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro,
        "train_batch_size": micro * steps * context.dims.dp.size,
        "gradient_clipping": 1.0,
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
    }
    hidden = _hidden_size(model)
    if hidden is not None:
        values.update(
            {
                "zero_optimization.reduce_bucket_size": hidden * hidden,
                "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
                "zero_optimization.stage3_param_persistence_threshold": 10 * hidden,
            }
        )
    if isinstance(optimizer, DummyOptim):
        values.update({"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay})
    if isinstance(scheduler, DummyScheduler):
        values.update(
            {
                "scheduler.params.warmup_min_lr": 0,
                "scheduler.params.warmup_max_lr": getattr(scheduler.optimizer, "lr", None),
                "scheduler.params.warmup_num_steps": scheduler.warmup_num_steps,
            }
        )
        if scheduler.total_num_steps is not None:
            # The engine steps its scheduler once per optimizer step; total_num_steps is counted as the
            # run's scheduler_stepping counts (per process by default, as Accelerate divides it).
            per_step = context.scheduler_steps_per_optimizer_step
            values["scheduler.params.total_num_steps"] = -(-scheduler.total_num_steps // per_step)
    plugin.deepspeed_config_process(must_match=False, **values)
    if isinstance(optimizer, torch.optim.Optimizer) and not isinstance(optimizer, DummyOptim):
        config["zero_allow_untested_optimizer"] = True

    left = remaining_auto(config)
    if left:
        raise ValueError(
            f'These DeepSpeed config values are "auto" but accel has nothing to fill them with: {", ".join(left)}. '
            "Give them values in the DeepSpeed config (or the matching DummyOptim / DummyScheduler arguments)."
        )
    expected = micro * steps * context.dims.dp.size
    # Absent is fine: DeepSpeed derives it from the micro batch, the accumulation and the processes.
    if config.get("train_batch_size") is not None and int(config["train_batch_size"]) != expected:
        raise ValueError(
            f"DeepSpeed config train_batch_size={config['train_batch_size']} but micro batch {micro} x accumulation "
            f'{steps} x {context.dims.dp.size} processes = {expected}. Set train_batch_size to "auto".'
        )
    return copy.deepcopy(config)


def _check_optimizer_and_scheduler(config: dict[str, Any], optimizer: Any, scheduler: Any) -> None:
    """The reference implementation's checks for an optimizer / scheduler both in the config and in the code."""
    if optimizer is not None:
        if "optimizer" in config and not isinstance(optimizer, DummyOptim):
            raise ValueError(
                "You cannot specify an optimizer in the config file and in the code at the same time. "
                "Please remove the optimizer from the config file or create `accel_deepspeed.DummyOptim` in the code."
            )
        if "optimizer" not in config and isinstance(optimizer, DummyOptim):
            raise ValueError("You cannot create a `DummyOptim` without specifying an optimizer in the config file.")
    if scheduler is not None:
        if "scheduler" in config and not isinstance(scheduler, DummyScheduler):
            raise ValueError(
                "You cannot specify a scheduler in the config file and in the code at the same time. Please remove the "
                "scheduler from the config file or create `accel_deepspeed.DummyScheduler` in the code."
            )
        if (
            "scheduler" not in config
            and isinstance(scheduler, DummyScheduler)
            and scheduler.lr_scheduler_callable is None
        ):
            raise ValueError(
                "You cannot create a `DummyScheduler` without specifying a scheduler in the config file "
                "(or pass `lr_scheduler_callable=` to DummyScheduler)."
            )
    if isinstance(optimizer, DummyOptim) and scheduler is not None and not isinstance(scheduler, DummyScheduler):
        raise ValueError(
            "You can only specify `accel_deepspeed.DummyScheduler` in the code when using `accel_deepspeed.DummyOptim`."
        )


def _micro_batch_size(
    context: StrategyContext, plugin: DeepSpeedPlugin, objects: list[Any], found: Sorted, config: dict[str, Any]
) -> int:
    loaders = [objects[i] for i in found.dataloaders] or list(context.prepared.dataloaders)
    sizes = [size for size in (_per_process_batch(loader, context.dims.dp.size) for loader in loaders) if size]
    configured = config.get("train_micro_batch_size_per_gpu")
    if not sizes:
        if configured is None or is_auto(configured):
            raise ValueError(
                "When using DeepSpeed `accelerator.prepare()` requires you to pass at least one of training or "
                "evaluation dataloaders or alternatively set an integer value in `train_micro_batch_size_per_gpu` in "
                "the deepspeed config file (DeepSpeedPlugin(hf_ds_config=...)) or in "
                "`plugin.deepspeed_config['train_micro_batch_size_per_gpu']`."
            )
        return int(configured)
    micro = min(sizes) if plugin.is_train_batch_min else max(sizes)
    if len(sizes) > 1:
        logger.info(
            "Several dataloaders: is_train_batch_min=%s picks micro batch size %d.",
            plugin.is_train_batch_min,
            micro,
        )
    if configured is not None and not is_auto(configured) and int(configured) != micro:
        logger.warning(
            "The DeepSpeed config says train_micro_batch_size_per_gpu=%s but the dataloaders give %d per process; "
            'DeepSpeed keeps the config\'s value (set it to "auto" to follow the dataloaders).',
            configured,
            micro,
        )
        return int(configured)
    return micro


def _per_process_batch(loader: Any, data_parallel_size: int) -> int | None:
    total = getattr(loader, "total_batch_size", None)
    if isinstance(total, int) and total > 0:
        return max(1, total // data_parallel_size)
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    if not isinstance(size, int):
        return None
    return max(1, size // data_parallel_size) if getattr(loader, "split_batches", False) else size


def _hidden_size(model: torch.nn.Module) -> int | None:
    model_config = getattr(model, "config", None)
    if model_config is None:
        return None
    sizes = getattr(model_config, "hidden_sizes", None)
    hidden = max(sizes) if sizes else getattr(model_config, "hidden_size", None)
    return hidden if isinstance(hidden, int) else None


def _initialize(
    config: dict[str, Any], model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> tuple[Any, Any, Any, Any]:
    deepspeed = import_deepspeed()
    kwargs: dict[str, Any] = {"model": model, "config": config}
    if isinstance(optimizer, DummyOptim):
        kwargs["model_parameters"] = optimizer.params
    elif optimizer is not None:
        optimizer = _offload_ready(config, optimizer, scheduler)
        kwargs["optimizer"] = optimizer
    if isinstance(scheduler, DummyScheduler) and "scheduler" not in config:
        kwargs["lr_scheduler"] = scheduler.lr_scheduler_callable
    elif scheduler is not None and is_deepspeed_scheduler(scheduler):
        kwargs["lr_scheduler"] = scheduler
    engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(**kwargs)
    return engine, ds_optimizer, ds_scheduler, optimizer


def _offload_ready(config: dict[str, Any], optimizer: torch.optim.Optimizer, scheduler: Any) -> torch.optim.Optimizer:
    """With optimizer offload DeepSpeed wants its CPU Adam: a torch Adam/AdamW is rebuilt as one, same groups.

    (DeepSpeed refuses other client optimizers with offload unless ``zero_force_ds_cpu_optimizer`` is false.)
    """
    device = get_value(config, "zero_optimization.offload_optimizer.device", "none")
    if device in ("cpu", "nvme"):
        load_op(CPU_ADAM)  # DeepSpeedCPUAdam's op, ours or DeepSpeed's: compiled the first time (minutes), announced
    forced = config.get("zero_force_ds_cpu_optimizer", True)
    if device not in ("cpu", "nvme") or not is_enabled(forced):
        return optimizer
    if not isinstance(optimizer, torch.optim.Adam) and not isinstance(optimizer, torch.optim.AdamW):
        return optimizer
    defaults = optimizer.defaults
    if defaults.get("amsgrad"):
        raise ValueError(
            "Optimizer offload runs Adam with DeepSpeedCPUAdam, which has no amsgrad: drop amsgrad=True, or set "
            '"zero_force_ds_cpu_optimizer": false in the DeepSpeed config to keep the torch optimizer (slower).'
        )
    if optimizer.state:
        logger.warning(
            "The optimizer already has state (it stepped before prepare); offload restarts it with DeepSpeedCPUAdam."
        )
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    adamw_mode = isinstance(optimizer, torch.optim.AdamW) or bool(defaults.get("decoupled_weight_decay", False))
    converted = DeepSpeedCPUAdam(
        optimizer.param_groups,
        lr=defaults["lr"],
        betas=defaults["betas"],
        eps=defaults["eps"],
        weight_decay=defaults["weight_decay"],
        adamw_mode=adamw_mode,
    )
    if isinstance(scheduler, LRScheduler) and scheduler.optimizer is optimizer:
        _rebind_scheduler(scheduler, converted)
    return converted


def _rebind_scheduler(scheduler: LRScheduler, optimizer: torch.optim.Optimizer) -> None:
    """Points a torch LR scheduler at ``optimizer`` (its param groups are replaced when a checkpoint loads).

    The scheduler's constructor wrapped its first optimizer's ``step`` to notice calls; the same
    wrapper goes on the new one, or torch warns that ``optimizer.step()`` was overridden.
    """
    track_step_calls(optimizer)
    scheduler.optimizer = optimizer
