"""The GPU lane: accel's CUDA paths that CPU tests cannot run, as named cases, in one command.

    python bench/gpu_lane.py                 # a GPU machine: a table of cases, exit 1 when one fails (< 10 min, 1 GPU)
    python bench/gpu_lane.py --cpu           # dry run over gloo: checks the script itself (GPU-only checks off)
    python bench/gpu_lane.py --only nccl_ddp fsdp2_offload_meta_init

Each case (bench/gpu_lane_cases.py) runs in its own torchrun job, so that one crash or hang does not take the
others: on 2 processes where it needs them (2 GPUs, or 2 processes on one GPU when NCCL accepts that; when it
answers "Duplicate GPU", the multi-process cases are reported as skipped, with that reason), else on one. A case
that cannot run on this machine (fp8 on a GPU below compute capability 8.9, Transformer-Engine not installed or
on the CPU) is reported as skipped with its reason: neither a pass nor a failure. The last case is
bench/gpu_mfu.py (accel against raw FSDP2, like for like) on every GPU of the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DUPLICATE_GPU = "Duplicate GPU detected"


@dataclass(frozen=True)
class Case:
    name: str
    processes: int  # what the case needs to mean anything (1: runs anywhere)
    what: str


CASES = (
    Case(
        "fsdp2_offload_meta_init", 2, "FSDP2 + CPU offload, meta-device and process-0 loading: shards CPU, buffers GPU"
    ),
    Case("fsdp2_sync_module_states", 2, "FSDP2 sync_module_states with the model still on the CPU (NCCL broadcast)"),
    Case("megatron_pp_bf16", 2, "Megatron pipeline pp=2 under bf16: bf16 between stages, loss vs fp32"),
    Case("process_groups_device_id", 2, "groups and GPU memory after setup, device_id given (the default)"),
    Case("process_groups_lazy", 2, "groups and GPU memory after setup, without device_id"),
    Case("nccl_ddp", 2, "DDP over NCCL: identical replicas, a gather in rank order"),
    Case("fp16_grad_scaler", 1, "fp16 + GradScaler: an inf gradient skips the step"),
    Case("fp16_fsdp2_cpu_offload", 1, "fp16 + FSDP2 + CPU offload: sharded scaler, shards CPU, buffers GPU"),
    Case("fp8_torchao", 1, "fp8 through torchao (tensorwise, compiled): layers converted, step and memory vs bf16"),
    Case("fp8_transformer_engine", 1, "fp8 through Transformer-Engine: layers converted, step and memory vs bf16"),
)


@dataclass
class Outcome:
    status: str  # pass, FAIL, skipped
    detail: str
    seconds: float
    nccl_refused: bool = False  # skipped because NCCL refuses several processes on one GPU


def gpu_count(cpu: bool) -> int:
    if cpu:
        return 0
    import torch  # here only: `--help` stays fast

    return torch.cuda.device_count()


def torchrun(script: Path, args: list[str], processes: int, env: dict[str, str], timeout: float) -> tuple[int, str]:
    """Runs `script` under torchrun; returns its exit code (124 on a timeout) and its output. On a timeout torchrun
    gets SIGTERM, on which it stops its workers itself (SIGTERM, then SIGKILL after 30 s); a SIGKILL to torchrun
    alone would leave them running in sessions of their own (a hung NCCL collective would keep its GPU)."""
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", "--standalone"]
    job = subprocess.Popen(
        [*command, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=HERE.parent,
    )
    try:
        output, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        job.terminate()
        try:
            output, _ = job.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            job.kill()
            output, _ = job.communicate()
        return 124, (output or "") + f"\n(timed out after {timeout:.0f} s: a hang?)"
    return job.returncode, output


def last_error(output: str) -> str:
    """The line that says why a case failed: the timeout note when it timed out (the traceback torchrun prints
    as it stops its workers would hide it), else the last line naming an error."""
    timed_out = [line.strip() for line in output.splitlines() if line.startswith("(timed out after ")]
    if timed_out:
        return timed_out[-1]
    lines = [line.strip() for line in output.splitlines() if "Error" in line or "error" in line]
    return (lines[-1] if lines else output.strip().splitlines()[-1] if output.strip() else "no output")[:300]


def run_case(case: Case, processes: int, env: dict[str, str], timeout: float) -> Outcome:
    start = time.perf_counter()
    code, output = torchrun(HERE / "gpu_lane_cases.py", [case.name], processes, env, timeout)
    seconds = time.perf_counter() - start
    results = [line for line in output.splitlines() if line.startswith("LANE RESULT ")]
    if code == 0 and results:
        return Outcome("pass", json.loads(results[-1].removeprefix("LANE RESULT "))["detail"], seconds)
    skips = [line for line in output.splitlines() if line.startswith("LANE SKIP ")]
    if code == 0 and skips:
        return Outcome("skipped", json.loads(skips[-1].removeprefix("LANE SKIP "))["reason"], seconds)
    if DUPLICATE_GPU in output:
        why = f"NCCL refuses {processes} processes on one GPU: needs {processes} GPUs"
        return Outcome("skipped", why, seconds, nccl_refused=True)
    return Outcome("FAIL", f"exit {code}: {last_error(output)}", seconds)


def run_mfu(gpus: int, cpu: bool, env: dict[str, str], timeout: float) -> Outcome:
    args = ["--tiny", "--no-compile", "--rounds", "1", "--steps", "1"] if cpu else ["--rounds", "2", "--steps", "5"]
    start = time.perf_counter()
    code, output = torchrun(HERE / "gpu_mfu.py", args, 2 if cpu else gpus, env, timeout)
    seconds = time.perf_counter() - start
    summary = [line for line in output.splitlines() if "step accel / raw" in line]
    if code == 0 and summary:
        return Outcome("pass", summary[-1], seconds)
    return Outcome("FAIL", f"exit {code}: {last_error(output)}", seconds)


def table(rows: list[tuple[str, int, Outcome]]) -> str:
    lines = ["| case | processes | result | seconds | detail |", "|---|---|---|---|---|"]
    lines += [f"| {name} | {n} | {o.status} | {o.seconds:.0f} | {o.detail} |" for name, n, o in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="dry run on CPU over gloo (checks the script itself)")
    parser.add_argument("--only", nargs="+", metavar="CASE", help="these cases only (gpu_mfu: the benchmark)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds per case before it counts as a hang (240; --cpu: 600)"
    )
    args = parser.parse_args()
    known = {case.name for case in CASES} | {"gpu_mfu"}
    unknown = set(args.only or ()) - known
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; the cases are {sorted(known)}")
    timeout = args.timeout or (600.0 if args.cpu else 240.0)
    gpus = gpu_count(args.cpu)
    if not args.cpu and gpus == 0:
        parser.error("no CUDA device here: run on a GPU machine, or pass --cpu for the dry run")
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4")}
    if args.cpu:
        env["ACCEL_USE_CPU"] = "true"
    chosen = [case for case in CASES if not args.only or case.name in args.only]
    rows: list[tuple[str, int, Outcome]] = []
    refused: Outcome | None = None  # NCCL's answer to 2 processes on one GPU, once known
    start = time.perf_counter()
    for case in chosen:
        processes = case.processes  # on one GPU, 2 processes share it (if NCCL allows)
        if refused is not None and processes > gpus:
            rows.append((case.name, processes, Outcome("skipped", refused.detail, 0.0, nccl_refused=True)))
            continue
        outcome = run_case(case, processes, env, timeout)
        if outcome.nccl_refused:
            refused = outcome
        rows.append((case.name, processes, outcome))
        print(f"{case.name}: {outcome.status}: {outcome.detail} ({outcome.seconds:.0f} s)", flush=True)
    if not args.only or "gpu_mfu" in args.only:
        outcome = run_mfu(gpus, args.cpu, env, max(timeout, 540.0))
        rows.append(("gpu_mfu", 2 if args.cpu else gpus, outcome))
        print(f"gpu_mfu: {outcome.status}: {outcome.detail} ({outcome.seconds:.0f} s)", flush=True)
    print()
    print(table(rows))
    count = {status: [name for name, _, o in rows if o.status == status] for status in ("pass", "skipped", "FAIL")}
    failed = count["FAIL"]
    print(
        f"\n{len(rows)} cases in {time.perf_counter() - start:.0f} s: {len(count['pass'])} passed, "
        f"{len(count['skipped'])} skipped, {len(failed)} failed" + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
