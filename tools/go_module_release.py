"""Write the Go client (``clients/go``) as a module release in the module proxy's layout.

``go help goproxy`` defines the layout: ``<dir>/turnwire.dev/go/@v/list`` (the versions),
``v<VERSION>.info`` (version and time, JSON), ``v<VERSION>.mod`` (the ``go.mod``) and
``v<VERSION>.zip`` (the module's files under ``turnwire.dev/go@v<VERSION>/``, the module zip
format of ``golang.org/x/mod/zip``). ``GOPROXY=file://<dir>`` (or ``<dir>`` served over HTTP)
then answers ``go get turnwire.dev/go@v<VERSION>``. The version is the repository's ``VERSION``
file; the time is the last commit's, so the same commit gives the same files.

    python tools/go_module_release.py DIR
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE_DIR = ROOT / "clients" / "go"


def module_path() -> str:
    """The ``module`` line of ``clients/go/go.mod``."""
    match = re.search(r"^module\s+(\S+)", (MODULE_DIR / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit("clients/go/go.mod has no module line")
    return match.group(1)


def module_files() -> list[Path]:
    """The files a module zip holds: every file under ``clients/go`` that git tracks or would
    (not ignored), so no build leftovers."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
        cwd=MODULE_DIR,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(MODULE_DIR / name for name in listed.split("\0") if name)


def write_release(out: Path) -> Path:
    """Writes the proxy layout for the current ``VERSION`` under ``out``; returns the zip's path."""
    version = "v" + (ROOT / "VERSION").read_text().strip()
    path = module_path()
    release = out / path / "@v"
    release.mkdir(parents=True, exist_ok=True)
    committed = subprocess.run(
        ["git", "log", "-1", "--format=%cI"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    (release / "list").write_text(version + "\n")
    (release / f"{version}.info").write_text(json.dumps({"Version": version, "Time": committed}) + "\n")
    (release / f"{version}.mod").write_bytes((MODULE_DIR / "go.mod").read_bytes())
    archive = release / f"{version}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for file in module_files():
            # Fixed entry times (ZipInfo's default, 1980-01-01): the zip depends on content only.
            entry = zipfile.ZipInfo(f"{path}@{version}/{file.relative_to(MODULE_DIR).as_posix()}")
            entry.compress_type = zipfile.ZIP_DEFLATED
            zipped.writestr(entry, file.read_bytes())
    return archive


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tools/go_module_release.py DIR")
    print(write_release(Path(sys.argv[1])))
