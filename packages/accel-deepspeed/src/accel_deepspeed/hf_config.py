"""``HfDeepSpeedConfig``: a DeepSpeed config that code outside the training loop can query (Accelerate's class of the
same name, which transformers subclasses for its ``Trainer`` and keeps a weak reference to, so that
``from_pretrained`` knows ZeRO-3 is on before any engine exists). No torch or deepspeed import.

Example::

    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    config.is_zero3(), config.is_offload()         # True, True
    config.get_value("zero_optimization.stage")    # 3
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
import os
from collections.abc import Mapping
from typing import Any

from .config import find_node, load_config

OFFLOAD_DEVICES = ("cpu", "nvme")


def _read(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """The config from a dict (deep-copied: the caller's stays as given), a JSON file, a JSON string, or a
    URL-safe base64 JSON string (how launchers pass a config in an environment variable)."""
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    if os.path.exists(source):
        return load_config(source)
    text = os.fspath(source)
    try:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = json.loads(base64.urlsafe_b64decode(text).decode("utf-8"))
    except (UnicodeDecodeError, binascii.Error, ValueError):
        raise ValueError(
            "Expected a string path to an existing deepspeed config, or a dictionary, or a base64 encoded string. "
            f"Received: {text}"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"A DeepSpeed config is a JSON object; got {type(data).__name__} from {text!r}.")
    return data


class HfDeepSpeedConfig:
    """A DeepSpeed config (``config``, a dict) with questions about it: ``get_value("a.b")``, ``is_zero3()``,
    ``is_offload()``.

    config_file_or_dict: a dict (copied), the path of a JSON file, a JSON string or a base64-encoded one.
    The ZeRO stage and the offload answer are read once, here (``set_stage_and_offload`` reads them again
    after the dict was changed).
    """

    def __init__(self, config_file_or_dict: str | os.PathLike[str] | Mapping[str, Any]) -> None:
        self.config: dict[str, Any] = _read(config_file_or_dict)
        self._stage: int = -1
        self._offload = False
        self.set_stage_and_offload()

    def set_stage_and_offload(self) -> None:
        """Reads the ZeRO stage (-1 when not set) and whether ZeRO-2/3 offloads parameters or optimizer state to the
        CPU or NVMe."""
        self._stage = self.get_value("zero_optimization.stage", -1)
        self._offload = False
        if self.is_zero2() or self.is_zero3():
            devices = {
                self.get_value("zero_optimization.offload_optimizer.device"),
                self.get_value("zero_optimization.offload_param.device"),
            }
            self._offload = any(device in OFFLOAD_DEVICES for device in devices)

    def find_config_node(self, ds_key_long: str) -> tuple[dict[str, Any] | None, str]:
        """The dict holding the last part of the dotted key, and that part; ``(None, part)`` when a parent is
        missing."""
        return find_node(self.config, ds_key_long)

    def get_value(self, ds_key_long: str, default: Any = None) -> Any:
        """The value at the dotted key (``"zero_optimization.stage"``), or ``default`` when it is not set."""
        node, key = self.find_config_node(ds_key_long)
        return default if node is None else node.get(key, default)

    def del_config_sub_tree(self, ds_key_long: str, must_exist: bool = False) -> None:
        """Removes the entry at the dotted key; a missing one is ignored unless ``must_exist`` (then ValueError)."""
        node, key = self.find_config_node(ds_key_long)
        if node is None or key not in node:
            if must_exist:
                raise ValueError(f"Can't find {ds_key_long} entry in the config: {self.config}")
            return
        node.pop(key)

    def is_true(self, ds_key_long: str) -> bool:
        """True only when the value is set and true (False when it is false or not set)."""
        value = self.get_value(ds_key_long)
        return False if value is None else bool(value)

    def is_false(self, ds_key_long: str) -> bool:
        """True only when the value is set and false (False when it is true or not set)."""
        value = self.get_value(ds_key_long)
        return False if value is None else not bool(value)

    def is_zero2(self) -> bool:
        """Whether the config asks for ZeRO stage 2."""
        return self._stage == 2

    def is_zero3(self) -> bool:
        """Whether the config asks for ZeRO stage 3 (parameters sharded: models are built under ``zero.Init``)."""
        return self._stage == 3

    def is_offload(self) -> bool:
        """Whether ZeRO-2/3 offloads optimizer state or parameters to the CPU or NVMe."""
        return self._offload
