"""Optimizer state loaded into the optimizer's own tensors (memory-mapped read), and the plain path.

After every load, the checkpoint's optimizer file is overwritten with zeros in place: a tensor still
backed by the file's memory map would then read zeros, so the comparisons below would fail.
"""

from __future__ import annotations

import os

import torch

from accel_checkpoint.optimizer_state import load_optimizer_state, read_optimizer_state
from accel_core import Accelerator


def make(accelerator, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return accelerator.prepare(model, optimizer)


def step(accelerator, model, optimizer, n=1):
    for _ in range(n):
        accelerator.backward(model(torch.randn(16, 8)).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()


def snapshot(optimizer):
    return {k: {n: v.clone() for n, v in s.items()} for k, s in optimizer.state_dict()["state"].items()}


def assert_state_equal(optimizer, expected):
    state = optimizer.state_dict()["state"]
    assert state.keys() == expected.keys()
    for key, entries in expected.items():
        assert state[key].keys() == entries.keys()
        for name, value in entries.items():
            assert torch.equal(state[key][name], value), (key, name)


def zero_file(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.write(b"\0" * size)
        handle.flush()
        os.fsync(handle.fileno())


def saved_optimizer_file(tmp_path):
    """An AdamW state of ``make``'s model after 2 steps, written by torch.save; and its contents."""
    accelerator = Accelerator(cpu=True)
    model, optimizer = make(accelerator)
    step(accelerator, model, optimizer, 2)
    path = str(tmp_path / "optimizer.bin")
    torch.save(optimizer.state_dict(), path)
    return path, snapshot(optimizer)


def trained_checkpoint(tmp_path, steps):
    """A run after ``steps`` steps, its checkpoint folder, and the optimizer state saved in it."""
    accelerator = Accelerator(cpu=True)
    model, optimizer = make(accelerator)
    step(accelerator, model, optimizer, steps)
    folder = accelerator.save_state(str(tmp_path / "ckpt"))
    return accelerator, model, optimizer, folder, snapshot(optimizer)


def test_running_optimizer_gets_the_saved_state_in_its_own_tensors(tmp_path):
    accelerator, model, optimizer, folder, expected = trained_checkpoint(tmp_path, 3)
    step(accelerator, model, optimizer, 2)  # moves the moments away from the saved ones
    before = {(k, n): v.data_ptr() for k, s in optimizer.state_dict()["state"].items() for n, v in s.items()}

    accelerator.load_state(folder)
    zero_file(os.path.join(folder, "optimizer.bin"))

    after = {(k, n): v.data_ptr() for k, s in optimizer.state_dict()["state"].items() for n, v in s.items()}
    assert after == before  # copied into the tensors the optimizer already had
    assert_state_equal(optimizer, expected)
    step(accelerator, model, optimizer)  # and training goes on with them


def test_fresh_optimizer_reads_into_new_memory(tmp_path):
    *_, folder, expected = trained_checkpoint(tmp_path, 2)
    resumed = Accelerator(cpu=True)
    _model2, optimizer2 = make(resumed, seed=1)
    assert not optimizer2.state_dict()["state"]
    resumed.load_state(folder)
    zero_file(os.path.join(folder, "optimizer.bin"))
    assert_state_equal(optimizer2, expected)


def test_saved_tensors_without_a_live_counterpart_are_copied_out_of_the_file(tmp_path):
    # The live optimizer has state for the first layer only, and in another dtype for one entry:
    # those saved tensors cannot be copied in place and must not stay mapped either.
    path, expected = saved_optimizer_file(tmp_path)
    torch.manual_seed(3)
    other = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    live = torch.optim.AdamW(other.parameters(), lr=1e-2)
    other[0].weight.grad = torch.randn_like(other[0].weight)
    live.step()  # state for parameter 0 only
    first = live.state[other[0].weight]
    first["exp_avg_sq"] = first["exp_avg_sq"].double()  # dtype differs from the saved one
    exp_avg_ptr = first["exp_avg"].data_ptr()

    saved = read_optimizer_state(live, path)
    assert saved.mapped
    load_optimizer_state(live, saved)
    zero_file(path)

    assert live.state[other[0].weight]["exp_avg"].data_ptr() == exp_avg_ptr
    assert_state_equal(live, expected)


def test_layout_mismatch_is_refused_and_leaves_live_state_alone(tmp_path):
    path, _ = saved_optimizer_file(tmp_path)
    small = torch.nn.Linear(8, 32)
    live = torch.optim.AdamW(small.parameters(), lr=1e-2)
    small(torch.randn(2, 8)).sum().backward()
    live.step()
    kept = snapshot(live)
    saved = read_optimizer_state(live, path)
    try:
        load_optimizer_state(live, saved)
    except ValueError as error:
        assert "parameter groups" in str(error) or "size" in str(error)
    else:
        raise AssertionError("a state dict for 4 parameters loaded into an optimizer of 2")
    assert_state_equal(live, kept)
