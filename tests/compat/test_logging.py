"""accel.logging.get_logger: main process only by default, every process on request, in rank order with in_order."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest


def test_records_on_two_processes(two_process_run) -> None:
    """scripts/api_checks.py's get_logger section, run with ACCELERATE_LOG_LEVEL=DEBUG."""
    out = two_process_run.output
    lines = out.splitlines()
    early = [line for line in lines if line.startswith("EARLY-ERROR")]
    assert len(early) == 2 and "PartialState()` or `Accelerator()` before using the logging utility" in early[0]
    assert lines.count("INFO:__main__:[RANK 0] main only") == 1 and "[RANK 1] main only" not in out
    assert {line for line in lines if "every process" in line} == {
        "INFO:__main__:[RANK 0] every process 0",
        "INFO:__main__:[RANK 1] every process 1",
    }
    ordered = [line for line in lines if "in order" in line]
    assert ordered == [f"INFO:__main__:[RANK {r}] in order {r} round {i}" for i in range(3) for r in range(2)], ordered
    assert lines.count("DEBUG:__main__:[RANK 0] debug shows when ACCELERATE_LOG_LEVEL=DEBUG") == 1
    assert lines.count("WARNING:__main__:[RANK 0] said once") == 1
    assert "below the quiet logger's level" not in out
    assert sorted(re.findall(r"ERROR:quiet:\[RANK (\d)\] an error from \1", out)) == ["0", "1"]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.endswith("LOG_LEVEL")}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**full_env, **env}, timeout=120
    )


def test_level_from_the_environment_accel_name_first() -> None:
    code = (
        "import logging; from accel.logging import get_logger; "
        "print(logging.getLevelName(get_logger('x').logger.level))"
    )
    assert _run(code, ACCELERATE_LOG_LEVEL="debug").stdout.strip() == "DEBUG"
    assert _run(code, ACCEL_LOG_LEVEL="error", ACCELERATE_LOG_LEVEL="debug").stdout.strip() == "ERROR"
    assert _run(code).stdout.strip() == "NOTSET"


def test_import_does_not_import_torch() -> None:
    code = (
        "import sys; from accel.logging import get_logger; get_logger('x', log_level='INFO'); "
        "print('torch' in sys.modules)"
    )
    assert _run(code).stdout.strip() == "False"


def test_one_process_logs_with_the_caller_location(caplog: pytest.LogCaptureFixture) -> None:
    from accel import PartialState
    from accel.logging import get_logger

    PartialState(cpu=True)
    logger = get_logger("accel-test-location")
    with caplog.at_level(logging.INFO, logger="accel-test-location"):
        logger.info("hello %s", "world")
    (record,) = caplog.records
    assert record.getMessage() == "[RANK 0] hello world"
    assert record.filename == Path(__file__).name  # stacklevel points at the caller, not the adapter
