"""Fixtures of the command-line tests: the `accel` command run as a user would.

A subprocess with the caller's environment minus any ACCEL_* setting, a private (empty) config
dir, and a timeout so that a hang fails the test instead of blocking the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import processes  # tests/harness
import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"


class Cli:
    """Runs ``accel ...`` and explains results: ``cli.run(*args, env_extra=..., cwd=..., stdin=...)``."""

    scripts = SCRIPTS

    def __init__(self, home: Path) -> None:
        self.home = home
        self.config_dir = home / "xdg" / "accel"

    @staticmethod
    def command() -> list[str]:
        """The installed console script next to this interpreter, else ``python -m accel.cli``."""
        script = Path(sys.executable).parent / "accel"
        return [str(script)] if script.exists() else [sys.executable, "-m", "accel.cli"]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        env["XDG_CONFIG_HOME"] = str(self.home / "xdg")
        env.update(extra)
        return env

    def run(
        self,
        *args: str,
        env_extra: dict[str, str] | None = None,
        cwd: Path | None = None,
        stdin: str | None = None,
        timeout: float = 240,
    ) -> subprocess.CompletedProcess[str]:
        try:  # in a session of its own, and on a timeout every process below it ends too (no pipe left open)
            return processes.run([*self.command(), *args], self.env(**(env_extra or {})), timeout, cwd=cwd, stdin=stdin)
        except subprocess.TimeoutExpired as error:
            pytest.fail(
                f"accel {' '.join(args)} did not finish in {timeout}s (a hang?)\n{error.stdout}\n{error.stderr}"
            )

    @staticmethod
    def describe(result: subprocess.CompletedProcess[str]) -> str:
        return (
            f"exit code {result.returncode}\n--- stdout\n{result.stdout[-5000:]}\n--- stderr\n{result.stderr[-5000:]}"
        )


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)
