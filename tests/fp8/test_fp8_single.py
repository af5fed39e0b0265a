"""accel-fp8 on one process (CPU): backend choice, recipe handlers, the capability fallback decision, the
conversion report, torchao's float8 tensor-parallel styles, Transformer-Engine's clear failure, and a
prepared fp8 model training and round-tripping its weights."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from accel_core.enums import FP8BackendType
from accel_core.precision.fp8_recipes import AORecipeKwargs, FP8RecipeKwargs, fp8_backend_of

pytest.importorskip("torchao")

from accel_fp8 import ConversionReport, convert_model_to_fp8_ao, fp8_fallback
from accel_fp8.ao import AOFloat8Precision


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 48), nn.Linear(48, 10)
    )


def test_fallback_decision_follows_compute_capability():
    assert fp8_fallback("cuda", (8, 0)) == "fp16"  # A100
    assert fp8_fallback("cuda", (8, 6)) == "fp16"
    assert fp8_fallback("cuda", (8, 9)) is None  # Ada
    assert fp8_fallback("cuda", (9, 0)) is None  # Hopper
    assert fp8_fallback("cpu", None) is None  # torchao's CPU kernel


def test_old_gpu_falls_back_to_fp16_with_a_warning(monkeypatch, caplog):
    # The decision and the fallback path of the factory, on a CPU machine: the GPU's capability is what is given.
    from accel_core.precision.modes import Precision, PrecisionContext
    from accel_fp8 import factory

    monkeypatch.setattr(factory, "device_capability", lambda device: (8, 0))
    built = []
    context = PrecisionContext(device=torch.device("cuda"), fallback=lambda name: built.append(name) or Precision(name))
    with caplog.at_level(logging.WARNING, logger="accel"):
        precision = factory.make_precision(context)
    assert precision.name == "fp16" and built == ["fp16"]
    assert "compute capability of (8, 0)" in caplog.text and "Will use FP16 instead" in caplog.text
    monkeypatch.setattr(factory, "device_capability", lambda device: (9, 0))
    context = PrecisionContext(device=torch.device("cuda"), fallback=lambda name: pytest.fail("no fallback on Hopper"))
    assert isinstance(factory.make_precision(context), AOFloat8Precision)


def test_backend_choice(monkeypatch):
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "TE")  # the record given is read, never os.environ
    assert fp8_backend_of({}, {}) == FP8BackendType.AO  # torchao installed here
    assert fp8_backend_of({AORecipeKwargs: AORecipeKwargs()}, {}) == FP8BackendType.AO
    assert fp8_backend_of({}, {"ACCEL_FP8_BACKEND": "te"}) == FP8BackendType.TE
    with pytest.raises(ValueError, match="use AO"):
        fp8_backend_of({}, {"ACCEL_FP8_BACKEND": "msamp"})
    with pytest.warns(FutureWarning, match="deprecated"):
        legacy = FP8RecipeKwargs(backend="ao")
    assert fp8_backend_of({FP8RecipeKwargs: legacy}, {}) == FP8BackendType.AO
    with pytest.warns(FutureWarning):
        unset = FP8RecipeKwargs()
    assert unset.backend == "TE"  # the reference's default
    unset.apply_environment({"ACCEL_FP8_BACKEND": "ao"})
    assert fp8_backend_of({FP8RecipeKwargs: unset}, {}) == FP8BackendType.AO
    legacy.apply_environment({"ACCEL_FP8_BACKEND": "TE"})
    assert legacy.backend == "AO"  # given in the constructor: wins over the variable
    with pytest.raises(ValueError, match="one fp8 recipe handler"), pytest.warns(FutureWarning):
        fp8_backend_of({AORecipeKwargs: AORecipeKwargs(), FP8RecipeKwargs: FP8RecipeKwargs(backend="TE")}, {})


def test_ao_recipe_kwargs(monkeypatch):
    assert AORecipeKwargs().enable_fsdp_float8_all_gather is True
    assert AORecipeKwargs().pad_inner_dim is True
    # torchao gathers float8 weights only with tensorwise scales.
    assert AORecipeKwargs(recipe_name="rowwise").enable_fsdp_float8_all_gather is False
    # ACCEL_FP8_* come from the run's settled record (apply_environment, called by accel-fp8's factory), not from
    # os.environ in the constructor; a field the script gave wins.
    monkeypatch.setenv("ACCEL_FP8_PAD_INNER_DIM", "false")
    assert AORecipeKwargs().pad_inner_dim is True
    record = {"ACCEL_FP8_PAD_INNER_DIM": "false", "ACCEL_FP8_RECIPE": "rowwise"}
    handler, given = AORecipeKwargs(), AORecipeKwargs(pad_inner_dim=True)
    handler.apply_environment(record)
    given.apply_environment(record)
    assert (handler.pad_inner_dim, handler.recipe_name, handler.enable_fsdp_float8_all_gather) == (
        False,
        "rowwise",
        False,
    )
    assert (given.pad_inner_dim, given.recipe_name) == (True, "rowwise")
    handler.apply_environment({})  # another record: the unset fields follow it
    assert (handler.pad_inner_dim, handler.recipe_name, handler.enable_fsdp_float8_all_gather) == (True, None, True)
    with pytest.raises(ValueError, match="recipe_name must be one of"):
        AORecipeKwargs(recipe_name="blockwise")
    with pytest.raises(ValueError, match="recipe_name must be one of"):
        AORecipeKwargs().apply_environment({"ACCEL_FP8_RECIPE": "blockwise"})


def test_the_fp8_factory_reads_the_runs_record_not_the_environment(monkeypatch):
    from accel_core.precision.modes import PrecisionContext
    from accel_fp8 import factory

    monkeypatch.setenv("ACCEL_FP8_PAD_INNER_DIM", "true")
    handler = AORecipeKwargs()
    context = PrecisionContext(
        torch.device("cpu"), {AORecipeKwargs: handler}, environ={"ACCEL_FP8_PAD_INNER_DIM": "false"}
    )
    precision = factory.make_precision(context)
    assert precision.config.pad_inner_dim is False and handler.pad_inner_dim is False
    # No handler given: the default one follows the record too.
    default = factory.make_precision(PrecisionContext(torch.device("cpu"), environ={"ACCEL_FP8_RECIPE": "rowwise"}))
    assert default.handler.recipe_name == "rowwise" and default.config.enable_fsdp_float8_all_gather is False


def test_the_accelerator_hands_fp8_its_settled_record(monkeypatch):
    from accel import Accelerator

    monkeypatch.setenv("ACCEL_FP8_PAD_INNER_DIM", "false")
    handler = AORecipeKwargs()
    assert handler.pad_inner_dim is True  # the constructor reads no environment
    accelerator = Accelerator(mixed_precision="fp8", cpu=True, kwargs_handlers=[handler])
    assert accelerator.precision.config.pad_inner_dim is False and handler.pad_inner_dim is False
    assert accelerator.fp8_backend == FP8BackendType.AO


def test_conversion_report_lists_converted_and_skipped_layers():
    model = mlp()
    report = convert_model_to_fp8_ao(model)
    assert isinstance(report, ConversionReport)
    assert report.converted == ["2", "4"]
    assert set(report.skipped) == {"0", "5"}
    assert "first linear layer" in report.skipped["0"]
    assert "not divisible by 16" in report.skipped["5"]  # also the last layer: the shape is the first reason
    assert "converted 2 layer(s)" in report.summary()
    # A user filter replaces the first/last rule; the shape rule stays.
    report = convert_model_to_fp8_ao(mlp(), module_filter_func=lambda module, fqn: fqn != "4")
    assert report.converted == ["0", "2"] and report.skipped["4"] == "module_filter_func returned False"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_float8_linear_trains_on_cpu(recipe):
    from torchao.float8.float8_linear import Float8Linear

    precision = AOFloat8Precision("cpu", AORecipeKwargs(recipe_name=recipe))
    model = precision.convert_module(mlp())
    assert isinstance(model[2], Float8Linear) and isinstance(model[4], Float8Linear)
    precision.wrap_forward(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(10):
        loss = model(x).pow(2).mean()
        loss.backward()
        precision.optimizer_step(optimizer)
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert model[2].weight.grad is None and model[2].weight.dtype == torch.float32


def test_parallel_style_swaps_for_float8_styles_of_converted_layers():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    from torchao.float8.float8_tensor_parallel import Float8ColwiseParallel, Float8RowwiseParallel

    precision = AOFloat8Precision("cpu", AORecipeKwargs())
    model = precision.convert_module(mlp())
    assert type(precision.parallel_style(ColwiseParallel(), [model[2]])) is Float8ColwiseParallel
    assert type(precision.parallel_style(RowwiseParallel(), [model[4]])) is Float8RowwiseParallel
    assert type(precision.parallel_style(ColwiseParallel(), [model[0]])) is ColwiseParallel  # left in high precision
    assert type(precision.parallel_style(SequenceParallel(), [model[2]])) is SequenceParallel
    rowwise = AOFloat8Precision("cpu", AORecipeKwargs(recipe_name="rowwise"))
    converted = rowwise.convert_module(mlp())
    assert (
        type(rowwise.parallel_style(ColwiseParallel(), [converted[2]])) is ColwiseParallel
    )  # float8 styles are tensorwise


def test_prepared_fp8_model_state_dict_is_plain_and_reloads():
    from accel import Accelerator

    accelerator = Accelerator(mixed_precision="fp8", cpu=True)
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)  # before prepare: re-mapped on the converted weights
    model, optimizer = accelerator.prepare(model, optimizer)
    assert accelerator.fp8_enabled and accelerator.fp8_backend == FP8BackendType.AO
    assert accelerator.precision.report.converted == ["2", "4"]
    assert {id(p) for p in model.parameters()} == {id(p) for g in optimizer.param_groups for p in g["params"]}
    x = torch.randn(8, 32)
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    state = accelerator.get_state_dict(model)
    assert set(state) == set(mlp().state_dict()) and all(type(t) is torch.Tensor for t in state.values())
    plain = mlp()
    plain.load_state_dict(state)
    assert not torch.equal(plain[2].weight, mlp()[2].weight)  # the trained weights, not the initial ones


def test_recipe_without_fp8_and_te_on_cpu_fail_clearly():
    from accel import Accelerator

    with pytest.raises(ValueError, match="requires setting `mixed_precision='fp8'`"):
        Accelerator(mixed_precision="bf16", cpu=True, kwargs_handlers=[AORecipeKwargs()])
    from accel_fp8.te import TEFloat8Precision, import_te

    with pytest.raises(ValueError, match="CUDA GPUs only"):
        TEFloat8Precision("cpu", None)
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"accel-fp8\[te\]"):
            import_te()


def test_transformer_engine_path_fails_clearly_without_te_or_gpu(monkeypatch):
    # The Transformer-Engine path needs CUDA and transformer_engine; here (CPU, no TE) every way in says what to do.
    from accel import Accelerator
    from accel_core.precision.fp8_recipes import TERecipeKwargs

    te_installed = True
    try:
        import transformer_engine.pytorch  # noqa: F401
    except ImportError:
        te_installed = False
    if not te_installed:
        with pytest.raises(ImportError, match=r"accel-fp8\[te\]"):
            TERecipeKwargs()
    monkeypatch.setenv("ACCEL_FP8_BACKEND", "TE")
    with pytest.raises(ValueError, match=r"CUDA GPUs only.*AORecipeKwargs"):
        Accelerator(mixed_precision="fp8", cpu=True)
    # The deprecated handler carries the TE fields, validated as the reference does.
    with pytest.raises(ValueError, match="fp8_format"), pytest.warns(FutureWarning):
        FP8RecipeKwargs(backend="TE", fp8_format="E3M4")
    with pytest.raises(ValueError, match="MS-AMP"), pytest.warns(FutureWarning):
        FP8RecipeKwargs(backend="MSAMP")
    with pytest.warns(FutureWarning):
        legacy = FP8RecipeKwargs(backend="TE", amax_compute_algo="MAX")
    assert legacy.to_kwargs()["amax_compute_algo"] == "max" and legacy.to_kwargs()["amax_history_len"] == 1024
    legacy.apply_environment({"ACCEL_FP8_AMAX_HISTORY_LEN": "16", "ACCEL_FP8_AMAX_COMPUTE_ALGO": "most_recent"})
    assert legacy.to_kwargs()["amax_compute_algo"] == "max" and legacy.to_kwargs()["amax_history_len"] == 16


def test_conversion_report_is_logged_on_the_main_process(caplog):
    precision = AOFloat8Precision("cpu", AORecipeKwargs(), is_main_process=True)
    with caplog.at_level(logging.INFO, logger="accel"):
        precision.convert_module(mlp())
    assert "fp8 (torchao) converted 2 layer(s)" in caplog.text
    caplog.clear()
    quiet = AOFloat8Precision("cpu", AORecipeKwargs(), is_main_process=False)
    with caplog.at_level(logging.INFO, logger="accel"):
        quiet.convert_module(mlp())
    assert "converted" not in caplog.text and quiet.report is not None


def _fp8_losses(dynamo_backend: str) -> tuple[list[float], nn.Module]:
    from accel import Accelerator

    accelerator = Accelerator(mixed_precision="fp8", cpu=True, dynamo_backend=dynamo_backend)
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(3))
    losses = []
    for _ in range(3):
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    accelerator.free_memory()
    return losses, model


@pytest.mark.slow
def test_fp8_composes_with_torch_compile():
    # aot_eager runs dynamo and AOTAutograd through torchao's float8 tensor subclasses without inductor's C++
    # build (inductor works on CPU too, but its first step takes about a minute on a 2-core machine: docs/fp8.md).
    eager, _ = _fp8_losses("no")
    compiled, model = _fp8_losses("aot_eager")
    assert type(model).__name__ == "OptimizedModule"
    assert compiled == pytest.approx(eager, rel=1e-5), (compiled, eager)


def test_model_converted_by_the_script_is_reported_and_saves_plain_weights():
    from torchao.float8 import Float8LinearConfig

    from accel import Accelerator

    model = mlp()
    convert_model_to_fp8_ao(model, config=Float8LinearConfig(enable_fsdp_float8_all_gather=True))
    accelerator = Accelerator(mixed_precision="fp8", cpu=True)
    model = accelerator.prepare(model)
    assert accelerator.precision.report.converted == ["2", "4"] and accelerator.precision.report.skipped == {}
    assert all(type(t) is torch.Tensor for t in accelerator.get_state_dict(model).values())
