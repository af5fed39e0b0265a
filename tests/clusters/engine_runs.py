"""What the cluster-engine tests share: the training script, reading what it wrote, running a job's command."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from processes import run
from safetensors.torch import load_file

TRAIN = Path(__file__).resolve().parent / "cluster_train.py"


@dataclass
class TrainingRun:
    """What ``cluster_train.py`` wrote: each rank's report and rank 0's weights."""

    reports: list[dict]
    initial: dict[str, torch.Tensor]
    final: dict[str, torch.Tensor]

    @classmethod
    def read(cls, out: Path, output: str = "") -> TrainingRun:
        found = sorted(out.glob("rank*.json"))
        if not found or not (out / "final.safetensors").exists():
            raise AssertionError(f"the run wrote no results in {out}; its output:\n{output[-6000:]}")
        reports = [json.loads(path.read_text()) for path in found]
        return cls(reports, load_file(str(out / "initial.safetensors")), load_file(str(out / "final.safetensors")))

    def assert_same_training(self, reference: TrainingRun) -> None:
        """Two processes trained, and the final weights equal the reference run's bit for bit (and moved)."""
        assert sorted(r["rank"] for r in self.reports) == [0, 1], self.reports
        for report in self.reports:
            assert report["world_size"] == 2, report
            assert report["gathered_ranks"] == [0, 1], report
            assert report["environ_changed"] == [], report  # Accelerator() wrote nothing into os.environ
            assert report["distributed_type"] == "MULTI_CPU", report
            assert report["steps"] == reference.reports[0]["steps"], report
        assert any(not torch.equal(self.initial[k], self.final[k]) for k in self.final), "the weights never moved"
        for name, tensor in reference.final.items():
            assert torch.equal(self.final[name], tensor), f"{name} differs from the accel launch run's"

    def assert_deepspeed_training(self, reference: TrainingRun) -> None:
        """Two processes trained with a DeepSpeed ZeRO-2 engine (``cluster_train.py --deepspeed``): every rank ends
        with the same weights, and each rank's losses and the final weights are the DDP reference run's up to float
        rounding (ZeRO-2 averages and steps flat partitions of the gradients, in another order)."""
        assert sorted(r["rank"] for r in self.reports) == [0, 1], self.reports
        for report, expected in zip(self.reports, reference.reports, strict=True):
            assert report["world_size"] == 2 and report["gathered_ranks"] == [0, 1], report
            assert report["distributed_type"] == "DEEPSPEED", report
            assert (report["zero_stage"], report["zero_optimizer"]) == (2, "DeepSpeedZeroOptimizer"), report
            assert report["steps"] == expected["steps"], report
            assert report["losses"] == pytest.approx(expected["losses"], rel=1e-5, abs=1e-6), report["rank"]
        assert len({r["weights_sha256"] for r in self.reports}) == 1, "the ranks ended with different weights"
        assert any(not torch.equal(self.initial[k], self.final[k]) for k in self.final), "the weights never moved"
        for name, tensor in reference.final.items():
            torch.testing.assert_close(self.final[name], tensor, rtol=1e-5, atol=1e-6, msg=f"{name} vs DDP's")


def run_job(command: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Runs a job's command; fails the test, with its output, on a timeout or a non-zero exit."""
    try:
        done = run(command, env=env, timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        raise AssertionError(f"{command} did not end within {timeout}s:\n{hung.stdout}\n{hung.stderr}") from None
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done
