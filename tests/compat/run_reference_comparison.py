"""Runs each script of tests/compat/examples/ on Hugging Face Accelerate and on accel, 2 CPU processes each, and
writes the side-by-side table (reference_comparison.md / .json beside this file).

    uv run python tests/compat/run_reference_comparison.py               # both sides (~2 x 20 launches)
    uv run python tests/compat/run_reference_comparison.py --accel-only  # accel again, reference from the JSON
    uv run python tests/compat/run_reference_comparison.py --only nlp_example memory

The reference is installed in a throwaway virtual environment (default /tmp/accel-compat-reference,
made with `uv venv` + `uv pip install accelerate==1.15.* torch==<this torch>`; nothing is added to the
workspace) and started with torchrun, because `accelerate launch --cpu --num_processes 2` without an
MPI hostfile starts a single process. accel runs as a user runs it: `accel launch --cpu -n 2`.
Both sides get the same script file; `ACCEL_COMPAT_LIB` picks the import.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLES_DIR = HERE / "examples"
RESULTS_JSON = HERE / "reference_comparison.json"
RESULTS_MD = HERE / "reference_comparison.md"
REFERENCE_SPEC = "accelerate==1.15.*"
REFERENCE_EXTRAS = [
    "numpy",
    "scikit-learn",
    "schedulefree",
    "tensorboard",
    "deepspeed",  # accelerate.utils exports DummyOptim / DummyScheduler only where DeepSpeed is installed
]  # what the examples import besides accelerate
DEFAULT_REFERENCE_VENV = Path(tempfile.gettempdir()) / "accel-compat-reference"
# Same script, same torch, same CPU, same gloo: the same calls give the same bits (the one example that
# matches today matches exactly). The tolerance only absorbs last-bit noise: a DDP comm hook left out
# moves the weights by ~1e-7 relative, which must show.
REL_TOL, ABS_TOL = 1e-9, 1e-12
TOLERANCE_TEXT = (
    f"numbers equal within rel {REL_TOL:g} / abs {ABS_TOL:g} (math.isclose); strings, booleans, lists' lengths exact"
)
# "Same CPU" above means the same kernels: on another processor (other vector instructions, so other kernels and
# summation orders) the same torch rounds some float32 results differently in their last bit. Measured between two
# CI machines (2026-12-03) with the same torch: a float32 loss 1 ULP apart (0.6565830111503601 -> 0.6565830707550049)
# and float64 weight norms 1e-9 to 3e-9 apart. Where the recording's processor is not this one, a float32 value (a
# loss read with .item()) may be 2 float32 ULPs off and any other number rel 1e-8: still well below what a left-out
# DDP comm hook moves (~1e-7).
OTHER_PROCESSOR_FLOAT32_ULPS, OTHER_PROCESSOR_REL_TOL = 2, 1e-8
OTHER_PROCESSOR_TEXT = (
    f"recorded on another processor: float32 values within {OTHER_PROCESSOR_FLOAT32_ULPS} float32 ULPs, other "
    f"numbers within rel {OTHER_PROCESSOR_REL_TOL:g}"
)


def processor_kernels() -> str:
    """What picks the CPU kernels torch runs, besides its version: torch's CPU capability (its vectorised kernels)
    and the processor's vector instruction sets (oneDNN's and MKL's). Recorded with the reference's numbers."""
    import torch

    flags: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    vector = sorted(flag for flag in set(flags) if flag.startswith(("avx", "amx", "fma", "f16c")))
    return f"{torch.backends.cpu.get_cpu_capability()}: {' '.join(vector)}"


def _within_other_processor_rounding(reference: float, accel: float) -> bool:
    as_float32 = struct.unpack("f", struct.pack("f", reference))[0] if math.isfinite(reference) else None
    if as_float32 == reference and reference != 0:  # a float32 result: its ULP is float64's times 2**29
        return abs(accel - reference) <= OTHER_PROCESSOR_FLOAT32_ULPS * math.ulp(reference) * 2**29
    return math.isclose(reference, accel, rel_tol=OTHER_PROCESSOR_REL_TOL, abs_tol=ABS_TOL)


@dataclass(frozen=True)
class Run:
    """One launch of an example; `{out}` in its arguments is the example's scratch folder, shared by its runs.

    `continues`: the label of the earlier run whose checkpoint this one resumes; an exact resume ends with
    that run's final metrics (but for `overall_step`, which the scripts count from the resume point).
    """

    label: str
    args: tuple[str, ...] = ()
    continues: str | None = None


@dataclass(frozen=True)
class Example:
    name: str  # the script in tests/compat/examples/
    reference: str  # the Accelerate example it follows
    runs: tuple[Run, ...] = (Run("default"),)
    needs: tuple[str, ...] = ()  # modules the script imports beyond torch/numpy
    accel_prints: str = ""  # a line the accel run prints when the feature it shows is engaged ("FSDP")
    # `accel launch` flags before the script (the backend's, as a user passes them); `{examples}` is EXAMPLES_DIR
    accel_launch_args: tuple[str, ...] = ()
    # (rel, abs, why) where accel runs a backend the reference cannot run on CPU and is compared with its plain
    # data-parallel run; None: the common REL_TOL / ABS_TOL
    tolerance: tuple[float, float, str] | None = None
    # processes of the reference's run: 1 where accel's run is one data-parallel replica split by tensor parallelism
    reference_processes: int = 2
    # (metric names, why): final metrics the script itself computes otherwise under the backend (a branch of the
    # reference's own example), left out of the comparison; the why says how the rest was checked
    not_compared: tuple[tuple[str, ...], str] | None = None
    # Why the backend run's numbers differ from the reference's plain run although accel runs the backend as the
    # reference's integration would (out of accel's hands): test_examples.py expects the difference
    known_gap: str | None = None

    def ignored(self) -> tuple[str, ...]:
        return self.not_compared[0] if self.not_compared else ()

    def tolerances(self) -> tuple[float, float]:
        return (self.tolerance[0], self.tolerance[1]) if self.tolerance else (REL_TOL, ABS_TOL)

    def run_id(self, label: str) -> str:
        return self.name if label == "default" else f"{self.name}[{label}]"

    def run_ids(self) -> list[str]:
        return [self.run_id(run.label) for run in self.runs]


RESUME_IGNORED = ("overall_step",)


def resume_exact(results: dict[str, dict[str, Any] | None], example: Example, run: Run) -> bool | None:
    """Whether a resumed run ended as the run it continues did (None when either did not finish)."""
    resumed, full = results.get(example.run_id(run.label)), results.get(example.run_id(run.continues or ""))
    if not (resumed and full and resumed["ok"] and full["ok"]):
        return None
    return not differences(full["metrics"], resumed["metrics"], ignore=RESUME_IGNORED)


EXAMPLES: tuple[Example, ...] = (
    Example("nlp_example", "examples/nlp_example.py"),
    Example("cv_example", "examples/cv_example.py"),
    Example(
        "complete_nlp_example",
        "examples/complete_nlp_example.py",
        runs=(
            Run(
                "epochs",
                (
                    "--with_tracking",
                    "--checkpointing_steps",
                    "epoch",
                    "--output_dir",
                    "{out}/ckpt",
                    "--project_dir",
                    "{out}/logs",
                ),
            ),
            Run(
                "resume_epoch_0",
                (
                    "--with_tracking",
                    "--resume_from_checkpoint",
                    "{out}/ckpt/epoch_0",
                    "--output_dir",
                    "{out}/resumed",
                    "--project_dir",
                    "{out}/logs",
                ),
                continues="epochs",
            ),
        ),
    ),
    Example(
        "complete_cv_example",
        "examples/complete_cv_example.py",
        runs=(
            Run(
                "steps",
                (
                    "--with_tracking",
                    "--checkpointing_steps",
                    "4",
                    "--output_dir",
                    "{out}/ckpt",
                    "--project_dir",
                    "{out}/logs",
                ),
            ),
            Run(
                "resume_step_8",
                ("--resume_from_checkpoint", "{out}/ckpt/step_8", "--output_dir", "{out}/resumed"),
                continues="steps",
            ),
        ),
    ),
    Example("automatic_gradient_accumulation", "examples/by_feature/automatic_gradient_accumulation.py"),
    Example(
        "checkpointing",
        "examples/by_feature/checkpointing.py",
        runs=(
            Run("steps", ("--checkpointing_steps", "4", "--output_dir", "{out}/ckpt")),
            Run(
                "resume_step_12",
                ("--resume_from_checkpoint", "{out}/ckpt/step_12", "--output_dir", "{out}/resumed"),
                continues="steps",
            ),
        ),
    ),
    Example(
        "cross_validation",
        "examples/by_feature/cross_validation.py",
        runs=(Run("default", ("--num_folds", "3")),),
        needs=("sklearn",),
    ),
    Example(
        "ddp_comm_hook",
        "examples/by_feature/ddp_comm_hook.py",
        runs=(Run("power_sgd_fp16", ("--ddp_comm_hook", "power_sgd", "--ddp_comm_wrapper", "fp16")),),
    ),
    Example("early_stopping", "examples/by_feature/early_stopping.py"),
    Example(
        "gradient_accumulation",
        "examples/by_feature/gradient_accumulation.py",
        runs=(Run("default", ("--gradient_accumulation_steps", "2")),),
    ),
    Example(
        "gradient_accumulation_for_autoregressive_models",
        "examples/by_feature/gradient_accumulation_for_autoregressive_models.py",
        runs=(Run("default", ("--gradient_accumulation_steps", "2")),),
    ),
    Example("local_sgd", "examples/by_feature/local_sgd.py", runs=(Run("default", ("--local_sgd_steps", "4")),)),
    Example("memory", "examples/by_feature/memory.py"),
    Example("multi_process_metrics", "examples/by_feature/multi_process_metrics.py"),
    Example(
        "profiler",
        "examples/by_feature/profiler.py",
        runs=(Run("default", ("--record_shapes", "--output_trace_dir", "{out}/traces")),),
    ),
    Example("schedule_free", "examples/by_feature/schedule_free.py", needs=("schedulefree",)),
    # Accelerate runs it as MULTI_CPU data parallelism on --cpu (its FSDP needs accelerator devices), accel under
    # real FSDP2: the same averaged gradients, so the same numbers.
    Example(
        "fsdp_with_peak_mem_tracking",
        "examples/by_feature/fsdp_with_peak_mem_tracking.py",
        needs=("psutil",),
        accel_prints="FSDP",  # its print(accelerator.distributed_type)
    ),
    # Accelerate 1.15 runs no DeepSpeed on --cpu (MULTI_CPU data parallelism, torch AdamW, the linear schedule
    # stepped once per process: 2 scheduler steps per optimizer step); accel runs ZeRO-2 with the config's AdamW
    # and WarmupDecayLR (its warmup_num_steps: 2 optimizer steps = the reference's 4 scheduler steps).
    Example(
        "deepspeed_with_config_support",
        "examples/by_feature/deepspeed_with_config_support.py",
        runs=(Run("zero2", ("--output_dir", "{out}/out", "--num_warmup_steps", "4", "--load_best_model")),),
        needs=("deepspeed",),
        accel_prints="DeepSpeedEngine zero_stage=2",
        accel_launch_args=(
            "--use_deepspeed",
            "--deepspeed_config_file",
            "{examples}/deepspeed_config_templates/zero_stage2_config.json",
        ),
        tolerance=(
            1e-5,
            1e-8,
            "vs the reference's plain data parallelism: ZeRO-2 reduce-scatters the fp32 gradients in buckets and "
            "steps each partition, DDP all-reduces them, so the averages differ in the last bits and 18 AdamW "
            "steps carry that forward",
        ),
        known_gap=(
            "the learning rates differ: the config's scheduler is DeepSpeed's WarmupDecayLR, built by DeepSpeed as "
            "Accelerate's DeepSpeed integration builds it (total_num_steps 'auto' = ceil(33 / 2 processes) = 17, "
            "warmup_num_steps 2), where the reference's plain run steps transformers' linear schedule (33 steps, "
            "warm-up 4, stepped twice per optimizer step). WarmupDecayLR starts at iteration -1 and its first step "
            "gives iteration 0, so the first two optimizer steps run at lr 0 (one with the linear schedule) and "
            "the decay ends at 17 optimizer steps, not 16.5: lr per step 0, 0, 0.005, 0.01, 0.00933... vs 0, 0.005, "
            "0.01, 0.00931... Everything else is the same: step by step, the batches are identical and the "
            "gradient norms (0.38-0.46, never clipped at the config's 1.0) agree to 1e-7, and the reference's "
            "plain run with its scheduler replaced by a LambdaLR giving WarmupDecayLR's learning rates (checked by "
            "hand on 2026-12-02) ends with accel's final metrics bit for bit (perplexity 20.208870373845226, "
            "weight_norm 25.34153173933904)"
        ),
    ),
    # Accelerate 1.15 cannot run Megatron on CPU (its integration needs Megatron-LM and CUDA): accel's TP=2 run (one
    # data-parallel replica) is held against the reference's plain run on one process (the same global batch).
    Example(
        "megatron_lm_gpt_pretraining",
        "examples/by_feature/megatron_lm_gpt_pretraining.py",
        runs=(Run("tp2", ("--output_dir", "{out}/out")),),
        needs=("megatron.core",),
        accel_prints="Megatron tp_degree=2",
        accel_launch_args=("--use-megatron", "--megatron-tp-degree", "2"),
        tolerance=(
            1e-6,
            1e-9,
            "vs the reference's plain one-process run: the row-parallel layer sums its two halves' products "
            "with an all-reduce, in another order than one matrix product",
        ),
        reference_processes=1,
        not_compared=(
            ("eval_loss", "perplexity"),
            "under Megatron the script (as Accelerate's example) averages the evaluation batches' mean losses "
            "(Megatron-LM averages them over the data-parallel group), otherwise the gathered per-sample losses, "
            "and the last evaluation batch is partial. The reference's plain run with the Megatron branch's "
            "averaging gives accel's eval_loss, 1.9008852243423462, exactly (checked by hand on 2026-12-02); "
            "the training metrics (last_loss, weight_norm, lr, steps) are compared",
        ),
    ),
    Example(
        "tracking",
        "examples/by_feature/tracking.py",
        runs=(Run("default", ("--with_tracking", "--project_dir", "{out}/logs")),),
    ),
    # Not one of Accelerate's examples: transformers' masked-LM script, whose collator masks with torch's global RNG
    # while the loader collates, so the order of collate and step (dropout) shows in every number.
    Example(
        "mlm_no_trainer",
        "transformers examples/pytorch/language-modeling/run_mlm_no_trainer.py",
        runs=(
            Run("steps", ("--checkpointing_steps", "5", "--output_dir", "{out}/ckpt")),
            Run("resume_step_10", ("--resume_from_checkpoint", "{out}/ckpt/step_10"), continues="steps"),
        ),
        needs=("transformers",),
    ),
)

SKIPPED: dict[str, str] = {
    "examples/finetune_lm_tpu.py": "TPU (torch_xla) only",
    "examples/multigpu_remote_launcher.py": "a GPU notebook launcher (runhouse cluster)",
    "examples/inference/*": "pipeline/distributed inference of hub checkpoints (Llama, Stable Diffusion, ...) on GPUs",
    "examples/torch_native_parallelism/*": "tensor/context parallelism and fp8 on GPUs",
    "examples/alst_ulysses_sequence_parallelism/*": "DeepSpeed Ulysses sequence parallelism on GPUs",
}


# --- launching ---


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(lib: str, home: Path) -> dict[str, str]:
    """The environment of one launch: no user config for either launcher, 1 thread per process, no online trackers."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCEL_", "ACCELERATE_", "WANDB_", "COMET_", "MLFLOW_"))
    }
    env.pop("VIRTUAL_ENV", None)
    env.update(
        ACCEL_COMPAT_LIB=lib,
        OMP_NUM_THREADS="1",
        HF_HOME=str(home / "hf"),
        XDG_CONFIG_HOME=str(home / "config"),
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
        # DeepSpeed's C++ ops build in minutes: a folder set by the caller (CI's cache) is kept
        TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR") or str(home / "torch_extensions"),
    )
    if lib == "accelerate":
        env["ACCELERATE_USE_CPU"] = "true"  # what `accelerate launch --cpu` sets
    return env


