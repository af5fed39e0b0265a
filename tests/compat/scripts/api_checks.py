"""Accelerate-style uses of get_logger, accel.utils and LocalSGD (only the imports changed), in one
2-process torchrun launch (each launch costs seconds of `import torch`).

Each ``@check`` is one test of test_utils.py or test_local_sgd.py (the harness: tests/harness/checklist.py); the
log records it prints are read by test_logging.py (conftest.py's two_process_run runs this once). The output folder
is the first argument.

LocalSGD checks: between averaging steps the processes' parameters differ (no gradient all-reduce);
every local_sgd_steps-th step makes them equal, to the mean of what each process had; leaving the
block averages once more; with enabled=False nothing is averaged and DDP syncs as usual.
"""

import logging
import os
import sys

import torch
from checklist import check, expect, run_checks
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.local_sgd import LocalSGD
from accel.logging import get_logger
from accel.utils import (
    SAFE_WEIGHTS_NAME,
    WEIGHTS_NAME,
    convert_to_fp32,
    extract_model_from_parallel,
    find_executable_batch_size,
    gather_object,
    load,
    release_memory,
    save,
    send_to_device,
    set_seed,
    slice_tensors,
    synchronize_rng_states,
    tqdm,
    wait_for_everyone,
)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- get_logger -----------------------------------------------------------------------------------
logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s", level=logging.INFO)
logger = get_logger(__name__)

try:
    logger.info("before the state exists")
except RuntimeError as error:
    # One write with its newline: print() writes the text and "\n" apart, and two ranks' lines then merge in the
    # shared pipe when stdout is unbuffered (seen in CI: one line holding both ranks' messages).
    sys.stdout.write(f"EARLY-ERROR {error}\n")
    sys.stdout.flush()

accelerator = Accelerator()
rank = accelerator.process_index

logger.info("main only")
logger.info(f"every process {rank}", main_process_only=False)
for i in range(3):
    logger.info(f"in order {rank} round {i}", in_order=True)
logger.debug("debug shows when ACCELERATE_LOG_LEVEL=DEBUG")
logger.warning_once("said once")
logger.warning_once("said once")

quiet = get_logger("quiet", log_level="ERROR")
quiet.warning("a warning below the quiet logger's level")
quiet.error(f"an error from {rank}", main_process_only=False)
accelerator.wait_for_everyone()


# -- accel.utils ----------------------------------------------------------------------------------
out = sys.argv[1]
model = torch.nn.Linear(3, 3)


@check
def tqdm_main_only():
    # tqdm draws on the main process only, unless asked
    expect(tqdm(range(3)).disable == (rank != 0), "tqdm draws on process 0 only")


@check
def tqdm_everywhere():
    expect(tqdm(range(3), main_process_only=False).disable is False, "main_process_only=False draws everywhere")


@check
def extract_model_from_parallel_unwraps_ddp():
    prepared = accelerator.prepare(model)
    expect(extract_model_from_parallel(prepared) is model and prepared is not model, "the DDP wrapper's module")


@check
def save_main_process_only():
    # save: one file per job (or per machine with save_on_each_node), safetensors or torch
    state_dict = model.state_dict()
    save(state_dict, os.path.join(out, f"rank{rank}_{SAFE_WEIGHTS_NAME}"), safe_serialization=True)
    save({"rank": rank}, os.path.join(out, f"rank{rank}_{WEIGHTS_NAME}"))
    save({"rank": rank}, os.path.join(out, f"node_rank{rank}.bin"), save_on_each_node=True)
    wait_for_everyone()
    written = sorted(os.listdir(out))
    expect(written == sorted(["rank0_model.safetensors", "rank0_pytorch_model.bin", "node_rank0.bin"]), f"{written}")


@check
def load_back():
    expect(load(os.path.join(out, "rank0_pytorch_model.bin")) == {"rank": 0}, "the saved object loads back")


@check
def gather_object_concatenates_lists():
    # gather_object: lists concatenated across processes
    expect(gather_object([rank, rank * 10]) == [0, 0, 1, 10], "lists concatenated across processes")


BATCH = {"x": torch.ones(4, 2, dtype=torch.float16), "mask": torch.zeros(4)}


@check
def send_to_device_keywords():
    # the reference's keyword names
    moved = send_to_device(tensor=BATCH, device=accelerator.device, non_blocking=False, skip_keys="mask")
    expect(moved["x"].device == accelerator.device, "send_to_device(tensor=, non_blocking=, skip_keys=)")


@check
def convert_to_fp32_keyword():
    expect(convert_to_fp32(tensor=BATCH)["x"].dtype == torch.float32, "convert_to_fp32(tensor=)")


