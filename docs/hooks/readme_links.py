"""mkdocs hook: links in README sections included into a page lead where they lead on GitHub.

The site's home page is made of README sections (pymdownx.snippets ``--8<-- "README.md:intro"``), whose
links are written relative to the repository root: ``docs/pipeline.md``, ``CONTRIBUTING.md``. Read
relative to the page they would be broken. After the snippets are expanded, every relative link of a
page whose target is not a file of the site but is a file of the repository is rewritten: a target
under ``docs/`` becomes the page's own relative link to it, any other file its address under
``repo_url``. Links that already work on the site are left alone, and a link that works nowhere stays
as written, so that mkdocs' strict link validation reports it.

Pictures the README shows from outside ``docs/`` (the benchmark charts in ``bench/results/``, which the
benchmark run rewrites) are copied into the site under ``assets/`` (``SITE_COPIES``), and links to them lead
there: one file in the repository, shown on GitHub and on the site alike.

``rewrite_link`` needs neither mkdocs nor Markdown: tests/docs reads it directly.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DOCS_PREFIX = "docs/"
# An inline link's target, `[text](target)` or `[text](target "title")`, and a reference definition's.
INLINE_TARGET = re.compile(r"(?<=\]\()([^()\s]+)(?=[)\s])")
DEFINITION_TARGET = re.compile(r"^( {0,3}\[[^\]]+\]:[ \t]*)(\S+)")
FENCE = re.compile(r"^\s*(```|~~~)")
URL_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

# Repository folders whose pictures the site holds a copy of: folder -> (where in the site, which files).
SITE_COPIES = {"bench/results/": ("assets/bench/", "*.png")}

# mkdocs renders one page at a time: on_page_markdown names it, then its Markdown runs the preprocessor.
_page_src_uri = ""
_site_files: set[str] = set()  # the site's files (generated pages included), from on_files


def rewrite_link(target: str, page_src_uri: str, site_files: Container[str], repo_url: str, repo: Path = REPO) -> str:
    """The target a link of page ``page_src_uri`` (relative to the docs folder) should have on the site.

    ``site_files`` holds the site's files relative to the docs folder, generated pages included.
    """
    if not target or target.startswith(("#", "/")) or URL_SCHEME.match(target):
        return target
    path, hash_mark, anchor = target.partition("#")
    page_dir = posixpath.dirname(page_src_uri)
    if posixpath.normpath(posixpath.join(page_dir, path)) in site_files:
        return target  # the page's own link
    from_root = posixpath.normpath(path)
    if from_root.startswith("../") or not (repo / from_root).exists():
        return target  # not the repository's either: mkdocs' validation names it
    for folder, (site_folder, _) in SITE_COPIES.items():
        copy = site_folder + from_root[len(folder) :]
        if from_root.startswith(folder) and copy in site_files:
            return posixpath.relpath(copy, page_dir or ".") + hash_mark + anchor
    if from_root.startswith(DOCS_PREFIX) and from_root[len(DOCS_PREFIX) :] in site_files:
        new = posixpath.relpath(from_root[len(DOCS_PREFIX) :], page_dir or ".")
    else:
        kind = "tree" if (repo / from_root).is_dir() else "blob"
        new = f"{repo_url.rstrip('/')}/{kind}/main/{from_root}"
    return new + hash_mark + anchor


def rewrite_lines(lines: list[str], rewrite: Callable[[str], str]) -> list[str]:
    """``lines`` with each link target outside fenced code blocks passed through ``rewrite``."""
    out: list[str] = []
    in_fence = False
    for line in lines:
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            line = INLINE_TARGET.sub(lambda m: rewrite(m.group(1)), line)
            line = DEFINITION_TARGET.sub(lambda m: m.group(1) + rewrite(m.group(2)), line)
        out.append(line)
    return out


def on_config(config: Any) -> Any:
    from markdown import Extension
    from markdown.preprocessors import Preprocessor

    if not config.repo_url:
        raise ValueError("docs/hooks/readme_links.py needs repo_url in mkdocs.yml to link repository files")

    class RepoLinks(Preprocessor):
        def run(self, lines: list[str]) -> list[str]:
            return rewrite_lines(lines, lambda t: rewrite_link(t, _page_src_uri, _site_files, config.repo_url))

    class RepoLinksExtension(Extension):
        def extendMarkdown(self, md: Any) -> None:
            # After pymdownx.snippets (32) has included the README's lines, before anything reads links.
            md.preprocessors.register(RepoLinks(md), "readme_links", 31)

    config.markdown_extensions.append(RepoLinksExtension())
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for folder, (site_folder, pattern) in SITE_COPIES.items():
        for picture in sorted((REPO / folder).glob(pattern)):
            files.append(File.generated(config, site_folder + picture.name, abs_src_path=str(picture)))
    # Listed after docs/hooks/reference.py in mkdocs.yml, so the generated reference pages are counted.
    _site_files.clear()
    _site_files.update(file.src_uri for file in files)
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    global _page_src_uri
    _page_src_uri = page.file.src_uri
    return markdown
