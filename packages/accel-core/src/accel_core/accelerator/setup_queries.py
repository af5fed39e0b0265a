"""The Accelerator's read-only questions about its setup, under the reference API's names.

``SetupQueries`` is a base class of the Accelerator (with ``ProcessControl``): it sets the two fields
it reads besides ``state`` (``handlers``, ``dataloader_config``) and computes everything else from them.

Scripts branch on these (``if accelerator.is_fsdp2``, ``if accelerator.should_save_model``) or
read the settings back (``accelerator.non_blocking``, ``accelerator.ddp_handler``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..configuration import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
)
from ..enums import FP8BackendType
from ..precision.fp8_recipes import AORecipeKwargs, FP8RecipeKwargs, TERecipeKwargs, fp8_backend_of, fp8_recipe_handler

if TYPE_CHECKING:
    from ..settings import RunSettings
    from ..state import AcceleratorState

# Distributed types with one accelerator device per process (the reference's `multi_device` list;
# names accel has no backend for count too, so a comparison never depends on what is installed).
_MULTI_DEVICE = {
    "MULTI_GPU",
    "MULTI_XPU",
    "MULTI_NPU",
    "MULTI_MLU",
    "MULTI_SDAA",
    "MULTI_MUSA",
    "MULTI_HPU",
    "MULTI_NEURON",
}


class SetupQueries:
    """Base of the Accelerator: properties that describe the run, read from the process state, the kwargs
    handlers and the dataloader settings it is constructed with.

    handlers: the kwargs handlers given to the Accelerator, by type (``arguments.index_handlers``).
    dataloader_config: the ``DataLoaderConfiguration`` in use.
    """

    # The run's settled record (``accel_core.settings``), set by the Accelerator once it is assembled.
    _settings: RunSettings

    def __init__(self, handlers: dict[type, Any], dataloader_config: DataLoaderConfiguration) -> None:
        self.handlers = handlers
        self.dataloader_config = dataloader_config

    @property
    def _current_state(self) -> AcceleratorState:
        """The process's ``AcceleratorState``, refusing once it was reset after this Accelerator was made (provided
        by the Accelerator)."""
        raise NotImplementedError

    @property
    def deepspeed_plugin(self) -> Any:
        """The active ``DeepSpeedPlugin``, or None when the run does not use DeepSpeed."""
        return self._current_state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``)."""
        return self._current_state.is_fsdp2

    @property
    def multi_device(self) -> bool:
        """Whether several processes each drive an accelerator device (GPUs, XPUs, ...), not CPUs."""
        return self._current_state.use_distributed and str(self._current_state.distributed_type) in _MULTI_DEVICE

    @property
    def should_save_model(self) -> bool:
        """Whether this process writes model files: the first process of each machine, as in Accelerate
        when no parallelism config is given."""
        return self._current_state.is_local_main_process

    @property
    def use_seedable_sampler(self) -> bool:
        """Whether shuffled loaders use a ``SeedableRandomSampler``
        (``DataLoaderConfiguration(use_seedable_sampler=)``)."""
        return self.dataloader_config.use_seedable_sampler

    @property
    def non_blocking(self) -> bool:
        """Whether batches move to the device with ``non_blocking=True``
        (``DataLoaderConfiguration(non_blocking=)``)."""
        return self.dataloader_config.non_blocking

    @property
    def use_stateful_dataloader(self) -> bool:
        """Whether prepared loaders are torchdata ``StatefulDataLoader`` s
        (``DataLoaderConfiguration(use_stateful_dataloader=)``)."""
        return self.dataloader_config.use_stateful_dataloader

    # The kwargs handlers given to the constructor, under the reference's attribute names (None when not given).
    @property
    def ddp_handler(self) -> DistributedDataParallelKwargs | None:
        """The ``DistributedDataParallelKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(DistributedDataParallelKwargs)

    @property
    def scaler_handler(self) -> GradScalerKwargs | None:
        """The ``GradScalerKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(GradScalerKwargs)

    @property
    def init_handler(self) -> InitProcessGroupKwargs | None:
        """The ``InitProcessGroupKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(InitProcessGroupKwargs)

    @property
    def autocast_handler(self) -> AutocastKwargs | None:
        """The ``AutocastKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(AutocastKwargs)

    @property
    def profile_handler(self) -> ProfileKwargs | None:
        """The ``ProfileKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(ProfileKwargs)

    @property
    def fp8_recipe_handler(self) -> FP8RecipeKwargs | None:
        """The deprecated ``FP8RecipeKwargs`` given in ``kwargs_handlers``, or None."""
        return self.handlers.get(FP8RecipeKwargs)

    @property
    def ao_recipe_handler(self) -> AORecipeKwargs | None:
        """The ``AORecipeKwargs`` given, if any."""
        return self.handlers.get(AORecipeKwargs)

    @property
    def te_recipe_handler(self) -> TERecipeKwargs | None:
        """The ``TERecipeKwargs`` given, if any."""
        return self.handlers.get(TERecipeKwargs)

    @property
    def has_fp8_handler(self) -> bool:
        """Whether an fp8 recipe handler was given."""
        return fp8_recipe_handler(self.handlers) is not None

    @property
    def fp8_enabled(self) -> bool:
        """Whether models train in fp8 (``mixed_precision="fp8"`` on a device that runs it)."""
        return self._current_state.mixed_precision == "fp8"

    @property
    def fp8_backend(self) -> FP8BackendType:
        """The library fp8 runs on (``AO`` or ``TE``); ``NO`` when fp8 is off."""
        if not self.fp8_enabled:
            return FP8BackendType.NO
        return fp8_backend_of(self.handlers, self._settings.environ)
