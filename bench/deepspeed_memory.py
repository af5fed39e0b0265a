"""accel-deepspeed: per-process memory of ZeRO-1/2/3 against DDP, same model, one run.

For each setup, a fresh 2-process launch (so one setup's peak cannot hide in another's) builds the
same model (a stack of Linear layers) with AdamW, trains a few steps through ``accel.Accelerator``,
and reports per rank:

- ``peak``: the peak resident memory of the process while building, preparing and training, above
  what it held just before building the model (Linux ``VmHWM`` after resetting it), i.e. what the
  training state really cost, transient buffers included; ``(prepare)``: the same peak up to the
  end of ``prepare`` (model built, engine or DDP set up), before any step;
- ``live``: bytes of all live CPU tensors (each storage counted once) during the last step, after
  backward and after the optimizer step (the larger), minus the same count before building the
  model: parameters, gradients, optimizer state, ZeRO's flat buffers and buckets. Tensors held only
  by C++ (DDP's reducer buckets) are not visible to it: ``peak`` has them.
- ``step ms``: median time of the other steps.

Setups: ``ddp`` (accel's DDP strategy, plain torch DDP), ``zero1``, ``zero2``, ``zero3``, and
``zero3_init`` (ZeRO-3 with the model built inside ``strategy.zero3_init_context()``: never whole).

    uv run python bench/deepspeed_memory.py [--width 2048 --depth 6 --steps 3 --setups ddp,zero1,zero2,zero3,zero3_init]

CPU only as written (gloo, ``ACCEL_USE_CPU=true``); it needs Linux for the peak measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SETUPS = ("ddp", "zero1", "zero2", "zero3", "zero3_init")


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # Linux: resets VmHWM (peak RSS) to the current RSS


def _live_tensor_bytes() -> int:
    import torch

    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
            try:
                storage = obj.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if storage.nbytes():
                storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(storages.values())


def child(setup: str, width: int, depth: int, steps: int, out: str) -> None:
    import logging

    import torch

    from accel_core import Accelerator

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if setup == "ddp":
        accelerator = Accelerator()
    else:
        from accel_deepspeed import DeepSpeedPlugin

        stage = int(setup[4])
        plugin = DeepSpeedPlugin(
            hf_ds_config={
                "train_batch_size": "auto",
                "train_micro_batch_size_per_gpu": "auto",
                "gradient_accumulation_steps": "auto",
                "gradient_clipping": 0.0,
                # DeepSpeed's bucket defaults are sized for GPUs (a 5e8-element ZeRO-3 reduce bucket is 1.9 GiB
                # per process); these are the values accel's "auto" rule gives a model with hidden size `width`.
                "zero_optimization": {
                    "stage": stage,
                    "reduce_bucket_size": width * width,
                    "stage3_prefetch_bucket_size": int(0.9 * width * width),
                    "stage3_param_persistence_threshold": 0,  # partition every tensor, however small
                },
            },
            zero3_init_flag=setup == "zero3_init",
        )
        accelerator = Accelerator(deepspeed_plugin=plugin)
    data = torch.utils.data.TensorDataset(torch.randn(64, width), torch.randn(64, width))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    gc.collect()
    live_before = _live_tensor_bytes()
    rss_before = _rss_kib("VmRSS")
    _reset_peak()

    torch.manual_seed(0)
    init = getattr(accelerator.strategy, "zero3_init_context", None)
    with init() if init is not None else _null():
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
        model = torch.nn.Sequential(*layers)
    parameters = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    peak_prepare = (_rss_kib("VmHWM") - rss_before) * 1024
    times, live = [], 0
    for i, (x, y) in enumerate(loader):
        if i == steps:
            break
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        if i == steps - 1:  # the last step: gradients are held now
            live = max(live, _live_tensor_bytes() - live_before)
        optimizer.step()
        if i == steps - 1:  # ... and optimizer state exists now
            live = max(live, _live_tensor_bytes() - live_before)
        optimizer.zero_grad()
        if i < steps - 1:
            times.append(time.perf_counter() - start)
    peak = (_rss_kib("VmHWM") - rss_before) * 1024
    result = {
        "setup": setup,
        "rank": accelerator.process_index,
        "parameters": parameters,
        "peak": peak,
        "peak_prepare": peak_prepare,
        "live": live,
        "step_s": sorted(times)[len(times) // 2],
    }
    with open(os.path.join(out, f"{setup}_{result['rank']}.json"), "w") as handle:  # ranks' prints may interleave
        json.dump(result, handle)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--setups", default=",".join(SETUPS))
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.width, args.depth, args.steps, args.out)
        return
    out = tempfile.mkdtemp(prefix="deepspeed_memory_")

    env = {
        **os.environ,
        "ACCEL_USE_CPU": "true",
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    rows: dict[str, list[dict]] = {}
    for setup in args.setups.split(","):
        command = [
            # --standalone: torchrun binds a free port itself and keeps it.
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--standalone",
            __file__,
            "--child",
            setup,
            "--width",
            str(args.width),
            "--depth",
            str(args.depth),
            "--steps",
            str(args.steps),
            "--out",
            out,
        ]
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.exit(f"{setup} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        rows[setup] = []
        for rank in (0, 1):
            with open(os.path.join(out, f"{setup}_{rank}.json")) as handle:
                rows[setup].append(json.load(handle))
        print(f"{setup}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr)

    mib = 1024 * 1024
    first = next(iter(rows.values()))[0]
    print(
        f"model: {args.depth} x Linear({args.width}, {args.width}) = {first['parameters'] / 1e6:.1f} M parameters "
        f"({first['parameters'] * 4 / mib:.0f} MiB fp32), AdamW, 2 processes (CPU, gloo)"
    )
    base = rows.get("ddp")
    print(
        f"{'setup':<11} {'rank':>4} {'peak MiB':>9} {'vs ddp':>7} {'(prepare)':>9} {'live MiB':>9} {'vs ddp':>7} "
        f"{'step ms':>8}"
    )
    for setup, results in rows.items():
        for r in results:
            ref = base[r["rank"]] if base else None
            peak_ratio = f"{r['peak'] / ref['peak']:.2f}" if ref else "-"
            live_ratio = f"{r['live'] / ref['live']:.2f}" if ref else "-"
            print(
                f"{setup:<11} {r['rank']:>4} {r['peak'] / mib:>9.0f} {peak_ratio:>7} {r['peak_prepare'] / mib:>9.0f} "
                f"{r['live'] / mib:>9.0f} {live_ratio:>7} {r['step_s'] * 1e3:>8.1f}"
            )
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
