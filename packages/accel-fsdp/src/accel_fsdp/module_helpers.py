"""Helpers frameworks call on a model before or after FSDP wraps it (Accelerate's ``accelerate.utils.fsdp_utils``)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from torch import nn


def get_parameters_from_modules(
    modules: Iterable[nn.Module] | str | None, model: nn.Module, device: Any
) -> set[nn.Parameter]:
    """The parameters of ``modules``: modules, or a regex matched in full against ``model``'s module names (as the
    plugin's ``ignored_modules``). Modules found by name are moved to ``device``, where FSDP, which leaves them alone,
    would not put them. None gives an empty set.

    Example::

        ignored = get_parameters_from_modules(plugin.ignored_modules, model, accelerator.device)
    """
    if modules is None:
        return set()
    if isinstance(modules, str):
        pattern = re.compile(modules)
        found = [module for name, module in model.named_modules() if pattern.fullmatch(name)]
        for module in found:
            module.to(device)
        modules = found
    return {parameter for module in modules for parameter in module.parameters()}
