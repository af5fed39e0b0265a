"""Ray Train with two workers, each running ``cluster_train.train`` (a plain ``Accelerator()`` inside ``train_func``).

Usage: ``ray_train.py <out_dir>``, with a Ray instance running (``ray start --head``; the test starts one with 2
CPUs). Runs ``TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))``: Ray starts the workers and
joins them in a torch.distributed group (gloo) before ``train_func`` runs, and the Accelerator must join that group.
The workers import ``cluster_train`` from ``PYTHONPATH`` (this folder, set by the test).
"""

from __future__ import annotations

import sys
from pathlib import Path

import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config: dict) -> None:
    from cluster_train import train  # imported in the worker: the driver never imports torch's training code

    train(config["out"])


def main(out: str) -> None:
    ray.init()  # the running Ray instance (RAY_ADDRESS, or `ray start`'s), else a new local one
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"out": out},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="accel-ray", storage_path=str(Path(out) / "ray_results")),
    )
    trainer.fit()
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
