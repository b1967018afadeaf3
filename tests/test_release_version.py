"""One version for every artifact ``make dist`` builds: the repository's ``VERSION`` file.

The three Python distributions read it through setuptools' dynamic metadata (their pyproject
files; ``clients/python/VERSION`` and ``middleware/VERSION`` are links to it). What cannot read it
is checked against it here: the npm package's ``package.json``, the Go client's
``turnwire.Version``, and ``CHANGELOG.md``, which has a section for the released version.
``make dist`` runs this module before it builds anything.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
VERSION = (REPO / "VERSION").read_text().strip()


def test_the_version_is_a_release_version() -> None:
    # Semantic Versioning 2.0.0 (semver.org), which npm and Go module versions require.
    assert re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?", VERSION), VERSION


def test_every_python_distribution_reads_the_version_file() -> None:
    for project in (REPO, REPO / "clients" / "python", REPO / "middleware"):
        metadata = tomllib.loads((project / "pyproject.toml").read_text())
        assert "version" not in metadata["project"], project
        assert metadata["project"]["dynamic"] == ["version"], project
        assert metadata["tool"]["setuptools"]["dynamic"]["version"] == {"file": "VERSION"}, project
        assert (project / "VERSION").resolve() == REPO / "VERSION", project


def test_the_python_distributions_require_each_other_in_the_version_s_series() -> None:
    """turnwire needs turnwire-sdk and turnwire-client, turnwire-sdk needs turnwire-client: each
    range must admit VERSION (and is bumped with it when a minor release breaks the others)."""
    ours = {"turnwire-client", "turnwire-sdk"}
    found = []
    for project in (REPO, REPO / "middleware"):
        for line in tomllib.loads((project / "pyproject.toml").read_text())["project"]["dependencies"]:
            requirement = Requirement(line)
            if requirement.name in ours:
                found.append(requirement.name)
                assert requirement.specifier.contains(VERSION), f"{project}: {line} excludes {VERSION}"
    assert sorted(found) == ["turnwire-client", "turnwire-client", "turnwire-sdk"]


def test_the_npm_package_has_the_version() -> None:
    package = json.loads((REPO / "clients" / "node" / "package.json").read_text())
    assert package["version"] == VERSION


def test_the_go_client_has_the_version() -> None:
    source = (REPO / "clients" / "go" / "turnwire" / "version.go").read_text()
    assert re.findall(r'^const Version = "([^"]*)"$', source, re.MULTILINE) == [VERSION]


def test_the_changelog_has_a_section_for_the_version() -> None:
    headings = re.findall(r"^## (.+)$", (REPO / "CHANGELOG.md").read_text(), re.MULTILINE)
    released = [heading for heading in headings if heading != "Unreleased"]
    assert released, "CHANGELOG.md has no released version"
    assert re.fullmatch(rf"{re.escape(VERSION)} \(\d{{4}}-\d{{2}}-\d{{2}}\)", released[0]), (
        f"the newest released section of CHANGELOG.md is {released[0]!r}, not '{VERSION} (YYYY-MM-DD)'"
    )
