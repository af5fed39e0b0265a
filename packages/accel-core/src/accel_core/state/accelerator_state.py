"""``AcceleratorState``: ``PartialState`` plus what the Accelerator chose (precision, distributed type, plugin)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import environment as env
from ..enums import DistributedType
from ..placement import ProcessPlacement
from ..settings import RunSettings
from .process_state import PartialState

if TYPE_CHECKING:  # for the annotations alone
    from torch.distributed.device_mesh import DeviceMesh

    from ..configuration import TorchDynamoPlugin
    from ..parallel.config import ParallelismConfig


class AcceleratorState(PartialState):
    """``PartialState`` plus what the Accelerator chose: mixed precision, how the processes train
    together (``distributed_type``) and the backend plugin the reference API exposes here.

    Only plain values are shared: the strategy lives in its Accelerator, not in process state.
    """

    def __init__(
        self,
        mixed_precision: str | None = None,
        cpu: bool = False,
        placement: ProcessPlacement | None = None,
        settings: RunSettings | None = None,
        **init_process_group_kwargs: Any,
    ) -> None:
        super().__init__(cpu=cpu, placement=placement, settings=settings, **init_process_group_kwargs)
        if "mixed_precision" not in self._shared_state or mixed_precision is not None:
            self.mixed_precision = mixed_precision or self.settings.get_str(env.MIXED_PRECISION, "no") or "no"

    @property
    def distributed_type(self) -> DistributedType:
        """What the Accelerator chose (FSDP, DEEPSPEED, ...) or a script assigned, else the process state's."""
        self._chosen("distributed_type")  # raises after a reset
        return super().distributed_type

    @distributed_type.setter
    def distributed_type(self, value: DistributedType | str) -> None:
        self._shared_state["chosen_distributed_type"] = DistributedType(value)

    def record_choice(
        self, distributed_type: DistributedType, plugins: dict[str, Any], setup: AcceleratorSetup
    ) -> None:
        """What an Accelerator decided: its distributed type, its backend plugin (``{"fsdp_plugin": p}``) and
        the rest of its setup the reference API reads here."""
        self._shared_state["chosen_distributed_type"] = distributed_type
        self._shared_state["plugins"] = dict(plugins)
        self._shared_state["setup"] = setup

    def _chosen(self, key: str) -> Any:
        if "mixed_precision" not in self._shared_state:  # every AcceleratorState() sets it: gone after a reset
            raise AttributeError(key)  # __getattr__ turns it into the error that names the reset
        return self._shared_state.get(key)

    @property
    def fsdp_plugin(self) -> Any:
        """The ``FullyShardedDataParallelPlugin`` of an FSDP run, else None."""
        return (self._chosen("plugins") or {}).get("fsdp_plugin")

    @property
    def deepspeed_plugin(self) -> Any:
        """The ``DeepSpeedPlugin`` of a DeepSpeed run, else None."""
        return (self._chosen("plugins") or {}).get("deepspeed_plugin")

    @property
    def megatron_lm_plugin(self) -> Any:
        """The ``MegatronLMPlugin`` of a Megatron run, else None."""
        return (self._chosen("plugins") or {}).get("megatron_lm_plugin")

    @property
    def is_fsdp2(self) -> bool:
        """Whether models are sharded with FSDP2 (``fully_shard``)."""
        plugin = self.fsdp_plugin
        return self.distributed_type == DistributedType.FSDP and plugin is not None and plugin.fsdp_version == 2

    def __repr__(self) -> str:
        text = f"{super().__repr__()}\nMixed precision type: {self.mixed_precision}\n"
        plugin = self.deepspeed_plugin
        return text + (f"ds_config: {plugin.deepspeed_config}\n" if plugin is not None else "")

    def _setup(self) -> AcceleratorSetup:
        return self._chosen("setup") or AcceleratorSetup()

    @property
    def deepspeed_plugins(self) -> Any:
        """The DeepSpeed plugin(s) as given to the Accelerator: a dict naming one, or the plugin; None without
        DeepSpeed."""
        return self._setup().deepspeed_plugins

    @property
    def dynamo_plugin(self) -> Any:
        """The Accelerator's ``TorchDynamoPlugin`` (None before an Accelerator exists)."""
        return self._setup().dynamo_plugin

    @property
    def parallelism_config(self) -> Any:
        """The Accelerator's resolved ``ParallelismConfig`` (None before an Accelerator exists)."""
        return self._setup().parallelism_config

    @property
    def device_mesh(self) -> Any:
        """The Accelerator's ``DeviceMesh`` (None for one process, or before an Accelerator exists)."""
        return self._setup().device_mesh

    def _require_deepspeed(self, what: str) -> None:
        if self.distributed_type != DistributedType.DEEPSPEED:
            raise ValueError(f"{what} needs DeepSpeed: create the Accelerator with a DeepSpeedPlugin.")

    def get_deepspeed_plugin(self, name: str) -> Any:
        """The DeepSpeed plugin given under ``name`` in ``Accelerator(deepspeed_plugins={name: plugin})``."""
        self._require_deepspeed("get_deepspeed_plugin")
        given = self.deepspeed_plugins
        if not isinstance(given, Mapping):
            raise ValueError(
                f"get_deepspeed_plugin({name!r}): the DeepSpeed plugin was not given a name (deepspeed_plugin=...): "
                "read `state.deepspeed_plugin`."
            )
        if name not in given:
            raise ValueError(f"get_deepspeed_plugin({name!r}): no plugin of that name; given: {sorted(given)}.")
        return given[name]

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        """Activates the plugin named ``name``. accel runs one DeepSpeed configuration per Accelerator, so
        this accepts only the plugin that is already active."""
        plugin = self.get_deepspeed_plugin(str(name))
        if plugin is not self.deepspeed_plugin:  # pragma: no cover - one plugin per Accelerator (arguments.py)
            raise ValueError(f"select_deepspeed_plugin({name!r}): accel runs one DeepSpeed configuration at a time.")

    @property
    def mixed_precision(self) -> str:
        """The precision the Accelerator runs in: ``"no"``, ``"fp16"``, ``"bf16"`` or ``"fp8"``."""
        return self._chosen("mixed_precision")

    @mixed_precision.setter
    def mixed_precision(self, value: str) -> None:
        self._shared_state["mixed_precision"] = value

    _known_attrs = PartialState._known_attrs | {
        "mixed_precision",
        "fsdp_plugin",
        "deepspeed_plugin",
        "megatron_lm_plugin",
        "is_fsdp2",
        "deepspeed_plugins",
        "dynamo_plugin",
        "parallelism_config",
        "device_mesh",
    }

    # What AcceleratorState adds to the shared state; the rest is PartialState's.
    _ACCELERATOR_KEYS = ("mixed_precision", "chosen_distributed_type", "plugins", "setup")

    @classmethod
    def has_accelerator_settings(cls) -> bool:
        """Whether an ``AcceleratorState()`` (an Accelerator) has recorded its settings in this process, asked without
        setting anything up. ``is_initialized()`` (inherited) answers for the process state, which a ``PartialState``
        alone sets up too."""
        return "mixed_precision" in cls._shared_state

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forgets what the Accelerator chose (tests only); the process state (device, process group)
        stays unless ``reset_partial_state``, as in Accelerate. An Accelerator made before the reset
        then refuses to work, with an error that says so."""
        if reset_partial_state:
            PartialState._reset_state()
            return
        for key in cls._ACCELERATOR_KEYS:
            cls._shared_state.pop(key, None)
        PartialState._resets += 1


@dataclass(frozen=True)
class AcceleratorSetup:
    """What an Accelerator set up that the reference API reads from ``AcceleratorState``."""

    dynamo_plugin: TorchDynamoPlugin | None = None
    parallelism_config: ParallelismConfig | None = None
    device_mesh: DeviceMesh | None = None
    deepspeed_plugins: Any = None
