"""TERecipeKwargs -> Transformer-Engine's DelayedScaling arguments: a setting the installed version's recipe lacks is
refused, not dropped (its recipe is a pydantic dataclass, which ignores unknown arguments silently).

The field sets are those of Transformer-Engine's ``DelayedScaling`` (1.x and 2.x); Transformer-Engine itself
needs CUDA and is not installed here.
"""

from __future__ import annotations

import pytest

from accel_fp8.te import delayed_scaling_kwargs

TE2 = {
    "margin",
    "fp8_format",
    "amax_history_len",
    "amax_compute_algo",
    "scaling_factor_compute_algo",
    "reduce_amax",
    "fp8_dpa",
    "fp8_mha",
    "backward_override",
}
TE1 = TE2 | {"interval", "override_linear_precision"}
DEFAULTS = {
    "margin": 0,
    "interval": 1,
    "fp8_format": "HYBRID",
    "amax_history_len": 1024,
    "amax_compute_algo": "most_recent",
    "override_linear_precision": (False, False, False),
}


def test_transformer_engine_1_gets_every_setting() -> None:
    settings = {**DEFAULTS, "interval": 4, "override_linear_precision": (False, False, True)}
    assert delayed_scaling_kwargs(settings, TE1) == settings


def test_transformer_engine_2_gets_the_rest_when_the_missing_ones_change_nothing() -> None:
    kwargs = delayed_scaling_kwargs(DEFAULTS, TE2)
    assert kwargs == {k: v for k, v in DEFAULTS.items() if k not in ("interval", "override_linear_precision")}


@pytest.mark.parametrize(("name", "value"), [("interval", 4), ("override_linear_precision", (False, False, True))])
def test_transformer_engine_2_refuses_a_setting_it_would_drop(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"TERecipeKwargs\({name}=.*has no '{name}'.*Leave {name} unset"):
        delayed_scaling_kwargs({**DEFAULTS, name: value}, TE2)
