"""The xla strategy on XLA's CPU device (PJRT_DEVICE=CPU), one replica: training, checkpoints, collectives, errors.

Needs torch-xla (tests/xla/setup.sh builds its environment); skipped without it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

torch_xla = pytest.importorskip("torch_xla", reason="needs torch-xla: run tests/xla/run.sh")

import torch  # noqa: E402

from accel import Accelerator  # noqa: E402
from accel_core.configuration import ProjectConfiguration  # noqa: E402
from accel_core.enums import DistributedType  # noqa: E402
from accel_core.state import AcceleratorState, GradientState  # noqa: E402
from accel_xla import XlaDeviceLoader, XlaStrategy  # noqa: E402

STEPS_DATA = 48


def make_job(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS_DATA, 6, generator=generator)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    return model, optimizer, loader


def reset_state() -> None:
    """Forgets the process state, as a new process would start (to build a second Accelerator in one test)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def plain_cpu_losses(accumulation: int, clip: float | None, epochs: int = 2) -> tuple[list[float], torch.nn.Module]:
    """The same loop in plain PyTorch on the CPU: what the XLA run must reproduce."""
    model, optimizer, loader = make_job()
    losses = []
    for _ in range(epochs):
        batches = list(loader)
        for i, (x, y) in enumerate(batches):
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
            (loss / accumulation).backward()
            if (i + 1) % accumulation == 0 or i == len(batches) - 1:
                if clip is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    return losses, model


def accel_losses(accelerator: Accelerator, clip: float | None, epochs: int = 2) -> tuple[list[float], Any]:
    model, optimizer, loader = make_job()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
                accelerator.backward(loss)
                if clip is not None and accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize(("accumulation", "clip"), [(1, None), (4, 0.5)])
def test_training_on_xla_matches_plain_cpu(accumulation: int, clip: float | None) -> None:
    # 6 batches per epoch with 4 accumulation steps: the last step of each epoch is cut short by the end of the data,
    # which the device loader must report for the batch the loop holds, not for the batches read ahead.
    accelerator = Accelerator(strategy="xla", gradient_accumulation_steps=accumulation)
    assert accelerator.device.type == "xla"
    assert accelerator.distributed_type == DistributedType.XLA
    losses, model = accel_losses(accelerator, clip)
    expected, reference = plain_cpu_losses(accumulation, clip)
    assert losses == pytest.approx(expected, rel=1e-4, abs=1e-5)
    trained = accelerator.unwrap_model(model).state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(trained[name].cpu(), value, rtol=1e-4, atol=1e-5)


def test_prepare_places_everything_on_the_xla_device(caplog: pytest.LogCaptureFixture) -> None:
    accelerator = Accelerator(strategy="xla")
    model, optimizer, loader = make_job()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    # The usual XLA flow (optimizer built first, prepare moves the model): no warning, as in the reference.
    assert "rebuilt" not in caplog.text
    assert isinstance(loader, XlaDeviceLoader)
    assert len(loader) == STEPS_DATA // 8
    parameters = list(model.parameters())
    assert all(p.device.type == "xla" for p in parameters)
    # Moving to XLA made new parameters: the optimizer was rebuilt on them.
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {id(p) for p in parameters}
    x, _ = next(iter(loader))
    assert x.device.type == "xla"
    assert accelerator.state.backend == "xla" and accelerator.num_processes == 1 and accelerator.is_main_process


