"""Checkpoint I/O: accel's save_state / load_state against raw safetensors / torch.save of the same tensors.

Measured side by side in one run, on one process (CPU), for a model of a few hundred MB with its
AdamW state (about 3x the model on disk):

- save throughput: ``save_state`` vs ``safetensors.torch.save_file(model) + torch.save(optimizer)``,
  like for like: ``save_state`` (fsyncs every file, so the checkpoint survives a power cut, not just
  a killed process) against raw + fsync, and ``save_state(durable=False)`` against raw without
  fsync. Goal: >= 0.8 of raw.
- load throughput: ``load_state`` vs ``model.load_state_dict(safetensors.torch.load_file(...))`` +
  ``optimizer.load_state_dict(torch.load(..., weights_only=True))``, both reading the files and
  putting them into the same objects, in two cases: into a running optimizer (it has Adam moments
  already: accel copies into them) and into a fresh one (no state yet: a resume in a new process).
  Before each load, freed heap memory is handed back to the kernel (``malloc_trim``), so that no
  variant profits from pages another one happened to leave mapped. Goal: >= 0.8 of raw.
- async save: time ``save_state(async_save=True)`` blocks the caller vs a synchronous save. Goal: <= 0.2.
- content hashes: ``save_state`` / ``load_state`` against the same calls with the per-file SHA-256
  hashing (save) and verification (load) switched off in this process, to show what they add.

Usage: python bench/checkpoint_io.py [--mb 256] [--repeats 3] [--dir /tmp]
Everything is written under a temporary folder that is deleted at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os
import shutil
import statistics
import tempfile
import time

import torch

from accel_checkpoint.fsio import fsync_path


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


def median_time(fn, repeats: int, before=None) -> float:
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def release_free_memory() -> None:
    """Returns freed heap pages to the kernel (glibc), so the next allocation pays its page faults."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="model size in MB (fp32); AdamW adds twice that")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp folder)")
    args = parser.parse_args()

    from safetensors.torch import load_file, save_file

    from accel_checkpoint import wait_for_checkpoint
    from accel_core import Accelerator

    width = 2048
    layers = max(1, round(args.mb * 2**20 / (4 * width * width)))
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # creates the Adam moments
    optimizer.zero_grad()

    root = tempfile.mkdtemp(prefix="accel-bench-", dir=args.dir)
    try:
        raw_model, raw_opt = os.path.join(root, "raw.safetensors"), os.path.join(root, "raw_optimizer.bin")
        target = os.path.join(root, "ckpt")

        def clean() -> None:
            for path in (raw_model, raw_opt):
                if os.path.exists(path):
                    os.remove(path)
            shutil.rmtree(target, ignore_errors=True)

        def raw_save(sync: bool) -> None:
            save_file({k: v for k, v in model.state_dict().items()}, raw_model)
            torch.save(optimizer.state_dict(), raw_opt)
            if sync:
                fsync_path(raw_model)
                fsync_path(raw_opt)

        def raw_load() -> None:
            # What a user does by hand. load_file alone only maps the file (safetensors >= 0.4 is
            # lazy), so the bytes are only read when copied into the model.
            accelerator.unwrap_model(model).load_state_dict(load_file(raw_model))
            optimizer.load_state_dict(torch.load(raw_opt, weights_only=True, map_location="cpu"))

        accelerator.save_state(target)  # warm-up (imports, first allocations)
        total = folder_bytes(target)
        accelerator.save_state(target, async_save=True)  # warm-up: allocates the async buffers
        wait_for_checkpoint(accelerator)
        state = [t for t in model.state_dict().values()] + [
            t for s in optimizer.state_dict()["state"].values() for t in s.values() if t.numel() > 1
        ]
        buffers = [torch.empty_like(t) for t in state]

        def memcpy() -> None:
            for b, t in zip(buffers, state, strict=True):
                b.copy_(t)

        def async_save() -> None:
            accelerator.save_state(target, async_save=True)

        import accel_checkpoint.content_hash as loading
        import accel_checkpoint.writer as writing

        def without_hashes(fn):  # the same call with the content hashes switched off (bench only)
            def run() -> None:
                hash_files, verify_file = writing.hash_files, loading.verify_file
                writing.hash_files, loading.verify_file = (
                    (lambda folder, names: {}),
                    (lambda path, expected, algorithm=None: None),
                )
                try:
                    fn()
                finally:
                    writing.hash_files, loading.verify_file = hash_files, verify_file

            return run

        def forget_optimizer_state() -> None:
            optimizer.optimizer.state.clear()
            release_free_memory()

        loads = {
            "raw_load": (raw_load, release_free_memory),
            "load": (lambda: accelerator.load_state(target), release_free_memory),
            "raw_load_fresh": (raw_load, forget_optimizer_state),
            "load_fresh": (lambda: accelerator.load_state(target), forget_optimizer_state),
            "load_nohash": (without_hashes(lambda: accelerator.load_state(target)), release_free_memory),
        }
        saves = {
            "raw": lambda: raw_save(False),
            "raw_fsync": lambda: raw_save(True),
            "save": lambda: accelerator.save_state(target),
            "save_nohash": without_hashes(lambda: accelerator.save_state(target)),
            "save_nosync": lambda: accelerator.save_state(target, durable=False),
            "async": async_save,
        }
        runs: dict[str, list[float]] = {k: [] for k in (*saves, "memcpy", *loads)}
        # Interleaved, so that load changes on this shared machine hit every variant alike.
        for repeat in range(args.repeats):
            for name, fn in saves.items():
                clean()
                runs[name].append(median_time(fn, 1))
                wait_for_checkpoint(accelerator)
            runs["memcpy"].append(median_time(memcpy, 1))
            raw_save(True)
            accelerator.save_state(target)  # with hashes, for the loads (load_nohash skips verifying them)
            order = list(loads) if repeat % 2 == 0 else list(reversed(loads))  # no variant always goes first
            for name in order:
                load, before = loads[name]
                runs[name].append(median_time(load, 1, before))
        (
            t_raw,
            t_raw_sync,
            t_save,
            t_nosync,
            t_async,
            t_copy,
            t_raw_load,
            t_load,
            t_raw_fresh,
            t_fresh,
            t_save_nh,
            t_load_nh,
        ) = (
            statistics.median(runs[k])
            for k in (
                "raw",
                "raw_fsync",
                "save",
                "save_nosync",
                "async",
                "memcpy",
                "raw_load",
                "load",
                "raw_load_fresh",
                "load_fresh",
                "save_nohash",
                "load_nohash",
            )
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    mb = total / 1e6
    print(f"model {layers}x{width}x{width} fp32 + AdamW: checkpoint {mb:.0f} MB, median of {args.repeats}")

    def row(label: str, seconds: float, note: str = "") -> None:
        print(f"{label:38s} {seconds:6.2f} s  {mb / seconds:6.0f} MB/s   {note}")

    row("save  raw (no fsync)", t_raw)
    row("save  raw + fsync", t_raw_sync)
    row("save  save_state", t_save, f"ratio {t_raw_sync / t_save:.2f} of raw + fsync  (goal >= 0.8)")
    row("save  save_state(durable=False)", t_nosync, f"ratio {t_raw / t_nosync:.2f} of raw  (goal >= 0.8)")
    row("load  raw, running optimizer", t_raw_load)
    row("load  load_state, running optimizer", t_load, f"ratio {t_raw_load / t_load:.2f}  (goal >= 0.8)")
    row("load  raw, fresh optimizer", t_raw_fresh)
    row("load  load_state, fresh optimizer", t_fresh, f"ratio {t_raw_fresh / t_fresh:.2f}  (goal >= 0.8)")
    row("save  save_state without hashes", t_save_nh, f"hashing adds {t_save / t_save_nh - 1:+.0%} to save_state")
    row("load  load_state without verifying", t_load_nh, f"verifying adds {t_load / t_load_nh - 1:+.0%} to load_state")
    print(f"{'async save blocks':38s} {t_async:6.2f} s  ratio {t_async / t_save:.2f} of a sync save  (goal <= 0.2)")
    print(
        f"  (its floor, a plain copy of the same tensors: {t_copy:.2f} s = {mb / t_copy / 1000:.1f} GB/s memory "
        f"bandwidth here, {t_copy / t_save:.2f} of a sync save)"
    )


if __name__ == "__main__":
    main()
