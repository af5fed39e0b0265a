"""The script ``accel test`` launches: checks an install end to end through the public API.

Each process checks its place in the job, the collectives (gather, gather_object, reduce) and one
training step with the strategy the launch chose (DDP, FSDP, DeepSpeed: the config file's or the flags')
against the same step computed by hand on the whole batch. The main
process prints one summary line; a failed check raises on its rank, which fails the job, and the
launcher names that rank.

Run it yourself with ``accel launch -m accel.check_script`` (any settings).
"""

from __future__ import annotations

import os
from typing import cast

import torch

from accel import Accelerator


def check(name: str, condition: bool, detail: str = "") -> None:
    if not condition:
        raise AssertionError(f"accel check '{name}' failed{': ' + detail if detail else ''}")


def check_layout(accelerator: Accelerator) -> None:
    expected = int(os.environ.get("WORLD_SIZE", "1"))
    check(
        "num_processes", accelerator.num_processes == expected, f"{accelerator.num_processes} != WORLD_SIZE {expected}"
    )
    check("process_index", 0 <= accelerator.process_index < expected, str(accelerator.process_index))
    check("is_main_process", accelerator.is_main_process == (accelerator.process_index == 0))
    if os.environ.get("ACCEL_USE_CPU", "").lower() in ("1", "true", "yes"):
        check("cpu device", accelerator.device.type == "cpu", str(accelerator.device))
    precision = os.environ.get("ACCEL_MIXED_PRECISION", "no")
    check("mixed_precision", accelerator.mixed_precision == precision, f"{accelerator.mixed_precision} != {precision}")


def check_collectives(accelerator: Accelerator) -> None:
    n, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    gathered = accelerator.gather(torch.tensor([rank], device=device))
    check("gather", gathered.cpu().tolist() == list(range(n)), str(gathered.tolist()))
    summed = accelerator.reduce(torch.ones(2, device=device), reduction="sum")
    check("reduce sum", summed.cpu().tolist() == [float(n)] * 2, str(summed.tolist()))
    mean = accelerator.reduce(torch.full((1,), float(rank), device=device), reduction="mean")
    check("reduce mean", abs(mean.item() - (n - 1) / 2) < 1e-6, str(mean.item()))
    objects = accelerator.gather_object([f"rank{rank}"])
    check("gather_object", objects == [f"rank{r}" for r in range(n)], str(objects))


def check_training_step(accelerator: Accelerator) -> None:
    """One SGD step of a data-parallel linear model equals the step on the whole batch."""
    n, rank = accelerator.num_processes, accelerator.process_index
    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(4 * n, 3, generator=generator), torch.randn(4 * n, 1, generator=generator)
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.1, -0.2, 0.3]]))
        model.bias.fill_(0.05)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    # One batch of 4 per process through a prepared loader (DeepSpeed reads its micro-batch size from it).
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(inputs, targets), batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = list(loader)
    check("data sharding", len(batches) == 1, f"{len(batches)} batches on rank {rank}, expected 1 of 4 samples")
    shard_inputs, shard_targets = batches[0]
    loss = torch.nn.functional.mse_loss(model(shard_inputs), shard_targets)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()

    # By hand: the mean loss over every process's shard, scaled like Accelerator.backward scales it.
    full_loss = torch.nn.functional.mse_loss(reference(inputs), targets) / accelerator.gradient_accumulation_steps
    full_loss.backward()
    with torch.no_grad():
        expected = torch.cat([(p - 0.1 * cast(torch.Tensor, p.grad)).flatten() for p in reference.parameters()])
    # The full weights as the strategy gathers them (FSDP and ZeRO-3 shard them: valid on the main process).
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        trained = torch.cat([state[name].detach().float().cpu().flatten() for name in ("weight", "bias")])
        tolerance = 1e-5 if accelerator.mixed_precision == "no" else 2e-2
        check("training step", torch.allclose(trained, expected, atol=tolerance), f"{trained} != {expected}")
    # Every process computes on the same weights after the step: its forward on one input equals the main one's.
    probe = torch.ones(1, 3, device=accelerator.device)
    with torch.no_grad():
        output = model(probe).float().reshape(1)
    everyone = accelerator.gather(output).cpu()
    check("replicas in sync", bool((everyone - everyone[0]).abs().max() == 0), str(everyone))


def main() -> None:
    accelerator = Accelerator()
    check_layout(accelerator)
    check_collectives(accelerator)
    check_training_step(accelerator)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print(
            f"accel check: OK on {accelerator.num_processes} process(es), device {accelerator.device.type}, "
            f"mixed precision {accelerator.mixed_precision}, strategy {accelerator.distributed_type.value}, "
            f"backend {accelerator.state.backend}",
            flush=True,
        )
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
