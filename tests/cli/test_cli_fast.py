"""The command line without starting torch: light imports, one-process runs, the worker runner, user errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Runs the CLI in-process in a fresh interpreter and reports whether torch (or yaml) got imported.
_PROBE = """
import contextlib, io, json, sys
from accel.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exit:
        code = exit.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules, "out": out.getvalue()}))
"""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--help"], "usage"),
        (["launch", "--help"], "usage"),
        (["config", "show"], "config file"),
        (["config", "--help"], "usage"),
        (["config", "default"], "Wrote "),
        (["config"], "Wrote "),  # the questions, all answered by Enter
        (["env"], "- devices: "),
        (["test", "--help"], "usage"),
        (["estimate-memory", "--help"], "usage"),
        (["merge-weights", "--help"], "usage"),
        (["to-fsdp2", "--help"], "usage"),
    ],
)
def test_help_config_and_env_do_not_import_torch(cli, argv: list[str], expected: str) -> None:
    result = subprocess.run(
        # Enter for every question of `accel config` (stdin ending before the last one writes nothing).
        [sys.executable, "-c", _PROBE, *argv],
        env=cli.env(),
        input="\n" * 40,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["code"] == 0, result.stderr
    assert report["torch"] is False
    assert expected in report["out"]


def test_launch_help_lists_every_flag_and_installed_backend_flags(cli) -> None:
    text = cli.run("launch", "--help").stdout
    for flag in (
        "--cpu",
        "--num-processes",
        "--num-machines",
        "--machine-rank",
        "--main-process-ip",
        "--main-process-port",
        "--rdzv-backend",
        "--max-restarts",
        "--monitor-interval",
        "--mixed-precision",
        "--gradient-accumulation-steps",
        "--dynamo-backend",
        "--debug",
        "--config-file",
        "--env",
        "--module",
    ):
        assert flag in text, flag
    from accel_core import discovery

    for backend in discovery.available("accel.cli"):
        assert f"{backend} options" in text


def test_one_process_runs_the_script_directly_with_its_exit_code(cli) -> None:
    script = cli.scripts / "exit_with.py"
    result = cli.run("launch", "--mixed-precision", "bf16", "--env", "EXTRA=1", str(script), "7", "--flag")
    assert result.returncode == 7, cli.describe(result)
    report = json.loads(result.stdout)
    assert report["argv"] == ["7", "--flag"] and report["name"] == "__main__"
    assert report["env"] == {
        "RANK": None,
        "WORLD_SIZE": None,
        "ACCEL_MIXED_PRECISION": "bf16",
        "ACCEL_USE_CPU": "false",
        "EXTRA": "1",
    }
    # Accelerate's underscore spellings work too.
    ok = cli.run("launch", "--num_processes", "1", "--use_cpu", str(script), "0")
    assert ok.returncode == 0 and json.loads(ok.stdout)["env"]["ACCEL_USE_CPU"] == "true"


def test_user_errors_exit_2_with_the_fix(cli, tmp_path: Path) -> None:
    missing = cli.run("launch", "-n", "2", "no_such_script.py")
    assert missing.returncode == 2 and "No such script" in missing.stderr
    script = tmp_path / "pkg" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    path_as_module = cli.run("launch", "-n", "2", "-m", str(script))  # would be "No module named" on every rank
    assert path_as_module.returncode == 2, cli.describe(path_as_module)
    assert f"-m takes a module's dotted name, not a file path: `-m {str(script)[1:-3].replace('/', '.')}`" in (
        path_as_module.stderr
    )
    machines = cli.run("launch", "--num-machines", "2", "-n", "2", "x.py")
    assert machines.returncode == 2 and "--main-process-ip" in machines.stderr
    bad_env = cli.run("launch", "--env", "NOEQUALS", "x.py")
    assert bad_env.returncode == 2 and "KEY=VALUE" in bad_env.stderr
    from_env = cli.run("launch", "--dry-run", "x.py", env_extra={"ACCEL_USE_CPU": "sometimes"})
    assert from_env.returncode == 2 and "ACCEL_USE_CPU" in from_env.stderr
    strategy = cli.run("launch", "--strategy", "no-such-strategy", "x.py")
    assert strategy.returncode == 2 and "not installed" in strategy.stderr and "ddp" in strategy.stderr
    dynamo = cli.run("launch", "--dynamo-backend", "magic", "x.py")
    assert dynamo.returncode == 2 and "inductor" in dynamo.stderr
    unknown = cli.run("lunch")
    assert unknown.returncode == 2 and "unknown command 'lunch'. Did you mean `accel launch`?" in unknown.stderr
    # `python -m accel` is the command too (where the console script is not on PATH).
    as_module = subprocess.run(
        [sys.executable, "-m", "accel", "--version"], capture_output=True, text=True, env=cli.env(), timeout=60
    )
    assert as_module.returncode == 0 and as_module.stdout.startswith("accel "), as_module.stderr
    named = cli.run("launch", "x.py", env_extra={"ACCEL_CONFIG_FILE": str(tmp_path / "nope.yaml")})
    assert named.returncode == 2 and "nope.yaml does not exist" in named.stderr
    # What is missing is the script (argparse alone would call its arguments required too).
    for no_script in (("launch",), ("launch", "--cpu", "-n", "2"), ("launch", "-m")):
        bare = cli.run(*no_script)
        assert bare.returncode == 2 and "the script to run is missing" in bare.stderr, cli.describe(bare)
        assert "script_args" not in bare.stderr
    gone = cli.run("merge-weights", str(tmp_path / "no_checkpoint"), str(tmp_path / "out"))
    assert gone.returncode == 2 and f"checkpoint folder {tmp_path / 'no_checkpoint'} does not exist" in gone.stderr
    (tmp_path / "empty").mkdir()
    empty = cli.run("merge-weights", str(tmp_path / "empty"), str(tmp_path / "out"))
    assert empty.returncode == 2 and "holds no model weights to merge" in empty.stderr, cli.describe(empty)
    # The script's own flags after the script are its own, even a prefix of a launcher flag (no abbreviations).
    own = cli.run("launch", "--dry-run", "-m", "pkg", "--x", "--num", "3")
    assert own.returncode == 0 and own.stdout.rstrip().endswith("-m pkg --x --num 3"), cli.describe(own)
    abbreviated = cli.run("launch", "--num", "2", "x.py")
    assert abbreviated.returncode == 2 and "unrecognized arguments: --num" in abbreviated.stderr
    misspelt = cli.run("launch", "--num_proceses", "2", "x.py")
    assert misspelt.returncode == 2, cli.describe(misspelt)
    assert "--num_proceses (--num_proceses: did you mean --num_processes?)" in misspelt.stderr
    # accel test's own usage line, not the page of launch settings.
    bogus = cli.run("test", "--bogus")
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr, cli.describe(bogus)
    assert len(bogus.stderr.splitlines()) == 2 and "--mixed-precision" not in bogus.stderr


def _runner(*args: str, cwd: Path, error_file: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    return subprocess.run(
        [sys.executable, "-m", "accel_launch.runner", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runner_finishes_what_an_interpreter_exit_would(cli, tmp_path: Path) -> None:
    # The runner ends a finished worker with os._exit (see exit_without_finalization); nothing the
    # script left for the exit may be lost.
    done = _runner(
        "path", str(cli.scripts / "leave_work_for_exit.py"), str(tmp_path), cwd=tmp_path, error_file=tmp_path / "e.json"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "no newline, not flushed"
    assert (tmp_path / "left_open.txt").read_text() == "buffered, never closed"
    assert (tmp_path / "thread.txt").read_text() == "thread finished"
    assert (tmp_path / "atexit.txt").read_text() == "atexit ran"


def test_runner_runs_like_python_and_records_the_users_traceback(cli, tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    ok = _runner("path", str(cli.scripts / "exit_with.py"), "0", "x", cwd=tmp_path, error_file=error_file)
    report = json.loads(ok.stdout)
    assert ok.returncode == 0 and report["argv"] == ["0", "x"] and report["name"] == "__main__"
    assert report["path0"] == str(cli.scripts)  # like `python script.py`: the script's folder first
    assert not error_file.exists()  # a clean exit records nothing
    before = time.time()
    assert _runner("path", str(cli.scripts / "exit_with.py"), "5", cwd=tmp_path, error_file=error_file).returncode == 5
    # A non-zero sys.exit is recorded with its exact time (the launcher orders failing ranks by it) and where it was.
    exited = json.loads(error_file.read_text())["message"]
    assert exited["message"] == "SystemExit: 5" and "sys.exit(int(sys.argv[1]))" in exited["extraInfo"]["py_callstack"]
    assert before <= float(exited["extraInfo"]["failed_at"]) <= time.time()
    error_file.unlink()

    failed = _runner(
        "path", str(cli.scripts / "raise_in_function.py"), "bad", "input", cwd=tmp_path, error_file=error_file
    )
    assert failed.returncode == 1
    assert "ValueError: bad input" in failed.stderr and "in explode" in failed.stderr
    assert "runner.py" not in failed.stderr and "runpy" not in failed.stderr  # only the user's frames
    data = json.loads(error_file.read_text())  # the layout torch's ProcessFailure reads
    assert data["message"]["message"] == "ValueError: bad input"
    callstack = data["message"]["extraInfo"]["py_callstack"]
    assert "in explode" in callstack and "runner.py" not in callstack
    assert int(data["message"]["extraInfo"]["timestamp"]) > 0

    module = _runner("module", "probe_pkg.missing_module", cwd=cli.scripts, error_file=error_file)
    assert module.returncode == 1 and "No module named probe_pkg.missing_module" in module.stderr

    # A folder holding __main__.py runs as `python folder` runs it, its absolute path first on sys.path.
    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import json, sys\nprint(json.dumps([__name__, sys.path[0]]))\n")
    folder = _runner("path", "app", cwd=tmp_path, error_file=error_file)
    assert folder.returncode == 0 and json.loads(folder.stdout) == ["__main__", str(app)], folder.stderr
    assert cli.run("launch", "--dry-run", str(app)).returncode == 0  # not "No such script"


# The commands of Accelerate 1.15's `accelerate` CLI.
ACCELERATE_COMMANDS = ("config", "env", "launch", "test", "estimate-memory", "merge-weights", "to-fsdp2", "tpu-config")


def test_every_accelerate_command_exists_or_is_listed_as_left_out() -> None:
    from accel.cli import COMMANDS

    page = (Path(__file__).resolve().parents[2] / "docs" / "coming_from_accelerate.md").read_text()
    left_out = page.split("### Commands", 1)[1].split("Left out:", 1)[1].split("\n\n", 1)[0]
    for name in ACCELERATE_COMMANDS:
        assert name in COMMANDS or f"`accelerate {name}`" in left_out, name


def test_output_cut_short_by_its_reader_ends_quietly(cli) -> None:
    """`accel --help | head -1`: the reader closes the pipe before accel has written; no traceback, as other tools."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the command starts: its first write fails with EPIPE
    try:
        result = subprocess.run(
            [*cli.command(), "--help"], env=cli.env(), stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr
    assert result.returncode == 1
