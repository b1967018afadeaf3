"""The Python client as a user outside the repository gets it: built, installed, imported, run.

A wheel built from a copy of ``clients/python`` and the copy itself (``pip install <path>``)
install into fresh virtual environments, offline and without build isolation: the
environments see this checkout's ``.venv`` site-packages through a ``.pth`` line (the declared
dependencies resolve against the pinned versions there) but not its editable installs, so
``turnwire_client`` comes only from what was installed. The installed client then runs the
README's chat against a real sidecar from a directory holding folders that shadowed it before
(docs/architecture.md, "Packages"), and every README snippet runs as written.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.sidecar import SidecarProcess

REPO = Path(__file__).resolve().parents[1]
CLIENT = REPO / "clients" / "python"
README = CLIENT / "README.md"
_ADDRESS = "127.0.0.1:50051"
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)

pytestmark = [pytest.mark.e2e, pytest.mark.packaging]

PROBE = """
import importlib.metadata, json, sys
from pathlib import Path
import turnwire_client
from turnwire_client import (
    ChatMessage, SyncTurnwireClient, ToolCall, TurnResult, TurnwireClient, TurnwireError, Usage, collect
)
from turnwire_client.v1 import chat_service_pb2_grpc
root = Path(turnwire_client.__file__).parent
print(json.dumps({
    "file": turnwire_client.__file__,
    "prefix": sys.prefix,
    "typed": (root / "py.typed").is_file() and (root / "v1" / "chat_service_pb2.pyi").is_file(),
    "requires": importlib.metadata.requires("turnwire-client"),
}))
"""


def _snippets() -> list[str]:
    return [match.group(1) for match in _PYTHON_BLOCK.finditer(README.read_text())]


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """A ``turnwire serve`` on its embedded defaults (the scripted demo model and tools)."""
    process = SidecarProcess(workdir=tmp_path_factory.mktemp("client-package"))
    process.start_blocking()
    yield process
    process.kill()


def _source_copy(tmp_path: Path) -> Path:
    """``clients/python`` copied out of the repository, without build leftovers."""
    copy = tmp_path / "turnwire-client-src"
    shutil.copytree(CLIENT, copy, ignore=shutil.ignore_patterns("*.egg-info", "build", "dist", "__pycache__"))
    return copy


def _fresh_venv(path: Path) -> Path:
    """A venv without pip whose only view of this checkout is the dependencies' site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    # A plain path line: the dependencies import from there, while the editable installs'
    # own .pth files in that directory are not processed (it is not a site directory here).
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _pip_install(python: Path, *arguments: str) -> None:
    """``pip install`` into ``python``'s environment, offline: this runner's pip drives it."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", "--python", str(python)]
    run = subprocess.run(
        [*pip, "install", "--no-index", "--no-build-isolation", *arguments],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def _workdir_with_shadows(tmp_path: Path) -> Path:
    """A user's directory: a clone named ``turnwire``, a folder named ``turnwire_client`` (a
    clone of the client, say), and the clone's ``clients`` folder beside the script."""
    app = tmp_path / "my-app"
    app.mkdir()
    (app / "turnwire").symlink_to(REPO, target_is_directory=True)
    (app / "clients").symlink_to(REPO / "clients", target_is_directory=True)
    (app / "turnwire_client").mkdir()
    (app / "turnwire_client" / "notes.txt").write_text("not a package")
    return app


def _run(python: Path, code: str, cwd: Path, target: str) -> str:
    script = cwd / "script.py"
    script.write_text(code.replace(_ADDRESS, target))
    run = subprocess.run(
        [str(python), str(script)], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    return run.stdout


def _assert_installed_from(python: Path, cwd: Path, venv: Path) -> None:
    import json

    facts: dict[str, Any] = json.loads(_run(python, PROBE, cwd, _ADDRESS))
    assert Path(facts["file"]).is_relative_to(venv), facts["file"]
    assert facts["typed"], "py.typed and the .pyi stubs are installed"
    requires = {re.split(r"[<>=!~ ]", line)[0]: line for line in facts["requires"]}
    assert set(requires) == {"grpcio", "grpcio-status", "googleapis-common-protos", "protobuf"}
    assert all("<" in line and ">=" in line for line in requires.values()), requires


def test_a_built_wheel_installs_in_a_fresh_venv_and_runs_the_readme_chat(
    tmp_path: Path, sidecar: SidecarProcess
) -> None:
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    build = subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(_source_copy(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("turnwire_client-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    python = _fresh_venv(venv)
    _pip_install(python, str(wheel))

    app = _workdir_with_shadows(tmp_path)
    _assert_installed_from(python, app, venv)
    output = _run(python, _snippets()[0], app, sidecar.target)
    assert "get_weather({'city': 'Paris'}) -> {" in output, output
    assert "COMPLETED" in output


def test_pip_install_of_the_source_directory_works_outside_the_repository(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    python = _fresh_venv(venv)
    _pip_install(python, str(_source_copy(tmp_path)))
    _assert_installed_from(python, _workdir_with_shadows(tmp_path), venv)


def test_the_readme_starts_with_install_then_a_chat_that_calls_a_tool() -> None:
    text = README.read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings[:2] == ["Install", "A chat that calls a tool"]
    chat = _snippets()[0]
    assert len(chat.strip().splitlines()) <= 12 and "tool_calls" in chat


@pytest.mark.parametrize("number", range(len(_snippets())), ids=lambda n: f"snippet{n + 1}")
def test_readme_snippet_runs(number: int, tmp_path: Path, sidecar: SidecarProcess) -> None:
    """Each ``python`` block of the client's README, run as a script with this checkout's
    client against the sidecar (the README's address replaced by the sidecar's)."""
    output = _run(Path(sys.executable), _snippets()[number], tmp_path, sidecar.target)
    expected = {
        0: ["get_weather({'city': 'Paris'}) -> {'city': 'Paris'", "COMPLETED"],
        1: ["{'expression': '12 * 7', 'result': 84}"],  # the calculator's output, as a dict
        2: ["NOT_FOUND CONVERSATION_NOT_FOUND", "None"],
    }.get(number, [])
    for piece in expected:
        assert piece in output, output