def launch_command(
    lib: str,
    script: Path,
    args: list[str],
    reference_python: Path | None,
    accel_launch_args: tuple[str, ...] = (),
    reference_processes: int = 2,
) -> list[str]:
    if lib == "accelerate":
        assert reference_python is not None
        return [
            str(reference_python),
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(reference_processes),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            str(script),
            "--cpu",
            *args,
        ]
    launcher = [a.replace("{examples}", str(EXAMPLES_DIR)) for a in accel_launch_args]
    return [
        str(Path(sys.executable).parent / "accel"),
        "launch",
        "--cpu",
        "-n",
        "2",
        *launcher,
        str(script),
        "--cpu",
        *args,
    ]


def parse_final_metrics(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith('{"final_metrics"'):
            return json.loads(line)["final_metrics"]
    return None


_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:\s?")
_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Interrupt|Warning)|ChildFailedError)\b.*")


def error_summary(stderr: str) -> str:
    """The last exception line of a failed job (torchrun's own report filtered out), else its last line."""
    lines = [
        _RANK_PREFIX.sub("", ln).strip()
        for ln in stderr.splitlines()
        if ln.strip() and not ln.startswith("Extension modules:")
    ]
    found = [
        ln
        for ln in lines
        if _ERROR_LINE.match(ln)
        and "ChildFailedError" not in ln
        and "FutureWarning" not in ln
        and "UserWarning" not in ln
    ]
    text = (found or lines or ["(no output)"])[-1]
    return text[:400]


