"""The README's TypeScript example compiles and runs as written, against a real sidecar.

The ``ts`` block of README.md is compiled by the repository's ``tsc`` (``node_modules/.bin/tsc``,
strict) against the built client (``clients/node/dist``, ``make build-node``) and run with Node.js,
its address ``127.0.0.1:50051`` pointed at a real ``turnwire serve`` on its embedded defaults (the
offline scripted model and the demo tools).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sidecar import SidecarProcess, running_sidecar

REPO = Path(__file__).resolve().parents[2]
TSC = REPO / "node_modules" / ".bin" / "tsc"
CLIENT = REPO / "clients" / "node" / "dist" / "index.js"
NODE = shutil.which("node")
_TS_BLOCK = re.compile(r"^```ts\n(.*?)^```", re.DOTALL | re.MULTILINE)
_ADDRESS = "127.0.0.1:50051"


def _example() -> str:
    (block,) = _TS_BLOCK.findall((REPO / "README.md").read_text())
    return str(block)


def test_the_readme_has_one_typescript_example_of_twenty_lines_at_most() -> None:
    assert len(_example().splitlines()) <= 20


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("typescript")) as process:
        yield process


def test_the_readme_typescript_example_compiles_and_runs(sidecar: SidecarProcess, tmp_path: Path) -> None:
    if NODE is None or not TSC.exists() or not CLIENT.exists():
        pytest.skip("needs node, node_modules/.bin/tsc and clients/node/dist: run `make build-node`")
    # A project of its own: '@turnwire/client' (an npm workspace link to clients/node) and
    # @types/node resolve through the repository's node_modules, as after an npm install.
    (tmp_path / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    (tmp_path / "package.json").write_text('{"type": "module", "private": true}\n')
    (tmp_path / "example.ts").write_text(_example().replace(_ADDRESS, sidecar.target))
    options = ["--strict", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext"]
    options += ["--types", "node", "--skipLibCheck", "--outDir", "out", "example.ts"]
    compiled = subprocess.run(
        [str(TSC), *options], cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    ran = subprocess.run(
        [NODE, "out/example.js"], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stderr
    # The first reply streamed on one line, the second turn's tool call with plain JSON values,
    # then its status and text.
    # The first turn's two steps, a line each: the tool call announced, then the answer.
    first, second = ran.stdout.splitlines()[:2]
    assert "calculator" in first and "12 * 7 = 84" in second, ran.stdout
    assert re.search(r"^get_weather \{ city: 'Paris' \} -> \{", ran.stdout, re.MULTILINE), ran.stdout
    assert re.search(r"^COMPLETED .*Paris", ran.stdout, re.MULTILINE | re.DOTALL), ran.stdout
