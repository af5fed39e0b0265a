"""save_state / load_state of a model of a few hundred MB with its AdamW state (Fabric: fabric.save / load;
raw: torch.save / torch.load), and the time an asynchronous save blocks the caller where the framework has one.

The async save is timed as a training loop meets it from its second save on (`async_blocked_s`, and over the durable
save of the same round, `async_over_save`): the first async save of a process allocates the buffers its snapshot is
copied into, and later ones reuse them, so it is timed apart (`async_first_blocked_s`, before the rounds). Runs up to
2026-12-02 took the median of a first and a second save.

accel fsyncs every file by default (a checkpoint that survives a power cut); the others do not, so accel's
save is also measured with ACCEL_CHECKPOINT_FSYNC=0 (`save_nofsync_s`), the like-for-like figure.

The limit, in accel's launch, each round, next to accel's durable save (before it in even rounds, after it in odd
ones): the disk's own durable write of the checkpoint's size from memory, the way
a careful writer does it (`disk_write_s`: the best of one file and 4 at once, an fsync every 64 MiB on a helper thread
as it goes; each way's own figure in `disk_write_one_s`, `disk_write_many_s`), and one file read back
after dropping it from the page cache (`disk_read_s`): `DiskLimit` of bench/checkpoint_io.py. Every timed write
(every framework's saves and the limit's) starts after `settle()` (earlier writes synced, then 1 s): on a virtual
disk a write straight after another pays for the first one's bytes. `save_over_disk_write`: accel's durable save
over that round's limit (1.0: the save runs at the disk's own durable speed).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # bench/
from checkpoint_io import DiskLimit, settle  # after the path


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def run(harness, quick: bool = False, dir: str | None = None, **_: str) -> dict:
    layers, rounds = (2, 1) if quick else (16, 2)  # 805 MB with the AdamW moments in full
    width = 2048
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer, _ = harness.prepare(model, optimizer)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # creates the Adam moments
    optimizer.zero_grad()
    root = tempfile.mkdtemp(prefix=f"bench-ckpt-{harness.name}-", dir=dir)
    path = os.path.join(root, "ckpt")
    saves, loads, nofsync, blocked, disk_read, save_over_disk, async_over_save = [], [], [], [], [], [], []
    first_blocked = None
    disk_write: dict[str, list[float]] = {"disk_write_s": [], "disk_write_one_s": [], "disk_write_many_s": []}
    try:
        harness.save(path, model, optimizer, None)  # warm-up
        size = _size(path)
        if harness.name == "accel":  # the first async save allocates its snapshot's buffers: timed apart
            _remove(path)
            settle()
            start = time.perf_counter()
            harness.save_async(path)
            first_blocked = time.perf_counter() - start
            harness.wait_async()
        disk = DiskLimit(root, size)

        def disk_limit() -> float:
            """The disk's durable write of `size` bytes (best way), then its cold read; returns the write's seconds."""
            best = disk.write()
            disk_write["disk_write_s"].append(best)
            disk_write["disk_write_one_s"].append(disk.ways["one file"])
            disk_write["disk_write_many_s"].append(disk.ways["4 files at once"])
            disk.drop_cache()
            start = time.perf_counter()
            disk.read()
            disk_read.append(time.perf_counter() - start)
            disk.remove()
            return best

        for round_index in range(rounds):
            # accel's durable save and the disk's own durable write of as many bytes are measured back to back, in
            # alternating order, so that both meet the virtual disk in the same state: measured rounds apart, the
            # limit once came out at twice the save it bounds (the host drains earlier bursts at its own pace).
            limit_first = harness.name == "accel" and round_index % 2 == 0
            limit = disk_limit() if limit_first else None
            _remove(path)
            settle()
            start = time.perf_counter()
            harness.save(path, model, optimizer, None)
            saves.append(time.perf_counter() - start)
            if harness.name == "accel":
                limit = limit if limit is not None else disk_limit()
                save_over_disk.append(saves[-1] / limit)
            start = time.perf_counter()
            harness.load(path, model, optimizer, None)
            loads.append(time.perf_counter() - start)
            if harness.name == "accel":
                _remove(path)
                settle()
                os.environ["ACCEL_CHECKPOINT_FSYNC"] = "0"
                start = time.perf_counter()
                harness.save(path, model, optimizer, None)
                nofsync.append(time.perf_counter() - start)
                del os.environ["ACCEL_CHECKPOINT_FSYNC"]
                _remove(path)
                settle()
                start = time.perf_counter()
                harness.save_async(path)
                blocked.append(time.perf_counter() - start)
                async_over_save.append(blocked[-1] / saves[-1])
                harness.wait_async()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"save_s": statistics.median(saves), "load_s": statistics.median(loads), "mb": size / 1e6}
    if nofsync:
        result["save_nofsync_s"] = statistics.median(nofsync)
        result["async_blocked_s"] = statistics.median(blocked)
        result["async_over_save"] = statistics.median(async_over_save)
        result["async_first_blocked_s"] = first_blocked
        result.update({key: statistics.median(values) for key, values in disk_write.items()})
        result["disk_read_s"] = statistics.median(disk_read)
        result["save_over_disk_write"] = statistics.median(save_over_disk)
    return result
