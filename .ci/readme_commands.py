"""Prints the command lines of the README's "The two commands" section, one per line, exactly as written.

`.ci/run` runs these lines verbatim, so CI starts where a new user starts and the README cannot drift from what
CI checks. The section's first ```bash block is the set-up command, the next ones are the test commands.
"""

from __future__ import annotations

import sys
from pathlib import Path

SECTION = "## The two commands"


def readme_commands(readme: str) -> list[str]:
    """The non-empty lines of every ```bash block between SECTION and the next `## ` heading."""
    start = readme.index(SECTION) + len(SECTION)
    end = readme.find("\n## ", start)
    section = readme[start : end if end != -1 else len(readme)]
    commands: list[str] = []
    in_block = False
    for line in section.splitlines():
        if line.strip().startswith("```"):
            in_block = line.strip() == "```bash"
            continue
        if in_block and line.strip():
            commands.append(line.strip())
    return commands


if __name__ == "__main__":
    lines = readme_commands(Path(sys.argv[1] if len(sys.argv) > 1 else "README.md").read_text())
    if len(lines) < 2:
        sys.exit(f"found {len(lines)} command lines under {SECTION!r} in the README: expected set-up + tests")
    print("\n".join(lines))
