"""Reading and filling a DeepSpeed config dict: dotted keys and ``"auto"`` values. No torch here.

A DeepSpeed config may say ``"auto"`` for values accel knows better at ``prepare`` time (batch
sizes, accumulation steps, precision, optimizer and scheduler parameters). ``fill_auto`` replaces
exactly those; ``remaining_auto`` lists what is still ``"auto"`` so the error can name it.

Example::

    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    fill_auto(config, {"train_micro_batch_size_per_gpu": 8, "zero_optimization.stage": 3})
    assert config == {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

AUTO = "auto"


def is_auto(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def find_node(config: Mapping[str, Any], dotted: str) -> tuple[Any, str]:
    """The mapping holding the last part of ``dotted`` and that part; ``(None, key)`` if a parent is missing."""
    *parents, key = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part) if isinstance(node, Mapping) else None
        if node is None:
            return None, key
    return (node if isinstance(node, Mapping) else None), key


def get_value(config: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    node, key = find_node(config, dotted)
    return default if node is None else node.get(key, default)


def set_value(config: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets ``dotted`` to ``value``, creating the parent mappings that are missing."""
    *parents, key = dotted.split(".")
    node = config
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[key] = value


def fill_auto(config: dict[str, Any], values: Mapping[str, Any]) -> None:
    """Replaces the ``"auto"`` entries among the dotted keys of ``values``; other entries are kept.

    A key absent from ``config`` is not added: DeepSpeed's own default then applies.
    """
    for dotted, value in values.items():
        node, key = find_node(config, dotted)
        if node is not None and is_auto(node.get(key)):
            node[key] = value


def walk(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf as ``(dotted key, value)``."""
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from walk(value, dotted + ".")
        else:
            yield dotted, value


def remaining_auto(config: Mapping[str, Any]) -> list[str]:
    return [dotted for dotted, value in walk(config) if is_auto(value)]


def is_enabled(value: Any) -> bool:
    """DeepSpeed's ``enabled`` switches may be booleans or the strings "true"/"false" (or "auto": not decided)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _unique_keys(pairs: list[tuple[str, Any]], path: str) -> dict[str, Any]:
    """A JSON object's pairs as a dict; a key given twice is refused (``json`` would keep the last one silently)."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"DeepSpeed config file {path}: key {key!r} is given twice in one object; keep one.")
        result[key] = value
    return result


def load_config(source: str | os.PathLike[str] | Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a config dict, or the JSON file at ``source`` (DeepSpeed's config format)."""
    if isinstance(source, Mapping):
        return json.loads(json.dumps(source))  # deep copy; also rejects what DeepSpeed could not read
    path = os.fspath(source)
    if not os.path.exists(path):
        raise ValueError(f"DeepSpeed config file {path} does not exist: give the path of a JSON file, or a dict.")
    if not os.path.isfile(path):  # a folder; a FIFO or a device would block or never end the read
        raise ValueError(
            f"DeepSpeed config file {path} is not a regular file: give the path of a JSON file, or a dict."
        )
    with open(path, encoding="utf-8") as handle:
        try:
            data = json.load(handle, object_pairs_hook=lambda pairs: _unique_keys(pairs, path))
        except json.JSONDecodeError as error:
            raise ValueError(f"DeepSpeed config file {path} is not valid JSON: {error}.") from None
        except RecursionError:
            raise ValueError(f"DeepSpeed config file {path} is nested too deeply to be a DeepSpeed config.") from None
    if not isinstance(data, dict):
        raise ValueError(f"DeepSpeed config file {path} must hold a JSON object, got {type(data).__name__}.")
    return data