def test_loader_position_counts_the_batches_the_loop_received() -> None:
    accelerator = Accelerator(strategy="xla")
    _, _, loader = make_job()
    loader = accelerator.prepare(loader)
    for seen, _ in enumerate(loader, start=1):
        if seen == 2:
            break
        assert not accelerator.gradient_state.end_of_dataloader
    # The parallel loader read ahead; the position is still the loop's.
    assert loader.state_dict()["batches_yielded"] == 2


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    accelerator = Accelerator(strategy="xla")
    model, optimizer, loader = accelerator.prepare(*make_job())
    for x, y in loader:
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    assert (Path(folder) / "sharded" / "model_0.bin").is_file()
    assert (Path(folder) / "sharded" / "optimizer_0.bin").is_file()
    assert (Path(folder) / "sharded" / "xla_rng_state_0.json").is_file()
    saved_model = {k: v.cpu().clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}
    saved_steps = optimizer.state_dict()["state"][0]["step"].cpu().clone()
    draw_after_save = torch.rand(4, device=accelerator.device).cpu()  # the XLA RNG, whose seed the checkpoint holds

    # xm.save wrote CPU tensors: the files load without torch-xla.
    on_disk = torch.load(Path(folder) / "sharded" / "model_0.bin", weights_only=True)
    assert all(t.device.type == "cpu" for t in on_disk.values())

    reset_state()
    accelerator = Accelerator(strategy="xla")
    fresh_model, fresh_optimizer, fresh_loader = make_job(seed=5)
    model, optimizer, loader = accelerator.prepare(fresh_model, fresh_optimizer, fresh_loader)
    accelerator.load_state(folder)
    assert torch.equal(torch.rand(4, device=accelerator.device).cpu(), draw_after_save)
    for name, value in accelerator.unwrap_model(model).state_dict().items():
        torch.testing.assert_close(value.cpu(), saved_model[name])
    assert optimizer.state_dict()["state"][0]["step"].cpu() == saved_steps
    assert optimizer.state_dict()["state"][0]["exp_avg"].device.type == "xla"
    assert loader.state_dict()["epoch"] == 1  # saved after a whole epoch

    # save_model exports ordinary CPU safetensors.
    accelerator.save_model(model, str(tmp_path / "export"))
    assert any(name.endswith(".safetensors") for name in os.listdir(tmp_path / "export"))


def test_periodic_checkpoints_are_taken_at_the_loops_boundaries(tmp_path: Path) -> None:
    """save_every_n_steps through the device loader: it took the wrapped loader's boundary hook (that loader is read on
    torch-xla's threads), so each save happens on the loop's thread with the position of the batches it received."""
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, save_every_n_steps=2)
    accelerator = Accelerator(strategy="xla", project_config=config)
    model, optimizer, loader = accelerator.prepare(*make_job())
    assert isinstance(loader, XlaDeviceLoader)
    assert loader.batch_boundary_hook is not None and loader.dataloader.batch_boundary_hook is None
    for step, (x, y) in enumerate(loader, start=1):  # 6 batches, one optimizer step each
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 5:
            break
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0", "checkpoint_1"]  # after steps 2 and 4
    accelerator.load_state(str(tmp_path / "checkpoints" / "checkpoint_1"))
    assert accelerator.completed_steps == 4
    assert loader.dataloader.state_dict()["batches_yielded"] == 4  # the loop's position, not the read-ahead's


def test_collectives_on_one_replica() -> None:
    accelerator = Accelerator(strategy="xla")
    device = accelerator.device
    scalar = torch.tensor(3.0, device=device)
    gathered = accelerator.gather(scalar)
    assert gathered.device.type == "xla" and gathered.shape == (1,) and gathered.item() == 3.0
    tree = {"a": torch.arange(4.0, device=device), "b": [torch.ones(2, 2, device=device)]}
    out = accelerator.gather(tree)
    assert out["a"].cpu().tolist() == [0.0, 1.0, 2.0, 3.0] and out["b"][0].shape == (2, 2)
    assert accelerator.reduce(torch.full((2,), 2.0, device=device)).cpu().tolist() == [2.0, 2.0]
    assert accelerator.reduce(torch.full((2,), 2.0, device=device), reduction="mean", scale=3.0).cpu().tolist() == [
        6.0,
        6.0,
    ]
    for reduction in ("max", "min", "product"):
        assert accelerator.reduce(torch.tensor([5.0], device=device), reduction=reduction).item() == 5.0
    from accel.utils import broadcast, broadcast_object_list, gather_object

    assert broadcast(torch.tensor([7.0], device=device)).cpu().tolist() == [7.0]
    assert gather_object(["x", "y"]) == ["x", "y"]
    assert broadcast_object_list([{"k": 1}]) == [{"k": 1}]
    padded = accelerator.pad_across_processes(torch.ones(2, 3, device=device), dim=1)
    assert padded.shape == (2, 3)
    assert accelerator.gather_for_metrics(torch.arange(3.0, device=device)).cpu().tolist() == [0.0, 1.0, 2.0]
    accelerator.wait_for_everyone()


