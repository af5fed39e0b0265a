"""The compatibility suite's 2-process launch: scripts/api_checks.py runs once, and every test that needs it reads its
checks' outcomes (tests/harness/) or its output."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from checkrun import CheckRun

HERE = Path(__file__).parent
API_CHECKS = HERE / "scripts" / "api_checks.py"


@dataclass
class TwoProcessRun:
    run: CheckRun  # every check's outcome per process
    folder: Path  # where the script saved files

    @property
    def output(self) -> str:
        """stdout and stderr of both processes."""
        return self.run.launched.stdout + self.run.launched.stderr


@pytest.fixture(scope="session")
def two_process_run(torchrun_checks, tmp_path_factory: pytest.TempPathFactory) -> TwoProcessRun:
    folder = tmp_path_factory.mktemp("api_checks")
    run = torchrun_checks(API_CHECKS, str(folder), env={"ACCELERATE_LOG_LEVEL": "DEBUG"})
    return TwoProcessRun(run, folder)
