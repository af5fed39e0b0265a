"""One rank of a job started without torchrun (the test fakes srun / mpirun / a PyTorchJob pod): joins it through
``Accelerator()``, checks an all_reduce and one prepared DDP step, and writes what it saw as JSON to argv[1]."""

import json
import os
import sys

import torch

from accel_core import Accelerator

accelerator = Accelerator(cpu=True)
state = accelerator.state
total = accelerator.reduce(torch.tensor([float(state.process_index + 1)]), reduction="sum")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model, optimizer = accelerator.prepare(model, optimizer)
batch = torch.full((2, 4), float(state.process_index + 1))
loss = model(batch).sum()
accelerator.backward(loss)
grad = model.module.weight.grad.clone() if hasattr(model, "module") else model.weight.grad.clone()
optimizer.step()
weights = accelerator.gather(accelerator.unwrap_model(model).weight.detach().reshape(1, -1))
report = {
    "rank": state.process_index,
    "world": state.num_processes,
    "local_rank": state.local_process_index,
    "backend": state.backend,
    "sum": total.item(),
    "ddp": type(model).__name__,
    "grad": grad.flatten().tolist(),
    "replicas_equal": bool(torch.equal(weights[0], weights[1])),
    "env": {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")},
}
with open(sys.argv[1], "w") as handle:
    json.dump(report, handle)
accelerator.end_training()
