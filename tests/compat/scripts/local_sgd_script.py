"""LocalSGD as in Accelerate's by_feature/local_sgd.py (only the import changed); torchrun, 2 processes.

Each process trains on different data. Checks, printed as CHECK <name> <ok>:
- between averaging steps the processes' parameters differ (no gradient all-reduce under LocalSGD);
- every local_sgd_steps-th step makes them equal, to the mean of what each process had;
- leaving the block averages once more; with enabled=False nothing is averaged.
"""

import torch
from torch.utils.data import DataLoader, TensorDataset

from accel import Accelerator
from accel.local_sgd import LocalSGD
from accel.utils import set_seed

LOCAL_SGD_STEPS = 3


def check(name, ok):
    print(f"CHECK {name} {bool(ok)}", flush=True)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


accelerator = Accelerator()
set_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(1)
x = torch.randn(64, 4, generator=generator)
loader = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) ** 2), batch_size=4)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
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
