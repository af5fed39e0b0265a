"""Damaged config files for `accel launch` and `accel config`: one line naming the file, no hang, no traceback.

Before: a FIFO blocked the read forever; /dev/zero ended in a MemoryError traceback; deep nesting in a RecursionError
traceback; a key given twice silently took the last value. In-process (``accel.cli.main``), with an alarm that turns
a hang into a failure.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from accel.cli import main as accel_main
from accel_launch.config import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH


@pytest.fixture
def no_hang():
    def hung(_signum, _frame):
        raise AssertionError("reading the config file hung")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _errors(capsys, *args: str) -> list[str]:
    """The error lines of ``accel <args>``, which must fail with exit code 2."""
    code = accel_main(list(args))
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert "Traceback" not in err
    return err.strip().splitlines()


def _both(capsys, path: Path | str) -> list[str]:
    """The one-line error of `accel launch` and of `accel config show` for the config file ``path``."""
    launched = _errors(capsys, "launch", "--dry-run", "--config-file", str(path), "train.py")
    shown = _errors(capsys, "config", "show", "--config-file", str(path))
    assert len(launched) == 1 and len(shown) == 1, (launched, shown)
    assert launched[0].removeprefix("accel launch: error: ") == shown[0].removeprefix("accel config: error: ")
    return launched


def test_a_fifo_is_refused_at_once(tmp_path: Path, capsys, no_hang, monkeypatch) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    assert _both(capsys, fifo) == [
        f"accel launch: error: Config file {fifo} is not a regular file (a FIFO): pass the path of a YAML file."
    ]
    # Named by ACCEL_CONFIG_FILE, or at the default location: refused too, not read (nor skipped as if absent).
    monkeypatch.setenv("ACCEL_CONFIG_FILE", str(fifo))
    assert _errors(capsys, "launch", "--dry-run", "train.py")[0].endswith(
        f"{fifo} is not a regular file (a FIFO): pass the path of a YAML file."
    )
    monkeypatch.delenv("ACCEL_CONFIG_FILE")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "accel").mkdir()
    os.mkfifo(tmp_path / "accel" / "default_config.yaml")
    assert "default_config.yaml is not a regular file (a FIFO)" in _errors(capsys, "launch", "--dry-run", "train.py")[0]


def test_a_device_is_refused_not_read_to_a_memory_error(capsys, no_hang) -> None:
    assert _both(capsys, "/dev/zero") == [
        "accel launch: error: Config file /dev/zero is not a regular file (a character device): pass the path of a "
        "YAML file."
    ]


def test_a_huge_file_is_refused_by_its_size(tmp_path: Path, capsys) -> None:
    big = tmp_path / "config.yaml"
    big.write_bytes(b"\0" * (MAX_CONFIG_BYTES + 1))
    assert _both(capsys, big) == [
        f"accel launch: error: Config file {big} is over 1024 kB, far more than a launch config holds: pass the YAML "
        "file `accel config` writes."
    ]
    small_zeros = tmp_path / "zeros.yaml"
    small_zeros.write_bytes(b"\0" * 100)
    assert "is not a text file (binary content)" in _both(capsys, small_zeros)[0]


@pytest.mark.parametrize("shape", ["flow", "block"])
def test_deep_nesting_is_refused_not_a_recursion_error(tmp_path: Path, capsys, shape: str) -> None:
    deep = tmp_path / "config.yaml"
    if shape == "flow":
        deep.write_text("fsdp: " + "[" * 5000 + "]" * 5000 + "\n")
        line = 1
    else:
        deep.write_text("".join(f"{'  ' * i}k{i}:\n" for i in range(MAX_CONFIG_DEPTH + 5)) + "  " * 70 + "x: 1\n")
        line = MAX_CONFIG_DEPTH
    assert _both(capsys, deep) == [
        f"accel launch: error: Config file {deep}: line {line}: nested deeper than 64 levels, far more than a launch "
        "config has."
    ]


def test_a_key_given_twice_is_refused(tmp_path: Path, capsys) -> None:
    top = tmp_path / "top.yaml"
    top.write_text("num_processes: 2\nuse_cpu: true\nnum_processes: 4\n")
    assert _both(capsys, top) == [
        f"accel launch: error: Config file {top}: key 'num_processes' is given twice (lines 1 and 3); YAML would keep "
        "the last one silently. Keep one."
    ]
    section = tmp_path / "section.yaml"
    section.write_text("fsdp:\n  sharding_strategy: FULL_SHARD\n  sharding_strategy: NO_SHARD\n")
    assert "key 'sharding_strategy' is given twice (lines 2 and 3)" in _both(capsys, section)[0]
    flow = tmp_path / "flow.json"  # a JSON file is YAML too: the same check
    flow.write_text('{"num_processes": 2, "num_processes": 3}')
    assert "key 'num_processes' is given twice (line 1)" in _both(capsys, flow)[0]
    imported = _errors(capsys, "config", "import", str(top))
    assert imported == [
        f"accel config: error: Accelerate config file {top}: key 'num_processes' is given twice (lines 1 and 3); "
        "YAML would keep the last one silently. Keep one."
    ]


def test_what_yaml_means_to_override_still_reads(tmp_path: Path, capsys) -> None:
    """A merge key (`<<: *anchor`) overridden in the same mapping is YAML's own override, not a duplicate."""
    config = tmp_path / "config.yaml"
    config.write_text("env: &base\n  A: 1\n  B: 2\nmytool:\n  <<: *base\n  A: 3\nnum_processes: 2\n")
    assert accel_main(["launch", "--dry-run", "--config-file", str(config), "train.py"]) == 0
    out = capsys.readouterr().out
    assert "ACCEL_MYTOOL_A=3" in out and "ACCEL_MYTOOL_B=2" in out


def test_deepspeed_json_config_refuses_duplicates_specials_and_depth(tmp_path: Path, no_hang) -> None:
    from accel_deepspeed.config import load_config

    duplicated = tmp_path / "ds.json"
    duplicated.write_text('{"zero_optimization": {"stage": 2, "stage": 3}}')
    with pytest.raises(ValueError, match=r"ds.json: key 'stage' is given twice in one object; keep one\.$"):
        load_config(duplicated)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=r"fifo.json is not a regular file"):
        load_config(fifo)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"deep.json is nested too deeply"):
        load_config(deep)
    fine = tmp_path / "ok.json"
    fine.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert load_config(fine) == {"zero_optimization": {"stage": 2}}
