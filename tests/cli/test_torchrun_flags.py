"""torchrun's launch lines under `accel launch`: every torchrun flag is taken, as accel's own flag, as the setting it
names under accel's name, passed on to torchrun's agent, accepted with a note that it is not needed, or refused with
what to do instead (accel_launch.torchrun_flags); never argparse's bare "unrecognized arguments"."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from nodes import NodeAgent, finish, free_port

from accel.commands.launch import build_parser
from accel.commands.launch import main as launch_main
from accel_launch.extensions import load_extensions
from accel_launch.torchrun_flags import NOT_NEEDED, PASSED_ON, REFUSED, SETTING, TORCHRUN_FLAGS

HERE = Path(__file__).resolve().parent
STORED_TORCHRUN_FLAGS = [
    line for line in (HERE / "torchrun_flags.txt").read_text().splitlines() if not line.startswith("#")
]


def _installed_torchrun_flags() -> list[str]:
    from torch.distributed.run import get_args_parser

    return [name for action in get_args_parser()._actions for name in action.option_strings if name != "--help"]


def test_every_flag_of_the_installed_torchrun_is_known_to_accel_launch() -> None:
    """Read from the installed torch: a flag a newer torch adds fails here until the table says what it does."""
    known = set(build_parser(load_extensions())._option_string_actions)
    installed = _installed_torchrun_flags()
    assert len(installed) > 40
    assert [flag for flag in installed if flag not in known] == []


def test_the_table_holds_only_torchrun_flags_each_with_its_outcome() -> None:
    known = set(STORED_TORCHRUN_FLAGS)
    for entry in TORCHRUN_FLAGS:
        assert [name for name in entry.names if name not in known] == [], entry.flag
        assert entry.outcome in (SETTING, PASSED_ON, NOT_NEEDED, REFUSED)
        assert entry.outcome in (SETTING, PASSED_ON) or entry.why, entry.flag


@pytest.fixture(autouse=True)
def _no_config_file(monkeypatch, tmp_path: Path) -> None:
    """No config file and no ACCEL_* variable of the caller's: the dry runs show only what the flags give."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    for name in [name for name in os.environ if name.startswith("ACCEL_") or name == "OMP_NUM_THREADS"]:
        monkeypatch.delenv(name)


