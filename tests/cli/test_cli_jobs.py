"""Real jobs: two gloo processes through `accel launch` (flags, config file, -m, restarts, a failing rank,
two machines on this host),
`accel test`, `accel env`, and the notebook/debug launchers.

Each launch costs torch's import in the agent and the workers, so each job checks many things at once;
the workers of the failure job do not import torch.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_with_flags_config_file_environment_module_and_a_restart(cli, tmp_path: Path) -> None:
    config = tmp_path / "job.yaml"
    config.write_text(
        "num_processes: 1\n"  # the flag says 2
        "mixed_precision: fp16\n"  # the flag says bf16
        "gradient_accumulation_steps: 3\n"  # the caller's environment says 5
        "dynamo_backend: 'no'\n"
        "env:\n  FROM_CONFIG: from-config\n  FOO: from-config\n"
        "toybackend:\n  level: 7\n  fast: true\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    result = cli.run(
        "launch",
        "--config-file",
        str(config),
        "--cpu",
        "-n",
        "2",
        "--mixed-precision",
        "bf16",
        "--env",
        "FOO=bar",
        "--max-restarts",
        "1",
        "--env",
        f"PROBE_FAIL_ONCE={tmp_path / 'marker'}",
        "-m",
        "probe_pkg.probe",
        str(out),
        "x",
        "--y",
        env_extra={"ACCEL_GRADIENT_ACCUMULATION_STEPS": "5"},
        cwd=cli.scripts,  # `-m` finds the package from the working directory, as `python -m` does
    )
    assert result.returncode == 0, cli.describe(result)
    # The first attempt crashed on rank 1; torchrun's agent restarted both ranks, and the second passed.
    assert "RuntimeError: attempt 0 fails on purpose" in result.stderr
    reports = [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world"], report["backend"], report["device"]) == (rank, 2, "gloo", "cpu")
        assert report["sum"] == 3.0  # the two processes saw each other
        assert report["attempt"] == 1
        assert report["argv"] == [str(out), "x", "--y"] and report["name"] == "__main__"
        env = report["env"]
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"]) == (str(rank), "2", str(rank))
        assert env["ACCEL_MIXED_PRECISION"] == "bf16"  # flag > config
        assert env["ACCEL_GRADIENT_ACCUMULATION_STEPS"] == "5"  # environment > config
        assert env["ACCEL_DYNAMO_BACKEND"] == "no" and env["ACCEL_USE_CPU"] == "true"
        assert env["ACCEL_DEBUG_MODE"] == "false"
        assert env["FOO"] == "bar" and env["FROM_CONFIG"] == "from-config"  # --env > config's env section
        assert env["ACCEL_TOYBACKEND_LEVEL"] == "7" and env["ACCEL_TOYBACKEND_FAST"] == "true"
        assert env["OMP_NUM_THREADS"] is not None


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_failing_rank_stops_the_job_and_is_named_with_its_traceback(cli) -> None:
    logs = cli.home / "logs"
    result = cli.run("launch", "--cpu", "-n", "2", "--log-dir", str(logs), str(cli.scripts / "fail_rank1.py"))
    assert result.returncode == 1, cli.describe(result)
    # --log-dir: each worker's output is also in files (torchrun's layout: <run>/attempt_0/<local rank>/).
    rank1_err = [p for p in logs.rglob("stderr.log") if p.parent.name == "1"]
    assert rank1_err and "ValueError: rank one is broken" in rank1_err[0].read_text(), sorted(logs.rglob("*"))
    summary = result.stderr[result.stderr.index("accel launch: The job failed") :]
    assert summary.startswith("accel launch: The job failed: rank 1 (local rank 1"), summary
    assert "exited with code 1" in summary
    # The traceback is shown once: rank 1 printed it; the summary names the error and where it was raised.
    assert result.stderr.count("Traceback (most recent call last)") == 1, result.stderr
    assert 'raise ValueError("rank one is broken")' in result.stderr.split("accel launch: The job failed")[0]
    assert "Rank 1: ValueError: rank one is broken (" in summary and "in explode" in summary
    assert "runner.py" not in summary and "The other ranks were stopped." in summary
    assert "rank 0 was not stopped" not in result.stdout  # it sleeps a minute and says so if not stopped


def _launch_two_machines(cli, port: int) -> tuple[list[int | None], list[tuple[str, str]]]:
    """Machines 0 and 1 of one job on this host; returns their exit codes and (stdout, stderr)."""
    common = [
        "launch",
        "--cpu",
        "--num-machines",
        "2",
        "--main-process-ip",
        "127.0.0.1",
        "--main-process-port",
        str(port),
        "-n",
        "4",
        "report_rank.py",  # relative, from its folder
    ]
    machines = {  # machine 1 first: it waits for machine 0's store
        rank: subprocess.Popen(
            [*cli.command(), *common[:1], "--machine-rank", str(rank), *common[1:]],
            env=cli.env(),
            cwd=cli.scripts,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (1, 0)
    }
    try:
        outputs = [machines[0].communicate(timeout=240)]
        if "EADDRINUSE" in outputs[0][1] or "already in use" in outputs[0][1]:
            machines[1].kill()  # machine 0 never listened: do not wait for machine 1 to give up
        outputs.append(machines[1].communicate(timeout=240))
    finally:
        for machine in machines.values():
            machine.kill()  # only if a hang left it running
    return [machines[0].returncode, machines[1].returncode], outputs


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_machines_meet_through_the_static_rendezvous(cli) -> None:
    # The static rendezvous needs a port both machines know before either starts, so it is picked
    # here and released; another process may take it in between: then start again on another.
    for _attempt in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        codes, outputs = _launch_two_machines(cli, port)
        if "EADDRINUSE" not in outputs[0][1] and "already in use" not in outputs[0][1]:
            break
    machines = dict(zip((0, 1), codes, strict=True))
    assert machines == {0: 0, 1: 0}, outputs
    seen = {}
    for machine_rank, (stdout, _) in zip((0, 1), outputs, strict=True):
        for match in re.finditer(r"RANKS (\{[^}]*\})", stdout):
            ranks = json.loads(match.group(1))
            assert ranks["GROUP_RANK"] == str(machine_rank) and ranks["WORLD_SIZE"] == "4"
            assert ranks["LOCAL_WORLD_SIZE"] == "2" and ranks["ACCEL_USE_CPU"] == "true"
            # As `python report_rank.py`: argv[0] as typed, __file__ absolute, the script's folder first on sys.path.
            script = cli.scripts / "report_rank.py"
            assert (ranks["argv0"], ranks["file"], ranks["path0"]) == ("report_rank.py", str(script), str(cli.scripts))
            seen[int(ranks["RANK"])] = int(ranks["LOCAL_RANK"])
    assert seen == {0: 0, 1: 1, 2: 0, 3: 1}  # machine 1 holds global ranks 2 and 3


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accel_test_passes_on_two_cpu_processes(cli) -> None:
    # After `accel config default` on a machine without GPUs (one CPU process), the check still runs on two.
    written = cli.run("config", "default", env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert written.returncode == 0, cli.describe(written)
    assert "num_processes: 1" in (cli.config_dir / "default_config.yaml").read_text()
    result = cli.run("test", env_extra={"CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, cli.describe(result)
    assert "runs one CPU process; checking on 2" in result.stdout
    assert "accel check: OK on 2 process(es), device cpu" in result.stdout
    assert result.stdout.rstrip().endswith("accel test: PASS")


def test_accel_env_reports_versions_backends_devices_and_config(cli) -> None:
    cli.config_dir.mkdir(parents=True)
    (cli.config_dir / "default_config.yaml").write_text("num_processes: 2\n")
    result = cli.run("env")
    assert result.returncode == 0, cli.describe(result)
    text = result.stdout
    for line in ("- python: 3.", "- torch: 2.", "- accel-core: ", "- accel: ", "- accel.strategies: ", "- devices: "):
        assert line in text, line
    assert re.search(r"^- libraries: numpy \d.*deepspeed \d", text, re.M) and re.search(r"^- memory: \d", text, re.M)
    assert str(cli.config_dir / "default_config.yaml") in text and "(config file)" in text


@pytest.mark.slow
@pytest.mark.multiprocess
def test_notebook_and_debug_launchers(cli) -> None:
    script = cli.scripts / "launchers_check.py"
    result = subprocess.run([sys.executable, str(script)], env=cli.env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, cli.describe(result)
    report = json.loads(result.stdout.splitlines()[-1])
    for name, scale in (("debug", 10), ("notebook", 2)):
        ranks = report[name]
        assert [r["rank"] for r in ranks] == [0, 1]
        assert all(r["world"] == 2 and r["backend"] == "gloo" and r["device"] == "cpu" for r in ranks)
        assert all(r["sum"] == 3.0 * scale and r["cpu"] == "true" for r in ranks)
    assert [r["precision"] for r in report["notebook"]] == ["bf16", "bf16"]
    assert report["one"] == ["fp16"] and report["env_after"] is None  # one process: here, settings restored after
    assert "already exists in this process" in report["refusal"] and "inside the function" in report["refusal"]
    failure = report["failure"]
    assert failure["rank"] == 1 and failure["exit_code"] == 1
    # torch's ChildFailedError (what Accelerate scripts catch), accel's JobFailedError too.
    assert failure["job_failed_error"] and failure["torch_failures"] == [1] and failure["first_failure"] == 1
    assert "KeyError: 'rank 1 cannot go on'" in failure["text"] and "in failing" in failure["text"]
    assert "torch/distributed" not in failure["text"]
    assert report["failure_seconds"] < 45  # the rank sleeping a minute was stopped, not waited for
    # A rank setting up the group after its peer returned fails at once, naming the peer (it hung before).
    lone = report["lone"]
    assert lone is not None and lone["rank"] == 0, lone
    assert "rank 1 already returned without setting it up" in lone["text"] and "every process must" in lone["text"]
    assert report["lone_seconds"] < 45
    # With a restart left, the agent runs it again; the waiting rank ends on SIGTERM at once, not after 30 s.
    assert [r["sum"] for r in report["restarted"]] == [9.0, 9.0] and report["restarted_seconds"] < 25
