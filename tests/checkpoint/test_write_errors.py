"""A checkpoint the file system refuses, and a folder that holds no checkpoint: one clear error each.

save_state into a folder it cannot write (a file in the way, read-only, the file-size limit
reached: EFBIG, what a full disk's ENOSPC also becomes; no inode left) raises ``CheckpointWriteError`` naming the
checkpoint, never its hidden ``.partial-`` folder; a disk that fills up inside ``torch.save`` (which
says only "unexpected pos") is named full, with the room there and the room needed; load_state of an
empty folder says no checkpoint is there, instead of "holds 0 models".
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from accel_checkpoint.errors import CheckpointNotFoundError, CheckpointWriteError
from accel_core import Accelerator
from accel_core.configuration import ProjectConfiguration


def _prepared(accelerator: Accelerator) -> torch.nn.Module:
    model = torch.nn.Linear(64, 64)
    return accelerator.prepare(model)


def test_save_state_under_a_file_names_the_target(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    _prepared(accelerator)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    target = blocker / "ckpt"
    with pytest.raises(CheckpointWriteError) as caught:
        accelerator.save_state(str(target))
    message = str(caught.value)
    assert f"Cannot write the checkpoint {target}" in message and "A file is in the way" in message
    assert ".partial" not in message
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, OSError)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes into read-only folders")
def test_save_state_into_a_read_only_folder_names_the_target(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    _prepared(accelerator)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        with pytest.raises(CheckpointWriteError, match=r"Cannot write the checkpoint .*locked/ckpt: Permission denied"):
            accelerator.save_state(str(locked / "ckpt"))
    finally:
        locked.chmod(0o700)


@pytest.mark.slow
def test_save_state_past_the_file_size_limit_names_the_target(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG), as a full disk refuses it with ENOSPC."""
    code = textwrap.dedent(
        f"""
        import resource, signal, os
        import torch
        from accel_core import Accelerator
        from accel_checkpoint.errors import CheckpointWriteError

        accelerator = Accelerator(cpu=True)
        accelerator.prepare(torch.nn.Linear(512, 512))  # 1 MB of weights
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        try:
            accelerator.save_state({str(tmp_path / "ckpt")!r})
        except CheckpointWriteError as error:
            print("ERROR", error)
        print("LEFT", sorted(os.listdir({str(tmp_path)!r})))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert f"ERROR Cannot write the checkpoint {tmp_path / 'ckpt'}: File too large (EFBIG)" in result.stdout
    assert "Free space" in result.stdout and ".partial" not in result.stdout.split("LEFT")[0]
    assert "LEFT []" in result.stdout  # the hidden folder was removed


def _tmpfs(tmp_path: Path, options: str):
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A real 1 MB file system (tmpfs), where a checkpoint runs out of space; needs the right to mount."""
    yield from _tmpfs(tmp_path, "size=1m")


@pytest.fixture
def few_inodes(tmp_path: Path):
    """A real tmpfs with 64 MB of room but 8 inodes (files and folders): a checkpoint runs out of inodes."""
    yield from _tmpfs(tmp_path, "size=64m,nr_inodes=8")


def test_out_of_inodes_says_inodes_not_disk_full(few_inodes: Path) -> None:
    """ENOSPC with megabytes free: the message names the inodes (before: "the disk is full ... has 66.3 MB free")."""
    accelerator = Accelerator(cpu=True)
    _prepared(accelerator)
    previous = accelerator.save_state(str(few_inodes / "ckpt_0"))  # 4 inodes of the 7 left (folder + 3 files)
    assert os.statvfs(few_inodes).f_favail < 4 < os.statvfs(few_inodes).f_bavail
    with pytest.raises(CheckpointWriteError) as caught:
        accelerator.save_state(str(few_inodes / "ckpt_1"))
    message = str(caught.value)
    print(message)
    assert message.startswith(
        f"Cannot write the checkpoint {few_inodes / 'ckpt_1'}: the file system of {few_inodes} has no free inodes "
        "(ENOSPC: it can hold no more files, though "
    )
    assert "MB are free" in message and "df -i" in message and "disk is full" not in message
    assert caught.value.errno == errno.ENOSPC
    assert sorted(os.listdir(few_inodes)) == ["ckpt_0"]  # the hidden folder is gone
    accelerator.load_state(previous)
    # No inode left even for the hidden folder: the folder's creation fails, with the same message.
    (few_inodes / "filler").mkdir()
    for i in range(os.statvfs(few_inodes).f_favail):
        (few_inodes / "filler" / str(i)).write_bytes(b"")
    with pytest.raises(CheckpointWriteError, match=r"ckpt_2: no free inodes: the file system can hold no more files"):
        accelerator.save_state(str(few_inodes / "ckpt_2"))


@pytest.mark.slow  # the first AdamW step of the process (its lazy imports) dominates
def test_a_disk_full_in_the_middle_of_a_save_says_so_and_keeps_the_previous_checkpoint(tiny_disk: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    model(torch.randn(2, 64)).sum().backward()
    optimizer.step()
    previous = accelerator.save_state(str(tiny_disk / "ckpt_0"))
    saved_weights = {k: v.clone() for k, v in model.state_dict().items()}
    # Leave 8 kB: the optimizer's file (64 kB of AdamW moments, written first) runs out of room inside torch.save.
    stat = os.statvfs(tiny_disk)
    (tiny_disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 8192))
    with pytest.raises(CheckpointWriteError) as caught:
        accelerator.save_state(str(tiny_disk / "ckpt_1"))
    message = str(caught.value)
    assert message.startswith(f"Cannot write the checkpoint {tiny_disk / 'ckpt_1'}: the disk is full (ENOSPC).")
    assert f"The file system of {tiny_disk} has 8.2 kB free without this save's partial files" in message
    assert "files still to write need about 65.0 kB" in message and "Free space on that file system" in message
    # The failed write surfaces as torch.save's own error, which names no reason ("unexpected pos": the translation read
    # the file system), or, when the file's flush fails first, as the OSError itself.
    cause = caught.value.__cause__
    assert (isinstance(cause, RuntimeError) and "unexpected pos" in str(cause)) or (
        isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    ), repr(cause)
    assert sorted(os.listdir(tiny_disk)) == ["ckpt_0", "filler"]  # the hidden folder is gone
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    accelerator.load_state(previous)
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved_weights[name]), name


def test_load_state_of_a_folder_without_a_checkpoint_says_so(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path / "project")))
    _prepared(accelerator)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointNotFoundError, match=r"No checkpoint found in .*empty: it is empty\. A checkpoint"):
        accelerator.load_state(str(empty))
    (empty / "notes.txt").write_text("x")
    with pytest.raises(CheckpointNotFoundError, match=r"it holds notes.txt\. .*model.safetensors"):
        accelerator.load_state(str(empty))
    # A project folder given for a checkpoint: the message names its newest checkpoint.
    accelerator.project_configuration.automatic_checkpoint_naming = True
    saved = accelerator.save_state()
    with pytest.raises(CheckpointNotFoundError, match=rf"newest complete checkpoint is {saved}"):
        accelerator.load_state(str(tmp_path / "project"))
