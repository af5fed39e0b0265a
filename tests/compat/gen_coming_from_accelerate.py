"""Regenerates the "Names accel does not provide" section of docs/coming_from_accelerate.md from the allow-list.

    python tests/compat/gen_coming_from_accelerate.py

test_docs_are_current (test_surface.py) fails when the page and surface_allowlist.yaml disagree.
"""

from __future__ import annotations

from pathlib import Path

import yaml

HERE = Path(__file__).parent
PAGE = HERE.parents[1] / "docs" / "coming_from_accelerate.md"
BEGIN = "<!-- BEGIN GENERATED from tests/compat/surface_allowlist.yaml -->"
END = "<!-- END GENERATED -->"
_TITLES = {
    "planned": "Coming in a later issue",
    "not planned": "Left out on purpose",
    "internal": "Internal helpers of the reference",
}


def _short(name: str) -> str:
    return name.replace("accelerate.", "", 1)


def render() -> str:
    data = yaml.safe_load((HERE / "surface_allowlist.yaml").read_text())
    lines = [BEGIN, ""]
    for kind in ("planned", "not planned", "internal"):
        groups = [g for g in data["missing"] if g["kind"] == kind]
        if not groups:
            continue
        lines += [f"### {_TITLES[kind]}", ""]
        for group in groups:
            names = ", ".join(f"`{_short(n)}`" for n in group["names"])
            lines += [f"- {' '.join(group['reason'].split())}", f"  {names}", ""]
    defaults = data.get("defaults") or []
    if defaults:
        lines += ["### Defaults that differ", ""]
        for group in defaults:
            names = ", ".join(f"`{_short(n)}`" for n in group["names"])
            lines += [f"- {' '.join(group['reason'].split())}", f"  {names}", ""]
    pending = data.get("pending") or []
    if pending:
        lines += ["### Being added now", ""]
        for group in pending:
            names = ", ".join(f"`{_short(n)}`" for n in group["names"])
            lines += [f"- In branch `{group['branch']}`: {names}", ""]
    return "\n".join([*lines, END])


def current_page_section() -> str:
    text = PAGE.read_text()
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def main() -> None:
    text = PAGE.read_text()
    PAGE.write_text(text[: text.index(BEGIN)] + render() + text[text.index(END) + len(END) :])
    print(f"updated {PAGE}")


if __name__ == "__main__":
    main()
