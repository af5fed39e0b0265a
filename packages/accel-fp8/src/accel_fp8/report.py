"""What a conversion did: which layers now compute in fp8 and which stayed in high precision, and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

# fp8 GEMMs (torch._scaled_mm, Transformer-Engine) need both matrix dimensions divisible by 16.
FP8_MULTIPLE = 16


@dataclass
class ConversionReport:
    """The layers one conversion changed (``converted``) and left alone (``skipped``: name -> reason).

    Example::

        model = accelerator.prepare(model)
        report = accelerator.precision.report
        print(report.converted, report.skipped)   # ['layers.0.up', ...] {'head': 'the last linear layer ...'}
    """

    model: str
    backend: str
    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def summary(self) -> str:
        """Several lines for a log: the counts, then each skipped layer with its reason."""
        lines = [
            f"fp8 ({self.backend}) converted {len(self.converted)} layer(s) of {self.model}"
            f"{': ' + ', '.join(self.converted) if self.converted else ''}; kept {len(self.skipped)} in high precision"
        ]
        lines += [f"  {name}: {reason}" for name, reason in self.skipped.items()]
        return "\n".join(lines)


def find_first_last_linear_layers(model: nn.Module) -> tuple[str | None, str | None]:
    """The names of the first and the last ``nn.Linear`` of ``model`` in module order (None without any)."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return (names[0], names[-1]) if names else (None, None)


def fp8_shape_problem(module: nn.Linear) -> str | None:
    """Why ``module``'s shape cannot run as an fp8 GEMM (None when it can)."""
    if module.in_features % FP8_MULTIPLE or module.out_features % FP8_MULTIPLE:
        return (
            f"dimensions not divisible by {FP8_MULTIPLE} (in_features={module.in_features}, "
            f"out_features={module.out_features})"
        )
    return None


def filter_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str]) -> bool:
    """Whether ``module`` may become fp8: a linear layer with dimensions divisible by 16 that is not listed in
    ``layers_to_filter`` (Accelerate's function of that name).

    Example: ``functools.partial(filter_linear_layers, layers_to_filter=["lm_head"])`` as a module filter.
    """
    if isinstance(module, nn.Linear) and fp8_shape_problem(module) is not None:
        return False
    return fqn not in layers_to_filter


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str) -> bool:
    """Accelerate's filter of that name, kept for scripts that pass it: ``filter_linear_layers`` with the first and
    last linear layers *of ``module`` itself* left out (the default filter of accel leaves out the model's)."""
    first, last = find_first_last_linear_layers(module)
    return filter_linear_layers(module, fqn, layers_to_filter=[n for n in (first, last) if n is not None])


class RecordingFilter:
    """A module filter that records each decision in a ``ConversionReport``.

    user_filter: ``fn(module, fqn) -> bool`` given by the user, consulted for layers of a shape fp8 can take;
        None applies accel's default: every linear layer except the model's first and last (Accelerate's
        default, for training stability).
    """

    def __init__(
        self, model: nn.Module, report: ConversionReport, user_filter: Callable[..., bool] | None = None
    ) -> None:
        self.report = report
        self.user_filter = user_filter
        first, last = find_first_last_linear_layers(model)
        self.edges = (
            {}
            if user_filter is not None
            else {
                name: why
                for name, why in ((first, "the first linear layer"), (last, "the last linear layer"))
                if name is not None
            }
        )

    def __call__(self, module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear):
            return False
        problem = fp8_shape_problem(module)
        if problem is not None:
            self.report.skipped[fqn] = problem
            return False
        if fqn in self.edges:
            self.report.skipped[fqn] = f"{self.edges[fqn]} (kept in high precision for stability, as Accelerate)"
            return False
        if self.user_filter is not None and not self.user_filter(module, fqn):
            self.report.skipped[fqn] = "module_filter_func returned False"
            return False
        self.report.converted.append(fqn)
        return True
