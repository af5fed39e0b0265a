"""Constructor arguments in the reference API's shapes, turned into what accel uses.

``kwargs_handlers`` (known types applied, unknown ones warned about), ``deepspeed_plugins`` (one
plugin or a dict of named ones), ``dynamo_backend`` / ``dynamo_plugin`` and the dataloader
settings (``split_batches`` & co, or a ``dataloader_config``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from .. import environment as env
from ..configuration import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    ProfileKwargs,
    TorchDynamoPlugin,
)
from ..precision.fp8_recipes import RECIPE_HANDLERS

# The kwargs handler types accel applies.
APPLIED_HANDLERS: tuple[type[KwargsHandler], ...] = (
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    AutocastKwargs,
    ProfileKwargs,
    *RECIPE_HANDLERS,
)


def index_handlers(handlers: list[KwargsHandler] | None) -> dict[type, KwargsHandler]:
    """The handlers by type. A ``KwargsHandler`` of a type accel does not apply is left out with a
    warning (a script written for Accelerate still runs); anything else is a TypeError."""
    indexed: dict[type, KwargsHandler] = {}
    for handler in handlers or []:
        if not isinstance(handler, KwargsHandler):
            raise TypeError(
                f"Unsupported kwargs handler {handler!r}: it must be an accel KwargsHandler dataclass "
                "(import it from accel.utils, not from accelerate)."
            )
        if type(handler) in indexed:
            raise ValueError(f"You can only pass one `{type(handler).__name__}` in `kwargs_handlers`.")
        if not isinstance(handler, APPLIED_HANDLERS):
            warnings.warn(
                f"accel does not apply {type(handler).__name__} (it applies "
                f"{', '.join(t.__name__ for t in APPLIED_HANDLERS)}): it is ignored.",
                UserWarning,
                stacklevel=3,
            )
            continue
        indexed[type(handler)] = handler
    return indexed


def one_deepspeed_plugin(deepspeed_plugin: Any, deepspeed_plugins: Any) -> Any:
    """The single DeepSpeed plugin of ``deepspeed_plugin`` / ``deepspeed_plugins`` (a plugin or a
    dict of named plugins, as Accelerate takes them), or None.

    accel runs one DeepSpeed configuration per Accelerator: a dict naming several is refused.
    """
    if deepspeed_plugin is not None and deepspeed_plugins is not None:
        raise ValueError("You cannot pass in both `deepspeed_plugins` and `deepspeed_plugin`.")
    given = deepspeed_plugins if deepspeed_plugins is not None else deepspeed_plugin
    if not isinstance(given, Mapping):
        return given
    if len(given) == 0:
        raise ValueError("`deepspeed_plugins` is an empty dict: pass one DeepSpeedPlugin, or None.")
    if len(given) > 1:
        raise ValueError(
            f"`deepspeed_plugins` names {len(given)} DeepSpeed configurations ({', '.join(map(str, given))}); accel "
            "runs one DeepSpeed configuration per Accelerator, so it cannot switch between them with "
            "`state.select_deepspeed_plugin`. Pass one plugin (deepspeed_plugin=...), and prepare a model that needs "
            "another configuration (an inference-only reference model, say) without DeepSpeed."
        )
    return next(iter(given.values()))


def dynamo_settings(
    dynamo_backend: Any, dynamo_plugin: TorchDynamoPlugin | None, environ: Mapping[str, str]
) -> TorchDynamoPlugin | None:
    """The ``TorchDynamoPlugin`` to compile with: ``dynamo_plugin``, or one for ``dynamo_backend`` (its other fields
    from the settled ``environ``); None when neither is given (the plan then reads ``ACCEL_DYNAMO_BACKEND``)."""
    if dynamo_plugin is not None and dynamo_backend is not None:
        raise ValueError("You cannot pass in both `dynamo_plugin` and `dynamo_backend`, please only pass in one.")
    if dynamo_plugin is not None and not isinstance(dynamo_plugin, TorchDynamoPlugin):
        raise TypeError(f"`dynamo_plugin` must be an accel TorchDynamoPlugin, got {type(dynamo_plugin).__name__}.")
    if dynamo_backend is not None:
        return dynamo_plugin_for(dynamo_backend, environ)
    return dynamo_plugin


def dynamo_plugin_for(backend: Any, environ: Mapping[str, str]) -> TorchDynamoPlugin:
    """A ``TorchDynamoPlugin`` for ``backend`` whose unset fields come from the run's settled variables (``accel
    launch --dynamo_mode ...``, or ``accelerate launch``'s translated), not from ``os.environ``."""

    def given(name: str) -> bool | None:
        return env.flag(name, False, environ) if env.get_str(name, None, environ) is not None else None

    return TorchDynamoPlugin(
        backend=backend,
        mode=env.get_str(env.DYNAMO_MODE, None, environ),
        fullgraph=given(env.DYNAMO_USE_FULLGRAPH),
        dynamic=given(env.DYNAMO_USE_DYNAMIC),
        use_regional_compilation=env.flag(env.DYNAMO_USE_REGIONAL_COMPILATION, False, environ),
    )


def dataloader_settings(
    dataloader_config: DataLoaderConfiguration | None,
    split_batches: bool,
    dispatch_batches: bool | None,
    even_batches: bool,
) -> DataLoaderConfiguration:
    """``dataloader_config``, or one made of the three loose arguments; both at once is a ValueError."""
    if dataloader_config is None:
        return DataLoaderConfiguration(
            split_batches=split_batches, dispatch_batches=dispatch_batches, even_batches=even_batches
        )
    if (split_batches, dispatch_batches, even_batches) != (False, None, True):
        raise ValueError(
            "Pass split_batches / dispatch_batches / even_batches either directly or inside dataloader_config, not "
            "both."
        )
    return dataloader_config
