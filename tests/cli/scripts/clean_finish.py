"""A short, successful 2-process training step; prints one line per rank. Run with PYTHONWARNINGS=error."""

import torch

from accel import Accelerator

accelerator = Accelerator()
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
loss = model(torch.ones(2, 3)).sum()
accelerator.backward(loss)
optimizer.step()
scheduler.step()
total = accelerator.reduce(torch.ones(1)).item()
accelerator.wait_for_everyone()
print(
    f"finished rank {accelerator.process_index} sum {total} stepping {accelerator.scheduler_stepping} "
    f"lr {scheduler.get_last_lr()[0]}",
    flush=True,
)
