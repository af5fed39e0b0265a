"""accel's gradient clipping on FSDP2's sharded gradients, 2 processes (gloo, CPU), in one launch.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/bench/fsdp2_clip_checks.py
Each ``@check`` is one test of test_fsdp2_clip.py. In the suite they run after tests/fsdp/train_checks.py's, in one
launch (tests/fsdp/two_process_checks.py): the process group may exist already, and the model is built on first use.
The clip reads each DTensor gradient's local piece without ``to_local()`` (its autograd Function cost 49 aten
operators per step of bench/fsdp2_step.py's model); these checks show the pieces are the same tensors, that no view
is taken any more, and that the norm and the clipped gradients are torch's own ``clip_grad_norm_``'s on the same
DTensors.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.profiler import ProfilerActivity, profile

from accel_core.grads import clip_grad_norm_, local_pieces

if not dist.is_initialized():  # started alone; after train_checks.py's, its Accelerator made the group
    dist.init_process_group("gloo")
rank = dist.get_rank()
MAX_NORM = 0.01  # below the norm: every check clips


@functools.cache
def sharded_model() -> nn.Module:
    """The model of every check, built by the first (not at import: a launch may run other checks first)."""
    torch.manual_seed(0)
    blocks = (nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)) for _ in range(3))
    model = nn.Sequential(*blocks)
    for block in model:
        fully_shard(block)
    fully_shard(model)
    return model


def backward() -> list[torch.Tensor]:
    """Fresh gradients (the same on each call); returns copies of the local pieces."""
    model = sharded_model()
    model.zero_grad()
    torch.manual_seed(rank)
    model(torch.randn(8, 64)).square().mean().backward()
    return [p.grad.to_local().clone() for p in model.parameters()]


@check
def local_pieces_are_the_gradients_local_tensors() -> None:
    backward()
    grads = [p.grad for p in sharded_model().parameters()]
    for grad, piece in zip(grads, local_pieces(grads), strict=True):
        view = grad.to_local()
        expect(
            (piece.data_ptr(), piece.shape, piece.stride(), piece.dtype)
            == (view.data_ptr(), view.shape, view.stride(), view.dtype),
            f"local piece {piece.shape} {piece.stride()} is not to_local()'s {view.shape} {view.stride()}",
        )


@check
def clipping_takes_no_view_of_the_gradients() -> None:
    backward()
    params = list(sharded_model().parameters())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        clip_grad_norm_(params, MAX_NORM)
    views = sum(e.count for e in prof.key_averages() if e.key == "aten::view_as")
    expect(views == 0, f"clip_grad_norm_ took {views} views (to_local() per gradient)")


@check
def norm_and_clipped_gradients_are_torchs() -> None:
    params = list(sharded_model().parameters())
    for norm_type in (2.0, 1.0, 3.0, math.inf):
        backward()
        ours = clip_grad_norm_(params, MAX_NORM, norm_type)
        clipped = [p.grad.to_local().clone() for p in params]
        backward()
        theirs = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, norm_type=norm_type).full_tensor()
        expect(ours.item() < math.inf and ours.item() > MAX_NORM, f"p={norm_type}: norm {ours.item()} does not clip")
        if math.isinf(norm_type):  # a max: exact whatever the order of operations
            expect(ours.item() == theirs.item(), f"p=inf: {ours.item()!r} vs torch's {theirs.item()!r}")
        else:  # torch takes the root of each process's sum, then the root of the sum of their squares
            close = torch.allclose(ours, theirs, rtol=1e-6, atol=0)
            expect(close, f"p={norm_type}: {ours.item()!r} vs torch's {theirs.item()!r}")
        torchs = [p.grad.to_local() for p in params]
        same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-10) for a, b in zip(clipped, torchs, strict=True))
        expect(same, f"p={norm_type}: the clipped gradients differ from torch's")


if __name__ == "__main__":
    run_checks(teardown=dist.destroy_process_group)