def test_bf16_autocasts_on_the_xla_device() -> None:
    accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
    model, _, loader = accelerator.prepare(*make_job())
    x, _ = next(iter(loader))
    inner = accelerator.unwrap_model(model)[0]
    seen: list[torch.dtype] = []
    handle = inner.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    out = model(x)
    handle.remove()
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32  # outputs are converted back, as with autocast elsewhere
    assert next(model.parameters()).dtype == torch.float32


def test_optimizer_built_before_moving_the_model_is_refused() -> None:
    accelerator = Accelerator(strategy="xla")
    model, optimizer, _ = make_job()
    model.to(accelerator.device)  # after the optimizer: XLA made new parameters, the optimizer holds the old ones
    with pytest.raises(ValueError, match="not on the same device"):
        accelerator.prepare(model, optimizer)


def test_precision_and_layout_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="not supported by the xla strategy"):
        Accelerator(strategy="xla", mixed_precision="fp16")
    reset_state()
    monkeypatch.setenv("ACCEL_XLA_DOWNCAST_BF16", "true")
    monkeypatch.setenv("XLA_DOWNCAST_BF16", "0")  # restored after the test: the strategy sets it
    with pytest.raises(ValueError, match="downcast_bf16"):
        Accelerator(strategy="xla")
    reset_state()
    accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
    assert isinstance(accelerator.strategy, XlaStrategy) and accelerator.strategy.downcast_bf16
    assert os.environ.get("XLA_DOWNCAST_BF16") == "1"


def test_selected_automatically_when_an_xla_device_is_configured() -> None:
    assert os.environ.get("PJRT_DEVICE")
    assert Accelerator().strategy.name == "xla"


def test_torchrun_processes_join_the_xla_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    # Several replicas need a TPU (XLA's CPU device hangs in the first collective across processes), so this checks
    # only what the strategy asks of torch.distributed when torchrun started several processes.
    import torch.distributed as dist

    joined: list[tuple[Any, ...]] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setenv("ACCEL_XLA_DEVICE", "cpu")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda *args, **kwargs: joined.append((args, kwargs)))
    XlaStrategy(downcast_bf16=False).init_process_group(timeout=None)
    assert joined == [(("xla",), {"init_method": "xla://", "timeout": None})]
    assert "xla" in dist.Backend.backend_list  # torch_xla.distributed.xla_backend registered it
    assert os.environ["PJRT_DEVICE"] == "CPU"  # the config file's `xla: device:`


def test_set_seed_seeds_xla_before_any_accelerator() -> None:
    """A script may seed first: accel-xla's seeder is an entry point that set_seed finds, not the strategy's."""
    import torch_xla.core.xla_model as xm

    from accel_core.random import set_seed

    set_seed(1234)
    assert xm.get_rng_state() == 1234


def test_set_seed_makes_xla_draws_repeatable() -> None:
    """set_seed seeds torch-xla's own generator: the same seed gives the same draws on the XLA device."""
    from accel_core.random import set_seed

    accelerator = Accelerator()
    draws = []
    for seed in (7, 7, 8):
        set_seed(seed)
        draws.append(torch.rand(4, device=accelerator.device).cpu())
    assert torch.equal(draws[0], draws[1]), draws
    assert not torch.equal(draws[0], draws[2]), draws
