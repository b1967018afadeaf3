"""The README fits a page (issue 28): at most 250 lines, everything else on the docs site, and its
links lead somewhere (``mkdocs build --strict`` checks the pages' links, not the README's)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#([^)\s]+))?\)")


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and mkdocs' ``toc`` both make it for plain headings."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the rest to a page under docs/"


def test_every_readme_link_names_a_file_and_heading_that_exist() -> None:
    links = [(path, anchor) for path, anchor in _LINK.findall(README.read_text()) if "://" not in path]
    assert len(links) >= 30  # the guarantees' rows at least
    for path, anchor in links:
        target = REPO / path
        assert target.exists(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", target.read_text(), re.MULTILINE)
            assert anchor in {_slug(heading) for heading in headings}, f"{path} has no heading #{anchor}"


def test_every_docs_page_is_in_the_nav_the_index_and_the_readme() -> None:
    """A page nobody links to is not found: each page under docs/ is in mkdocs.yml's nav, in
    docs/index.md's table and in the README's list of the documentation."""
    docs = REPO / "docs"
    pages = {path.relative_to(docs).as_posix() for path in docs.rglob("*.md")}
    nav = set(
        re.findall(
            r"^\s*- (?:[^\n:]+|\"[^\"]+\"): (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), re.MULTILINE
        )
    )
    index = {path for path, _ in _LINK.findall((docs / "index.md").read_text())}
    readme = README.read_text()
    listed = {
        path.removeprefix("docs/")
        for path, _ in _LINK.findall(readme[readme.index("## The documentation") :])
    }
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert pages - index - {"index.md"} == set(), "pages missing from docs/index.md"
    assert pages - listed - {"index.md"} == set(), "pages missing from the README's documentation list"
