"""One rank of each of several jobs started without torchrun (the test fakes srun / mpirun / a PyTorchJob pod): each
job joins through ``Accelerator()``, checks an all_reduce and one prepared DDP step, and writes what it saw as JSON.

Usage: ``cluster_job.py <jobs.json>``: a list of ``{"kind", "env", "report"}``, this rank's variables for that kind of
launcher and the file for its report. torch and accel are imported once, here; each job runs in a process forked from
this one (one thread, no process group, no Accelerator yet) that sees that job's variables and none of the others':
what a fresh process of that launcher reads, without importing torch four times. Exits 1 when a job failed.
"""

import json
import os
import sys
import time
import traceback

import torch

from accel_core import Accelerator

# Every variable a job reads its place from: a job's process sees its own, not those of the job before.
JOB_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"}
JOB_TIMEOUT = 300  # seconds; a job that hangs (its peer failed before joining) is killed and counted failed


def run_job(report_path: str) -> None:
    environ_before = dict(os.environ)
    accelerator = Accelerator(cpu=True)
    # The launcher's variables are settled into a record (accel_core.settings); os.environ is left as given.
    changed = sorted(k for k in {*environ_before, *os.environ} if environ_before.get(k) != os.environ.get(k))
    settled = accelerator.state.settings
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
        "environ_changed_by_accelerator": changed,
        "settled": {
            "launcher": settled.launcher,
            "master_addr": settled.master_addr,
            "master_port": settled.master_port,
        },
    }
    with open(report_path, "w") as handle:
        json.dump(report, handle)
    accelerator.end_training()


def run_forked(job: dict, others: set[str]) -> bool:
    """Runs one job in a child process; whether it succeeded."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for name in others | JOB_VARIABLES:
                os.environ.pop(name, None)
            os.environ.update(job["env"])
            run_job(job["report"])
            code = 0
        except BaseException:  # noqa: BLE001 - shown in the test's failure message
            print(f"{job['kind']} job failed:", file=sys.stderr)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    print(f"{job['kind']} job did not end within {JOB_TIMEOUT} s", file=sys.stderr)
    return False


with open(sys.argv[1]) as handle:
    jobs = json.load(handle)
every_name = {name for job in jobs for name in job["env"]}
failed = [job["kind"] for job in jobs if not run_forked(job, every_name)]
sys.exit(1 if failed else 0)
