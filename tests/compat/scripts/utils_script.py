"""accel.utils as Accelerate scripts call them (only the import changed); torchrun, 2 processes.

Prints CHECK <name> <ok> per check; the output folder is the first argument.
"""

import os
import sys

import torch

from accel import Accelerator
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
    slice_tensors,
    synchronize_rng_states,
    tqdm,
    wait_for_everyone,
)


def check(name, ok):
    print(f"CHECK {name} {bool(ok)}", flush=True)


out = sys.argv[1]
accelerator = Accelerator()
rank = accelerator.process_index

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
