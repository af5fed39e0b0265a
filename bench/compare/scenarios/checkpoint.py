"""save_state / load_state of a model of a few hundred MB with its AdamW state (Fabric: fabric.save / load;
raw: torch.save / torch.load), and the time an asynchronous save blocks the caller where the framework has one.

accel fsyncs every file by default (a checkpoint that survives a power cut); the others do not, so accel's
save is also measured with ACCEL_CHECKPOINT_FSYNC=0 (`save_nofsync_s`), the like-for-like figure.

The limit, in accel's launch, each round: the disk's own sequential write of the checkpoint's size from memory +
fsync (`disk_write_s`) and read back after dropping it from the page cache (`disk_read_s`).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import torch


def _size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)


def _remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def _disk_limit(folder: str, nbytes: int) -> tuple[float, float]:
    """Seconds to write ``nbytes`` of incompressible bytes to one file + fsync, and to read it back uncached."""
    path, chunk = os.path.join(folder, "disk-limit.bin"), bytearray(os.urandom(1 << 20) * 64)
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as handle:
        left = nbytes
        while left > 0:
            left -= handle.write(memoryview(chunk)[: min(left, len(chunk))]) or 0
        os.fsync(handle.fileno())
        written = time.perf_counter() - start
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages leave the cache
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as handle:
        while handle.readinto(chunk):
            pass
    read = time.perf_counter() - start
    os.remove(path)
    return written, read


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
    saves, loads, nofsync, blocked, disk_write, disk_read = [], [], [], [], [], []
    try:
        harness.save(path, model, optimizer, None)  # warm-up
        size = _size(path)
        for _ in range(rounds):
            _remove(path)
            start = time.perf_counter()
            harness.save(path, model, optimizer, None)
            saves.append(time.perf_counter() - start)
            start = time.perf_counter()
            harness.load(path, model, optimizer, None)
            loads.append(time.perf_counter() - start)
            if harness.name == "accel":
                _remove(path)
                os.environ["ACCEL_CHECKPOINT_FSYNC"] = "0"
                start = time.perf_counter()
                harness.save(path, model, optimizer, None)
                nofsync.append(time.perf_counter() - start)
                del os.environ["ACCEL_CHECKPOINT_FSYNC"]
                _remove(path)
                start = time.perf_counter()
                harness.save_async(path)
                blocked.append(time.perf_counter() - start)
                harness.wait_async()
                written, read = _disk_limit(root, size)
                disk_write.append(written)
                disk_read.append(read)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result = {"save_s": statistics.median(saves), "load_s": statistics.median(loads), "mb": size / 1e6}
    if nofsync:
        result["save_nofsync_s"] = statistics.median(nofsync)
        result["async_blocked_s"] = statistics.median(blocked)
        result["disk_write_s"] = statistics.median(disk_write)
        result["disk_read_s"] = statistics.median(disk_read)
    return result