def run_one(
    lib: str, example: Example, run: Run, workdir: Path, reference_python: Path | None, timeout: float
) -> dict[str, Any]:
    """Launches one run of `example` on `lib` with `workdir` as its cwd and `{out}`; returns ok, metrics, error,
    seconds."""
    args = [a.replace("{out}", str(workdir)) for a in run.args]
    command = launch_command(
        lib,
        EXAMPLES_DIR / f"{example.name}.py",
        args,
        reference_python,
        example.accel_launch_args,
        example.reference_processes,
    )
    started = time.monotonic()
    try:
        done = subprocess.run(
            command, cwd=workdir, env=clean_env(lib, workdir), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as expired:
        stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else (expired.stderr or "")
        return {
            "ok": False,
            "metrics": None,
            "error": f"timed out after {timeout:.0f}s: {error_summary(stderr)}",
            "seconds": round(time.monotonic() - started, 1),
        }
    metrics = parse_final_metrics(done.stdout)
    ok = done.returncode == 0 and metrics is not None
    engaged = example.accel_prints in done.stdout.splitlines() if lib == "accel" and example.accel_prints else None
    error = None if ok else error_summary(done.stderr) if done.returncode else "finished without a final_metrics line"
    return {
        "ok": ok,
        "metrics": metrics,
        "error": error,
        "seconds": round(time.monotonic() - started, 1),
        "stderr_tail": None if ok else done.stderr[-1500:],
        **({} if engaged is None else {"engaged": engaged}),
    }


def run_example(lib: str, example: Example, reference_python: Path | None, timeout: float) -> list[dict[str, Any]]:
    """All runs of one example in order, in one scratch folder (a resume run reads what the run before wrote)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"compat-{lib}-{example.name}-"))
    try:
        return [run_one(lib, example, run, workdir, reference_python, timeout) for run in example.runs]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- comparing ---


def differences(
    reference: Any,
    accel: Any,
    path: str = "",
    ignore: tuple[str, ...] = (),
    tolerances: tuple[float, float] = (REL_TOL, ABS_TOL),
    other_processor: bool = False,
) -> list[str]:
    """Where two final-metrics values differ beyond the tolerance (rel, abs), as 'key: reference -> accel'.
    other_processor: the reference was recorded on another processor; its last-bit rounding is allowed
    (OTHER_PROCESSOR_TEXT)."""
    if isinstance(reference, dict) and isinstance(accel, dict):
        reference = {k: v for k, v in reference.items() if k not in ignore}
        accel = {k: v for k, v in accel.items() if k not in ignore}
        out = [f"{path}{k}: missing on accel" for k in reference if k not in accel]
        out += [f"{path}{k}: only on accel" for k in accel if k not in reference]
        for key in reference:
            if key in accel:
                out += differences(
                    reference[key], accel[key], f"{path}{key}.", tolerances=tolerances, other_processor=other_processor
                )
        return out
    name = path.rstrip(".")
    if isinstance(reference, list) and isinstance(accel, list):
        if len(reference) != len(accel):
            return [f"{name}: {reference} -> {accel}"]
        differ = any(
            differences(r, a, tolerances=tolerances, other_processor=other_processor)
            for r, a in zip(reference, accel, strict=True)
        )
        return [f"{name}: {reference} -> {accel}"] if differ else []
    numbers = (int, float)
    if (
        isinstance(reference, numbers)
        and isinstance(accel, numbers)
        and not isinstance(reference, bool)
        and not isinstance(accel, bool)
    ):
        close = math.isclose(reference, accel, rel_tol=tolerances[0], abs_tol=tolerances[1]) or (
            other_processor and _within_other_processor_rounding(float(reference), float(accel))
        )
        return [] if close else [f"{name}: {reference} -> {accel}"]
    return [] if reference == accel else [f"{name}: {reference!r} -> {accel!r}"]


def make_rows(
    example: Example, reference_results: list[dict[str, Any] | None], accel_results: list[dict[str, Any] | None]
) -> list[dict[str, Any]]:
    """The table rows of one example's runs: both sides' results, their differences, and for a resumed
    run whether each side ended as its uninterrupted run did."""
    by_lib = {
        "reference": dict(zip(example.run_ids(), reference_results, strict=True)),
        "accel": dict(zip(example.run_ids(), accel_results, strict=True)),
    }
    rows = []
    for run_id, run, ref, acc in zip(example.run_ids(), example.runs, reference_results, accel_results, strict=True):
        diffs = (
            differences(ref["metrics"], acc["metrics"], ignore=example.ignored(), tolerances=example.tolerances())
            if ref and acc and ref["ok"] and acc["ok"]
            else []
        )
        rows.append(
            {
                "id": run_id,
                "example": example.name,
                "reference_example": example.reference,
                "args": list(run.args),
                "reference": ref,
                "accel": acc,
                "tolerance": example.tolerance[2] if example.tolerance else None,
                "identical": bool(ref and acc and ref["ok"] and acc["ok"] and not diffs),
                "differences": diffs,
                "continues": example.run_id(run.continues) if run.continues else None,
                "resume_exact": {lib: resume_exact(results, example, run) for lib, results in by_lib.items()}
                if run.continues
                else None,
            }
        )
    return rows


# --- the reference environment ---


def reference_python(venv: Path) -> Path:
    """Makes (once) the throwaway venv with Accelerate and this process's torch version; returns its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        import torch

        uv = shutil.which("uv") or "uv"
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        torch_version = torch.__version__.split("+")[0]
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "-q",
                "--python",
                str(python),
                REFERENCE_SPEC,
                f"torch=={torch_version}",
                # mlm_no_trainer's collator and model: the workspace's version, so both sides run the same code
                f"transformers=={importlib.metadata.version('transformers')}",
                *REFERENCE_EXTRAS,
            ],
            check=True,
        )
    return python


