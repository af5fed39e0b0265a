"""``FullyShardedDataParallelPlugin``: the FSDP settings, as data, readable from ``ACCEL_FSDP_*`` variables.

Nothing here imports torch: ``accel launch`` and ``accel config`` may validate a plugin without it.
Torch objects (``MixedPrecisionPolicy``, ``ShardingStrategy``, modules) are accepted as values and
converted when the strategy wraps a model (``policies``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from accel_core import environment as env
from accel_core.settings import settle_environment

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
AUTO_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
STATE_DICT_TYPES = ("SHARDED_STATE_DICT", "FULL_STATE_DICT")
DEFAULT_MIN_NUM_PARAMS = 100_000_000


def _choice(value: Any, choices: tuple[str, ...], what: str) -> str:
    """Upper-cased name from a string, an enum member (``ShardingStrategy.FULL_SHARD``) or a 1-based index."""
    name = getattr(value, "name", value)
    if (isinstance(name, int) and not isinstance(name, bool)) or (isinstance(name, str) and name.strip().isdigit()):
        index = int(name)
        if not 1 <= index <= len(choices):
            raise ValueError(f"{what}={value!r}: a number must be between 1 and {len(choices)} ({', '.join(choices)}).")
        return choices[index - 1]
    if not isinstance(name, str) or name.strip().upper() not in choices:
        raise ValueError(f"{what}={value!r} is not one of {', '.join(choices)}.")
    return name.strip().upper()


def _names(value: Any) -> list[str] | None:
    """A list of class names from ``"A,B"``, ``["A", "B"]`` or classes."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [item.__name__ if isinstance(item, type) else str(item).strip() for item in items]
    return [n for n in names if n] or None


