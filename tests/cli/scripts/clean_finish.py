"""A short, successful 2-process training step; prints one line per rank. Run with PYTHONWARNINGS=error.

Then both ranks print numbered lines at the same time, with print's defaults: each must reach the output whole."""

import time

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
accelerator.wait_for_everyone()
# Both ranks print in a tight loop for the same 0.3 s, so their writes meet.
end, i = time.monotonic() + 0.3, 0
while time.monotonic() < end:
    print(f"burst {accelerator.process_index} {i}")
    i += 1
print(f"burst {accelerator.process_index} end {i}")
