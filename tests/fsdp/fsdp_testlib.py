"""Shared pieces of the accel-fsdp multi-process check scripts: a small transformer-like model,
the data, a plain-DDP reference run, and byte counting. Imported by the scripts (their folder is
on ``sys.path`` when torchrun runs them), not collected by pytest."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

DIM, IN, OUT, DEPTH = 16, 8, 4, 3
GLOBAL_BATCH, STEPS, MAX_NORM, LR = 8, 5, 0.5, 2e-2


class Block(nn.Module):
    def __init__(self, dim: int = DIM) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 2 * dim)
        self.fc2 = nn.Linear(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Every parameter's first dimension is even, so 2 processes hold exactly half of each."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(DEPTH))
        self.head = nn.Linear(DIM, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        """A method other than forward that uses the root's own parameters (inp, head) directly."""
        return self.head(self.inp(x)).argmax(-1)


def make_net(seed: int = 0) -> Net:
    torch.manual_seed(seed)
    return Net()


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (identical on every process)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN, generator=g)
    y = torch.randn(GLOBAL_BATCH, OUT, generator=g)
    return x, y


def local(tensor: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    per = tensor.shape[0] // world
    return tensor[rank * per : (rank + 1) * per]


def param_groups(model: nn.Module) -> list[dict]:
    """Two groups (decay / no decay), to check that groups survive the optimizer rebuild."""
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and "norm" not in n]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and "norm" not in n)]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0, "lr": LR / 2}]


def ddp_reference(rank: int, world: int, steps: int = STEPS) -> dict:
    """Plain torch DDP on the same data: per-step local losses, clip norms, and the final weights."""
    from torch.nn.parallel import DistributedDataParallel

    model = make_net()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(param_groups(model), lr=LR)
    losses, norms = [], []
    for step in range(steps):
        x, y = data(step)
        loss = nn.functional.mse_loss(ddp(local(x, rank, world)), local(y, rank, world))
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(ddp.parameters(), MAX_NORM).item())
        optimizer.step()
        held = held_bytes(model, optimizer)  # gradients still there, as during a step
        optimizer.zero_grad()
        losses.append(loss.item())
    dist.barrier()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"losses": losses, "norms": norms, "state": state, "held_bytes": held}


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """This process's bytes of parameters, gradients and optimizer state (step counters included), as
    `accel estimate-memory --json` reports them."""
    states = (v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v))
    return {
        "parameters": local_nbytes(model.parameters()),
        "gradients": local_nbytes(p.grad for p in model.parameters()),
        "optimizer_state": local_nbytes(states),
    }


def local_nbytes(tensors) -> int:
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        total += t.numel() * t.element_size()
    return total


def optimizer_state_nbytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of per-parameter state tensors (exp_avg, ...), leaving out scalar step counters."""
    return local_nbytes(v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)


def full_nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())
