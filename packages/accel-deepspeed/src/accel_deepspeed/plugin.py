"""``DeepSpeedPlugin``: what the user (or the launcher's environment) says about DeepSpeed. No torch here.

Either a DeepSpeed config (a JSON file path or a dict, ``hf_ds_config``) or the simple fields; both
may be combined when they agree: a field fills the config's ``"auto"`` (or missing) entry and
contradicting an explicit entry is an error. The config is completed at ``prepare`` time by the
strategy (batch sizes, accumulation steps, precision, optimizer and scheduler parameters).

Example::

    plugin = DeepSpeedPlugin(zero_stage=3, offload_optimizer_device="cpu", zero3_save_16bit_model=True)
    plugin = DeepSpeedPlugin(hf_ds_config="ds_config.json")          # "auto" values are filled by accel
    plugin = DeepSpeedPlugin.from_env()                                # ACCEL_DEEPSPEED_* from `accel launch`
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from accel_core import environment as env
from accel_core.settings import settle_environment

from .config import fill_auto, get_value, is_auto, is_enabled, load_config, set_value

logger = logging.getLogger(__name__)

OFFLOAD_DEVICES = ("none", "cpu", "nvme")

# plugin field -> its place in the DeepSpeed config
FIELD_KEYS = {
    "zero_stage": "zero_optimization.stage",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}

# ACCEL_DEEPSPEED_<OPTION> -> (plugin field, kind). Accelerate's config keys, with "deepspeed_" dropped.
ENV_OPTIONS: dict[str, tuple[str, str]] = {
    "config_file": ("hf_ds_config", "str"),
    "zero_stage": ("zero_stage", "int"),
    "gradient_accumulation_steps": ("gradient_accumulation_steps", "int"),
    "gradient_clipping": ("gradient_clipping", "float"),
    "offload_optimizer_device": ("offload_optimizer_device", "str"),
    "offload_param_device": ("offload_param_device", "str"),
    "offload_optimizer_nvme_path": ("offload_optimizer_nvme_path", "str"),
    "offload_param_nvme_path": ("offload_param_nvme_path", "str"),
    "zero3_init_flag": ("zero3_init_flag", "bool"),
    "zero3_save_16bit_model": ("zero3_save_16bit_model", "bool"),
    "is_train_batch_min": ("is_train_batch_min", "bool"),
}
# Options of DeepSpeed's own multi-node launcher: accel always launches with torchrun.
LAUNCHER_ONLY_OPTIONS = ("multinode_launcher", "hostfile", "exclusion_filter", "inclusion_filter")

# DeepSpeed prints a line every `steps_per_print` steps; accel users log through trackers instead.
_QUIET_STEPS = 10**12


@dataclass
class DeepSpeedPlugin:
    """DeepSpeed settings for ``Accelerator(deepspeed_plugin=...)``.

    Args:
        hf_ds_config: a DeepSpeed config, as a JSON file path or a dict; ``"auto"`` values are
            filled at ``prepare``. Without it a config is built from the fields below.
        gradient_accumulation_steps: must agree with the Accelerator's (which wins, with a warning).
        gradient_clipping: max gradient norm; DeepSpeed clips inside its step (``clip_grad_norm_``
            cannot change it later).
        zero_stage: 0, 1, 2 or 3 (default 2 without a config).
        is_train_batch_min: with several dataloaders, the micro batch size is their smallest (True)
            or largest batch size.
        offload_optimizer_device: "none", "cpu" or "nvme".
        offload_param_device: "none", "cpu" or "nvme" (stage 3 only).
        offload_optimizer_nvme_path: the optimizer's folder for "nvme".
        offload_param_nvme_path: the parameters' folder for "nvme".
        zero3_init_flag: build models partitioned (``strategy.zero3_init_context()``), stage 3 only.
        zero3_save_16bit_model: gather the full weights under stage 3 for ``get_state_dict`` /
            ``save_model`` (DeepSpeed's ``stage3_gather_16bit_weights_on_model_save``).

    Example::

        Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=1.0))
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    deepspeed_config: dict[str, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._check_fields()
        if self.hf_ds_config is None:
            self.deepspeed_config = self._config_from_fields()
        else:
            self.deepspeed_config = load_config(self.hf_ds_config)
            self._merge_fields_into_config()
        self._read_fields_from_config()
        if self.zero3_init_flag and self.zero_stage != 3:
            logger.warning(
                "zero3_init_flag only applies to ZeRO stage 3 (this config uses stage %s): ignored.", self.zero_stage
            )
            self.zero3_init_flag = False

    # -- building ---------------------------------------------------------------------------
    def _check_fields(self) -> None:
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}.")
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value is not None:
                value = str(value).lower()
                if value not in OFFLOAD_DEVICES:
                    raise ValueError(
                        f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}, got {getattr(self, name)!r}."
                    )
                setattr(self, name, value)
        steps = self.gradient_accumulation_steps
        if steps is not None and not is_auto(steps) and (not isinstance(steps, int) or steps < 1):
            raise ValueError(
                f"gradient_accumulation_steps must be an integer >= 1, got {self.gradient_accumulation_steps!r}."
            )
        if (
            self.gradient_clipping is not None
            and not is_auto(self.gradient_clipping)
            and float(self.gradient_clipping) < 0
        ):
            raise ValueError(f"gradient_clipping must be >= 0 (0 turns clipping off), got {self.gradient_clipping!r}.")

    def _config_from_fields(self) -> dict[str, Any]:
        stage = 2 if self.zero_stage is None else self.zero_stage
        zero: dict[str, Any] = {
            "stage": stage,
            "offload_optimizer": {"device": self.offload_optimizer_device or "none"},
            "offload_param": {"device": self.offload_param_device or "none"},
            "stage3_gather_16bit_weights_on_model_save": bool(self.zero3_save_16bit_model),
        }
        for kind in ("optimizer", "param"):
            path = getattr(self, f"offload_{kind}_nvme_path")
            if path is not None:
                zero[f"offload_{kind}"]["nvme_path"] = path
        config: dict[str, Any] = {
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto"
            if self.gradient_accumulation_steps is None
            else self.gradient_accumulation_steps,
            "zero_optimization": zero,
            "steps_per_print": _QUIET_STEPS,
            # Recent DeepSpeed clips at 1.0 when the key is absent; like plain PyTorch, accel clips only when asked.
            "gradient_clipping": 0.0 if self.gradient_clipping is None else self.gradient_clipping,
        }
        return config

    def _merge_fields_into_config(self) -> None:
        """A field given alongside a config fills the config's "auto"/missing entry, or must agree with it."""
        source = self.hf_ds_config if isinstance(self.hf_ds_config, (str, os.PathLike)) else "dict"
        for name, dotted in FIELD_KEYS.items():
            value = getattr(self, name)
            if value is None or is_auto(value):
                continue
            current = get_value(self.deepspeed_config, dotted)
            if current is None or is_auto(current):
                set_value(self.deepspeed_config, dotted, value)
            elif _normalized(current) != _normalized(value):
                raise ValueError(
                    f"DeepSpeedPlugin({name}={value!r}) contradicts `{dotted}`: {current!r} in the DeepSpeed config "
                    f'({source}). Set it in one place: drop the argument, or change (or make "auto") the config entry.'
                )

    def _read_fields_from_config(self) -> None:
        """Fields report what the config says (the config is the source of truth from here on)."""
        config = self.deepspeed_config
        self.zero_stage = int(get_value(config, "zero_optimization.stage", 0) or 0)
        gas = get_value(config, "gradient_accumulation_steps")
        self.gradient_accumulation_steps = gas if isinstance(gas, int) else None
        clip = get_value(config, "gradient_clipping")
        self.gradient_clipping = None if clip is None or is_auto(clip) else float(clip)
        for name in ("offload_optimizer_device", "offload_param_device"):
            device = get_value(config, FIELD_KEYS[name])
            setattr(self, name, "none" if device is None or is_auto(device) else str(device).lower())
            if getattr(self, name) not in OFFLOAD_DEVICES:
                raise ValueError(f"`{FIELD_KEYS[name]}` must be one of {', '.join(OFFLOAD_DEVICES)}, got {device!r}.")
            kind = name.split("_")[1]
            if getattr(self, name) == "nvme" and not get_value(config, f"zero_optimization.offload_{kind}.nvme_path"):
                raise ValueError(f"Offloading the {kind} to nvme needs a folder: set offload_{kind}_nvme_path.")
        if self.offload_param_device != "none" and self.zero_stage != 3:
            raise ValueError(
                f"Parameter offload (offload_param_device={self.offload_param_device!r}) needs ZeRO stage 3; "
                f"this config uses stage {self.zero_stage}. Use zero_stage=3, or offload only the optimizer."
            )
        self.zero3_save_16bit_model = is_enabled(get_value(config, FIELD_KEYS["zero3_save_16bit_model"], False))

    # -- the environment from `accel launch` --------------------------------------------------
    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeepSpeedPlugin:
        """The plugin described by the ``ACCEL_DEEPSPEED_*`` variables (``accel launch --use-deepspeed ...``).

        environ: the run's settled variables (``RunSettings.environ``); None settles this process's environment
        (``accel_core.settings.settle_environment``), as ``Accelerator()`` would."""
        if environ is None:
            environ = settle_environment().environ
        kwargs: dict[str, Any] = {}
        for option, raw in env.backend_options("deepspeed", environ).items():
            if option in LAUNCHER_ONLY_OPTIONS:
                continue
            if option not in ENV_OPTIONS:
                logger.warning(
                    "ACCEL_DEEPSPEED_%s is not a DeepSpeed option accel knows (known: %s): ignored.",
                    option.upper(),
                    ", ".join(sorted(ENV_OPTIONS)),
                )
                continue
            name, kind = ENV_OPTIONS[option]
            value = _parse_env(f"ACCEL_DEEPSPEED_{option.upper()}", raw, kind)
            if value is not None:
                kwargs[name] = value
        return cls(**kwargs)

    # -- precision and "auto" values ----------------------------------------------------------
    def set_mixed_precision(self, mixed_precision: str) -> str:
        """Writes ``mixed_precision`` into the config's fp16/bf16 sections; returns the precision DeepSpeed will use.

        The config wins where it is explicit (a config with ``bf16.enabled: true`` trains in bf16
        even with ``mixed_precision="no"``); asking for the other 16-bit type is an error.
        """
        config = self.deepspeed_config
        if mixed_precision not in ("no", "fp16", "bf16"):
            raise ValueError(
                f"mixed_precision={mixed_precision!r} is not supported with DeepSpeed: use no, fp16 or bf16."
            )
        if mixed_precision != "no":
            other = "bf16" if mixed_precision == "fp16" else "fp16"
            if is_enabled(get_value(config, f"{other}.enabled")):
                raise ValueError(
                    f"`--mixed_precision` arg cannot be set to `{mixed_precision}` when `{other}` is set in the "
                    "DeepSpeed config file."
                )
        if mixed_precision == "fp16" and "fp16" not in config:
            # auto_cast: DeepSpeed casts floating inputs to fp16, so the training loop stays unchanged.
            config["fp16"] = {"enabled": True, "auto_cast": True}
        elif mixed_precision == "bf16" and "bf16" not in config:
            config["bf16"] = {"enabled": True}
        fill_auto(config, {"fp16.enabled": mixed_precision == "fp16", "bf16.enabled": mixed_precision == "bf16"})
        return self.effective_precision

    @property
    def effective_precision(self) -> str:
        """The precision the DeepSpeed config enables: "fp16", "bf16" or "no"."""
        if is_enabled(get_value(self.deepspeed_config, "fp16.enabled")):
            return "fp16"
        if is_enabled(get_value(self.deepspeed_config, "bf16.enabled")):
            return "bf16"
        return "no"

    def deepspeed_config_process(self, must_match: bool = False, **kwargs: Any) -> None:
        """Fills the config's ``"auto"`` values from ``kwargs`` (dotted keys, e.g. ``"optimizer.params.lr"``).

        must_match: also raise when an explicit config value differs from the one given.
        """
        if must_match:
            mismatches = [
                f"- ds {key}={current} vs accel {key}={value}"
                for key, value in kwargs.items()
                if (current := get_value(self.deepspeed_config, key)) is not None
                and not is_auto(current)
                and _normalized(current) != _normalized(value)
            ]
            if mismatches:
                raise ValueError(
                    "Please correct the following DeepSpeed config values that mismatch the values accel computed:\n"
                    + "\n".join(mismatches)
                    + '\nThe easiest fix is to set them to "auto" in the DeepSpeed config.'
                )
        fill_auto(self.deepspeed_config, kwargs)

    # -- ZeRO-3 ------------------------------------------------------------------------------
    @property
    def is_zero3(self) -> bool:
        """Whether the plugin asks for ZeRO stage 3."""
        return self.zero_stage == 3

    def zero3_init_config(self) -> dict[str, Any]:
        """The config for ``deepspeed.zero.Init``: batch-size "auto" values, unknown before prepare, set to 1."""
        import copy

        config = copy.deepcopy(self.deepspeed_config)
        for key in ("gradient_accumulation_steps", "train_micro_batch_size_per_gpu"):
            if key not in config or is_auto(config[key]):
                config[key] = 1
        if is_auto(config.get("train_batch_size")):
            del config["train_batch_size"]
        for section in ("fp16", "bf16"):
            if is_auto(get_value(config, f"{section}.enabled")):
                config[section]["enabled"] = False
        return config

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"DeepSpeedPlugin({shown})"


def _normalized(value: Any) -> Any:
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        try:
            return float(lowered)
        except ValueError:
            return lowered
    if isinstance(value, (bool, int, float)):
        return float(value) if not isinstance(value, bool) else value
    return value


def _parse_env(name: str, raw: str, kind: str) -> Any:
    text = raw.strip()
    if kind == "str":
        return text or None
    if kind == "bool":
        return env.parse_flag(text) if text else None
    if text.lower() in ("", "auto", "none"):
        return None
    try:
        return int(text) if kind == "int" else float(text)
    except ValueError:
        raise ValueError(
            f"Environment variable {name}={raw!r} must be {'an integer' if kind == 'int' else 'a number'}."
        ) from None
