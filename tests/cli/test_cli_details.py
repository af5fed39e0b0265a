"""The command line's details a user coming from Accelerate meets (issue 45): `accel plot` on a real run's metrics,
`accel config update`, `accel env --config_file` and its tracker and torch lines, `accel estimate-memory --dtypes int8
int4 --library_name`, `accel merge-weights` without OUTPUT and its human sizes, `accel tpu-config`'s answer, the
tqdm wrapper on the base install, `accel test` with the configured strategy, and the Accelerate release the docs
name."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def accel(argv: list[str]) -> int:
    """``accel ARGV`` run in this process (the command's own dispatcher: user errors exit 2 with the message)."""
    from accel.cli import main

    return main(argv)


def _short_local_run(project: Path) -> Path:
    """Trains a small regression for 12 steps with the local tracker (a real run in this process); its run folder."""
    import torch

    from accel import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(log_with="local", project_dir=str(project))
    accelerator.init_trackers("short")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)
    inputs = torch.randn(64, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    for step in range(12):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": loss.item(), "lr": 0.1}, step=step)
    accelerator.end_training()
    return project / "short"


@pytest.mark.slow  # trains, and starts `accel plot` as a user does (matplotlib's import: seconds)
def test_accel_plot_draws_a_real_runs_metrics(cli, tmp_path: Path, capsys) -> None:
    pytest.importorskip("matplotlib")  # accel-tracking[plot]; the workspace's `uv sync` has it
    run = _short_local_run(tmp_path / "runs")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(12)) and records[-1]["loss"] < records[0]["loss"]

    drawn = cli.run("plot", str(run))
    assert drawn.returncode == 0, cli.describe(drawn)
    assert drawn.stdout.strip() == f"wrote {run / 'metrics.png'} (12 records of {run / 'metrics.jsonl'})"
    png = (run / "metrics.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 10_000, len(png)
    from matplotlib.image import imread

    pixels = imread(run / "metrics.png")
    assert pixels.shape[1] == 700 and pixels.shape[0] == 2 * 260  # 7 in wide at 100 dpi, one 2.6 in panel a metric
    assert pixels[..., :3].std() > 0.05  # drawn, not a blank canvas

    # The logging folder holding that one run is enough; -o and --keys choose the file and the panel.
    assert accel(["plot", str(tmp_path / "runs"), "--keys", "loss", "-o", str(tmp_path / "loss.png")]) == 0
    assert imread(tmp_path / "loss.png").shape[0] == 260
    # Bad input: exit 2 with the fix.
    (tmp_path / "runs" / "other").mkdir()
    (tmp_path / "runs" / "other" / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    assert accel(["plot", str(tmp_path / "runs")]) == 2
    assert "holds 2 runs: pass one of" in capsys.readouterr().err
    assert accel(["plot", str(tmp_path / "nowhere")]) == 2
    assert "does not exist: pass a run folder" in capsys.readouterr().err
    assert accel(["plot", str(run), "--keys", "accuracy"]) == 2
    assert "No numeric values of ['accuracy']" in capsys.readouterr().err


def test_plot_module_needs_a_run_and_names_matplotlibs_install(tmp_path: Path) -> None:
    bare = subprocess.run([sys.executable, "-m", "accel_tracking.plot"], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "usage: python -m accel_tracking.plot" in bare.stderr, bare.stderr
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n{"step": 1, "loss": 0.5}\n')
    without_matplotlib = textwrap.dedent(
        f"""
        import sys
        sys.modules["matplotlib"] = None  # Python's own block: `import matplotlib` raises ImportError
        from accel.cli import main
        sys.exit(main(["plot", {str(run)!r}]))
        """
    )
    result = subprocess.run([sys.executable, "-c", without_matplotlib], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert "Plotting metrics needs `matplotlib`" in result.stderr
    assert 'pip install "accel-tracking[plot]"' in result.stderr and "tracker" not in result.stderr


def test_tqdm_is_a_dependency_not_a_tracker_extra() -> None:
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    project = tomllib.loads((REPO / "packages/accel-tracking/pyproject.toml").read_text())["project"]
    assert any(re.match(r"tqdm\b", requirement) for requirement in project["dependencies"])
    import io

    from accel.utils import tqdm

    out = io.StringIO()
    assert list(tqdm(range(3), file=out, desc="epoch")) == [0, 1, 2]
    assert "epoch" in out.getvalue() and "3/3" in out.getvalue()


def test_config_update_rewrites_an_existing_file_in_the_current_format(cli, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    missing = cli.run("config", "update", "--config_file", str(config))
    assert missing.returncode == 2 and f"no config file at {config} to update: `accel config`" in missing.stderr
    # An Accelerate file (as `accelerate config` writes it) becomes accel's, values in their types.
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_CPU\nnum_processes: 2\n"
        "mixed_precision: bf16\nuse_cpu: true\n"
    )
    converted = cli.run("config", "update", "--config_file", str(config))
    assert converted.returncode == 0, cli.describe(converted)
    assert f"Updated {config}: converted from Accelerate's format" in converted.stdout
    import yaml

    assert yaml.safe_load(config.read_text()) == {"num_processes": 2, "use_cpu": True, "mixed_precision": "bf16"}
    again = cli.run("config", "update", "--config_file", str(config))
    assert again.returncode == 0 and "already in the current format: nothing changed" in again.stdout
    # accel's own file with a value in another spelling and settings out of order.
    config.write_text("mixed_precision: 'no'\nuse_cpu: 'yes'\nnum_processes: '4'\n")
    rewritten = cli.run("config", "update", "--config_file", str(config))
    assert rewritten.returncode == 0 and "rewritten in the current format" in rewritten.stdout
    assert yaml.safe_load(config.read_text()) == {"num_processes": 4, "use_cpu": True, "mixed_precision": "no"}
    # What `accel launch` would refuse is refused, and the file is left as it was.
    config.write_text("num_processes: 2\nnum_procesess: 3\n")
    refused = cli.run("config", "update", "--config_file", str(config))
    assert refused.returncode == 2 and "Did you mean 'num_processes'?" in refused.stderr
    assert config.read_text() == "num_processes: 2\nnum_procesess: 3\n"


def test_env_takes_a_config_file_and_reports_trackers_and_torch_as_installed(cli, tmp_path: Path, monkeypatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("num_processes: 3\nuse_cpu: true\n")
    report = cli.run("env", "--config_file", str(config))
    assert report.returncode == 0, cli.describe(report)
    assert f"- config file: {config}" in report.stdout
    assert re.search(r"num_processes\s+3\b", report.stdout), report.stdout

    import torch

    from accel.commands import env

    # torch's own version string, build tag included (+cu132, +cpu), read without importing torch.
    assert env.torch_version() == torch.__version__
    assert f"- torch: {torch.__version__}\n" in report.stdout
    # A tracker whose library is missing is marked with the install that adds it.
    real_find_spec = env.importlib.util.find_spec
    monkeypatch.setattr(
        env.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real_find_spec(name, *a)
    )
    trackers = env._trackers().split(", ")
    assert 'mlflow (library not installed: pip install "accel-tracking[mlflow]")' in trackers
    assert "local" in trackers  # no library: always ready


def test_estimate_memory_takes_accelerates_quantized_dtypes_and_library_name(tmp_path: Path, capsys) -> None:
    (tmp_path / "models.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 10))\n"
    )
    spec = f"{tmp_path / 'models.py'}:build"
    assert accel(["estimate-memory", spec, "-n", "2", "--dtypes", "float32", "int8", "int4", "--json"]) == 0
    rows = {(r["dtype"], r["strategy"]): r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    parameters = 1000 * 1000 + 1000 + 1000 * 10 + 10
    assert rows["float32", "ddp"]["parameters"] == 4 * parameters
    # Quantized weights: their bytes alone (8 and 4 bits a parameter), nothing to train.
    assert rows["int8", "ddp"] == {**rows["int8", "ddp"], "parameters": parameters, "gradients": 0, "total": parameters}
    assert rows["int4", "ddp"]["total"] == parameters // 2
    assert rows["int4", "zero3"]["total"] == (parameters // 2 + 1) // 2  # each process a half, bits rounded up
    assert accel(["estimate-memory", spec, "-n", "2", "--dtypes", "int4"]) == 0
    assert "parameters in int4 (quantized: not trained, no gradients or optimizer state)" in capsys.readouterr().out

    assert accel(["estimate-memory", spec, "--library_name", "transformers"]) == 2
    assert "--library_name transformers reads a local Hugging Face config" in capsys.readouterr().err
    code = accel(["estimate-memory", "resnet18", "--library_name", "timm", "-n", "1", "--dtypes", "float32", "--json"])
    printed = capsys.readouterr()
    try:
        import timm as _  # noqa: F401
    except ImportError:
        assert code == 2 and "which is not installed: pip install timm" in printed.err, printed
    else:
        assert code == 0 and json.loads(printed.out.splitlines()[0])["parameters"] > 10**7


def test_merge_weights_writes_to_the_current_folder_by_default_with_a_human_size(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import torch
    from safetensors.torch import save_file

    shards = tmp_path / "shards"
    shards.mkdir()
    tensors = {"a.weight": torch.ones(40, 20), "b.weight": torch.zeros(20, 20)}
    save_file({"a.weight": tensors["a.weight"]}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({"b.weight": tensors["b.weight"]}, str(shards / "model-00002-of-00002.safetensors"))
    index = {
        "metadata": {"total_size": 4800},
        "weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"},
    }
    (shards / "model.safetensors.index.json").write_text(json.dumps(index))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert accel(["merge-weights", str(shards)]) == 0
    merged = capsys.readouterr()
    written = here / "model.safetensors"
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(written))["a.weight"], tensors["a.weight"])
    size = written.stat().st_size
    assert 4800 < size < 10_000
    assert f"({size / 1000:.1f} KB)" in merged.out and "MiB" not in merged.out, merged.out

    from accel.commands.merge_weights import human_size

    assert [human_size(n) for n in (512, 6_700, 3_300_000, 7 * 10**9)] == ["512 bytes", "6.7 KB", "3.3 MB", "7.0 GB"]


def test_tpu_config_says_it_is_not_provided_and_why(cli) -> None:
    result = cli.run("tpu-config", "--command", "pip install x")
    assert result.returncode == 2
    assert "`accel tpu-config` is not provided" in result.stderr and "gcloud compute tpus tpu-vm ssh" in result.stderr
    assert "Did you mean" not in result.stderr


def test_the_docs_name_one_accelerate_release_for_the_api() -> None:
    """The API level is Accelerate 1.15 everywhere; 1.16 appears only where the launcher's flags or variables were
    taken from it, and then beside 1.15 (1.16's flags are 1.15's less --fp8_opt_level, which accel takes too)."""
    page = (REPO / "docs" / "coming_from_accelerate.md").read_text()
    assert page.split("\n\n")[1].startswith("accel follows the public API of Hugging Face Accelerate 1.15:")
    for paragraph in page.split("\n\n"):
        releases = set(re.findall(r"\b1\.1[0-9]\b", paragraph))
        assert releases <= {"1.15", "1.16"}, paragraph
        if "1.16" in releases:
            assert "1.15" in releases, f"a paragraph names 1.16 without saying how it relates to 1.15:\n{paragraph}"
    flags = (REPO / "tests" / "cli" / "accelerate_launch_flags.txt").read_text()
    assert "--fp8_opt_level" in flags.splitlines() and "1.15.0's and 1.16.0's" in flags


@pytest.mark.slow
@pytest.mark.multiprocess
def test_accel_test_checks_the_strategy_of_the_config_file(cli, tmp_path: Path) -> None:
    config = tmp_path / "fsdp.yaml"
    config.write_text("num_processes: 2\nuse_cpu: true\nstrategy: fsdp\n")
    result = cli.run("test", "--config_file", str(config), timeout=400)
    assert result.returncode == 0, cli.describe(result)
    assert (
        "accel test: running accel.check_script on 2 process(es) on 1 machine(s), cpu, mixed precision no, "
        "strategy fsdp" in result.stdout
    )
    assert "strategy FSDP, backend gloo" in result.stdout and "accel test: PASS" in result.stdout
