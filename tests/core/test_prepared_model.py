"""One record per prepared model (``PreparedModel``): made once by ``prepare``, read by ``unwrap_model``, a second
``prepare``, autocast, ``_models`` and ``get_state_dict`` instead of looking inside the wrappers again."""

from __future__ import annotations

from typing import ClassVar

import torch

from accel_core import Accelerator, TorchDynamoPlugin
from accel_core.model_utils import is_compiled_module
from accel_core.precision.modes import AutocastForward


class Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_a_compiled_model_has_one_record_that_every_reader_reads():
    accelerator = Accelerator(dynamo_backend="eager", mixed_precision="bf16", cpu=True)
    model = torch.nn.Linear(2, 2)
    runs = accelerator.prepare(model)
    (record,) = accelerator.prepared.records
    assert is_compiled_module(runs) and record.runs is runs and record.given is model
    assert record.wrapped is model and record.module is model and record.pipeline is None and record.stages == []
    assert accelerator.prepared.models == [runs] and accelerator.prepared.record_of(model) is record
    # Autocast went on the user's module (the record's), not on torch.compile's wrapper.
    assert isinstance(model.__dict__.get("forward"), AutocastForward)
    assert not isinstance(runs.__dict__.get("forward"), AutocastForward)
    # Readers: a second prepare of the module passed, unwrap_model, _models, get_state_dict.
    assert accelerator.prepare(model) is runs
    assert accelerator.unwrap_model(runs, keep_torch_compile=False) is model
    kept = accelerator.unwrap_model(runs)
    assert is_compiled_module(kept) and kept._orig_mod is model and kept is not runs
    assert accelerator._models == [model]
    assert sorted(accelerator.get_state_dict(runs)) == ["bias", "weight"]  # the model's own keys
    accelerator.free_memory()
    assert accelerator.prepared.records == [] and accelerator.prepared.models == []


def test_regional_compilation_records_the_module_that_runs():
    accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    model = Stack()
    runs = accelerator.prepare(model)
    record = accelerator.prepared.record_of(runs)
    assert record is not None and record.given is model
    # The regions are compiled in a shallow copy of the containers: that copy runs, and is the module read.
    assert runs is not model and record.module is runs and record.wrapped is runs
    assert accelerator.prepare(model) is runs and accelerator.unwrap_model(runs) is runs
    x = torch.randn(2, 4)
    assert torch.equal(runs(x), model(x))


def test_an_evaluation_model_is_recorded_placed_not_wrapped():
    accelerator = Accelerator()
    model = Stack()
    runs = accelerator.prepare_model(model, evaluation_mode=True)
    record = accelerator.prepared.record_of(model)
    assert record is not None and runs is model and record.module is model and record.wrapped is model


class BlockStack(Stack):
    _no_split_modules: ClassVar[list[str]] = ["Linear"]  # blocks a training chain would compile one by one


def test_an_evaluation_model_is_compiled_whole_or_by_region_as_in_the_reference():
    from torch._dynamo.utils import counters

    for regional in (False, True):
        torch._dynamo.reset()
        counters.clear()
        accelerator = Accelerator(dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=regional))
        model = BlockStack()
        runs = accelerator.prepare_model(model, evaluation_mode=True)
        record = accelerator.prepared.record_of(model)
        assert record is not None and record.runs is runs
        # Not block by block (the training chain's way): no block carries a compiled forward of its own.
        assert all(block._compiled_call_impl is None for block in model.blocks)
        if regional:  # the stack's blocks compiled in a shallow copy of the containers, which runs
            assert runs is not model and record.module is runs and runs.blocks is not model.blocks
            assert all(is_compiled_module(block) for block in runs.blocks)
        else:  # torch.compile's module around the user's, whose record keeps the user's module
            assert is_compiled_module(runs) and runs._orig_mod is model and record.module is model
        x = torch.randn(2, 4)
        with torch.no_grad():
            assert torch.equal(runs(x), model(x))
        assert counters["stats"]["unique_graphs"] > 0  # dynamo traced the forward: the compilation was engaged


def test_a_model_prepare_never_saw_is_unwrapped_by_looking_inside():
    accelerator = Accelerator()
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model, backend="eager")
    assert accelerator.prepared.record_of(compiled) is None
    assert accelerator.unwrap_model(compiled, keep_torch_compile=False) is model
    assert sorted(accelerator.get_state_dict(compiled)) == ["bias", "weight"]