@dataclass
class FullyShardedDataParallelPlugin:
    """How the ``fsdp`` strategy shards a model. Pass it as ``Accelerator(fsdp_plugin=...)``.

    fsdp_version: 2 (``fully_shard``, default) or 1 (``FullyShardedDataParallel``).
    sharding_strategy: FULL_SHARD, SHARD_GRAD_OP (ZeRO-2: keep gathered parameters between forward
        and backward), HYBRID_SHARD (shard within a machine, replicate across machines),
        _HYBRID_SHARD_ZERO2, NO_SHARD (FSDP1 only). A 1-based index or a torch enum also works.
    reshard_after_forward: FSDP2; ``None`` derives it from ``sharding_strategy``.
    cpu_offload: keep sharded parameters (and their gradients and optimizer state) in CPU memory.
    auto_wrap_policy: which submodules become their own FSDP unit: TRANSFORMER_BASED_WRAP (classes
        named in ``transformer_cls_names_to_wrap``, else the model's ``_no_split_modules``),
        SIZE_BASED_WRAP (``min_num_params``), NO_WRAP (only the root), or an FSDP1-style callable
        ``policy(module, recurse, nonwrapped_numel) -> bool``. Default: transformer-based when class
        names are given, otherwise NO_WRAP.
    backward_prefetch / forward_prefetch / limit_all_gathers / use_orig_params: FSDP1 only
        (FSDP2 always prefetches the next unit and keeps the original parameters).
    mixed_precision_policy: a ``MixedPrecisionPolicy`` (FSDP2) / ``MixedPrecision`` (FSDP1), a dict
        ``{"param_dtype": "bf16", "reduce_dtype": "fp32", ...}`` or a dtype name. ``None`` follows the
        Accelerator: with ``mixed_precision="bf16"``/``"fp16"`` parameters are gathered in that dtype and
        gradients reduced in fp32; the sharded (master) parameters stay fp32.
    ignored_modules: modules (or a regex matched in full against module names) FSDP leaves alone:
        not sharded, and their gradients are not reduced.
    state_dict_type: what ``save_state`` writes: SHARDED_STATE_DICT (DCP, each process its shard;
        loads on any number of processes) or FULL_STATE_DICT (model as safetensors, optimizer gathered
        on process 0). ``None`` (the default, as in Accelerate) takes the kind of the state dict configs
        given (``FullStateDictConfig`` -> FULL_STATE_DICT), else SHARDED_STATE_DICT.
    state_dict_config / optim_state_dict_config: Accelerate's torch ``FullStateDictConfig`` /
        ``ShardedStateDictConfig`` (``Full``/``ShardedOptimStateDictConfig``), or dicts of their fields;
        ``None`` means the one ``state_dict_type`` implies. Their kind must match ``state_dict_type``.
        accel-fsdp, like Accelerate's ``save_state`` on several processes, gathers full state dicts to
        CPU memory on process 0 and writes sharded ones from where they are, whatever their
        ``offload_to_cpu`` / ``rank0_only`` say.
    sync_module_states: every process starts from process 0's parameters and buffers (FSDP2: scattered shard
        by shard once sharded, as with ``cpu_ram_efficient_loading``; FSDP1: broadcast before sharding).
    cpu_ram_efficient_loading: process 0 alone builds the real model, the others build it on the
        meta device; process 0's weights are then scattered shard by shard.
    activation_checkpointing: recompute the activations of each wrapped unit during backward.
    param_init_fn: called on every submodule of a model built on the meta device once its shard
        has memory (default: the module's ``reset_parameters()``).
    forward_methods: methods besides ``forward`` that use the parameters (``generate``): they
        gather them like ``forward`` does.
    device_mesh: a ``DeviceMesh`` to shard over (FSDP2) instead of the default one over all processes.

    Example::

        plugin = FullyShardedDataParallelPlugin(
            auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"],
            activation_checkpointing=True,
        )
        accelerator = Accelerator(fsdp_plugin=plugin, mixed_precision="bf16")
    """

    fsdp_version: int = 2
    sharding_strategy: Any = "FULL_SHARD"
    reshard_after_forward: bool | int | None = None
    cpu_offload: Any = False
    auto_wrap_policy: str | Callable[..., Any] | None = None
    transformer_cls_names_to_wrap: list[str] | str | None = None
    min_num_params: int | None = None
    backward_prefetch: Any = None
    forward_prefetch: bool = False
    mixed_precision_policy: Any = None
    ignored_modules: Iterable[Any] | str | None = None
    state_dict_type: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None
    limit_all_gathers: bool = True
    use_orig_params: bool = True
    sync_module_states: bool = False
    cpu_ram_efficient_loading: bool = False
    activation_checkpointing: bool = False
    param_init_fn: Callable[[Any], None] | None = None
    forward_methods: tuple[str, ...] = field(default=("generate",))
    device_mesh: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.fsdp_version, str) and self.fsdp_version.strip().isdigit():
            self.fsdp_version = int(self.fsdp_version)
        if self.fsdp_version not in (1, 2):
            raise ValueError(f"fsdp_version must be 1 or 2, got {self.fsdp_version!r}.")
        if str(getattr(self.sharding_strategy, "name", self.sharding_strategy)).strip().upper() == "HYBRID_SHARD_ZERO2":
            self.sharding_strategy = "_HYBRID_SHARD_ZERO2"  # Accelerate's spelling (FSDP_SHARDING_STRATEGY)
        self.sharding_strategy = _choice(self.sharding_strategy, SHARDING_STRATEGIES, "sharding_strategy")
        if self.fsdp_version == 2 and self.sharding_strategy == "NO_SHARD":
            raise ValueError(
                "sharding_strategy=NO_SHARD does not exist in FSDP2 (fully_shard always shards): use the DDP "
                "strategy for pure data parallelism, or fsdp_version=1."
            )
        if self.reshard_after_forward is not None and not isinstance(self.reshard_after_forward, (bool, int)):
            raise TypeError(
                f"reshard_after_forward must be a bool, an int or None, got {self.reshard_after_forward!r}."
            )
        self.transformer_cls_names_to_wrap = _names(self.transformer_cls_names_to_wrap)
        if self.auto_wrap_policy is None:
            self.auto_wrap_policy = "TRANSFORMER_BASED_WRAP" if self.transformer_cls_names_to_wrap else "NO_WRAP"
        elif not callable(self.auto_wrap_policy) or isinstance(self.auto_wrap_policy, str):
            self.auto_wrap_policy = _choice(self.auto_wrap_policy, AUTO_WRAP_POLICIES, "auto_wrap_policy")
        if self.min_num_params is not None and (not isinstance(self.min_num_params, int) or self.min_num_params < 0):
            raise ValueError(f"min_num_params must be a non-negative integer, got {self.min_num_params!r}.")
        if self.backward_prefetch is not None:
            self.backward_prefetch = _choice(self.backward_prefetch, BACKWARD_PREFETCH, "backward_prefetch")
        if self.state_dict_type is None:
            self.state_dict_type = self._state_dict_type_of_configs()
        self.state_dict_type = _choice(self.state_dict_type, STATE_DICT_TYPES, "state_dict_type")
        self._check_state_dict_configs()
        if isinstance(self.ignored_modules, str):
            try:
                re.compile(self.ignored_modules)
            except re.error as error:
                raise ValueError(
                    f"ignored_modules={self.ignored_modules!r} is not a valid regular expression: {error}."
                ) from None
        if isinstance(self.forward_methods, str):
            self.forward_methods = (self.forward_methods,)
        self.forward_methods = tuple(self.forward_methods or ())
        if self.cpu_ram_efficient_loading and self.fsdp_version == 1:
            self.sync_module_states = True  # FSDP1 scatters process 0's weights through sync_module_states

    @staticmethod
    def get_module_class_from_name(module: Any, name: str) -> type | None:
        """The class named ``name`` among ``module`` and its submodules, or None (as Accelerate's plugin offers it;
        ``accel_core.model_utils.get_module_class_from_name``)."""
        from accel_core.model_utils import get_module_class_from_name

        return get_module_class_from_name(module, name)

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Changes what ``save_state`` writes from now on (as in Accelerate); ``None`` reads
        ``ACCEL_FSDP_STATE_DICT_TYPE``, else FULL_STATE_DICT.

        Example: ``plugin.set_state_dict_type("SHARDED_STATE_DICT")``.
        """
        if state_dict_type is None:
            state_dict_type = env.get_str("ACCEL_FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT")
        self.state_dict_type = _choice(state_dict_type, STATE_DICT_TYPES, "state_dict_type")
        # Configs of the other kind described the previous type: the new type implies its own.
        kind = self.state_dict_type.split("_")[0].lower()
        for name in ("state_dict_config", "optim_state_dict_config"):
            config = getattr(self, name)
            if (
                config is not None
                and not isinstance(config, Mapping)
                and not type(config).__name__.lower().startswith(kind)
            ):
                setattr(self, name, None)

    def _state_dict_type_of_configs(self) -> str:
        # Scripts written for Accelerate pass FullStateDictConfig(...) without a type: they mean a full state dict.
        kinds = {
            type(config).__name__.lower().startswith("full")
            for config in (self.state_dict_config, self.optim_state_dict_config)
            if config is not None and not isinstance(config, Mapping)
        }
        if len(kinds) > 1:
            raise ValueError(
                "state_dict_config and optim_state_dict_config are of different kinds (one full, one sharded): pass "
                "both of one kind, or state_dict_type."
            )
        return "FULL_STATE_DICT" if kinds == {True} else "SHARDED_STATE_DICT"

    def _check_state_dict_configs(self) -> None:
        # Checked by name and fields: torch's config classes are not imported here.
        kind = self.state_dict_type.split("_")[0].lower()  # "full" or "sharded"
        for name in ("state_dict_config", "optim_state_dict_config"):
            config = getattr(self, name)
            if config is None:
                continue
            if isinstance(config, Mapping):
                unknown = set(config) - {"offload_to_cpu", "rank0_only", "_use_dtensor"}
                if unknown:
                    raise ValueError(f"{name} has unknown keys {sorted(unknown)}: use offload_to_cpu and rank0_only.")
                continue
            if not hasattr(config, "offload_to_cpu"):
                raise TypeError(f"{name} must be a torch.distributed.fsdp state dict config or a dict, got {config!r}.")
            if not type(config).__name__.lower().startswith(kind):
                raise ValueError(
                    f"{name}={type(config).__name__} does not match state_dict_type={self.state_dict_type}: pass a "
                    f"{'Full' if kind == 'full' else 'Sharded'}{'Optim' if name.startswith('optim') else ''}"
                    "StateDictConfig, or None."
                )

    @property
    def offload_params(self) -> bool:
        """Whether sharded parameters live in CPU memory (from a bool, ``CPUOffload`` or ``CPUOffloadPolicy``)."""
        value = self.cpu_offload
        if isinstance(value, bool) or value is None:
            return bool(value)
        return bool(getattr(value, "offload_params", True))

    @property
    def min_params(self) -> int:
        """The size-based wrap threshold: ``min_num_params``, or the default when unset."""
        return DEFAULT_MIN_NUM_PARAMS if self.min_num_params is None else self.min_num_params

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FullyShardedDataParallelPlugin:
        """The plugin described by the ``ACCEL_FSDP_*`` variables that ``accel launch`` writes.

        Option names follow Accelerate's ``fsdp_config`` keys without their ``fsdp_`` prefix
        (``ACCEL_FSDP_SHARDING_STRATEGY``, ``ACCEL_FSDP_OFFLOAD_PARAMS``, ``ACCEL_FSDP_VERSION``, ...).

        Example: ``ACCEL_FSDP_VERSION=1 ACCEL_FSDP_STATE_DICT_TYPE=FULL_STATE_DICT`` gives
        ``FullyShardedDataParallelPlugin(fsdp_version=1, state_dict_type="FULL_STATE_DICT")``.

        environ: the run's settled variables (``RunSettings.environ``); None settles this process's environment
        (``accel_core.settings.settle_environment``: ``accelerate launch``'s variables translated), as
        ``Accelerator()`` would.
        """
        if environ is None:
            environ = settle_environment().environ
        kwargs = env.parse_backend_options("fsdp", ENV_OPTIONS, environ, label="FSDP")
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as error:
            raise ValueError(f"The ACCEL_FSDP_* environment describes an invalid FSDP setup: {error}") from None

    def to_env(self) -> dict[str, str]:
        """The ``ACCEL_FSDP_*`` variables that rebuild this plugin in the launched processes (plain values only)."""
        result: dict[str, str] = {}
        defaults = type(self)()
        for f in fields(self):
            value = getattr(self, f.name)
            option = _ENV_NAME.get(f.name)
            if option is None or value == getattr(defaults, f.name) or (callable(value) and not isinstance(value, str)):
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, (list, tuple)):
                text = ",".join(map(str, value))
            elif isinstance(value, (str, int)):
                text = str(value)
            else:
                continue  # torch objects (policies, modules) do not travel through the environment
            result[f"ACCEL_FSDP_{option.upper()}"] = text
        return result


def _bool(raw: str) -> bool:
    return env.parse_flag(raw)


def _bool_or_int(raw: str) -> bool | int:
    stripped = raw.strip()
    if stripped.lstrip("-").isdigit() and stripped not in ("0", "1"):
        return int(stripped)
    return env.parse_flag(raw)


def _int(raw: str) -> int:
    text = raw.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)  # "1e8", as people write parameter counts
    except ValueError:
        raise ValueError("expected an integer") from None
    if not value.is_integer():
        raise ValueError("expected an integer")
    return int(value)


def _prefetch(raw: str) -> str | None:
    return raw.strip().upper() or None


def _mixed_precision(raw: str) -> Any:
    stripped = raw.strip()
    if stripped.startswith("{"):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise ValueError(f"not valid JSON ({error})") from None
        if not isinstance(value, dict):
            raise ValueError('expected a JSON object such as {"param_dtype": "bf16"}')
        return value
    return stripped or None


def _str_or_none(raw: str) -> str | None:
    return raw.strip() or None


# option (lower-case, as ``environment.backend_options`` returns it) -> (plugin field, parser)
ENV_OPTIONS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "version": ("fsdp_version", _int),
    "fsdp_version": ("fsdp_version", _int),
    "sharding_strategy": ("sharding_strategy", str.strip),
    "reshard_after_forward": ("reshard_after_forward", _bool_or_int),
    "offload_params": ("cpu_offload", _bool),
    "cpu_offload": ("cpu_offload", _bool),
    "auto_wrap_policy": ("auto_wrap_policy", str.strip),
    "transformer_layer_cls_to_wrap": ("transformer_cls_names_to_wrap", _str_or_none),
    "transformer_cls_names_to_wrap": ("transformer_cls_names_to_wrap", _str_or_none),
    "transformer_cls_to_wrap": ("transformer_cls_names_to_wrap", _str_or_none),
    "min_num_params": ("min_num_params", _int),
    "backward_prefetch": ("backward_prefetch", _prefetch),
    "backward_prefetch_policy": ("backward_prefetch", _prefetch),
    "forward_prefetch": ("forward_prefetch", _bool),
    "mixed_precision": ("mixed_precision_policy", _mixed_precision),
    "mixed_precision_policy": ("mixed_precision_policy", _mixed_precision),
    "ignored_modules": ("ignored_modules", _str_or_none),
    "state_dict_type": ("state_dict_type", str.strip),
    "limit_all_gathers": ("limit_all_gathers", _bool),
    "use_orig_params": ("use_orig_params", _bool),
    "sync_module_states": ("sync_module_states", _bool),
    "cpu_ram_efficient_loading": ("cpu_ram_efficient_loading", _bool),
    "activation_checkpointing": ("activation_checkpointing", _bool),
    "forward_methods": ("forward_methods", lambda raw: tuple(m.strip() for m in raw.split(",") if m.strip())),
}

# plugin field -> the option name ``to_env`` writes (the first one listed above)
_ENV_NAME: dict[str, str] = {}
for _option, (_field, _) in ENV_OPTIONS.items():
    _ENV_NAME.setdefault(_field, _option)
