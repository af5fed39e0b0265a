"""accel's device maps, balanced memory and module sizes equal the reference's, on the same models and budgets.

The reference's answers are recorded in big_modeling_reference.json, written once by running the
reference's own functions (nothing of it is installed in CI):

    ACCEL_REFERENCE_SRC=<huggingface/accelerate checkout>/src python tests/compat/test_big_modeling_parity.py

With ``ACCEL_REFERENCE_SRC`` set, the tests also compare with the reference live. The results are
arithmetic on shapes, so no device is needed: integer keys stand for GPUs that need not exist.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

RECORD = Path(__file__).with_name("big_modeling_reference.json")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)


class LanguageModel(nn.Module):
    def __init__(self, width: int = 32, depth: int = 5, vocab: int = 200, tied: bool = True) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(16, width))
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.final = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", torch.ones(16, 16, dtype=torch.bool))
        if tied:
            self.head.weight = self.embed.weight


MODELS = {
    "lm_tied": lambda: LanguageModel(tied=True),
    "lm_untied": lambda: LanguageModel(tied=False),
    "mlp": lambda: nn.Sequential(*[nn.Linear(16 * (i + 1), 16 * (i + 2)) for i in range(8)]),
    "lm_wide": lambda: LanguageModel(width=48, depth=3, vocab=500, tied=True),
}
BUDGETS: list[dict[Any, Any]] = [
    {"cpu": 10**9},
    {"cpu": 60_000},
    {"cpu": 20_000},
    {0: 50_000, "cpu": 80_000},
    {0: 30_000, 1: 30_000, "cpu": 40_000},
    {0: "40KB", 1: "40KiB", "cpu": "100KB", "disk": 10**9},
    {0: 10**6, 1: 10**6, "cpu": 10**6},  # room everywhere: "balanced" decides the split
    {0: 10**6, 1: 10**6, 2: 10**6, "cpu": 10**6},
]
NO_SPLIT = {"split": None, "no_split": ["Block"]}
DTYPES = {"fp32": None, "fp16": torch.float16}


def _pairs(mapping: dict[Any, Any]) -> list[list[Any]]:
    return [[k, v] for k, v in mapping.items()]  # JSON keeps int keys apart from str ones this way


def _device_map(mapping: dict[str, Any]) -> list[list[Any]]:
    # clean_device_map regroups through a set: the order of its keys follows str hashing, so compare sorted.
    return sorted(_pairs(mapping))


def results(modeling: ModuleType) -> dict[str, Any]:
    """Every case's answer from ``modeling`` (accel_checkpoint.big_modeling or accelerate.utils.modeling)."""
    out: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for model_name, make in MODELS.items():
            model = make()
            for b, budget in enumerate(BUDGETS):
                for split_name, no_split in NO_SPLIT.items():
                    for dtype_name, dtype in DTYPES.items():
                        case = f"{model_name}/budget{b}/{split_name}/{dtype_name}"
                        device_map = modeling.infer_auto_device_map(
                            model, dict(budget), no_split_module_classes=no_split, dtype=dtype
                        )
                        out[f"{case}/device_map"] = _device_map(device_map)
                        # The reference's get_balanced_memory cannot take a "disk" key (torch.device("disk") raises).
                        for low_zero in () if "disk" in budget else (False, True):
                            balanced = modeling.get_balanced_memory(
                                model, dict(budget), no_split, dtype=dtype, low_zero=low_zero
                            )
                            out[f"{case}/balanced_low_zero={low_zero}"] = _pairs(balanced)
                            out[f"{case}/balanced_low_zero={low_zero}/device_map"] = _device_map(
                                modeling.infer_auto_device_map(model, balanced, no_split)
                            )
            for dtype in (None, "float16", torch.bfloat16, torch.int8):
                out[f"{model_name}/sizes/{dtype}"] = _pairs(dict(modeling.compute_module_sizes(model, dtype=dtype)))
            out[f"{model_name}/tied"] = modeling.find_tied_parameters(model)
            total, (largest, names) = modeling.calculate_maximum_sizes(model)
            out[f"{model_name}/maximum_sizes"] = [total, largest, names]
    for size in (123, "5GB", "5GiB", "3MB", "2Mb", "7KiB", "1.5GB"):
        out[f"file_size/{size}"] = modeling.convert_file_size_to_int(size)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.float8_e4m3fn):
        out[f"dtype_size/{dtype}"] = modeling.dtype_byte_size(dtype)
    return out


def reference_modeling() -> ModuleType | None:
    source = os.environ.get("ACCEL_REFERENCE_SRC")
    if not source:
        return None
    sys.path.insert(0, source)
    try:
        return importlib.import_module("accelerate.utils.modeling")
    finally:
        sys.path.remove(source)


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    from accel_checkpoint import big_modeling

    return json.loads(json.dumps(results(big_modeling)))  # the same normalisation as the record


def test_recorded_reference_answers(ours: dict[str, Any]) -> None:
    recorded = json.loads(RECORD.read_text())
    assert recorded.keys() == ours.keys()
    differing = [case for case in recorded if recorded[case] != ours[case]]
    assert not differing, f"{len(differing)} cases differ from the reference, e.g. {differing[:3]}"


def test_live_reference_answers(ours: dict[str, Any]) -> None:
    modeling = reference_modeling()
    if modeling is None:
        pytest.skip("set ACCEL_REFERENCE_SRC to the reference's src/ folder to compare with it live")
    live = json.loads(json.dumps(results(modeling)))
    assert [case for case in live if live[case] != ours[case]] == []


if __name__ == "__main__":
    modeling = reference_modeling()
    if modeling is None:
        sys.exit(__doc__)
    RECORD.write_text(json.dumps(results(modeling), indent=0) + "\n")
    print(f"wrote {RECORD}")
