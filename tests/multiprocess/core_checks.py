"""Many accel-core checks in one 2-process launch (each launch costs seconds of torch import).

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/multiprocess/core_checks.py <tmp_dir>
Each ``@check`` is one test of tests/core/test_multiprocess_core.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import copy
import sys
import time
from collections import namedtuple
from pathlib import Path

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_core import Accelerator, DistributedDataParallelKwargs, DistributedType, PartialState, ops
from accel_core.random import synchronize_rng_states

TMP = Path(sys.argv[1])
if __name__ == "__main__":  # not in a DataLoader worker started with spawn, which imports this file again
    acc = Accelerator()  # plain, no arguments: under torchrun this must be a 2-process gloo run
    rank, world = acc.process_index, acc.num_processes


@check
def two_processes_over_gloo() -> None:
    expect(world == 2, f"expected 2 processes, got {world}")
    expect(dist.is_initialized() and dist.get_backend() == "gloo", "gloo process group expected")
    expect(acc.distributed_type == DistributedType.MULTI_CPU, f"distributed_type {acc.distributed_type}")
    expect(acc.device.type == "cpu", "cpu device expected")
    expect(acc.is_main_process == (rank == 0) and acc.is_last_process == (rank == 1), "main/last process flags")
    expect(acc.local_process_index == rank and acc.is_local_main_process == (rank == 0), "local indices")


@check
def collectives() -> None:
    t = torch.tensor([rank, rank + 10])
    expect(acc.gather(t).tolist() == [0, 10, 1, 11], "gather 1-d")
    expect(acc.gather(torch.tensor(rank * 1.0)).tolist() == [0.0, 1.0], "gather 0-d")
    Pair = namedtuple("Pair", ["a", "b"])
    nested = {"x": [torch.full((1, 2), rank)], "p": Pair(torch.tensor([rank]), torch.tensor([[rank]]))}
    g = acc.gather(nested)
    expect(g["x"][0].tolist() == [[0, 0], [1, 1]], "gather nested list in dict")
    expect(isinstance(g["p"], Pair) and g["p"].a.tolist() == [0, 1] and g["p"].b.shape == (2, 1), "gather namedtuple")
    expect(acc.gather_object([f"r{rank}"]) == ["r0", "r1"], "gather_object of lists concatenates")
    expect(acc.gather_object({"r": rank}) == [{"r": 0}, {"r": 1}], "gather_object of dicts lists them")
    expect(acc.reduce(torch.tensor([1.0 + rank])).tolist() == [3.0], "reduce sum")
    expect(acc.reduce(torch.tensor([1.0 + rank]), reduction="mean").tolist() == [1.5], "reduce mean")
    expect(acc.reduce({"a": torch.tensor([rank])}, reduction="sum")["a"].tolist() == [1], "reduce nested")
    b = ops.broadcast({"w": torch.tensor([rank + 5.0])}, from_process=1)
    expect(b["w"].tolist() == [6.0], "broadcast from process 1")
    objs = [f"from {rank}", rank]
    ops.broadcast_object_list(objs, from_process=0)
    expect(objs == ["from 0", 0], "broadcast_object_list")
    # Uneven shapes: pad, then gather.
    uneven = torch.arange(rank + 1) + 1  # rank 0: [1], rank 1: [1, 2]
    padded = acc.pad_across_processes(uneven)
    expect(padded.tolist() == ([1, 0] if rank == 0 else [1, 2]), f"pad end: {padded.tolist()}")
    first = acc.pad_across_processes(uneven, pad_index=-1, pad_first=True)
    expect(first.tolist() == ([-1, 1] if rank == 0 else [1, 2]), "pad first")
    both = acc.gather(acc.pad_across_processes({"u": uneven.view(1, -1)}, dim=1))
    expect(both["u"].tolist() == [[1, 0], [1, 2]], "pad dim=1 then gather nested")
    moved = ops.send_to_device({"a": [torch.ones(1)], "s": "keep"}, "cpu")
    expect(moved["s"] == "keep" and moved["a"][0].device.type == "cpu", "send_to_device")


@check
def process_control() -> None:
    expect(acc.on_main_process(lambda: "main")() == ("main" if rank == 0 else None), "on_main_process")
    expect(acc.on_last_process(lambda: "last")() == ("last" if rank == 1 else None), "on_last_process")
    expect(acc.on_process(lambda: 1, process_index=1)() == (1 if rank == 1 else None), "on_process")
    expect(acc.on_local_main_process(lambda: 2)() == (2 if rank == 0 else None), "on_local_main_process")

    @acc.on_local_process(local_process_index=1)
    def local_one() -> str:
        return "one"

    expect(local_one() == ("one" if rank == 1 else None), "on_local_process as decorator factory")
    order = TMP / "order.txt"
    with acc.main_process_first():
        if rank == 0:
            time.sleep(0.5)  # process 1 must still wait
        with order.open("a") as f:
            f.write(f"{rank}\n")
    acc.wait_for_everyone()
    expect(order.read_text().split() == ["0", "1"], f"main_process_first order: {order.read_text().split()}")
    with acc.split_between_processes(["a", "b", "c", "d", "e"]) as mine:
        expect(mine == (["a", "b", "c"] if rank == 0 else ["d", "e"]), f"split list {mine}")
    with acc.split_between_processes(["a", "b", "c"], apply_padding=True) as mine:
        expect(mine == (["a", "b"] if rank == 0 else ["c", "c"]), f"split padded {mine}")
    with acc.split_between_processes({"k": [1, 2, 3, 4], "v": [5, 6, 7, 8]}) as mine:
        expect(mine == ({"k": [1, 2], "v": [5, 6]} if rank == 0 else {"k": [3, 4], "v": [7, 8]}), "split dict")
    with acc.split_between_processes(torch.arange(5), apply_padding=True) as mine:
        expect(mine.tolist() == ([0, 1, 2] if rank == 0 else [3, 4, 4]), f"split tensor {mine.tolist()}")


@check
def rng_sync() -> None:
    torch.manual_seed(100 + rank)
    synchronize_rng_states(["torch"])
    draws = acc.gather(torch.rand(3))
    expect(torch.equal(draws[:3], draws[3:]), "torch RNG synchronised")
    generator = torch.Generator().manual_seed(7 + rank)
    acc.synchronize_rng_states(generator)
    values = acc.gather(torch.rand(2, generator=generator))
    expect(torch.equal(values[:2], values[2:]), "generator RNG synchronised")


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


@check
def training_parity() -> None:
    """2 processes x accumulation 2 x micro-batch 4 == one process on the full batch of 16."""
    torch.manual_seed(1)
    x, y = torch.randn(48, 6), torch.randn(48, 1)
    reference = make_model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(
            reference(x[step * 16 : (step + 1) * 16]), y[step * 16 : (step + 1) * 16]
        ).backward()
        ref_opt.step()

    accelerator = Accelerator(gradient_accumulation_steps=2, kwargs_handlers=[DistributedDataParallelKwargs()])
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)  # counts steps, keeps lr
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    expect(isinstance(model, torch.nn.parallel.DistributedDataParallel), "model wrapped in DDP")
    before = copy.deepcopy(accelerator.unwrap_model(model).state_dict())
    for step in range(3):
        for micro in range(2):
            start = step * 16 + micro * 8 + rank * 4
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x[start : start + 4]), y[start : start + 4])
                accelerator.backward(loss)
                if micro == 0:
                    expect(not accelerator.sync_gradients, "first micro-batch must not sync")
                    grads = accelerator.gather(next(model.parameters()).grad.flatten()[None])
                    expect(not torch.allclose(grads[0], grads[1]), "no_sync: gradients differ across ranks")
                else:
                    expect(accelerator.sync_gradients, "second micro-batch syncs")
                    grads = accelerator.gather(next(model.parameters()).grad.flatten()[None])
                    expect(torch.allclose(grads[0], grads[1]), "synced gradients equal across ranks")
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if step == 0 and micro == 0:
                after_micro = accelerator.unwrap_model(model).state_dict()
                expect(
                    all(torch.equal(before[k], after_micro[k]) for k in before), "no optimizer step while accumulating"
                )
    # 3 optimizer steps, each one scheduler step per process (Accelerate's stepping, the default).
    expect(scheduler.scheduler.last_epoch == 6, f"scheduler stepped {scheduler.scheduler.last_epoch} times, want 3 x 2")
    got = accelerator.unwrap_model(model).state_dict()
    for name, value in reference.state_dict().items():
        expect(
            torch.allclose(got[name], value, atol=1e-6), f"parity: {name} differs by {(got[name] - value).abs().max()}"
        )


@check
def mixed_precision() -> None:
    for precision in ("bf16", "fp16"):
        accelerator = Accelerator(mixed_precision=precision)
        model = make_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        model, optimizer = accelerator.prepare(model, optimizer)
        torch.manual_seed(3 + rank)
        x = torch.randn(32, 6)
        y = x.sum(dim=1, keepdim=True) * 0.1
        losses = []
        for _ in range(15):
            out = model(x)
            expect(out.dtype == torch.float32, f"{precision}: outputs converted back to fp32")
            loss = torch.nn.functional.mse_loss(out, y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        expect(losses[-1] < losses[0], f"{precision}: loss should fall, {losses[0]:.4f} -> {losses[-1]:.4f}")
        expect((accelerator.scaler is not None) == (precision == "fp16"), f"{precision}: GradScaler only for fp16")
        with accelerator.autocast():
            expect(torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype != torch.float32, "autocast() lowers precision")


@check
def join_uneven_inputs() -> None:
    accelerator = Accelerator()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    batches = 3 if rank == 0 else 2  # uneven: without Join, rank 0's third backward waits forever
    with accelerator.join_uneven_inputs([model], even_batches=False):
        for _ in range(batches):
            loss = model(torch.randn(4, 6)).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    accelerator.wait_for_everyone()


@check
def tracker_failure_stops_every_rank() -> None:
    class BrokenTracker:
        name = "broken"

        def store_init_configuration(self, values: dict) -> None:
            raise OSError("disk full")

        def log(self, values: dict, step: int | None = None) -> None: ...

        def finish(self) -> None: ...

    accelerator = Accelerator(log_with=[BrokenTracker()])
    try:
        accelerator.init_trackers("run", config={"lr": 1})
        raised = ""
    except (OSError, RuntimeError) as error:
        raised = str(error)
    expect("disk full" in raised, f"init_trackers failure must raise on every rank, got {raised!r}")


class StateReader(torch.utils.data.Dataset):
    """Holds the process state (and GradientState); a spawned DataLoader worker reads them."""

    def __init__(self, state: object, gradient_state: object) -> None:
        self.state, self.gradient_state = state, gradient_state

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> list:
        s = self.state
        return [
            s.process_index,
            s.num_processes,
            str(s.distributed_type),
            s.mixed_precision,
            self.gradient_state.num_steps,
        ]


@check
def copies_behave_as_the_original() -> None:
    """A pickled, deep-copied or spawned copy of an Accelerator (or its state) is the same job."""
    import pickle

    accelerator = Accelerator(mixed_precision="bf16", gradient_accumulation_steps=3)
    model = accelerator.prepare(torch.nn.Linear(2, 2))  # a DDP model: it cannot travel to a process without a group
    expect(
        copy.deepcopy(accelerator) is accelerator and copy.deepcopy(accelerator.state) is accelerator.state, "deepcopy"
    )
    clone = pickle.loads(pickle.dumps(accelerator))
    expect(isinstance(clone.unwrap_model(clone.prepared.models[0]), torch.nn.Linear), "the copy's prepared model")
    accelerator.gradient_state._set_sync_gradients(False)
    expect(clone.sync_gradients is False, "a copy must see the process's accumulation state, not a snapshot")
    accelerator.gradient_state._set_sync_gradients(True)
    expect(
        (clone.process_index, clone.num_processes, clone.parallel_dims.dp.size) == (rank, 2, 2),
        "copy's place in the job",
    )
    gathered = clone.gather_for_metrics(torch.tensor([rank]))
    expect(gathered.tolist() == [0, 1], f"gather_for_metrics through the copy: {gathered}")
    # A worker started with spawn unpickles the state in a process with no process group of its own.
    loader = torch.utils.data.DataLoader(
        StateReader(accelerator.state, accelerator.gradient_state),
        num_workers=1,
        multiprocessing_context="spawn",
        batch_size=None,
    )
    seen = next(iter(loader))
    expect(seen == [rank, 2, "MULTI_CPU", "bf16", 3], f"the spawned worker's state: {seen}")
    del model
    accelerator.free_memory()


if __name__ == "__main__":
    run_checks(teardown=PartialState().destroy_process_group)
