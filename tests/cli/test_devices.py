"""Device detection without torch (accel env, accel config default): parsers on sample system files,
the visibility variables, and agreement with torch itself on this machine."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from accel_launch import devices
from accel_launch.devices import detect_devices, torch_build, visible

GPUS = [("GPU-aaaa-1111", "NVIDIA H100"), ("GPU-bbbb-2222", "NVIDIA H100"), ("GPU-cccc-3333", "NVIDIA A10")]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("2,0", [2, 0]),
        ("1,7,2", [1]),  # stops at the first entry that names no device, as CUDA does
        ("GPU-cccc", [2]),  # uuid prefix
        ("0,0", [0]),
    ],
)
def test_visible_devices_follow_the_cuda_rules(value, expected):
    environ = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    assert visible(GPUS, "CUDA_VISIBLE_DEVICES", environ) == [GPUS[i] for i in expected]


def test_mig_instances_count_as_named():
    chosen = visible(GPUS, "CUDA_VISIBLE_DEVICES", {"CUDA_VISIBLE_DEVICES": "MIG-1a2b,MIG-3c4d"})
    assert chosen == [("MIG-1a2b", "MIG instance"), ("MIG-3c4d", "MIG instance")]


def test_torch_build_matches_torch_version():
    import torch

    build = torch_build()
    assert build["__version__"] == torch.__version__
    for name in ("cuda", "hip", "xpu"):
        assert build.get(name) == getattr(torch.version, name, None), name


def test_nvidia_smi_output_is_parsed(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\nprintf 'GPU-aaaa-1111, NVIDIA H100 80GB HBM3\\nGPU-bbbb-2222, NVIDIA H100 80GB HBM3\\n'\n"
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert devices.nvidia_gpus() == [
        ("GPU-aaaa-1111", "NVIDIA H100 80GB HBM3"),
        ("GPU-bbbb-2222", "NVIDIA H100 80GB HBM3"),
    ]


def test_proc_files_are_used_when_nvidia_smi_fails(tmp_path, monkeypatch):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    gpu = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:17:00.0"
    gpu.mkdir(parents=True)
    (gpu / "information").write_text("Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 93\nGPU UUID: \t GPU-dddd-4444\n")
    assert devices.nvidia_gpus(str(tmp_path / "proc")) == [("GPU-dddd-4444", "NVIDIA A100-SXM4-40GB")]


def _node(root: Path, index: int, simds: int, name: str) -> None:
    node = root / "class" / "kfd" / "kfd" / "topology" / "nodes" / str(index)
    node.mkdir(parents=True)
    (node / "properties").write_text(f"cpu_cores_count {0 if simds else 64}\nsimd_count {simds}\nmem_banks_count 1\n")
    (node / "name").write_text(f"{name}\n")


def test_amd_gpus_are_the_kfd_nodes_with_simds(tmp_path):
    _node(tmp_path, 0, 0, "")
    for i in range(1, 12):  # numeric order, not text order (node 10 after node 9)
        _node(tmp_path, i, 440, f"gfx90a-{i}")
    found = devices.amd_gpus(str(tmp_path))
    assert [name for _, name in found] == [f"gfx90a-{i}" for i in range(1, 12)]
    assert [index for index, _ in found] == [str(i) for i in range(11)]


def test_intel_gpus_are_intel_render_nodes(tmp_path):
    for node, vendor in (("renderD128", "0x8086"), ("renderD129", "0x10de"), ("renderD130", "0x8086")):
        folder = tmp_path / "class" / "drm" / node / "device"
        folder.mkdir(parents=True)
        (folder / "vendor").write_text(f"{vendor}\n")
        (folder / "device").write_text("0x0bd5\n")
    assert devices.intel_gpus(str(tmp_path)) == [("0", "Intel GPU 0x0bd5"), ("1", "Intel GPU 0x0bd5")]


def test_a_gpu_counts_only_when_torchs_build_can_use_it(monkeypatch):
    monkeypatch.setattr(devices, "nvidia_gpus", lambda: GPUS)
    monkeypatch.setattr(devices, "torch_build", lambda: {"__version__": "2.9.0+cpu", "cuda": None})
    assert detect_devices({}).kind == "cpu"
    monkeypatch.setattr(devices, "torch_build", lambda: {"__version__": "2.9.0+cu128", "cuda": "12.8"})
    found = detect_devices({"CUDA_VISIBLE_DEVICES": "0,2"})
    assert (found.kind, found.count, found.names, found.detail) == (
        "cuda",
        2,
        ["NVIDIA H100", "NVIDIA A10"],
        "CUDA 12.8",
    )
    assert detect_devices({"CUDA_VISIBLE_DEVICES": ""}).kind == "cpu"


def test_agrees_with_torch_on_this_machine():
    import torch

    found = detect_devices()
    if torch.cuda.is_available():
        assert (found.kind, found.count) == ("cuda", torch.cuda.device_count())
    elif hasattr(torch, "xpu") and torch.xpu.is_available():
        assert (found.kind, found.count) == ("xpu", torch.xpu.device_count())
    else:
        assert found.kind in ("cpu", "mps")
