"""The compatibility suite's 2-process launch: scripts/api_checks.py runs once, and every test that needs it reads its
output."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def _run_torchrun():
    # The root conftest's launcher (a session fixture cannot use its function-scoped `torchrun` fixture).
    spec = importlib.util.spec_from_file_location("_accel_root_conftest", HERE.parent / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.run_torchrun


@dataclass
class TwoProcessRun:
    output: str  # stdout and stderr of both processes
    folder: Path  # where the script saved files

    def checks(self, *names: str) -> dict[str, list[bool]]:
        """``{name: [ok on one process, ok on the other]}`` for the CHECK lines called ``names``."""
        found: dict[str, list[bool]] = {name: [] for name in names}
        for name, ok in re.findall(r"CHECK (\S+) (True|False)", self.output):
            if name in found:
                found[name].append(ok == "True")
        return found


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> TwoProcessRun:
    folder = tmp_path_factory.mktemp("api_checks")
    result = _run_torchrun()(HERE / "scripts" / "api_checks.py", str(folder), env={"ACCELERATE_LOG_LEVEL": "DEBUG"})
    return TwoProcessRun(result.stdout + result.stderr, folder)
