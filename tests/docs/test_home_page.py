"""The site's home page cannot fall behind the README: it is made of README sections included by
their snippet markers (pymdownx.snippets), headings and link lists, and nothing else.

- Text of its own on docs/index.md fails: outside the includes only headings, an HTML comment and
  list items that link to pages of the site are allowed, and none of them may repeat the README's words.
- A README section the home page shows is included whole: its markers span the section from its
  heading to the next one, so text added to the README there reaches the home page.
- Expanded, the home page says what the README's opening says (the backends, fp8, TP, PP, XLA...).
The README links these sections make are rewritten for the site by docs/hooks/readme_links.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
HOME = REPO / "docs" / "index.md"
README = REPO / "README.md"
INCLUDE = re.compile(r'^--8<-- "README\.md:([a-z][-_0-9a-z]*)"$')
MARKER = re.compile(r"^<!-- --8<-- \[(start|end):([a-z][-_0-9a-z]*)\] -->$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SHARED_WORDS = 6  # a run of this many README words on the home page's own lines is a copy


def readme_section(name: str) -> str:
    lines = README.read_text().splitlines()
    start = lines.index(f"<!-- --8<-- [start:{name}] -->")
    end = lines.index(f"<!-- --8<-- [end:{name}] -->")
    return "\n".join(lines[start + 1 : end])


def expanded_home() -> str:
    return "\n".join(
        readme_section(m.group(1)) if (m := INCLUDE.match(line)) else line for line in HOME.read_text().splitlines()
    )


def own_lines(markdown: str) -> list[str]:
    """The home page's lines that are not its front matter, an include, a heading, blank or inside an
    HTML comment."""
    own, in_comment = [], False
    body = markdown.split("\n---\n", 1)[1] if markdown.startswith("---\n") else markdown
    for line in body.splitlines():
        if line.startswith("<!--"):
            in_comment = True
        if not (in_comment or INCLUDE.match(line) or line.startswith("#") or not line.strip()):
            own.append(line)
        if "-->" in line:
            in_comment = False
    return own


def list_items(lines: list[str]) -> list[str]:
    """Lines grouped into list items (a continuation line is indented); a line outside a list fails."""
    items: list[str] = []
    for line in lines:
        if line.startswith("- "):
            items.append(line[2:])
        else:
            assert items and line.startswith("  "), f"docs/index.md has text of its own: {line!r}"
            items[-1] += " " + line.strip()
    return items


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", LINK.sub(" ", text).lower())


def test_home_page_has_no_text_of_its_own() -> None:
    items = list_items(own_lines(HOME.read_text()))
    assert items, "docs/index.md should link to the quick start and the other pages"
    site = REPO / "docs"
    for item in items:
        targets = LINK.findall(item)
        assert targets, f"docs/index.md: a list item without a link is text of its own: {item!r}"
        for target in targets:
            assert target.endswith(".md"), f"docs/index.md links pages of the site only: {target}"
    readme_words = words(README.read_text())
    readme_runs = {tuple(readme_words[i : i + SHARED_WORDS]) for i in range(len(readme_words) - SHARED_WORDS + 1)}
    for item in items:
        item_words = words(item)
        for i in range(len(item_words) - SHARED_WORDS + 1):
            run = tuple(item_words[i : i + SHARED_WORDS])
            assert run not in readme_runs, f"docs/index.md copies the README ({' '.join(run)!r}): include it"
    assert (site / "quickstart.md").is_file() and "](quickstart.md)" in HOME.read_text()


def test_home_page_includes_whole_readme_sections() -> None:
    included = [m.group(1) for line in HOME.read_text().splitlines() if (m := INCLUDE.match(line))]
    # The first screen: the pitch (with the picture), then the four-line change; the details below.
    assert included == ["pitch", "four-line-change", "intro", "install"], included
    lines = README.read_text().splitlines()
    for name in included:
        start = lines.index(f"<!-- --8<-- [start:{name}] -->")
        end = lines.index(f"<!-- --8<-- [end:{name}] -->")
        before = next(i for i in range(start - 1, -1, -1) if lines[i].startswith("#"))
        after = next((i for i in range(end + 1, len(lines)) if lines[i].startswith("#")), len(lines))
        outside = [line for line in lines[before + 1 : start] + lines[end + 1 : after] if line.strip()]
        assert not outside, f"README section {lines[before]!r} has text outside its {name!r} markers: {outside}"


def test_home_page_says_what_the_readme_says() -> None:
    home = expanded_home()
    for topic in (
        "FSDP",
        "DeepSpeed ZeRO",
        "Megatron-core",
        "tensor parallelism",
        "pipeline parallelism",
        "fp8",
        "XLA",
        "accel launch",
        "auto-resume",
        "from accel import Accelerator",
        '"accel==0.1.0"',  # the install from wheels, pinned exactly (PyPI's accel is another project)
    ):
        assert topic in home, f"the home page does not mention {topic}"
    for section in ("pitch", "four-line-change", "intro", "install"):
        assert readme_section(section) in home


@pytest.fixture(scope="module")
def links_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_readme_links_hook", REPO / "docs" / "hooks" / "readme_links.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_readme_links_lead_to_the_page_or_the_repository(links_hook: ModuleType) -> None:
    site = {"index.md", "pipeline.md", "backends/fsdp.md", "reference/cli.md"}
    url = "https://github.com/accel-dev/accel"

    def rewrite(target: str, page: str = "index.md") -> str:
        return links_hook.rewrite_link(target, page, site, url)

    assert rewrite("docs/pipeline.md") == "pipeline.md"
    assert (
        rewrite("docs/pipeline.md#how-the-model-is-split", "backends/fsdp.md")
        == "../pipeline.md#how-the-model-is-split"
    )
    assert rewrite("CONTRIBUTING.md") == f"{url}/blob/main/CONTRIBUTING.md"
    assert rewrite("examples") == f"{url}/tree/main/examples"
    # Links that work on the site, addresses and anchors stay; a link that works nowhere stays for mkdocs to report.
    for target in ("pipeline.md", "reference/cli.md", "https://pytorch.org", "#install", "no/such/file.md"):
        assert rewrite(target) == target
    assert rewrite("../pipeline.md", "backends/fsdp.md") == "../pipeline.md"
    # A benchmark chart: the site's copy (SITE_COPIES), from the page's folder.
    charts = {*site, "assets/bench/step.png"}
    assert links_hook.rewrite_link("bench/results/step.png", "benchmarks.md", charts, url) == "assets/bench/step.png"
    assert links_hook.rewrite_link("bench/results/step.png", "a/b.md", charts, url) == "../assets/bench/step.png"
    # Only outside fenced code, in inline links and in reference definitions.
    lines = [
        'see [the guide](docs/pipeline.md "title")',
        "```",
        "[x](docs/pipeline.md)",
        "```",
        "[ref]: docs/pipeline.md",
    ]
    assert links_hook.rewrite_lines(lines, lambda t: rewrite(t)) == [
        'see [the guide](pipeline.md "title")',
        "```",
        "[x](docs/pipeline.md)",
        "```",
        "[ref]: pipeline.md",
    ]


def _built_home_page(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The home page's HTML: from ``site/`` when it was built after every file it is made of (CI builds the site
    before the tests run), else built now into a temporary folder (about a minute)."""
    sources = [
        README,
        HOME,
        REPO / "mkdocs.yml",
        *(REPO / "docs" / "hooks").glob("*.py"),
        *(REPO / "docs" / "assets").rglob("*"),
    ]
    built = REPO / "site" / "index.html"
    if built.is_file() and built.stat().st_mtime >= max(path.stat().st_mtime for path in sources):
        return built.read_text()
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return (out / "index.html").read_text()


