"""``accel merge-weights CHECKPOINT [OUTPUT]``: a sharded checkpoint's model as one safetensors file.

The command of ``accel_checkpoint.merge_sharded_checkpoint`` (``merge_fsdp_weights`` in the Python
API): reads every shard in this one process, torch imported only here.
"""

from __future__ import annotations

import argparse
import os
import shutil

DESCRIPTION = """Merges the model of a sharded checkpoint into one file, for inference, export or another tool.

CHECKPOINT is one of: a folder `save_state` wrote with sharded models (FSDP's default
SHARDED_STATE_DICT: its sharded/model_<i> is read), a torch.distributed.checkpoint (DCP) folder
(one with a .metadata file, e.g. Accelerate's pytorch_model_fsdp_0), or a folder of safetensors
shards with model.safetensors.index.json. OUTPUT is a .safetensors file, or a folder that receives
model.safetensors (pytorch_model.bin with --unsafe-serialization); without it, the current folder, as
with Accelerate. Runs in one process, on the CPU."""

EPILOG = """example:
  accel merge-weights outputs/digits/checkpoints/checkpoint_3 export/model.safetensors"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="accel merge-weights",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoint_directory", metavar="CHECKPOINT", help="the sharded checkpoint folder")
    parser.add_argument(
        "output_path",
        metavar="OUTPUT",
        nargs="?",
        default=".",
        help="a .safetensors file, or a folder (default: the current folder)",
    )
    parser.add_argument(
        "--model-index",
        "--model_index",
        dest="model_index",
        type=int,
        default=0,
        metavar="I",
        help="which prepared model of a save_state folder (default 0)",
    )
    parser.add_argument(
        "--unsafe-serialization",
        "--unsafe_serialization",
        dest="unsafe_serialization",
        action="store_true",
        help="write a pickled pytorch_model.bin instead of safetensors",
    )
    parser.add_argument(
        "--remove-checkpoint-dir",
        "--remove_checkpoint_dir",
        dest="remove_checkpoint_dir",
        action="store_true",
        help="delete CHECKPOINT once the merged file is written",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    source = os.path.abspath(os.path.expanduser(args.checkpoint_directory))
    if not os.path.isdir(source):
        raise ValueError(f"checkpoint folder {source} does not exist: pass the folder save_state wrote.")
    if args.unsafe_serialization and args.model_index:
        raise ValueError("--unsafe-serialization writes model 0 only: leave out --model-index.")
    output = os.path.expanduser(args.output_path)
    written = _merge(source, output, args.model_index, args.unsafe_serialization)
    size = os.path.getsize(written)
    print(f"accel merge-weights: wrote {written} ({human_size(size)}) from {source}")
    if args.remove_checkpoint_dir:
        shutil.rmtree(source)
        print(f"accel merge-weights: removed {source}")
    return 0


def human_size(count: int) -> str:
    """``count`` bytes in the largest unit that keeps the number at least 1 (6.7 KB, not 0.0 MiB): 1000-based, as
    ``ls -h --si`` and file managers show file sizes."""
    value = float(count)
    for unit in ("bytes", "KB", "MB", "GB"):
        if value < 1000:
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _merge(source: str, output: str, model_index: int, unsafe: bool) -> str:
    """The merged file's path. A folder with nothing to merge becomes the ``ValueError`` the CLI reports."""
    from accel_checkpoint import merge_sharded_checkpoint
    from accel_checkpoint.errors import CheckpointError

    try:
        if not unsafe:
            return merge_sharded_checkpoint(source, output, model_index=model_index)
        from accel_checkpoint.merge import merge_fsdp_weights

        merge_fsdp_weights(source, output, safe_serialization=False)
        return os.path.join(output, "pytorch_model.bin")
    except CheckpointError as error:
        raise ValueError(
            f"{source} holds no model weights to merge ({error}): pass the checkpoint folder save_state wrote, "
            "or its sharded/model_<i> folder."
        ) from None
