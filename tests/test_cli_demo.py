"""``turnwire demo``'s closing hint names a command the user can run as it stands: ``turnwire``
when that name on the PATH is the program that ran, else the path it was started by (``make
demo`` starts ``.venv/bin/turnwire``, which a fresh shell does not find as ``turnwire``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from turnwire_server.cli.demo import command_name


def _program(directory: Path) -> Path:
    directory.mkdir(parents=True)
    program = directory / "turnwire"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    return program


def test_the_hint_names_the_program_as_the_user_can_run_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = _program(tmp_path / "app" / ".venv" / "bin")
    monkeypatch.chdir(tmp_path / "app")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "argv", [".venv/bin/turnwire", "demo"])
    assert command_name() == ".venv/bin/turnwire"  # not on the PATH: the path it was started by
    monkeypatch.setenv("PATH", str(venv.parent) + os.pathsep + str(tmp_path / "empty"))
    assert command_name() == "turnwire"  # on the PATH, the same program
    other = _program(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", str(other.parent))
    assert command_name() == ".venv/bin/turnwire"  # another turnwire on the PATH
    monkeypatch.setattr(sys, "argv", ["/usr/lib/python3/turnwire_server/__main__.py", "demo"])
    assert command_name() == "turnwire"  # python -m turnwire_server
