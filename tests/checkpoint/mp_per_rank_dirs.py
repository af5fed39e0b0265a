"""Run under ``torchrun --nproc_per_node 2`` by test_per_rank_dirs.py: every process checkpoints into
its own folder (as on machines that each write to a local disk) and reads back what it wrote.

Written as an Accelerate user writes it (only the import differs). Checks:
1. ``save_state(f"{base}/rank{r}")``: each folder is a whole checkpoint (weights, optimizer, the
   process's RNG streams and dataloader position, a COMPLETE marker); after training on and
   ``load_state(own folder)``, each process replays exactly the same batches, RNG draws and losses.
2. ``ProjectConfiguration(project_dir=<own folder>, automatic_checkpoint_naming=True, total_limit=2)``:
   numbering and pruning per folder; ``load_state()`` picks the newest checkpoint complete on
   every process (one process's newest being unfinished makes all of them take the previous one).
3. A folder missing on one process only: every process raises, none hangs, nothing is modified.
4. Sharded (DTensor) state into folders of their own: a clear error on every process, nothing left behind.
Each ``@check`` is one test of test_per_rank_dirs.py (the harness: tests/harness/checklist.py).
"""

from __future__ import annotations

import faulthandler
import os
import sys

import torch
from checklist import check, expect, run_checks
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.utils import ProjectConfiguration, set_seed

BASE = sys.argv[1]
faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where it is, then fails


def build(project_config: ProjectConfiguration | None = None):
    set_seed(7)
    accelerator = Accelerator(cpu=True, project_config=project_config)
    data = TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=2, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    return accelerator, model, optimizer, loader


# One prepared run, shared by the own-folder and the missing-folder checks (built first, as it always was).
accelerator, model, optimizer, loader = build()


def steps(accelerator, model, optimizer, iterator, count: int) -> list[tuple[list[float], float, float]]:
    """Trains ``count`` steps; returns each step's inputs, loss and a draw of this process's RNG."""
    out = []
    for _ in range(count):
        x, y = next(iterator)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        out.append((x.flatten().tolist(), loss.item(), torch.rand(1).item()))
    return out


@check
def own_folders_hold_whole_checkpoints_that_replay_exactly() -> None:
    rank = accelerator.process_index
    torch.manual_seed(100 + rank)  # each process its own RNG stream: reading another's shows
    it = iter(loader)
    steps(accelerator, model, optimizer, it, 3)
    folder = os.path.join(BASE, f"rank{rank}")
    expect(accelerator.save_state(folder) == folder, "save_state returns the process's folder")
    expected = steps(accelerator, model, optimizer, it, 4)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    names = set(os.listdir(folder))
    for name in (
        "COMPLETE",
        "model.safetensors",
        "optimizer.bin",
        f"random_states_{rank}.pt",
        f"dataloader_0_rank_{rank}.pt",
    ):
        expect(name in names, f"rank {rank} folder holds {name}: {sorted(names)}")
    expect(
        f"random_states_{1 - rank}.pt" not in names,
        f"rank {rank} folder holds only its own per-process files: {sorted(names)}",
    )
    expect(
        not [n for n in os.listdir(BASE) if n.startswith(".")],
        f"rank {rank} leaves no partial folder: {os.listdir(BASE)}",
    )

    steps(accelerator, model, optimizer, it, 2)  # go on, then come back
    torch.manual_seed(999)
    del it
    expect(accelerator.load_state(folder) == folder, "load_state returns the process's folder")
    replay = steps(accelerator, model, optimizer, iter(loader), 4)
    expect(replay == expected, f"rank {rank} replays its batches, losses and RNG: {replay}\n!= {expected}")
    expect(all(torch.equal(v, weights[k]) for k, v in model.state_dict().items()), f"rank {rank} weights")


@check
def automatic_naming_numbers_and_prunes_per_folder() -> None:
    rank = int(os.environ["RANK"])
    project = os.path.join(BASE, f"project{rank}")
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True, total_limit=2)
    accelerator, model, optimizer, loader = build(config)
    torch.manual_seed(200 + rank)
    it = iter(loader)
    draws = []
    for _ in range(3):
        steps(accelerator, model, optimizer, it, 1)
        accelerator.save_state()
        draws.append(torch.rand(1).item())
    found = sorted(os.listdir(os.path.join(project, "checkpoints")))
    expect(found == ["checkpoint_1", "checkpoint_2"], f"rank {rank} total_limit per folder: {found}")
    for name in found:
        files = set(os.listdir(os.path.join(project, "checkpoints", name)))
        expect(
            {"COMPLETE", f"random_states_{rank}.pt", "model.safetensors"} <= files,
            f"rank {rank} {name} complete with its files: {files}",
        )

    torch.manual_seed(5)
    loaded = accelerator.load_state()
    expect(loaded == os.path.join(project, "checkpoints", "checkpoint_2"), f"rank {rank} loads its newest: {loaded}")
    expect(torch.rand(1).item() == draws[2], f"rank {rank} newest RNG")
    expect(config.iteration == 3, f"rank {rank} numbering continues: {config.iteration}")

    accelerator.wait_for_everyone()
    if rank == 0:  # process 0's newest was interrupted before its marker: nobody may load checkpoint_2
        os.remove(os.path.join(project, "checkpoints", "checkpoint_2", "COMPLETE"))
    accelerator.wait_for_everyone()
    loaded = accelerator.load_state()
    expect(loaded.endswith("checkpoint_1"), f"rank {rank} falls back to the newest complete everywhere: {loaded}")
    expect(torch.rand(1).item() == draws[1], f"rank {rank} previous RNG")


@check
def a_folder_missing_on_one_process_fails_every_process() -> None:
    rank = accelerator.process_index
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folder = os.path.join(BASE, f"rank{rank}")
    target = folder if rank == 0 else folder + "_missing"
    try:
        accelerator.load_state(target)
    except ValueError as error:
        expect(rank == 0 or "rank1_missing" in str(error), f"the error names the missing folder: {error}")
    else:
        expect(False, "a folder missing on one process fails every process")
    expect(all(torch.equal(v, before[k]) for k, v in model.state_dict().items()), "nothing modified")


@check
def sharded_state_into_folders_of_their_own_is_refused() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from mp_checkpoint import FullyShardStrategy

    from accel_checkpoint.errors import CheckpointError

    rank = int(os.environ["RANK"])
    accelerator = Accelerator(cpu=True, strategy=FullyShardStrategy())
    accelerator.prepare(torch.nn.Linear(4, 4))
    try:
        accelerator.save_state(os.path.join(BASE, f"sharded{rank}"))
    except CheckpointError as error:
        expect("one folder that every process sees" in str(error), f"sharded: the error says why: {error}")
    else:
        expect(False, "sharded state into folders of their own is refused")
    accelerator.wait_for_everyone()
    left = [n for n in os.listdir(BASE) if n.startswith(".") or n.startswith("sharded")]
    expect(not left, f"sharded: nothing left behind: {left}")


if __name__ == "__main__":
    run_checks()
