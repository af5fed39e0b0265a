"""``accel launch`` with the xla strategy (chosen by ``--use-xla``, the config file's ``strategy: xla`` or
``ACCEL_STRATEGY=xla``) refuses a torch and a torch-xla of different releases before any worker starts, naming the
pair accel-xla's ``xla`` extra pins, and reads versions from package metadata without importing torch_xla.

The installed pair is made with a torch-xla distribution folder (``*.dist-info``) put first on ``PYTHONPATH``: the
launcher reads real metadata of the torch installed here next to it. Runs in every environment."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from accel_xla import XlaLaunchOptions
from accel_xla.versions import release

# A torch_xla module that, if anything imports it, says so in a file: the launcher must not.
_IMPORT_SPY = "import os, pathlib\npathlib.Path(os.environ['XLA_PAIR_IMPORTED']).write_text('imported')\n"


def fake_torch_xla(site: Path, version: str) -> None:
    """An installed torch-xla ``version`` (its metadata) whose module records being imported."""
    info = site / f"torch_xla-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-xla\nVersion: {version}\n")
    (site / "torch_xla").mkdir()
    (site / "torch_xla" / "__init__.py").write_text(_IMPORT_SPY)


def launch(site: Path, tmp_path: Path, chosen_by: str = "flag") -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    """Runs ``accel launch train.py`` with the xla strategy ``chosen_by`` the flag, the config file or the environment,
    with ``site`` first on the path; the script leaves a file."""
    started, imported = tmp_path / "worker_started", tmp_path / "torch_xla_imported"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(started)!r}, 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": str(site), "XLA_PAIR_IMPORTED": str(imported)}
    for name in ("ACCEL_STRATEGY", "ACCEL_CONFIG_FILE", "PJRT_DEVICE"):
        env.pop(name, None)
    config = tmp_path / "accel.yaml"
    config.write_text("strategy: xla\n" if chosen_by == "config file" else "{}\n")
    if chosen_by == "environment":
        env["ACCEL_STRATEGY"] = "xla"
    flags = ["--use-xla"] if chosen_by == "flag" else []
    command = [sys.executable, "-m", "accel.cli", "launch", "--config-file", str(config), *flags]
    result = subprocess.run([*command, str(script)], env=env, capture_output=True, text=True, timeout=120)
    return result, started, imported


@pytest.mark.parametrize("chosen_by", ["flag", "config file", "environment"])
def test_launch_refuses_a_mismatched_pair_before_starting_workers(
    chosen_by: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_version = metadata.version("torch")
    major, minor = release(torch_version)
    other = f"{major}.{minor - 1}.0"  # a torch-xla one release behind the installed torch
    mismatched = tmp_path / "mismatched"
    fake_torch_xla(mismatched, other)
    result, started, imported = launch(mismatched, tmp_path, chosen_by)
    assert result.returncode == 2, result.stderr
    expected = (
        f"accel launch: error: torch-xla {other} runs only with torch {major}.{minor - 1}, but torch {torch_version}"
        " is installed: pip install torch==2.9.0 torch-xla==2.9.0"
    )
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert not started.exists(), "a worker started although the pair cannot run"
    assert not imported.exists(), "the launcher imported torch_xla to read its version"

    # The same release passes the check: the flags' variables, in this process (metadata read from sys.path).
    matched = tmp_path / "matched"
    fake_torch_xla(matched, f"{major}.{minor}.0")
    monkeypatch.syspath_prepend(str(matched))
    monkeypatch.delenv("ACCEL_STRATEGY", raising=False)
    namespace = argparse.Namespace(use_xla=True)
    options = XlaLaunchOptions()
    assert options.to_env(namespace)["ACCEL_STRATEGY"] == "xla"
    options.check_before_launch()  # no error
    assert metadata.version("torch-xla") == f"{major}.{minor}.0", "the matched torch-xla was not the one checked"
