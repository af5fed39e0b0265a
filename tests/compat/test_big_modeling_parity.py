"""accel's device maps and sizes against the reference's own functions, on the same models and budgets.

Needs the reference source importable as ``accelerate`` (e.g. ``git archive`` of huggingface/accelerate,
then ``ACCEL_REFERENCE_SRC=<that>/src``); skipped otherwise. The results are pure arithmetic on
shapes, so no device is needed: integer keys stand for GPUs that need not exist.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings

import pytest
import torch
from torch import nn

from accel_checkpoint import big_modeling as ours

REFERENCE_SRC = os.environ.get("ACCEL_REFERENCE_SRC")


@pytest.fixture(scope="module")
def reference():  # type: ignore[no-untyped-def]
    if not REFERENCE_SRC:
        pytest.skip("set ACCEL_REFERENCE_SRC to the reference's src/ folder to compare with it")
    sys.path.insert(0, REFERENCE_SRC)
    try:
        return importlib.import_module("accelerate.utils.modeling")
    finally:
        sys.path.remove(REFERENCE_SRC)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attn = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.mlp(self.attn(x)))


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


def models() -> list[nn.Module]:
    torch.manual_seed(0)
    return [
        LanguageModel(tied=True),
        LanguageModel(tied=False),
        nn.Sequential(*[nn.Linear(16 * (i + 1), 16 * (i + 2)) for i in range(8)]),
        LanguageModel(width=48, depth=3, vocab=500, tied=True),
    ]


BUDGETS = [
    {"cpu": 10**9},
    {"cpu": 60_000},
    {"cpu": 20_000},
    {0: 50_000, "cpu": 80_000},
    {0: 30_000, 1: 30_000, "cpu": 40_000},
    {0: "40KB", 1: "40KiB", "cpu": "100KB", "disk": 10**9},
]


@pytest.mark.parametrize("budget", BUDGETS, ids=str)
@pytest.mark.parametrize("no_split", [None, ["Block"]], ids=["split", "no_split"])
@pytest.mark.parametrize("dtype", [None, torch.float16], ids=["fp32", "fp16"])
def test_infer_auto_device_map_matches_the_reference(reference, budget, no_split, dtype) -> None:  # type: ignore[no-untyped-def]
    for model in models():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = reference.infer_auto_device_map(model, dict(budget), no_split_module_classes=no_split, dtype=dtype)
            got = ours.infer_auto_device_map(model, dict(budget), no_split_module_classes=no_split, dtype=dtype)
            assert dict(got) == dict(expected), type(model).__name__
            # The reference's get_balanced_memory cannot take a "disk" key (torch.device("disk") raises).
            for low_zero in () if "disk" in budget else (False, True):
                balanced_ref = reference.get_balanced_memory(model, dict(budget), no_split, dtype=dtype, low_zero=low_zero)
                balanced = ours.get_balanced_memory(model, dict(budget), no_split, dtype=dtype, low_zero=low_zero)
                assert balanced == balanced_ref
                assert dict(ours.infer_auto_device_map(model, balanced, no_split)) == dict(
                    reference.infer_auto_device_map(model, balanced_ref, no_split)
                )


def test_sizes_and_ties_match_the_reference(reference) -> None:  # type: ignore[no-untyped-def]
    for model in models():
        for dtype in (None, "float16", torch.bfloat16, torch.int8):
            assert dict(ours.compute_module_sizes(model, dtype=dtype)) == dict(reference.compute_module_sizes(model, dtype=dtype))
        assert ours.find_tied_parameters(model) == reference.find_tied_parameters(model)
        assert ours.calculate_maximum_sizes(model) == reference.calculate_maximum_sizes(model)
    for size in (123, "5GB", "5GiB", "3MB", "2Mb", "7KiB", "1.5GB"):
        assert ours.convert_file_size_to_int(size) == reference.convert_file_size_to_int(size)
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.float8_e4m3fn):
        assert ours.dtype_byte_size(dtype) == reference.dtype_byte_size(dtype)
