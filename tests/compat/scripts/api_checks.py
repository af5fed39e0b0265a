"""Accelerate-style uses of get_logger, accel.utils and LocalSGD (only the imports changed), in one
2-process torchrun launch (each launch costs seconds of `import torch`).

Prints CHECK <name> <ok> lines and log records; test_logging.py, test_utils.py and test_local_sgd.py
read them (conftest.py's two_process_run runs this once). The output folder is the first argument.

LocalSGD checks: between averaging steps the processes' parameters differ (no gradient all-reduce);
every local_sgd_steps-th step makes them equal, to the mean of what each process had; leaving the
block averages once more; with enabled=False nothing is averaged and DDP syncs as usual.
"""

import logging
import os
import sys

import torch
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


def check(name, ok):
    print(f"CHECK {name} {bool(ok)}", flush=True)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# -- get_logger -----------------------------------------------------------------------------------
logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s", level=logging.INFO)
logger = get_logger(__name__)

try:
    logger.info("before the state exists")
except RuntimeError as error:
    print(f"EARLY-ERROR {error}", flush=True)

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

# tqdm draws on the main process only, unless asked
check("tqdm_main_only", tqdm(range(3)).disable == (rank != 0))
check("tqdm_everywhere", tqdm(range(3), main_process_only=False).disable is False)

# save: one file per job (or per machine with save_on_each_node), safetensors or torch
model = torch.nn.Linear(3, 3)
prepared = accelerator.prepare(model)
check("extract_model_from_parallel", extract_model_from_parallel(prepared) is model and prepared is not model)
state_dict = extract_model_from_parallel(prepared).state_dict()
save(state_dict, os.path.join(out, f"rank{rank}_{SAFE_WEIGHTS_NAME}"), safe_serialization=True)
save({"rank": rank}, os.path.join(out, f"rank{rank}_{WEIGHTS_NAME}"))
save({"rank": rank}, os.path.join(out, f"node_rank{rank}.bin"), save_on_each_node=True)
wait_for_everyone()
check("save_main_process_only", sorted(os.listdir(out)) == sorted([
    "rank0_model.safetensors", "rank0_pytorch_model.bin", "node_rank0.bin"]))  # fmt: skip
check("load_back", load(os.path.join(out, "rank0_pytorch_model.bin")) == {"rank": 0})

# gather_object: lists concatenated across processes
check("gather_object", gather_object([rank, rank * 10]) == [0, 0, 1, 10])

# the reference's keyword names
batch = {"x": torch.ones(4, 2, dtype=torch.float16), "mask": torch.zeros(4)}
moved = send_to_device(tensor=batch, device=accelerator.device, non_blocking=False, skip_keys="mask")
check("send_to_device_keywords", moved["x"].device == accelerator.device)
check("convert_to_fp32_keyword", convert_to_fp32(tensor=batch)["x"].dtype == torch.float32)
sliced = slice_tensors(batch, slice(0, 2), process_index=rank, num_processes=accelerator.num_processes)
check("slice_tensors_keywords", sliced["x"].shape == (2, 2))

# synchronize_rng_states: every process continues with process 0's torch RNG
torch.manual_seed(100 + rank)
synchronize_rng_states(["torch"])
draws = gather_object([torch.rand(1).item()])
check("synchronize_rng_states", draws[0] == draws[1])


# find_executable_batch_size: each process shrinks its own batch on a real CPU out-of-memory error
@find_executable_batch_size(starting_batch_size=64)
def allocate(batch_size, label):
    if batch_size > 40:
        torch.empty(2**62, dtype=torch.uint8)  # DefaultCPUAllocator: can't allocate memory
    return batch_size, label


sizes = gather_object([allocate("run")])
check("find_executable_batch_size", sizes == [(40, "run"), (40, "run")])  # 64, 57, 51, 45, 40
a, b = release_memory(torch.ones(3), model)
check("release_memory", a is None and b is None)


# -- LocalSGD -------------------------------------------------------------------------------------
LOCAL_SGD_STEPS = 3

set_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=generator)
loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) ** 2), batch_size=4)
model, optimizer, loader = accelerator.prepare(net, optimizer, loader)
check("start_equal", torch.equal(*accelerator.gather(flat(model)[None])))

steps_equal, steps_different, mean_ok = [], [], []
with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=LOCAL_SGD_STEPS, enabled=True) as local_sgd:
    for step, (inputs, targets) in enumerate(loader):
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            before = accelerator.gather(flat(model)[None])
            local_sgd.step()
            after = accelerator.gather(flat(model)[None])
        if local_sgd.num_steps % LOCAL_SGD_STEPS == 0:
            steps_equal.append(torch.equal(after[0], after[1]))
            mean_ok.append(torch.allclose(after[0], before.mean(dim=0), atol=1e-6))
        else:
            steps_different.append(not torch.equal(after[0], after[1]))
        if step == 6:
            break
    last_before_exit = accelerator.gather(flat(model)[None])

final = accelerator.gather(flat(model)[None])
check("different_between_averaging_steps", steps_different and all(steps_different))
check("equal_after_averaging_steps", len(steps_equal) == 2 and all(steps_equal))
check("averaging_is_the_mean", all(mean_ok))
check("different_before_exit", not torch.equal(last_before_exit[0], last_before_exit[1]))
check("equal_after_exit", torch.equal(final[0], final[1]))
check("num_steps", local_sgd.num_steps == 7)

with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=1, enabled=False) as disabled:
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)  # synced by DDP as usual
        optimizer.step()
        optimizer.zero_grad()
        disabled.step()
check("disabled_keeps_ddp_sync", torch.equal(*accelerator.gather(flat(model)[None])) and disabled.num_steps == 8)
