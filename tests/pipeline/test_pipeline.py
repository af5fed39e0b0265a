"""Pipeline parallelism without processes: the layout settings, how a model is cut into stages (a stage's
module is the whole model's, pruned, and the stages chained give the whole model's output), the refusals,
and ``forward_backward`` without pipeline parallelism (exactly forward + ``backward``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from accel_core.parallel.config import ParallelismConfig, resolve_parallelism
from accel_core.pipelining import chain_units, resolve_layout, split_model, stage_boundaries
from accel_launch.plan import resolve_plan as resolve_launch_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipemodel import SEQ, lm_loss, make_model, token_data


def test_layout_settings_resolve_from_arguments_and_environment() -> None:
    config = resolve_parallelism(ParallelismConfig(pp_size=2), 4, environ={"ACCEL_PP_SCHEDULE": "GPipe"})
    assert (config.pp_size, config.dp_replicate_size, config.pp_schedule, config.pp_microbatches) == (
        2,
        2,
        "gpipe",
        None,
    )
    config = resolve_parallelism(None, 4, environ={"ACCEL_PP_SIZE": "4", "ACCEL_PP_MICROBATCHES": "8"})
    assert (config.pp_size, config.dp_replicate_size, config.pp_microbatches) == (4, 1, 8)
    layout = resolve_layout(ParallelismConfig(pp_size=2, pp_schedule="interleaved_1f1b"), rank=1)
    assert (layout.num_stages, layout.local_stages, layout.microbatches) == (4, [1, 3], 4)
    with pytest.raises(ValueError, match="1F1B needs at least as many micro-batches"):
        resolve_layout(ParallelismConfig(pp_size=4, pp_microbatches=2), rank=0)
    with pytest.raises(ValueError, match="pp_schedule must be one of"):
        ParallelismConfig(pp_schedule="zero_bubble")
    with pytest.raises(ValueError, match="pp_microbatches must be an integer >= 1"):
        ParallelismConfig(pp_microbatches=0)
    with pytest.raises(TypeError, match="list of module names"):
        ParallelismConfig(pp_split_points="layers.2")


def test_launch_flags_reach_the_workers() -> None:
    from accel.commands.launch import build_parser

    namespace = build_parser([]).parse_args(
        ["--pp-size", "2", "--pp-schedule", "gpipe", "--pp-microbatches", "4", "-n", "4", "train.py"]
    )
    assert (namespace.pp_size, namespace.pp_schedule, namespace.pp_microbatches) == (2, "gpipe", 4)
    plan = resolve_launch_plan({"num_processes": 4, "pp_size": 2, "pp_schedule": "gpipe", "pp_microbatches": 4}, {}, {})
    assert plan.env["ACCEL_PP_SIZE"] == "2" and plan.env["ACCEL_PP_SCHEDULE"] == "gpipe"
    assert plan.env["ACCEL_PP_MICROBATCHES"] == "4"


def test_stages_even_and_by_split_points() -> None:
    model = make_model(depth=4)
    assert chain_units(model) == ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "head"]
    assert stage_boundaries(model, 2) == [["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "head"]]
    assert stage_boundaries(make_model(depth=5), 2)[0] == ["embed", "layers.0", "layers.1", "layers.2"]
    assert stage_boundaries(model, 3, ["layers.1", "norm"]) == [
        ["embed", "layers.0"],
        ["layers.1", "layers.2", "layers.3"],
        ["norm", "head"],
    ]
    parts = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))  # model_parts: one child per stage
    assert stage_boundaries(parts, 3) == [["0"], ["1"], ["2"]]


@pytest.mark.parametrize(
    "stages, points, fragment",
    [
        (2, ["layers.1", "layers.2"], "names 2 point"),
        (2, ["layers.9"], "not units"),
        (3, ["layers.2", "layers.1"], "chain order"),
        (8, None, "4 block"),
    ],
)
def test_bad_split_points_name_the_units(stages, points, fragment) -> None:
    with pytest.raises(ValueError, match=fragment):
        stage_boundaries(make_model(depth=4), stages, points)


def test_stages_keep_names_hold_only_their_parameters_and_chain_to_the_whole_model() -> None:
    whole = make_model()
    tokens = token_data(4)[:, :SEQ]
    expected = whole(tokens)
    names = {n for n, _ in whole.named_parameters()}
    model = make_model()
    first, second = split_model(model, 2, [0, 1])  # both stages on one rank: they share no tensors
    first_names = {n for n, _ in first.named_parameters()}
    second_names = {n for n, _ in second.named_parameters()}
    assert first_names | second_names == names and not first_names & second_names
    assert "layers.2.wq.weight" in second_names and isinstance(second.embed, nn.Identity)
    assert [n for n, _ in second.layers.named_children()] == ["2", "3"]
    assert torch.equal(second(first(tokens)), expected)
    (only,) = split_model(make_model(), 2, [1])  # one stage on this rank: the model itself, pruned
    assert {n for n, _ in only.named_parameters()} == second_names


def test_tied_weights_across_stages_and_root_parameters_are_refused() -> None:
    tied = make_model()
    tied.head.weight = tied.embed.weight
    with pytest.raises(ValueError, match="tied weights cannot span pipeline stages"):
        split_model(tied, 2, [0])
    rooted = make_model()
    rooted.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(ValueError, match=r"holds parameters \['scale'\] directly"):
        split_model(rooted, 2, [0])


def test_forward_backward_without_pipeline_is_forward_plus_backward_with_accumulation() -> None:
    from accel import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, reference = make_model(), make_model()
    model = accelerator.prepare(model)
    data = token_data(8)
    for rows in data.chunk(2):
        with accelerator.accumulate(model):
            loss = accelerator.forward_backward(model, rows[:, :-1], rows[:, 1:], lm_loss)
        expected = lm_loss(reference(rows[:, :-1]), rows[:, 1:])
        (expected / 2).backward()
        assert not loss.requires_grad and torch.allclose(loss, expected.detach())
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-7), name
    kwargs_loss = accelerator.forward_backward(model, {"tokens": data[:2, :-1]}, data[:2, 1:], lm_loss)
    assert kwargs_loss.shape == ()


def test_a_pipeline_on_the_cpu_with_a_torch_that_fails_there_is_refused_with_the_fix(monkeypatch) -> None:
    from accel_core import pipelining

    if torch.__version__ >= pipelining._PIPELINE_ON_CPU_FROM:  # the lock's torch (not the floors lane's)
        pipelining.require_pipelines_on(torch.device("cpu"))
    pipelining.require_pipelines_on(torch.device("meta"))
    # A torch below the release that runs them (raised here rather than installing an old torch in this test).
    monkeypatch.setattr(pipelining, "_PIPELINE_ON_CPU_FROM", "99.0")
    with pytest.raises(
        RuntimeError, match=r'needs torch>=99\.0; this environment has torch .*pip install "torch>=99\.0"'
    ):
        pipelining.require_pipelines_on(torch.device("cpu"))
    pipelining.require_pipelines_on(torch.device("cuda"))  # nccl is not concerned
