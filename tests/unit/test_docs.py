"""The README stays short, and every relative link of the README and the docs pages resolves: the
file exists and, when the link names an anchor, the target has a heading with that anchor."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.support.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
PAGES = [README, *sorted((REPO_ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 200

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); a title after the target ("...") is allowed and ignored.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXTERNAL = ("http://", "https://", "mailto:")


def prose(markdown: str) -> str:
    """The text a reader sees as prose: code blocks and code spans hold examples, not links."""
    return CODE_SPAN.sub("", FENCE.sub("", markdown))


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces made hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: Counter[str] = Counter()
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = anchor_of(heading)
        found.add(base if seen[base] == 0 else f"{base}-{seen[base]}")
        seen[base] += 1
    return found


def broken_links(page: Path) -> list[str]:
    broken: list[str] = []
    for target in LINK.findall(prose(page.read_text())):
        if target.startswith(EXTERNAL):
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
            continue
        checks_anchor = bool(fragment) and resolved.suffix == ".md"
        if checks_anchor and fragment not in anchors(resolved.read_text()):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; the depth belongs in docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), broken_links(page)


def test_the_readme_links_every_docs_page() -> None:
    linked = {
        (README.parent / target.partition("#")[0]).resolve()
        for target in LINK.findall(prose(README.read_text()))
        if not target.startswith(EXTERNAL)
    }
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not unlinked, f"docs pages no reader can reach from the README: {unlinked}"


def test_a_missing_file_and_a_missing_anchor_are_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## The `k` cutoff, explained\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[fine](other.md#the-k-cutoff-explained) [gone](missing.md) [wrong](other.md#nowhere)\n"
        "[self](#a-heading) [web](https://example.com/x.md)\n\n# A heading\n\n"
        "```\n[inside a code block](also-missing.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "other.md#nowhere: no heading with that anchor",
    ]


def test_repeated_headings_get_numbered_anchors() -> None:
    assert anchors("# Setup\n\n## Setup\n\n### Setup\n") == {"setup", "setup-1", "setup-2"}
