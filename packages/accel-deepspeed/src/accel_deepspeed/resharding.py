"""Loading a ZeRO checkpoint with another number of processes, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer file per data-parallel process (``*zero_pp_rank_<r>_*optim_states.pt``:
that process's slice of the fp32 master weights and Adam moments). DeepSpeed's plain
``load_checkpoint`` refuses another process count (``ZeRORuntimeException`` - after ZeRO-1/2 have
already overwritten the module's weights but not the master weights). Its own answer is the
*universal checkpoint*: ``deepspeed.checkpoint.ds_to_universal`` rewrites the slices as one folder
per parameter (``zero/<name>/fp32.pt, exp_avg.pt, exp_avg_sq.pt``), which an engine with
``checkpoint.load_universal`` cuts into its own slices, whatever their number.

So when the saved count differs, the checkpoint is converted once, into ``<sharded>/universal/model_<i>/``
beside the original (kept: the next load with that count reuses it), and loaded from there:

- global process 0 converts; then each machine's first process converts too if it cannot see the
  result (checkpoints copied to every machine, ``save_on_each_node``);
- a conversion is written into a hidden ``.partial-`` folder and renamed into place, so a killed
  conversion never leaves a half folder that a later load would take;
- a failure on any process raises on every process (none waits forever), before the engine is touched.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import shutil
from argparse import Namespace
from typing import TYPE_CHECKING, Any

from accel_core.checkpointing import CheckpointMismatchError

if TYPE_CHECKING:
    from accel_core.checkpointing import CheckpointIO

UNIVERSAL_DIR = "universal"
# One file per data-parallel process, written by every ZeRO stage and by bf16's optimizer (``bf16_`` prefix).
OPTIMIZER_SHARDS = "*zero_pp_rank_*_mp_rank_*optim_states.pt"


def saved_process_count(path: str) -> int | None:
    """Data-parallel processes that wrote the ZeRO checkpoint in ``path``; None without ZeRO partitions."""
    return len(glob.glob(os.path.join(path, OPTIMIZER_SHARDS))) or None


def current_process_count(engine: Any) -> int:
    """The count DeepSpeed compares with the checkpoint's (sequence parallelism folded in)."""
    return int(getattr(engine, "seq_dp_world_size", engine.dp_world_size))


def universal_checkpoint(
    is_local_main_process: bool, engine: Any, folder: str, tag: str, saved: int, checkpoint_io: CheckpointIO
) -> str:
    """Collective. The universal checkpoint of ``folder/tag`` (converted when missing): its root folder.

    ``checkpoint_io``: what accel-checkpoint handed ``load_sharded`` (its processes' agreement, hidden folders).
    """
    now = current_process_count(engine)
    if engine.zero_nvme_offload_optimizer():
        # NVMe offload keeps each process's optimizer state in per-rank swap files, outside the ZeRO files.
        raise CheckpointMismatchError(
            f"{os.path.join(folder, tag)} was saved by {saved} processes and {now} run now, but with the optimizer "
            "offloaded to NVMe DeepSpeed can only load it with the same number: launch with "
            f"{saved} processes, or load it once without NVMe offload and save it again."
        )
    root = os.path.join(folder, UNIVERSAL_DIR)
    target = os.path.join(root, tag)
    coord = checkpoint_io.coordinator
    error: BaseException | None = None
    if coord.rank == 0 and not os.path.isdir(target):
        error = _convert_guarded(os.path.join(folder, tag), root, tag, saved, now, checkpoint_io)
    coord.agree(error, "converting the DeepSpeed checkpoint to a universal checkpoint")
    if is_local_main_process and not os.path.isdir(target):
        # this machine has its own copy
        error = _convert_guarded(os.path.join(folder, tag), root, tag, saved, now, checkpoint_io)
    coord.agree(error, "converting the DeepSpeed checkpoint to a universal checkpoint on every machine")
    if not os.path.isdir(target):
        error = CheckpointMismatchError(f"{target} is not visible on this process after its conversion.")
    coord.agree(error, "finding the universal checkpoint")
    return root


def _convert_guarded(
    source: str, root: str, tag: str, saved: int, now: int, checkpoint_io: CheckpointIO
) -> BaseException | None:
    try:
        _convert(source, root, tag, checkpoint_io.partial_path(os.path.join(root, tag)))
    except Exception as caught:  # noqa: BLE001 - reported on every process by agree()
        error = CheckpointMismatchError(
            f"{source} was saved by {saved} processes and {now} run now; converting it to a DeepSpeed universal "
            f"checkpoint in {root} failed: {type(caught).__name__}: {caught}. Load it with {saved} processes, or "
            "convert it yourself: python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state "
            f"--input_folder {source} --output_folder {os.path.join(root, tag)}"
        )
        error.__cause__ = caught
        return error
    return None


def _convert(source: str, root: str, tag: str, partial: str) -> None:
    """ds_to_universal into the hidden folder ``partial``, then renamed to ``root/tag`` (a concurrent conversion may
    win)."""
    from deepspeed.checkpoint import ds_to_universal

    os.makedirs(root, exist_ok=True)
    args = Namespace(
        input_folder=source,
        output_folder=os.path.join(partial, tag),
        num_extract_workers=1,  # no process pool: the training processes are busy enough
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # engines without tensor parallelism do not record its layout
    )
    output = io.StringIO()
    try:
        # ds_to_universal prints its progress (and tqdm bars) for a command line; keep it for errors only.
        with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
            ds_to_universal.main(args)
        try:
            os.rename(os.path.join(partial, tag), os.path.join(root, tag))
        except OSError:
            if not os.path.isdir(os.path.join(root, tag)):
                raise
    except Exception as error:
        raise RuntimeError(f"{error} (ds_to_universal's output: {output.getvalue()[-2000:]})") from error
    finally:
        shutil.rmtree(partial, ignore_errors=True)  # gone already when another process removed it


@contextlib.contextmanager
def loading_universal(engine: Any):
    """The engine reads universal checkpoints (DeepSpeed's ``checkpoint.load_universal``) inside this block only."""
    config = engine._config
    before = config.load_universal_checkpoint
    config.load_universal_checkpoint = True
    try:
        yield
    finally:
        config.load_universal_checkpoint = before
