"""docs/quickstart.md works exactly as written: its script is the tested file (included by a snippet),
and each command the page shows, run in order in an empty folder, prints what the page says it prints
(the same lines; numbers within 0.05 of the page's) and leaves the files the page names."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "quickstart.md"
SCRIPT = REPO / "docs" / "quickstart" / "train.py"
FENCED = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
DECIMAL = re.compile(r"\d+\.\d+")
# What each command of the page becomes here: the interpreter and console script of this environment.
PROGRAMS = {"python": sys.executable, "accel": str(Path(sys.executable).parent / "accel")}


def fenced_blocks(markdown: str) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCED.findall(markdown)]


def shown_runs(markdown: str) -> list[tuple[str, str]]:
    """Each ``bash`` block followed directly by a ``text`` block: (the command, the output the page shows)."""
    blocks = fenced_blocks(markdown)
    return [
        (command.strip(), output)
        for (lang, command), (next_lang, output) in itertools.pairwise(blocks)
        if lang == "bash" and next_lang == "text"
    ]


def test_the_page_shows_the_tested_script_through_a_snippet() -> None:
    markdown = PAGE.read_text()
    assert ("python", '--8<-- "docs/quickstart/train.py"\n') in fenced_blocks(markdown)
    assert '\n--8<-- "README.md:install"\n' in markdown  # the README's install section, not a copy
    assert "(quickstart/train.py)" in markdown  # the download link: the same file, copied into the site
    assert [command for command, _ in shown_runs(markdown)] == [
        "python train.py",
        "accel launch --cpu -n 2 train.py --project-dir runs/two",
        "python train.py --epochs 5 --resume",
        "accel plot runs/quickstart/train",
    ]


def assert_prints_as_shown(command: str, printed: str, shown: str) -> None:
    printed_lines, shown_lines = printed.strip().splitlines(), shown.strip().splitlines()
    assert [DECIMAL.sub("#", line) for line in printed_lines] == [DECIMAL.sub("#", line) for line in shown_lines], (
        f"`{command}` printed:\n{printed}\nthe page shows:\n{shown}"
    )
    for got, page in zip(DECIMAL.findall(printed), DECIMAL.findall(shown), strict=True):
        assert abs(float(got) - float(page)) <= 0.05, f"`{command}` printed {got} where the page shows {page}"


@pytest.mark.slow
@pytest.mark.multiprocess
def test_each_command_prints_what_the_page_shows(tmp_path: Path) -> None:
    shutil.copy(SCRIPT, tmp_path / "train.py")  # the reader saved the page's script as train.py
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command, shown in shown_runs(PAGE.read_text()):
        program, *args = shlex.split(command)
        result = subprocess.run(
            [PROGRAMS[program], *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
        )
        assert result.returncode == 0, (
            f"`{command}` failed:\nstdout:\n{result.stdout}\nstderr:\n{result.stderr[-6000:]}"
        )
        assert_prints_as_shown(command, result.stdout, shown)

    # What the page says the runs left: the newest two checkpoints, one metrics line per epoch.
    assert sorted(p.name for p in (tmp_path / "runs/quickstart/checkpoints").iterdir()) == [
        "checkpoint_3",
        "checkpoint_4",
    ]
    metrics = [json.loads(line) for line in (tmp_path / "runs/quickstart/train/metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in metrics] == [0, 1, 2, 3, 4], metrics
    assert (tmp_path / "runs/two/checkpoints").is_dir()
    # `accel plot` drew the run's metrics: a PNG of a real figure's size, not an empty file.
    png = (tmp_path / "runs/quickstart/train/metrics.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000, len(png)
