"""``Strategy.teardown`` in the Accelerator's lifecycle: called by ``free_memory`` (harmless twice), once at exit for
a script that never called it (before the process groups are destroyed), and never the reason an Accelerator
outlives its script's references."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from accel_core import Accelerator
from accel_core.strategies import Strategy

SCRIPT = Path(__file__).parent / "scripts" / "teardown_at_exit.py"


class RecordingStrategy(Strategy):
    """The base strategy (single process), counting its teardowns."""

    name = "recording"

    def __init__(self) -> None:
        super().__init__()
        self.teardowns = 0

    def teardown(self) -> None:
        self.teardowns += 1


def trained(accelerator: Accelerator) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()
    return model, optimizer


def test_free_memory_tears_the_strategy_down_and_a_second_call_is_harmless() -> None:
    strategy = RecordingStrategy()
    accelerator = Accelerator(strategy=strategy)
    trained(accelerator)
    accelerator.end_training()
    assert strategy.teardowns == 0, "end_training() must leave the prepared model usable (scripts save it after)"
    accelerator.free_memory()
    assert strategy.teardowns == 1 and accelerator._models == []
    accelerator.clear()
    assert strategy.teardowns == 2  # the strategy's teardown is idempotent; calling it again is allowed
    trained(accelerator)  # a new training on the same Accelerator after the teardown
    assert len(accelerator._models) == 1


def test_the_exit_hook_does_not_keep_an_accelerator_alive() -> None:
    accelerator = Accelerator(strategy=RecordingStrategy())
    model, optimizer = trained(accelerator)
    gone = weakref.ref(accelerator)
    del accelerator, model, optimizer
    gc.collect()
    assert gone() is None, "the Accelerator (and its prepared objects) outlived the script's references"


def test_the_default_teardown_releases_nothing_and_may_be_called_again() -> None:
    accelerator = Accelerator()
    model, _ = trained(accelerator)
    accelerator.strategy.teardown()
    accelerator.strategy.teardown()
    assert accelerator._models == [model]  # the prepared objects are the Accelerator's: teardown leaves them


@pytest.mark.slow  # a process of its own that imports torch: about 5 s
def test_a_script_that_never_frees_memory_is_torn_down_once_at_exit_before_the_groups(tmp_path: Path) -> None:
    out = tmp_path / "teardown.txt"
    ended = subprocess.run([sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=180)
    assert ended.returncode == 0 and "script done" in ended.stdout, ended.stdout + ended.stderr
    # Once, and while the process group still existed (the process state's exit hook destroys it after).
    assert out.read_text().strip() == "teardowns=1 group_alive=[True]", ended.stderr
