"""The README fits a page (issue 28): at most 250 lines, everything else on the docs site."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_is_at_most_250_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the rest to a page under docs/"