@check
def slice_tensors_keywords():
    sliced = slice_tensors(BATCH, slice(0, 2), process_index=rank, num_processes=accelerator.num_processes)
    expect(sliced["x"].shape == (2, 2), "slice_tensors(process_index=, num_processes=)")


@check
def synchronize_rng_states_continues_with_process_0s():
    # synchronize_rng_states: every process continues with process 0's torch RNG
    torch.manual_seed(100 + rank)
    synchronize_rng_states(["torch"])
    draws = gather_object([torch.rand(1).item()])
    expect(draws[0] == draws[1], f"draws after synchronizing: {draws}")


# find_executable_batch_size: each process shrinks its own batch on a real CPU out-of-memory error
@find_executable_batch_size(starting_batch_size=64)
def allocate(batch_size, label):
    if batch_size > 40:
        torch.empty(2**62, dtype=torch.uint8)  # DefaultCPUAllocator: can't allocate memory
    return batch_size, label


@check
def find_executable_batch_size_shrinks_each_process_batch():
    sizes = gather_object([allocate("run")])
    expect(sizes == [(40, "run"), (40, "run")], f"{sizes}")  # 64, 57, 51, 45, 40


@check
def release_memory_returns_nones():
    a, b = release_memory(torch.ones(3), model)
    expect(a is None and b is None, "release_memory returns Nones")


# -- LocalSGD -------------------------------------------------------------------------------------
LOCAL_SGD_STEPS = 3
SGD: dict = {}  # the LocalSGD run's results, for the checks after the one that runs it


@check
def start_equal():
    set_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=generator)
    loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) ** 2), batch_size=4)
    sgd_model, optimizer, loader = accelerator.prepare(net, optimizer, loader)
    SGD.update(model=sgd_model, optimizer=optimizer, loader=loader)
    expect(torch.equal(*accelerator.gather(flat(sgd_model)[None])), "the processes start from the same weights")
    steps_equal, steps_different, mean_ok = [], [], []
    with LocalSGD(accelerator=accelerator, model=sgd_model, local_sgd_steps=LOCAL_SGD_STEPS, enabled=True) as local:
        for step, (inputs, targets) in enumerate(loader):
            with accelerator.accumulate(sgd_model):
                loss = torch.nn.functional.mse_loss(sgd_model(inputs), targets)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
                before = accelerator.gather(flat(sgd_model)[None])
                local.step()
                after = accelerator.gather(flat(sgd_model)[None])
            if local.num_steps % LOCAL_SGD_STEPS == 0:
                steps_equal.append(torch.equal(after[0], after[1]))
                mean_ok.append(torch.allclose(after[0], before.mean(dim=0), atol=1e-6))
            else:
                steps_different.append(not torch.equal(after[0], after[1]))
            if step == 6:
                break
        last_before_exit = accelerator.gather(flat(sgd_model)[None])
    final = accelerator.gather(flat(sgd_model)[None])
    SGD.update(
        steps_equal=steps_equal,
        steps_different=steps_different,
        mean_ok=mean_ok,
        last_before_exit=last_before_exit,
        final=final,
        num_steps=local.num_steps,
    )


@check
def different_between_averaging_steps():
    expect(SGD["steps_different"] and all(SGD["steps_different"]), f"{SGD['steps_different']}")


@check
def equal_after_averaging_steps():
    expect(len(SGD["steps_equal"]) == 2 and all(SGD["steps_equal"]), f"{SGD['steps_equal']}")


@check
def averaging_is_the_mean():
    expect(all(SGD["mean_ok"]), f"{SGD['mean_ok']}")


@check
def different_before_exit():
    expect(not torch.equal(SGD["last_before_exit"][0], SGD["last_before_exit"][1]), "equal before leaving the block")


@check
def equal_after_exit():
    expect(torch.equal(SGD["final"][0], SGD["final"][1]), "leaving the block averages once more")


@check
def num_steps():
    expect(SGD["num_steps"] == 7, f"{SGD['num_steps']} steps counted")


@check
def disabled_keeps_ddp_sync():
    sgd_model, optimizer, loader = SGD["model"], SGD["optimizer"], SGD["loader"]
    with LocalSGD(accelerator=accelerator, model=sgd_model, local_sgd_steps=1, enabled=False) as disabled:
        for inputs, targets in loader:
            loss = torch.nn.functional.mse_loss(sgd_model(inputs), targets)
            accelerator.backward(loss)  # synced by DDP as usual
            optimizer.step()
            optimizer.zero_grad()
            disabled.step()
    expect(
        torch.equal(*accelerator.gather(flat(sgd_model)[None])) and disabled.num_steps == 8,
        "enabled=False: DDP keeps the processes in sync",
    )


if __name__ == "__main__":
    run_checks()
