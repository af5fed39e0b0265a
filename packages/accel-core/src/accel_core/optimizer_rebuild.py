"""Rebuilding an optimizer created before ``prepare`` on the model's new parameters.

Sharding (FSDP2's DTensors, FSDP1's flat or view parameters) and tensor parallelism replace the
model's parameters, so an optimizer built on the originals would update tensors the model no
longer uses. The new one has the same class, hyper-parameters and parameter groups, matched by
parameter name.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

logger = logging.getLogger("accel")

_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def clean_name(name: str) -> str:
    for prefix in _PREFIXES:
        name = name.replace(prefix, "")
    return name


class ParameterNames:
    """Remembers each original parameter's name, without keeping the (full-size) tensors alive."""

    def __init__(self) -> None:
        self._names: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def record(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            self._names[param] = clean_name(name)

    def name_of(self, param: torch.Tensor) -> str | None:
        return self._names.get(param)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyed by the identity of this process's tensors: meaningless in a copy, which starts empty.
        return (ParameterNames, ())


def _construct(
    cls: type[torch.optim.Optimizer], groups: list[dict[str, Any]], defaults: dict[str, Any]
) -> torch.optim.Optimizer:
    try:
        return cls(groups, **defaults)
    except TypeError:
        # Some optimizers store defaults their constructor does not take back (``differentiable`` in
        # older torch, derived values in third-party ones): keep only the constructor's arguments.
        accepted = inspect.signature(cls.__init__).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            raise
        return cls(groups, **{k: v for k, v in defaults.items() if k in accepted})


def track_step_calls(optimizer: torch.optim.Optimizer) -> None:
    """Wraps ``optimizer.step`` as a torch LR scheduler's constructor does, unless it is wrapped already.

    The scheduler checks through that wrapper that ``optimizer.step()`` ran before ``scheduler.step()``;
    an optimizer put in place of the one a scheduler was built on (rebuilt on new parameters, or
    converted by a backend) needs it too, or the scheduler warns that ``step`` was overridden.
    """
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    owner = weakref.ref(optimizer)  # the wrapper lives on the optimizer: no reference cycle
    function = cast("Callable[..., Any]", type(optimizer).step)

    # The marker attributes are torch's (LRScheduler.__init__ and its step-order check).
    @functools.wraps(function)
    def step(*args: Any, **kwargs: Any) -> Any:
        bound = cast(torch.optim.Optimizer, owner())  # alive: its own step is running
        bound._opt_called = True  # pyright: ignore[reportAttributeAccessIssue]
        return function(bound, *args, **kwargs)

    step._wrapped_by_lr_sched = True  # pyright: ignore[reportAttributeAccessIssue]
    optimizer.step = step


def parameter_ids(optimizer: torch.optim.Optimizer) -> set[int]:
    """The ids of the parameters ``optimizer`` updates (in any of its groups)."""
    return {id(p) for group in optimizer.param_groups for p in group["params"]}


def optimizer_owner(optimizer: torch.optim.Optimizer, models: Iterable[nn.Module]) -> nn.Module:
    """The model among ``models`` whose parameters ``optimizer`` updates (sharded optimizer state is keyed by
    its parameter names)."""
    ids = parameter_ids(optimizer)
    for model in models:
        if any(id(p) in ids for p in model.parameters()):
            return model
    raise ValueError(
        f"{type(optimizer).__name__} updates none of the prepared models' parameters, so its sharded state cannot be "
        "saved: prepare the model and its optimizer together (accelerator.prepare(model, optimizer))."
    )


def rebuild(
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    names: ParameterNames,
    *,
    flat: bool = False,
    announce: bool = True,
    log: logging.Logger = logger,
    who: str = "accel",
    stage_parameters: dict[str, torch.Tensor] | None = None,
) -> torch.optim.Optimizer:
    """The same optimizer on ``model``'s new parameters.

    flat: the new parameters are FSDP1 flat parameters (``use_orig_params=False``): groups cannot be
        kept, so everything goes in one group with the first group's hyper-parameters.
    announce: log what happened (on the main process), to ``log``, with messages starting ``who:``.
    stage_parameters: the parameters this process holds of a model split into pipeline stages, by
        their names in the whole model; parameters of other stages are left out (groups are kept,
        possibly empty, so that LR schedulers see the same groups on every stage).
    """
    cls = type(optimizer)
    if stage_parameters is not None:
        new_params = {clean_name(n): p for n, p in stage_parameters.items()}
    else:
        new_params = {clean_name(n): p for n, p in model.named_parameters()}
    if parameter_ids(optimizer) <= {id(p) for p in new_params.values()}:
        return optimizer  # built on the sharded parameters already
    if flat:
        if len(optimizer.param_groups) > 1 and announce:
            log.warning(
                "%s: %s has %d parameter groups, but FSDP1 with use_orig_params=False flattens parameters, so they "
                "become one group with the first group's hyper-parameters. Use use_orig_params=True to keep them.",
                who,
                cls.__name__,
                len(optimizer.param_groups),
            )
        hyper = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
        groups = [{**hyper, "params": list(model.parameters())}]
    else:
        groups = []
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                name = names.name_of(param)
                if stage_parameters is not None and name is not None and name not in new_params:
                    continue  # another pipeline stage's
                if name is None or name not in new_params:
                    raise ValueError(
                        f"{cls.__name__} updates a parameter that is not part of the model being prepared "
                        f"({name or tuple(param.shape)}). Use one optimizer per prepared model, or build the optimizer "
                        "after prepare(model) from model.parameters()."
                    )
                params.append(new_params[name])
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
    if optimizer.state and announce:
        log.warning(
            "%s: %s already has state (it stepped before prepare); the rebuilt optimizer starts fresh.",
            who,
            cls.__name__,
        )
    try:
        rebuilt = _construct(cls, groups, dict(optimizer.defaults))
    except TypeError as error:
        raise TypeError(
            f"{who} could not rebuild {cls.__name__} on the model's new parameters ({error}). Create it after "
            "model = accelerator.prepare(model), from model.parameters(), then prepare it."
        ) from error
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):  # an LR scheduler was built on the old one
        track_step_calls(rebuilt)
    if announce:
        log.warning(
            "%s: %s was created before the model's parameters were replaced (sharded or split); it was rebuilt on the "
            "new parameters (%d parameter group(s), hyper-parameters kept). Use the optimizer that prepare() returns.",
            who,
            cls.__name__,
            len(groups),
        )
    return rebuilt


def only_moved(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> bool:
    """Whether the model's new parameters are plain tensors of the same sizes on another device (nothing sharded)."""
    from .transforms.state_dict import has_dtensors

    old = [p for group in optimizer.param_groups for p in group["params"]]
    new = list(model.parameters())
    return (
        bool(old)
        and not has_dtensors(model)
        and sorted(p.numel() for p in old) == sorted(p.numel() for p in new)
        and {p.device for p in old}.isdisjoint({p.device for p in new})
    )
