"""What this machine can run on, for ``accel config default`` and ``accel env``. Imports torch when called."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Devices:
    """The accelerators torch sees: ``kind`` is cuda, xpu, mps or cpu; ``count`` how many (1 for cpu)."""

    kind: str
    count: int
    names: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def has_accelerator(self) -> bool:
        return self.kind != "cpu"


def detect_devices() -> Devices:
    """Asks torch which accelerators this process sees (respects ``CUDA_VISIBLE_DEVICES``).

    Example::

        devices = detect_devices()
        num_processes = devices.count if devices.kind in ("cuda", "xpu") else 1
    """
    import torch

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        version = torch.version.hip and f"ROCm {torch.version.hip}" or f"CUDA {torch.version.cuda}"
        return Devices("cuda", count, names, version)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        count = torch.xpu.device_count()
        return Devices("xpu", count, [torch.xpu.get_device_name(i) for i in range(count)])
    if torch.backends.mps.is_available():
        return Devices("mps", 1, ["Apple MPS"])
    return Devices("cpu", 1, [], f"{torch.get_num_threads()} threads")
