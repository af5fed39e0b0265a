"""CI runs the README's set-up and test commands verbatim: the lines it reads are the README's own."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
readme_commands = runpy.run_path(str(REPO / ".ci" / "readme_commands.py"))["readme_commands"]


def test_ci_reads_the_setup_and_test_commands_from_the_readme():
    lines = readme_commands((REPO / "README.md").read_text())
    assert lines[0].startswith("uv sync"), lines
    assert "accel launch" in lines[0], "the set-up command also runs the main example"
    assert lines[1:] and all(line.startswith("uv run pytest") for line in lines[1:]), lines
    printed = subprocess.run(
        [sys.executable, ".ci/readme_commands.py", "README.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert printed == lines


def test_ci_runs_those_lines_and_no_private_set_up():
    ci = (REPO / ".ci" / "run").read_text()
    assert ".ci/readme_commands.py README.md" in ci
    # CI's own install would hide a README set-up that misses a package (as `--all-packages` once did).
    assert "uv sync" not in ci.replace("`uv sync`", ""), "CI must install through the README's set-up line only"


def test_a_readme_without_the_section_is_refused(tmp_path):
    (tmp_path / "README.md").write_text("# accel\n\n## The two commands\n\nnothing here\n")
    result = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "readme_commands.py"), "README.md"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "found 0 command lines" in result.stderr
