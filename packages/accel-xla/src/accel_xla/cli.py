"""``accel launch`` flags of the xla strategy (the ``accel.cli`` entry point). No torch here.

``--use-xla`` (Accelerate's ``--tpu`` too) selects the strategy; the processes are started by
torchrun as usual, one per XLA device of the machine (``--num-processes``), and join torch-xla's
PJRT runtime (``PJRT_DEVICE``). Config-file section ``xla:`` with the option names below. A torch and a torch-xla of
different releases are refused here, before any process starts (``accel_xla.versions``).

Example::

    accel launch --use-xla --xla-device TPU --num-processes 4 train.py
    accel launch --tpu --mixed-precision bf16 --downcast-bf16 train.py
"""

from __future__ import annotations

import argparse

from accel_core.launch_options import OptionTable, choice_text

from .versions import check_installed_pair

PJRT_DEVICES = ("TPU", "CPU", "CUDA")


class XlaLaunchOptions(OptionTable):
    """The xla strategy's ``accel launch`` flags (``accel_core.launch_options.OptionTable``)."""

    name = "xla"
    # (flag, ACCEL_XLA_<OPTION>, parser, metavar, help)
    options = (
        ("xla-device", "DEVICE", choice_text(PJRT_DEVICES), "{TPU,CPU,CUDA}", "the PJRT device (sets PJRT_DEVICE)"),
    )

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        super().add_arguments(group)
        # Accelerate's spelling of --use-xla.
        group.add_argument("--tpu", dest="use_xla", action="store_true", default=None, help="same as --use-xla")
        # A switch, as Accelerate's --downcast_bf16 (the config file's `xla: downcast_bf16:` takes true / false).
        group.add_argument(
            "--downcast-bf16",
            "--downcast_bf16",
            dest="xla_downcast_bf16",
            action="store_const",
            const="true",
            default=None,
            help="with --mixed-precision bf16: store float32 tensors as bfloat16 on the device too",
        )

    def lays_mesh_over_devices(self) -> bool:
        """SPMD: --dp-shard-size / --tp-size count the devices of one process (checked by the strategy there),
        whether the strategy comes from --use-xla, ACCEL_STRATEGY or the config file (``LaysMeshOverDevices``)."""
        return True

    def check_before_launch(self) -> None:
        """``ChecksBeforeLaunch``: refuses (ImportError naming the pair to install) a torch and a torch-xla of
        different releases before any worker starts, whether --use-xla, ACCEL_STRATEGY or the config file's
        ``strategy: xla`` chose the strategy."""
        # Package metadata only: importing torch_xla here would start loading its runtime in the launcher.
        check_installed_pair()

    def to_env(self, namespace: argparse.Namespace) -> dict[str, str]:
        """The flags' variables (``--use-xla`` and ``--xla-downcast-bf16`` choose the xla strategy)."""
        result = super().to_env(namespace)
        downcast = getattr(namespace, "xla_downcast_bf16", None)
        if downcast is not None:
            result["ACCEL_XLA_DOWNCAST_BF16"] = downcast
            result["ACCEL_STRATEGY"] = self.name
        device = result.get("ACCEL_XLA_DEVICE")
        if device is not None:
            result["PJRT_DEVICE"] = device
        if result.get("ACCEL_XLA_DOWNCAST_BF16") == "true":
            result["XLA_DOWNCAST_BF16"] = "1"  # read by torch-xla when its runtime starts
        return result

    def config_options(self) -> tuple[str, ...]:
        """``DeclaresConfigOptions``: the ``xla:`` section's options (``ACCEL_XLA_DEVICE``, ``ACCEL_XLA_DOWNCAST_BF16``,
        read by the strategy)."""
        return ("device", "downcast_bf16")