class _ArticleParts(HTMLParser):
    """The words of the page's article in order, with where its first picture and the four-line change start."""

    def __init__(self) -> None:
        super().__init__()
        self.in_article = False
        self.words: list[str] = []
        self.picture_at: int | None = None
        self.picture_src = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "article":
            self.in_article = True
        elif self.in_article and tag in ("img", "svg") and self.picture_at is None:
            self.picture_at = len(self.words)
            self.picture_src = dict(attrs).get("src") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self.in_article = False

    def handle_data(self, data: str) -> None:
        if self.in_article:
            self.words += data.split()


@pytest.mark.slow  # builds the site when site/ is not up to date
def test_built_home_page_opens_with_the_pitch_a_picture_and_the_four_line_change(tmp_path_factory) -> None:
    parts = _ArticleParts()
    parts.feed(_built_home_page(tmp_path_factory))
    words = parts.words
    opening = ["from", "accel", "import", "Accelerator"]  # the code's tokens are spans of their own
    starts = [i for i in range(len(words)) if words[i : i + 4] == opening and "prepare" in words[i : i + 40]]
    assert starts, "the built home page has no four-line change"
    words_before_change = starts[0]
    # The title, the two-line pitch and the section heading: a reader meets the code within a screen.
    assert words_before_change <= 60, f"{words_before_change} words come before the four-line change"
    assert parts.picture_at is not None and parts.picture_at <= words_before_change, (
        "the home page shows no picture before its four-line change"
    )
    assert parts.picture_src == "assets/architecture.svg" and (REPO / "docs" / parts.picture_src).is_file()
