"""Mismatched collectives on 2 processes: each raises the same clear error on both ranks, nothing hangs.

Run: PYTHONPATH=tests/harness torchrun --nproc_per_node 2 tests/multiprocess/collective_checks.py
Each ``@check`` is one test of tests/core/test_collective_checks.py (the harness: tests/harness/checklist.py); a
collective called on one rank only is collective_subset_checks.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from checklist import check, expect, run_checks

from accel_core import Accelerator, PartialState, ops
from accel_core.ops import DistributedOperationException

acc = Accelerator()
rank = acc.process_index
STARTED = time.monotonic()


def raises_everywhere(name: str, call: Callable[[], Any], *expected: str) -> None:
    """``call`` raises DistributedOperationException (a ValueError) on this rank, naming ``expected``;
    and on the other."""
    message = None
    try:
        result = call()
    except DistributedOperationException as error:
        expect(isinstance(error, ValueError), f"{name}: not a ValueError")
        message = str(error)
    else:
        raise AssertionError(f"[rank {rank}] {name}: no error, returned {result!r}")
    for part in expected:
        expect(part in message, f"{name}: {part!r} missing from the message:\n{message}")
    everyone: list[Any] = [None, None]
    dist.all_gather_object(everyone, message)
    expect(everyone[0] == everyone[1], f"{name}: the ranks raised different messages: {everyone}")
    if rank == 0:
        print(f"ok {name}: {message.splitlines()[0]}", flush=True)


def raises_plain_value_error_everywhere(name: str, call: Callable[[], Any], *expected: str) -> None:
    """``call`` raises ValueError on this rank (a local check every rank reaches alike), naming ``expected``."""
    try:
        result = call()
    except ValueError as error:
        message = str(error)
    else:
        raise AssertionError(f"[rank {rank}] {name}: no error, returned {result!r}")
    for part in expected:
        expect(part in message, f"{name}: {part!r} missing from the message:\n{message}")
    if rank == 0:
        print(f"ok {name}: {message}", flush=True)


# The cases, as a new user would write them: each raises the same clear error on every rank.


@check
def gather_sizes_differ() -> None:
    raises_everywhere(
        "gather, sizes differ",
        lambda: acc.gather(torch.ones(2 + rank, 3)),
        "Cannot apply gather",
        "process 0: tensor: float32 (2, 3)",
        "process 1: tensor: float32 (3, 3)",
        "pad_across_processes",
    )


@check
def gather_dtypes_differ() -> None:
    raises_everywhere(
        "gather, dtypes differ",
        lambda: acc.gather(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.int32)),
        "process 0: tensor: float32 (4,)",
        "process 1: tensor: int32 (4,)",
    )


@check
def broadcast_into_another_shape() -> None:
    raises_everywhere(
        "broadcast into another shape",
        lambda: ops.broadcast(torch.ones(4 if rank == 0 else 3)),
        "Cannot apply broadcast",
        "(4,)",
        "(3,)",
    )


@check
def pad_numbers_of_dimensions_differ() -> None:
    raises_everywhere(
        "pad_across_processes, numbers of dimensions differ",
        lambda: acc.pad_across_processes(torch.ones(2, 3) if rank == 0 else torch.ones(2, 3, 1), dim=1),
        "Cannot apply pad_across_processes",
        "process 0: tensor: 2-d",
        "process 1: tensor: 3-d",
    )


@check
def large_gather_sizes_differ() -> None:
    raises_everywhere(
        "gather, sizes of a large tensor differ (the check, then the data)",
        lambda: acc.gather(torch.ones(5000 + rank, 2)),
        "process 0: tensor: float32 (5000, 2)",
        "process 1: tensor: float32 (5001, 2)",
    )


@check
def reduce_shapes_differ() -> None:
    raises_everywhere("reduce, shapes differ", lambda: acc.reduce(torch.ones(2 + rank)), "Cannot apply reduce")


@check
def gather_nested_keys_differ() -> None:
    raises_everywhere(
        "gather, nested keys differ",
        lambda: acc.gather({"a": torch.ones(2)} if rank == 0 else {"b": torch.ones(2)}),
        "process 0: input: dict of 1; ['a']",
        "process 1: input: dict of 1; ['b']",
    )


@check
def gather_a_tensor_on_one_rank_only() -> None:
    raises_everywhere(
        "gather, a tensor on one rank only",
        lambda: acc.gather(torch.ones(2) if rank == 0 else [torch.ones(1), torch.ones(1)]),
        "process 1: input: list of 2",
    )


@check
def gather_for_metrics_labels_differ() -> None:
    raises_everywhere(
        "gather_for_metrics, labels differ",
        lambda: acc.gather_for_metrics((torch.ones(4, 2), torch.ones(4 if rank == 0 else 3, dtype=torch.int64))),
        "Cannot apply gather_for_metrics",
        "[1]: int64 (4,)",
        "[1]: int64 (3,)",
    )


@check
def pad_on_a_dimension_the_tensor_lacks() -> None:
    raises_plain_value_error_everywhere(
        "pad_across_processes on a dimension the tensor lacks",
        lambda: acc.pad_across_processes(torch.ones(2, 3), dim=5),
        "dim=5",
        "2 dimension(s)",
    )


@check
def what_the_operations_allow_still_works_after_the_failures() -> None:
    # What the operations allow still works, and the group is usable after every failure above.
    expect(acc.gather(torch.full((2, 3), float(rank))).sum().item() == 6.0, "gather after the failures")
    padded = acc.pad_across_processes({"x": torch.ones(2, 1 + rank), "y": [torch.ones(1 + 2 * rank)]}, dim=-1)
    expect(padded["x"].shape == (2, 2) and padded["y"][0].shape == (3,), f"pad of several leaves: {padded}")
    both = acc.gather_for_metrics(
        (torch.ones(2, 2), torch.ones(2, dtype=torch.int64), ["a", "b"] if rank == 0 else ["c"])
    )
    expect(both[0].shape == (4, 2) and both[2] == ["a", "b", "c"], "gather_for_metrics with lists of differing lengths")
    expect(acc.gather_object([rank] * (rank + 1)) == [0, 1, 1], "gather_object of differing lengths is allowed")
    large = acc.gather({"a": torch.full((3000, 2), float(rank)), "b": torch.arange(10)})  # over SMALL_GATHER_BYTES
    expect(
        large["a"].shape == (6000, 2) and bool(large["a"][3000:].eq(1).all()) and bool(large["a"][:3000].eq(0).all()),
        "large gather",
    )
    expect(large["b"].tolist() == list(range(10)) * 2, "large gather, second tensor")
    # Several tensors travel packed in one all_gather: every dtype and shape comes back intact.
    mixed = {
        "f": torch.arange(6, dtype=torch.float32).view(3, 2) + 10 * rank,
        "i": [torch.tensor([rank, -rank], dtype=torch.int64), torch.tensor(rank == 1)],
        "h": torch.full((1, 1, 3), rank + 0.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 3, dtype=torch.float16),
    }
    for name, gathered in (("gather", acc.gather(mixed)), ("gather_for_metrics", acc.gather_for_metrics(mixed))):
        expect(
            torch.equal(gathered["f"], torch.cat([torch.arange(6.0).view(3, 2), torch.arange(6.0).view(3, 2) + 10])),
            f"{name} f",
        )
        expect(
            gathered["i"][0].tolist() == [0, 0, 1, -1] and gathered["i"][1].tolist() == [False, True],
            f"{name} i: {gathered['i']}",
        )
        expect(
            gathered["h"].dtype == torch.bfloat16 and gathered["h"].view(-1).tolist() == [0.5] * 3 + [1.5] * 3,
            f"{name} h",
        )
        expect(gathered["empty"].shape == (0, 3) and gathered["empty"].dtype == torch.float16, f"{name} empty")
    # A group of one process (each rank its own): the gather returns this rank's data, dtypes intact.
    alone = [dist.new_group([0]), dist.new_group([1])][rank]
    single = ops.gather((torch.full((3,), rank, dtype=torch.int8), torch.arange(5.0), torch.tensor(True)), alone)
    expect(
        single[0].tolist() == [rank] * 3 and single[1].tolist() == [0, 1, 2, 3, 4] and single[2].tolist() == [True],
        f"gather in a group of one: {single}",
    )


@check
def gathers_of_changing_sizes() -> None:
    """Checked gathers of changing sizes: the data rides with the check when it fits the group's capacity,
    which follows recent sizes; every result is right, and a mismatch is caught whatever the capacity."""
    sizes = [32 * 1000, 32 * 1000, 32 * 1000, 8, 600 * 1000, 32 * 1000, 40, 32 * 1000, 32 * 1000]
    for step, numel in enumerate(sizes):
        mine = (torch.arange(numel, dtype=torch.float32) + rank * numel + step, torch.full((3,), rank + step))
        for name, gathered in (("gather", acc.gather(mine)), ("gather_for_metrics", acc.gather_for_metrics(mine))):
            expected = torch.arange(2 * numel, dtype=torch.float32) + step
            expect(torch.equal(gathered[0], expected), f"{name} step {step} ({numel} floats): wrong data")
            expect(gathered[1].tolist() == [step] * 3 + [step + 1] * 3, f"{name} step {step}: {gathered[1]}")
    # Same-sized gathers in a row (an evaluation loop): one all_gather each, the check included.
    real = {name: getattr(dist, name) for name in ("all_gather", "all_gather_into_tensor", "all_gather_object")}
    calls: list[str] = []

    def counting(name: str) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real[name](*args, **kwargs)

        return collective

    for name in real:
        setattr(dist, name, counting(name))
    try:
        logits = (torch.ones(32, 1000), torch.ones(32, dtype=torch.int64))
        per_call = []
        for _ in range(3):
            calls.clear()
            acc.gather_for_metrics(logits)
            per_call.append(len(calls))
        # Logits too large to ride with the check: the labels do, so two collectives as without the check.
        large_logits = (torch.full((32, 10000), float(rank)), torch.arange(32) + rank)
        per_large_call = []
        for _ in range(3):
            calls.clear()
            gathered = acc.gather_for_metrics(large_logits)
            per_large_call.append(len(calls))
    finally:
        for name, collective in real.items():
            setattr(dist, name, collective)
    expect(per_call[1:] == [1, 1], f"all_gathers per same-sized gather_for_metrics: {per_call}")
    expect(per_large_call[1:] == [2, 2], f"all_gathers per gather_for_metrics of large logits: {per_large_call}")
    expect(
        gathered[0].shape == (64, 10000)
        and bool(gathered[0][32:].eq(1).all())
        and bool(gathered[0][:32].eq(0).all())
        and gathered[1].tolist() == list(range(32)) + list(range(1, 33)),
        "large logits and their labels",
    )
    # The capacity now fits 128 KB: sizes that differ slightly both fit, and the check still refuses them.
    raises_everywhere(
        "gather, sizes differ while both fit the adapted capacity",
        lambda: acc.gather(torch.ones(32 * 1000 - rank)),
        "process 0: tensor: float32 (32000,)",
        "process 1: tensor: float32 (31999,)",
    )
    if rank == 0:
        print("ok gathers of changing sizes", flush=True)


@check
def nothing_hung() -> None:
    acc.wait_for_everyone()
    took = time.monotonic() - STARTED
    expect(took < 60, f"the mismatch checks took {took:.0f}s")  # each raised within seconds, nothing hung


if __name__ == "__main__":
    run_checks(teardown=PartialState().destroy_process_group)