def reference_versions(python: Path) -> dict[str, str]:
    code = (
        "import accelerate, torch, json; "
        "print(json.dumps({'accelerate': accelerate.__version__, 'torch': torch.__version__}))"
    )
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


# --- the table ---


def cell(result: dict[str, Any] | None) -> str:
    if result is None:
        return "not run"
    return "yes" if result["ok"] else f"**no**: `{result['error']}`"


def metrics_text(result: dict[str, Any] | None) -> str:
    if not result or not result.get("metrics"):
        return "-"
    return ", ".join(f"{k}={_short(v)}" for k, v in sorted(result["metrics"].items()))


def _yes_no(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "**no**"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def write_table(rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    RESULTS_JSON.write_text(json.dumps({**meta, "rows": rows, "skipped": SKIPPED}, indent=1, sort_keys=True) + "\n")
    ref_ok = sum(1 for r in rows if r["reference"] and r["reference"]["ok"])
    accel_ok = sum(1 for r in rows if r["accel"] and r["accel"]["ok"])
    same = sum(1 for r in rows if r["identical"])
    lines = [
        "# Accelerate's examples on Accelerate and on accel (2 CPU processes each)",
        "",
        f"Written by `tests/compat/run_reference_comparison.py` on {meta['date']}: reference Accelerate "
        f"{meta['reference_versions'].get('accelerate')} (torch {meta['reference_versions'].get('torch')}) under "
        f"torchrun, accel {meta['accel_version']} (commit {meta['accel_commit']}) under `accel launch --cpu -n 2`. "
        f"Identical means {TOLERANCE_TEXT}.",
        "",
        f"Runs to the end: reference {ref_ok}/{len(rows)}, accel {accel_ok}/{len(rows)}; same final metrics: "
        f"{same}/{len(rows)}.",
        "",
        "| example run | reference runs | accel runs | identical | differences (reference -> accel) |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        diff = "; ".join(r["differences"]) if r["differences"] else ""
        lines.append(
            f"| {r['id']} | {cell(r['reference'])} | {cell(r['accel'])} | {'yes' if r['identical'] else '**no**'} | "
            f"{diff} |"
        )
    resumes = [r for r in rows if r.get("continues")]
    if resumes:
        lines += [
            "",
            "## Resume: does the resumed run end as the uninterrupted one? (overall_step aside)",
            "",
            "| resumed run | continues | reference | accel |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['id']} | {r['continues']} | {_yes_no(r['resume_exact']['reference'])} | "
            f"{_yes_no(r['resume_exact']['accel'])} |"
            for r in resumes
        ]
    tolerated = [e for e in EXAMPLES if e.tolerance]
    if tolerated:
        lines += [
            "",
            "## Backend runs the reference cannot make on CPU: compared with its plain run, within a stated tolerance",
            "",
            "| example | reference run | accel shows | tolerance (rel / abs) | why |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {e.name} | {e.reference_processes} process(es), plain | `{e.accel_prints}` | "
            f"{e.tolerance[0]:g} / {e.tolerance[1]:g} | {e.tolerance[2]} |"
            for e in tolerated
            if e.tolerance
        ]
        notes = [e for e in tolerated if e.not_compared or e.known_gap]
        if notes:
            lines += [""]
        for e in notes:
            if e.not_compared:
                names = ", ".join(e.not_compared[0])
                lines += [f"- {e.name}: not compared: {names}, since {e.not_compared[1]}."]
            if e.known_gap:
                lines += [f"- {e.name}: differs, out of accel's hands: {e.known_gap}."]
    lines += ["", "## Final metrics", "", "| example run | reference | accel |", "|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {metrics_text(r['reference'])} | {metrics_text(r['accel'])} |")
    lines += [
        "",
        "## Not run (need what this CPU machine does not have)",
        "",
        "| reference example | why |",
        "|---|---|",
    ]
    lines += [f"| {name} | {why} |" for name, why in SKIPPED.items()]
    RESULTS_MD.write_text("\n".join(lines) + "\n")


def git_commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", help="example names (default: all)")
    parser.add_argument(
        "--accel-only", action="store_true", help="rerun accel only; reference results come from the JSON"
    )
    parser.add_argument("--retable", action="store_true", help="run nothing: rebuild the table from the JSON's results")
    parser.add_argument("--reference-venv", type=Path, default=DEFAULT_REFERENCE_VENV)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per launch")
    options = parser.parse_args()

    previous = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {"rows": []}
    previous_rows = {row["id"]: row for row in previous["rows"]}
    selected = [e for e in EXAMPLES if not options.only or e.name in options.only]
    reuse = options.accel_only or options.retable
    python = None if reuse else reference_python(options.reference_venv)
    versions = previous.get("reference_versions", {}) if reuse else reference_versions(python)

    import accel

    meta = {
        "date": time.strftime("%Y-%m-%d"),
        "reference_versions": versions,
        "accel_version": accel.__version__,
        "accel_commit": git_commit(),
        "tolerance": {"rel": REL_TOL, "abs": ABS_TOL, "text": TOLERANCE_TEXT},
        # The tests compare bit for bit (within TOLERANCE_TEXT) only on a processor with the same kernels; reused
        # reference numbers keep the processor they were recorded on.
        "processor": previous.get("processor") if reuse else processor_kernels(),
        "launch": {
            "reference": "python -m torch.distributed.run --nproc_per_node 2 <script> --cpu (ACCELERATE_USE_CPU=true)",
            "accel": "accel launch --cpu -n 2 <script> --cpu",
        },
    }
    order = [run_id for e in EXAMPLES for run_id in e.run_ids()]
    rows_by_id = dict(previous_rows)
    for example in selected:
        print(f"== {example.name}", flush=True)
        if options.retable:
            reference_results = [previous_rows.get(run_id, {}).get("reference") for run_id in example.run_ids()]
            accel_results = [previous_rows.get(run_id, {}).get("accel") for run_id in example.run_ids()]
            rows_by_id.update((row["id"], row) for row in make_rows(example, reference_results, accel_results))
            continue
        if options.accel_only:
            reference_results = [previous_rows.get(run_id, {}).get("reference") for run_id in example.run_ids()]
        else:
            reference_results = run_example("accelerate", example, python, options.timeout)
        accel_results = run_example("accel", example, None, options.timeout)
        for row in make_rows(example, reference_results, accel_results):
            rows_by_id[row["id"]] = row
            print(
                f"   {row['id']}: reference {cell(row['reference'])} | accel {cell(row['accel'])} | "
                f"identical {row['identical']} {'; '.join(row['differences'])}",
                flush=True,
            )
        write_table(
            [rows_by_id[i] for i in order if i in rows_by_id], meta
        )  # after each example: a long run keeps its work
    write_table([rows_by_id[i] for i in order if i in rows_by_id], meta)

    print(f"wrote {RESULTS_MD.relative_to(HERE.parents[1])} and {RESULTS_JSON.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
