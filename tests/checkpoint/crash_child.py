"""Child process of test_crash.py: saves checkpoint_0, then is SIGKILLed in the middle of writing checkpoint_1.

Usage: crash_child.py <sync|async> <project_dir> <signal_dir>

The kill lands deterministically mid-write: a registered object's state contains a value whose
pickling (inside the writer, after the model, optimizer and scheduler files are on disk and while
``custom_checkpoint_0.pt`` is open) tells the parent and then sleeps until killed. With ``async``
the writer is the background thread, and the main thread meanwhile returns and keeps training.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration


def signal(folder: str, name: str) -> None:
    with open(os.path.join(folder, name + ".tmp"), "w") as handle:
        handle.write(name)
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


class Stall:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __deepcopy__(self, memo):  # the async snapshot copies state; the stall must happen in the writer
        return self

    def __reduce__(self):
        signal(self.folder, "writing")
        time.sleep(600)
        return (dict, ())


class Tracker:
    """A registered object; armed, its state makes the writer stall."""

    def __init__(self, folder: str) -> None:
        self.folder, self.value, self.armed = folder, 0, False

    def state_dict(self):
        return {"value": self.value, "stall": Stall(self.folder)} if self.armed else {"value": self.value}

    def load_state_dict(self, state):
        self.value = state["value"]


def setup(project_dir: str):
    config = ProjectConfiguration(project_dir=project_dir, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
    return (accelerator, *accelerator.prepare(model, optimizer, scheduler))


def train(accelerator, model, optimizer, scheduler, steps: int) -> None:
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()


def main() -> None:
    mode, project_dir, signal_dir = sys.argv[1:4]
    accelerator, model, optimizer, scheduler = setup(project_dir)
    tracker = Tracker(signal_dir)
    accelerator.register_for_checkpointing(tracker)
    train(accelerator, model, optimizer, scheduler, 2)
    tracker.value = 2
    accelerator.save_state()  # checkpoint_0, complete
    train(accelerator, model, optimizer, scheduler, 1)
    tracker.value, tracker.armed = 3, True
    accelerator.save_state(async_save=mode == "async")  # checkpoint_1: killed while writing
    signal(signal_dir, "returned")  # only reached by the async save: the main thread is free
    while True:
        train(accelerator, model, optimizer, scheduler, 1)


if __name__ == "__main__":
    main()
