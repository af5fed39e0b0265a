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
  ``--sharded``: the same for a sharded (FSDP2, ``torch.distributed.checkpoint``) save on one process, whose
  shards accel-fsdp hands over and accel-checkpoint writes in the background (goal <= 0.25); only the durable
  save, the async save's blocked time (the first of the process apart: it allocates the snapshot's buffers) and
  the plain copy of the tensors (the snapshot's floor) are measured then.
- content hashes: ``save_state`` / ``load_state`` against the same calls with the per-file
  hashing (save) and verification (load) switched off in this process, to show what they add.
- the limit: the disk's own bandwidth in the same run, alternating with the rest: the checkpoint's
  size written from memory durably the way a careful writer does (``DiskLimit``: the best of one
  file and 4 files at once, an fsync every 64 MiB on a helper thread as it goes), then one file
  read back after dropping it from the page cache (``posix_fadvise``), and read again from the
  cache. Saves are shown as a fraction of the write figure (durable save against the durable
  write), loads of the read figures. Every timed write (saves and the limit's) starts after
  ``settle()``: earlier writes synced, then 1 s, so that none pays for the bytes of the one before.

Every figure is the median of ``--repeats`` alternating rounds, with its range (min to max), and
the CPU time the process spent (user + system, all threads): on a loaded machine CPU time moves
far less than wall time, so it shows a change in the work done when wall times overlap.

Usage: python bench/checkpoint_io.py [--mb 256] [--repeats 3] [--dir /tmp] [--sharded]
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
from concurrent.futures import ThreadPoolExecutor

import torch


def folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)


def median_time(fn, repeats: int, before=None, cpu: list[float] | None = None) -> float:
    """Median wall time of ``fn``; appends the process CPU time of each call to ``cpu`` when given."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        if cpu is not None:
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(times)


def settle() -> None:
    """Lets the disk finish earlier writes before a timed one: everything dirty is synced, then a pause.

    On a virtual disk the host absorbs a burst of writes and then drains it to its own storage: 805 MB written
    and fsynced straight after accel's async save of as many took 2.0 s here, 0.52 s in a process of its own.
    Every timed write (saves and the limit alike) starts from this state, so none pays for another's bytes.
    """
    os.sync()
    time.sleep(1.0)


class DiskLimit:
    """What the disk allows for ``nbytes``: written from memory durably the way a careful writer does, and read
    back cold (dropped from the page cache) and warm.

    The careful write (``write``, seconds): the best of one file and ``files`` files written in parallel, each
    in 64 MiB writes with an fsync of the file so far every 64 MiB on a helper thread (the writer goes on
    meanwhile; what accel's own writer does) and a final fsync that waits for the tail. Not one fsync of the
    whole file at the end: that waits for every byte after the writing is done, 2.0-2.2 s for 805 MB in the full
    run of 2026-12-02 11:10, slower than accel's own durable save of the same bytes, so
    no limit. Each way starts after ``settle()``. ``ways`` keeps the last round's seconds per way.
    """

    def __init__(self, folder: str, nbytes: int, files: int = 4) -> None:
        self.folder = folder
        self.path = os.path.join(folder, "disk-limit.bin")
        self.chunk = bytearray(os.urandom(1 << 20) * 64)  # 64 MiB of incompressible bytes
        self.nbytes = nbytes
        self.files = files
        self.ways: dict[str, float] = {}

    def _write_one(self, path: str, nbytes: int, syncer: ThreadPoolExecutor) -> None:
        view, pending, since_sync, offset = memoryview(self.chunk), None, 0, 0
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while offset < nbytes:
                done = 0
                piece = view[: min(nbytes - offset, len(view))]
                while done < len(piece):
                    done += os.write(fd, piece[done:])
                offset += done
                since_sync += done
                if since_sync >= 64 << 20 and (pending is None or pending.done()):
                    if pending is not None:
                        pending.result()
                    pending, since_sync = syncer.submit(os.fsync, fd), 0
            if pending is not None:
                pending.result()
            os.fsync(fd)
        finally:
            os.close(fd)

    def write(self) -> float:
        """Seconds of the best way this round; the one file stays, for ``read``."""
        parts = [self.nbytes // self.files + (i < self.nbytes % self.files) for i in range(self.files)]
        paths = [f"{self.path}.{i}" for i in range(self.files)]
        with ThreadPoolExecutor(max_workers=2 * self.files) as pool:  # writers + their fsyncs
            settle()
            start = time.perf_counter()
            list(pool.map(lambda job: self._write_one(*job, pool), zip(paths, parts, strict=True)))
            self.ways[f"{self.files} files at once"] = time.perf_counter() - start
            for path in paths:
                os.remove(path)
            settle()
            start = time.perf_counter()
            self._write_one(self.path, self.nbytes, pool)
            self.ways["one file"] = time.perf_counter() - start
        return min(self.ways.values())

    def drop_cache(self) -> None:
        """Clean pages (the file was synced) leave the page cache: the next read comes from the disk."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)

    def read(self) -> None:
        with open(self.path, "rb", buffering=0) as handle:
            while handle.readinto(self.chunk):
                pass

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


def release_free_memory() -> None:
    """Returns freed heap pages to the kernel (glibc), so the next allocation pays its page faults."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


WIDTH = 2048  # of each bias-free linear layer of the benchmark's model


def layer_count(mb: float) -> int:
    """How many WIDTH x WIDTH fp32 layers make about ``mb`` MB of weights."""
    return max(1, round(mb * 2**20 / (4 * WIDTH * WIDTH)))


def prepared_model(accelerator, mb: float):
    """About ``mb`` MB of weights (``layer_count`` layers) with AdamW, prepared, after one step (Adam's moments
    exist, so the optimizer state is saved at full size)."""
    width = WIDTH
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layer_count(mb))])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="model size in MB (fp32); AdamW adds twice that")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: the system temp folder)")
    parser.add_argument("--sharded", action="store_true", help="an FSDP2 model: durable vs async save only")
    args = parser.parse_args()
    if args.sharded:
        sharded_main(args)
        return

    from safetensors.torch import load_file, save_file

    from accel_checkpoint import wait_for_checkpoint
    from accel_checkpoint.fsio import fsync_path
    from accel_core import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model, optimizer = prepared_model(accelerator, args.mb)

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
        import accel_checkpoint.file_sink as sinks
        import accel_checkpoint.writer as writing

        class NoDigest:
            def update(self, data: object) -> None:
                pass

            def hexdigest(self) -> str:
                return ""

        def without_hashes(fn):  # the same call with the content hashes switched off (bench only)
            def run() -> None:
                hash_files, verify_file, new_digest = writing.hash_files, loading.verify_file, sinks.new_digest
                writing.hash_files, loading.verify_file, sinks.new_digest = (
                    (lambda folder, names: {}),
                    (lambda path, expected, algorithm=None: None),
                    NoDigest,
                )
                try:
                    fn()
                finally:
                    writing.hash_files, loading.verify_file, sinks.new_digest = hash_files, verify_file, new_digest

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
        disk = DiskLimit(root, total)
        ways = [f"disk_write_{n}" for n in ("one", "many")]
        runs: dict[str, list[float]] = {
            k: [] for k in (*saves, "memcpy", *loads, "disk_write", *ways, "disk_read", "disk_read_cached")
        }
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        # Interleaved, so that load changes on this shared machine hit every variant alike.
        for repeat in range(args.repeats):
            for name, fn in saves.items():
                clean()
                settle()  # as before each of the limit's writes
                runs[name].append(median_time(fn, 1, cpu=cpu[name]))
                wait_for_checkpoint(accelerator)
            clean()
            start_cpu = time.process_time()
            runs["disk_write"].append(disk.write())  # the best way this round
            cpu["disk_write"].append((time.process_time() - start_cpu) / 2)  # two ways: the CPU of one
            for key, seconds in zip(ways, (disk.ways["one file"], disk.ways["4 files at once"]), strict=True):
                runs[key].append(seconds)
                cpu[key].append(0.0)
            runs["disk_read"].append(median_time(disk.read, 1, disk.drop_cache, cpu=cpu["disk_read"]))
            runs["disk_read_cached"].append(median_time(disk.read, 1, cpu=cpu["disk_read_cached"]))
            disk.remove()
            runs["memcpy"].append(median_time(memcpy, 1))
            raw_save(True)
            accelerator.save_state(target)  # with hashes, for the loads (load_nohash skips verifying them)
            order = list(loads) if repeat % 2 == 0 else list(reversed(loads))  # no variant always goes first
            for name in order:
                load, before = loads[name]
                runs[name].append(median_time(load, 1, before, cpu=cpu[name]))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    report(runs, cpu, total, layer_count(args.mb), WIDTH, args.repeats)


def sharded_main(args: argparse.Namespace) -> None:
    """Durable save vs the time an async save blocks, for a model sharded with FSDP2 (one process, DCP shards)."""
    from accel_checkpoint import wait_for_checkpoint
    from accel_core import Accelerator
    from accel_fsdp import FSDPStrategy

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True, strategy="fsdp")
    assert isinstance(accelerator.strategy, FSDPStrategy)
    model, optimizer = prepared_model(accelerator, args.mb)
    state = [p.to_local() for p in model.parameters()]
    state += [t.to_local() for s in optimizer.optimizer.state.values() for t in s.values() if t.numel() > 1]
    buffers = [torch.empty_like(t) for t in state]

    def memcpy() -> None:
        for b, t in zip(buffers, state, strict=True):
            b.copy_(t)

    root = tempfile.mkdtemp(prefix="accel-bench-sharded-", dir=args.dir)
    target = os.path.join(root, "ckpt")
    try:
        accelerator.save_state(target)  # warm-up (imports, first allocations)
        total = folder_bytes(target)
        assert os.path.isdir(os.path.join(target, "sharded", "model_0")), "not a sharded (DCP) checkpoint"
        shutil.rmtree(target, ignore_errors=True)
        settle()
        first_cpu: list[float] = []
        # The first async save allocates the buffers its snapshot is copied into; later ones reuse them.
        first = median_time(lambda: accelerator.save_state(target, async_save=True), 1, cpu=first_cpu)
        wait_for_checkpoint(accelerator)
        saves = {
            "save": lambda: accelerator.save_state(target),
            "async": lambda: accelerator.save_state(target, async_save=True),
        }
        runs: dict[str, list[float]] = {"save": [], "async": [], "memcpy": []}
        cpu: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(args.repeats):
            for name, fn in saves.items():
                shutil.rmtree(target, ignore_errors=True)
                settle()
                runs[name].append(median_time(fn, 1, cpu=cpu[name]))
                wait_for_checkpoint(accelerator)
            runs["memcpy"].append(median_time(memcpy, 1, cpu=cpu["memcpy"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    t = {k: statistics.median(v) for k, v in runs.items()}
    c = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"FSDP2 model {layer_count(args.mb)}x{WIDTH}x{WIDTH} fp32 + AdamW: sharded checkpoint {total / 1e6:.0f} MB, "
        f"median of {args.repeats} (range; CPU s of the process while the call ran)"
    )
    for key, label in (("save", "durable save_state"), ("async", "async save blocks"), ("memcpy", "plain copy")):
        print(f"{label:38s} {t[key]:6.2f} s ({min(runs[key]):.2f} to {max(runs[key]):.2f})  cpu {c[key]:5.2f} s")
    print(f"{'  the first async save of the process':38s} {first:6.2f} s  cpu {first_cpu[0]:5.2f} s (allocates)")
    print(f"async save blocks {t['async'] / t['save']:.2f} of a durable save (goal <= 0.25)")
    print(
        f"  its floor, the plain copy of the same tensors: {t['memcpy'] / t['save']:.2f} of a durable save; the async "
        f"save blocks {t['async'] / t['memcpy']:.2f}x the plain copy (CPU {c['async'] / c['memcpy']:.2f}x)"
    )


def report(
    runs: dict[str, list[float]], cpu: dict[str, list[float]], total: int, layers: int, width: int, repeats: int
) -> None:
    mb = total / 1e6
    t = {k: statistics.median(v) for k, v in runs.items()}
    print(f"model {layers}x{width}x{width} fp32 + AdamW: checkpoint {mb:.0f} MB, median of {repeats} (range; CPU s)")

    def row(label: str, key: str, note: str = "") -> None:
        spread = f"({min(runs[key]):.2f} to {max(runs[key]):.2f})"
        print(
            f"{label:38s} {t[key]:6.2f} s {spread:16s} {mb / t[key]:6.0f} MB/s  "
            f"cpu {statistics.median(cpu[key]):5.2f} s   {note}"
        )

    write, read, cached = t["disk_write"], t["disk_read"], t["disk_read_cached"]
    row("limit disk write, durable", "disk_write", "the checkpoint's size, the best way each round:")
    row("        one file", "disk_write_one", "an fsync every 64 MiB on a helper thread")
    row("        4 files at once", "disk_write_many", "the same, a quarter each")
    row("limit disk read (not cached)", "disk_read")
    row("limit read from the page cache", "disk_read_cached")
    row("save  raw (no fsync)", "raw")
    row("save  raw + fsync", "raw_fsync", f"{write / t['raw_fsync']:.2f} of the disk's durable write")
    row(
        "save  save_state",
        "save",
        f"ratio {t['raw_fsync'] / t['save']:.2f} of raw + fsync (goal >= 0.8); {write / t['save']:.2f} of the disk's "
        f"durable write; {t['save'] / t['save_nosync']:.2f}x durable=False (goal <= 1.3)",
    )
    row(
        "save  save_state(durable=False)",
        "save_nosync",
        f"ratio {t['raw'] / t['save_nosync']:.2f} of raw (goal >= 0.8)",
    )
    row("load  raw, running optimizer", "raw_load")
    row(
        "load  load_state, running optimizer",
        "load",
        f"ratio {t['raw_load'] / t['load']:.2f} (goal >= 0.8); {cached / t['load']:.2f} of a cached read, "
        f"{read / t['load']:.2f} of a disk read",
    )
    row("load  raw, fresh optimizer", "raw_load_fresh")
    row("load  load_state, fresh optimizer", "load_fresh", f"ratio {t['raw_load_fresh'] / t['load_fresh']:.2f}")
    row("save  save_state without hashes", "save_nohash", f"hashing adds {t['save'] / t['save_nohash'] - 1:+.0%}")
    row("load  load_state without verifying", "load_nohash", f"verifying adds {t['load'] / t['load_nohash'] - 1:+.0%}")
    print(
        f"{'async save blocks':38s} {t['async']:6.2f} s  ratio {t['async'] / t['save']:.2f} of a sync save "
        "(goal <= 0.2)"
    )
    print(
        f"  (its floor, a plain copy of the same tensors: {t['memcpy']:.2f} s = {mb / t['memcpy'] / 1000:.1f} GB/s "
        f"memory bandwidth here, {t['memcpy'] / t['save']:.2f} of a sync save)"
    )


if __name__ == "__main__":
    main()