def _dry_run(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[dict[str, str], str, str]:
    """The settings a dry run resolved (name -> value), its torchrun command, and what it wrote on stderr."""
    assert launch_main(["--dry-run", "--cpu", *flags, "train.py"]) == 0
    out, err = capsys.readouterr()
    block = out.split("settings:\n")[1].split("added to the environment:")[0]
    settings = dict(line.split()[:2] for line in block.splitlines() if len(line.split()) >= 2)
    return settings, out.split("command:\n")[1].strip(), err


def test_a_multi_node_torchrun_line_is_the_same_job(capsys) -> None:
    settings, command, err = _dry_run(
        capsys,
        "--nnodes=2", "--nproc_per_node=4", "--node_rank=1", "--master_addr", "10.0.0.1", "--master_port", "29511",
    )  # fmt: skip
    # torchrun counts one machine's processes, accel's -n all of them.
    assert (settings["num_processes"], settings["num_machines"], settings["machine_rank"]) == ("8", "2", "1")
    assert (settings["main_process_ip"], settings["main_process_port"]) == ("10.0.0.1", "29511")
    assert "--nnodes=2 --nproc-per-node=4 --node-rank=1 --master-addr=10.0.0.1 --master-port=29511" in command
    assert err == ""


def test_an_elastic_torchrun_line_with_a_rendezvous_endpoint(capsys) -> None:
    settings, command, _ = _dry_run(
        capsys,
        "--nnodes", "1:4", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400",
        "--rdzv-id", "job7", "--max-restarts", "3",
    )  # fmt: skip
    assert (settings["num_processes"], settings["num_machines"]) == ("8", "1:4")  # 2 on each of at most 4
    assert (settings["main_process_ip"], settings["main_process_port"]) == ("node0", "29400")
    assert "--rdzv-backend=c10d --rdzv-endpoint=node0:29400 --rdzv-id=job7" in command
    # An endpoint without a port gets torchrun's default port; an IPv6 one is written in brackets.
    settings, _, _ = _dry_run(capsys, "--nnodes", "2", "--rdzv_endpoint", "node0", "--nproc-per-node", "1")
    assert (settings["main_process_ip"], settings["main_process_port"]) == ("node0", "29400")
    settings, _, _ = _dry_run(capsys, "--nnodes", "2", "--rdzv-endpoint", "[fd00::1]:29600", "--nproc-per-node", "1")
    assert (settings["main_process_ip"], settings["main_process_port"]) == ("fd00::1", "29600")


def test_nproc_per_node_by_name_counts_this_machine_as_torchrun_does(capsys, monkeypatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    settings, _, _ = _dry_run(capsys, "--nproc-per-node", "cpu")
    assert settings["num_processes"] == "6"
    settings, _, _ = _dry_run(capsys, "--nproc-per-node", "auto")  # no GPU here, or --cpu: the cores
    assert settings["num_processes"] == "6"


def test_agent_flags_are_passed_on_to_torchrun_and_unneeded_ones_noted(capsys) -> None:
    _, command, err = _dry_run(
        capsys,
        "--standalone", "--nproc-per-node", "2", "-r", "3", "--local-ranks-filter", "0", "--start_method", "fork",
        "--run-path",
    )  # fmt: skip
    assert "--start-method=fork --redirects=3 --local-ranks-filter=0 -m accel_launch.runner" in command
    assert err.splitlines() == [
        "accel launch: --standalone: torchrun's flag, not needed: a one-machine job's rendezvous runs on this "
        "machine without it.",
        "accel launch: --run-path: torchrun's flag, not needed: accel runs the script with runpy.run_path anyway.",
    ]
    # One process runs without torchrun's agent: what would tune it does nothing, and says so.
    _, command, err = _dry_run(capsys, "--local-ranks-filter", "0")
    assert "torch.distributed.run" not in command
    assert "--local-ranks-filter=0: torchrun's agent is not used for one process" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--no-python"], "--no-python: accel launch runs a Python script or module (-m); run another program with"),
        (["--nproc-per-node", "2", "-n", "4"], "--nproc-per-node 2 and -n/--num-processes 4 both count processes"),
        (["--master-port", "29501", "--main-process-port", "29502"], "--master-port 29501 and --main-process-port"),
        (["--nnodes", "2", "--num-machines", "3"], "--nnodes 2 and --num-machines 3 say different things"),
        (["--standalone", "--nnodes", "2"], "--standalone is a job of one machine, but --nnodes/--num-machines says"),
        (["--nproc-per-node", "gpu"], "--nproc-per-node gpu: no GPU device is visible here"),
        (["--nproc-per-node", "0"], "--nproc-per-node 0: expected at least 1 process."),
        (["--node-rank", "one"], "--node-rank 'one': expected a whole number."),
        (["--rdzv-endpoint", ":29400"], "--rdzv-endpoint ':29400': expected HOST:PORT"),
    ],
)
def test_what_accel_cannot_honour_stops_the_launch_saying_why(capsys, flags: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as stopped:
        launch_main(["--cpu", *flags, "train.py"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "unrecognized arguments" not in err, err


def _ranks(output: str) -> list[dict[str, str]]:
    return [json.loads(line.split("RANKS ", 1)[1]) for line in output.splitlines() if "RANKS " in line]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_lines_run_on_one_machine_and_on_two_nodes(cli) -> None:
    """One machine: torchrun's agent takes the flags passed on (only local rank 1's output is shown). Two nodes on
    127.0.0.1, each started with torchrun's classic multi-node line: they meet at the port given, under the job id
    given."""
    script = str(cli.scripts / "torchrun_line.py")
    result = cli.run("launch", "--cpu", "--nproc_per_node", "2", "--local-ranks-filter", "1", script)
    assert result.returncode == 0, cli.describe(result)
    assert [(r["RANK"], r["WORLD_SIZE"]) for r in _ranks(result.stdout)] == [("1", "2")], cli.describe(result)

    port = free_port()
    line = ["--cpu", "--nnodes", "2", "--nproc-per-node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port)]
    line += ["--rdzv-id", "job7"]
    env = cli.env()
    agents = [NodeAgent.start(str(rank), rank, [*line, script], env, rank_flag="--node_rank") for rank in (0, 1)]
    codes = finish(agents, timeout=180)
    outputs = {agent.name: agent.output() for agent in agents}
    assert codes == {"0": 0, "1": 0}, outputs
    for rank in ("0", "1"):
        (report,) = _ranks(outputs[rank])
        assert (report["RANK"], report["GROUP_RANK"], report["WORLD_SIZE"]) == (rank, rank, "2"), outputs
        assert report["TORCHELASTIC_RUN_ID"] == "job7", outputs

    # The port given is the one machine 0 listens on: held by another program, the launch says so before starting.
    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = cli.run("launch", "--cpu", "--nproc-per-node", "2", "--master-port", str(port), script)
    assert result.returncode != 0 and f"port {port} is already in use" in result.stderr, cli.describe(result)
