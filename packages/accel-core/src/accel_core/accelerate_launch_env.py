"""Joining a job ``accelerate launch`` started: its settings variables, read as accel's.

Hugging Face Accelerate's launcher hands its settings to the workers as variables: ``ACCELERATE_MIXED_PRECISION``,
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, ``ACCELERATE_USE_FSDP`` with ``FSDP_*``, ``ACCELERATE_USE_DEEPSPEED`` with
``ACCELERATE_DEEPSPEED_*``, ``ACCELERATE_USE_MEGATRON_LM`` with ``MEGATRON_LM_*``, ``ACCELERATE_USE_PARALLELISM_CONFIG``
with ``PARALLELISM_CONFIG_*`` (the reference ``Accelerator`` reads them: its ``mixed_precision`` defaults to
``ACCELERATE_MIXED_PRECISION``). accel's launcher writes ``ACCEL_*`` names. A script ported by changing its import
and still started with ``accelerate launch --mixed_precision bf16`` would train in float32 without a word.

``variables`` gives each of those settings under accel's name where accel's is not set (accel's own spelling wins, as
for the cluster launchers of ``cluster_env``); ``settings.settle`` puts them in the run's settled record, which is
what the ``Accelerator`` reads (``os.environ`` is left as it is). A setting accel cannot honour
(``--megatron_lm_recompute_granularity``, say) is refused, naming it and what to do. The options a backend reads
come from its launch extension (``launch_options.DeclaresConfigOptions``). No torch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from . import environment as env

# Accelerate's variable -> accel's, for the settings of every run.
_SETTINGS = {
    "ACCELERATE_USE_CPU": env.USE_CPU,
    "ACCELERATE_MIXED_PRECISION": env.MIXED_PRECISION,
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": env.GRADIENT_ACCUMULATION_STEPS,
    "ACCELERATE_DEBUG_MODE": env.DEBUG_MODE,
    "ACCELERATE_DYNAMO_BACKEND": env.DYNAMO_BACKEND,
    "ACCELERATE_DYNAMO_MODE": env.DYNAMO_MODE,
    "ACCELERATE_DYNAMO_USE_FULLGRAPH": env.DYNAMO_USE_FULLGRAPH,
    "ACCELERATE_DYNAMO_USE_DYNAMIC": env.DYNAMO_USE_DYNAMIC,
    "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION": env.DYNAMO_USE_REGIONAL_COMPILATION,
}


@dataclass(frozen=True)
class _Backend:
    """A backend ``accelerate launch`` switches on with ``switch``, its options in ``prefix`` variables."""

    strategy: str
    switch: str
    prefix: str
    renamed: Mapping[str, str]  # Accelerate's option -> accel's, where they differ
    extra: Mapping[str, str]  # another Accelerate variable of this backend -> accel's option


_BACKENDS = (
    _Backend("fsdp", "ACCELERATE_USE_FSDP", "FSDP_", {}, {}),
    _Backend(
        "deepspeed",
        "ACCELERATE_USE_DEEPSPEED",
        "ACCELERATE_DEEPSPEED_",
        {"zero3_init": "zero3_init_flag"},
        {"ACCELERATE_GRADIENT_CLIPPING": "gradient_clipping"},
    ),
    _Backend("megatron", "ACCELERATE_USE_MEGATRON_LM", "MEGATRON_LM_", {}, {}),
)

# Accelerate's mesh sizes (--parallelism_config_*) -> accel's.
_MESH_SWITCH = "ACCELERATE_USE_PARALLELISM_CONFIG"
_MESH_SIZES = {
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "ACCEL_DP_REPLICATE_SIZE",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "ACCEL_DP_SHARD_SIZE",
    "PARALLELISM_CONFIG_TP_SIZE": "ACCEL_TP_SIZE",
    "PARALLELISM_CONFIG_CP_SIZE": "ACCEL_CP_SIZE",
}
# Accelerate's mesh settings accel has not, with the value that asks for nothing.
_MESH_HARMLESS = {
    "PARALLELISM_CONFIG_SP_SIZE": ("1",),
    "PARALLELISM_CONFIG_SP_BACKEND": None,  # any: it only names the backend of a sequence parallelism of size 1
    "PARALLELISM_CONFIG_CP_BACKEND": None,  # accel's context parallelism is torch's
    "PARALLELISM_CONFIG_CP_COMM_STRATEGY": ("allgather",),
}

# Values of an option accel has not that ask for nothing (Accelerate writes its defaults too).
_NOTHING = ("", "none", "false", "no", "0")


class AccelerateLaunchError(ValueError):
    """``accelerate launch`` passed a setting accel cannot honour; the message names it and what to do."""


def translate(
    environ: Mapping[str, str], declared: Mapping[str, Collection[str] | None] | None = None
) -> tuple[dict[str, str], list[str]]:
    """accel's variables for the settings ``accelerate launch`` put in ``environ``, and the ones accel cannot honour.

    declared: backend -> the options its strategy reads (``None``: not known, every option is passed on); by default
    the installed backends' launch extensions. Settings already under accel's name are left out (they win).

    Example::

        translate({"ACCELERATE_MIXED_PRECISION": "bf16"}, {})  # ({"ACCEL_MIXED_PRECISION": "bf16"}, [])
    """
    found: dict[str, str] = {}
    refused: list[str] = []
    switched_on = [backend for backend in _BACKENDS if env.parse_flag(environ.get(backend.switch) or None)]
    if switched_on and declared is None:
        declared = _installed_options()
    for accelerate_name, accel_name in _SETTINGS.items():
        value = environ.get(accelerate_name)
        if value is not None and value != "":
            # Accelerate writes the compile backend as its enum's value (EAGER, NO); accel's names are lower-case.
            found[accel_name] = value.lower() if accel_name == env.DYNAMO_BACKEND else value
    for backend in switched_on:
        found[env.STRATEGY] = backend.strategy
        known = (declared or {}).get(backend.strategy)
        given = {
            name.removeprefix(backend.prefix).lower(): (name, value)
            for name, value in environ.items()
            if name.startswith(backend.prefix)
        }
        given.update({option: (name, environ[name]) for name, option in backend.extra.items() if name in environ})
        for option, (name, value) in sorted(given.items()):
            option = backend.renamed.get(option, option)
            if known is None or option in known:
                found[f"{env.PREFIX}{backend.strategy.upper()}_{option.upper()}"] = value
            elif value.strip().lower() not in _NOTHING:
                refused.append(f"{name}={value}: accel's {backend.strategy} strategy has no such setting")
    if env.parse_flag(environ.get(_MESH_SWITCH) or None):
        for name, accel_name in _MESH_SIZES.items():
            if environ.get(name):
                found[accel_name] = environ[name]
        for name, harmless in _MESH_HARMLESS.items():
            value = environ.get(name)
            if value and harmless is not None and value.strip().lower() not in harmless:
                refused.append(f"{name}={value}: accel has no such setting")
    return {name: value for name, value in found.items() if not environ.get(name)}, refused


def variables(environ: Mapping[str, str]) -> dict[str, str]:
    """``accelerate launch``'s settings in ``environ`` under accel's names (those not set already); ``environ`` is
    only read (``settings.settle`` applies the result to its copy of the environment).

    Raises ``AccelerateLaunchError`` for a setting accel cannot honour, in every process alike (they share the
    launcher's variables), before any of them communicates.
    """
    if not any(name.startswith("ACCELERATE_") for name in environ):
        return {}
    found, refused = translate(environ)
    if refused:
        raise AccelerateLaunchError(
            "This process was started by `accelerate launch` with setting(s) accel cannot honour:\n  "
            + "\n  ".join(refused)
            + "\nLeave them out, or start the script with `accel launch` and the same flags: it says what to do "
            "instead of each."
        )
    return found


def _installed_options() -> dict[str, Collection[str] | None]:
    """backend -> the options its installed launch extension declares (``None``: it declares none)."""
    from . import discovery
    from .launch_options import GROUP, as_extension, declared_options

    return {
        backend.strategy: declared_options(as_extension(discovery.load(GROUP, backend.strategy)))
        for backend in _BACKENDS
        # A backend not installed: the strategy's own error (pip install ...) comes when it is created.
        if discovery.is_available(GROUP, backend.strategy)
    }
