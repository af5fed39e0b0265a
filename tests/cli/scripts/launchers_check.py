"""notebook_launcher and debug_launcher for real: results by rank, settings, a failing rank. Prints one JSON line."""

import json
import os
import time

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from accel_launch import JobFailedError, debug_launcher, notebook_launcher


def work(scale: int) -> dict:
    import torch
    import torch.distributed as dist

    from accel_core.state import PartialState

    state = PartialState()
    total = torch.tensor([float(state.process_index + 1)])
    dist.all_reduce(total)
    return {
        "rank": state.process_index,
        "world": state.num_processes,
        "backend": state.backend,
        "device": str(state.device),
        "sum": total.item() * scale,
        "precision": os.environ.get("ACCEL_MIXED_PRECISION"),
        "cpu": os.environ.get("ACCEL_USE_CPU"),
    }


def failing() -> None:
    if os.environ["RANK"] == "1":
        raise KeyError("rank 1 cannot go on")
    time.sleep(60)


def lone_state() -> None:
    # Rank 1 returns without setting up the process group rank 0 sets up: it will never join.
    if os.environ["RANK"] == "1":
        return
    from accel_core.state import PartialState

    PartialState()


def lone_then_together(scale: int) -> dict | None:
    # Accelerate's fault-tolerance test, made deterministic: the first attempt is lone_state, the restart works.
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        return lone_state()
    return work(scale)


def local() -> str:
    return os.environ.get("ACCEL_MIXED_PRECISION", "")


if __name__ == "__main__":
    report = {"debug": debug_launcher(work, args=(10,))}
    report["notebook"] = notebook_launcher(
        work, args=(2,), num_processes=2, mixed_precision="bf16", use_cpu=True, log_line_prefix_template="[${rank}]: "
    )
    report["one"] = notebook_launcher(local, num_processes=1, mixed_precision="fp16")
    report["env_after"] = os.environ.get("ACCEL_MIXED_PRECISION")
    start = time.monotonic()
    try:
        notebook_launcher(failing, num_processes=2, use_cpu=True)
    except ChildFailedError as error:  # what scripts written for Accelerate catch
        report["failure"] = {
            "rank": error.root.rank,
            "exit_code": error.exit_code,
            "text": str(error),
            "job_failed_error": isinstance(error, JobFailedError),
            "torch_failures": sorted(error.failures),
            "first_failure": error.get_first_failure()[0],
        }
    report["failure_seconds"] = time.monotonic() - start
    # A rank waiting to set up the group for a peer that returned: fails at once (it waited for the group timeout,
    # 30 minutes, with the agent waiting for it), and a restart then runs the function again.
    start = time.monotonic()
    try:
        notebook_launcher(lone_state, num_processes=2, use_cpu=True)
        report["lone"] = None
    except ChildFailedError as error:
        report["lone"] = {"rank": error.root.rank, "text": str(error)}
    report["lone_seconds"] = time.monotonic() - start
    start = time.monotonic()
    report["restarted"] = notebook_launcher(
        lone_then_together, args=(3,), num_processes=2, use_cpu=True, max_restarts=1
    )
    report["restarted_seconds"] = time.monotonic() - start
    # A process state in the parent would be inherited by forked workers: refused before any worker starts.
    from accel_core.state import PartialState

    PartialState(cpu=True)
    try:
        notebook_launcher(work, args=(2,), num_processes=2, use_cpu=True)
        report["refusal"] = None
    except ValueError as error:
        report["refusal"] = str(error)
    print(json.dumps(report), flush=True)
