"""``accel launch`` flags of the megatron strategy (the ``accel.cli`` entry point). No torch here.

Each flag becomes an ``ACCEL_MEGATRON_*`` variable that ``MegatronLMPlugin.from_env`` reads in the
launched processes; ``--use-megatron`` (or any ``--megatron-*`` flag) selects the strategy. Values
the plugin refuses (``--megatron-vp-degree 2`` without ``--megatron-pp-degree``) fail in every launched process with
the plugin's message.

Example::

    accel launch --cpu -n 4 --use-megatron --megatron-tp-degree 2 train.py   # 2-way TP x 2-way DP
"""

from __future__ import annotations

from accel_core.launch_options import OptionTable, bool_text, nonnegative_int_text, nonnegative_number_text


class MegatronLaunchOptions(OptionTable):
    """The megatron strategy's ``accel launch`` flags (``accel_core.launch_options.OptionTable``)."""

    name = "megatron"
    accelerate_name = "megatron_lm"  # Accelerate's --use_megatron_lm, --megatron_lm_tp_degree, ...
    # (flag, ACCEL_MEGATRON_<OPTION>, parser, metavar, help)
    options = (
        (
            "megatron-tp-degree",
            "TP_DEGREE",
            nonnegative_int_text,
            "N",
            "tensor-parallel size; must divide the number of processes",
        ),
        ("megatron-pp-degree", "PP_DEGREE", nonnegative_int_text, "N", "pipeline stages (Megatron's schedules, GPUs)"),
        ("megatron-vp-degree", "VP_DEGREE", nonnegative_int_text, "N", "model chunks per pipeline rank (interleaved)"),
        (
            "megatron-num-micro-batches",
            "NUM_MICRO_BATCHES",
            nonnegative_int_text,
            "N",
            "micro-batches of one pipeline step (needs --megatron-pp-degree)",
        ),
        (
            "megatron-sequence-parallelism",
            "SEQUENCE_PARALLELISM",
            bool_text,
            "BOOL",
            "split activations along the sequence over the TP group",
        ),
        (
            "megatron-gradient-clipping",
            "GRADIENT_CLIPPING",
            nonnegative_number_text,
            "NORM",
            "clip the global gradient norm after each synced backward",
        ),
        ("megatron-seed", "SEED", nonnegative_int_text, "N", "seed of Megatron's model-parallel RNG streams"),
    )

    def config_options(self) -> tuple[str, ...]:
        """``DeclaresConfigOptions``: the ``megatron:`` section's options, those ``MegatronLMPlugin.from_env`` reads
        (its module does not import torch or megatron-core)."""
        from .plugin import ENV_OPTIONS

        return tuple(ENV_OPTIONS)
