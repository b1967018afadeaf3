"""A browser chats through the HTTP listener (docs/api/http.md#from-a-browser): the example page
``clients/web-example`` (connect-web, built offline by esbuild), served from another origin
(so CORS is exercised), driven in Debian's Chromium by playwright-core. The turn's text streams
in and a tool call shows with its input and output; a screenshot goes to the test's output
directory (``web-example.png``; its path is printed).

Before issue 35 the sidecar had no HTTP listener: the page's call fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.http_sidecar import http_base
from support.page_server import serving
from support.sidecar import SidecarProcess, free_port, running_sidecar
from support.tokens import auth_config, new_token, write_tokens_file

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "clients" / "web-example"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOKEN = new_token()

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM}: `make install-chromium` installs Debian's",
)


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """The built page (``make build-web-example``), served on a port of its own: another origin."""
    subprocess.run(["npm", "run", "--silent", "build", "-w", "clients/web-example"], cwd=ROOT, check=True)
    with serving(EXAMPLE / "dist") as origin:
        yield origin


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, page_origin: str) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("web-example-e2e")
    tokens = write_tokens_file(workdir / "tokens.json", {TOKEN: ("web", "tenant-web")})
    config = {
        "auth": auth_config(tokens),
        "http": {"listen": f"127.0.0.1:{free_port()}", "cors": {"allow_origins": [page_origin]}},
    }
    with running_sidecar(workdir, config) as process:
        yield process


def test_the_page_streams_a_reply_and_a_tool_call(
    sidecar: SidecarProcess, page_origin: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api = http_base(sidecar)
    screenshot = tmp_path / "web-example.png"
    node = shutil.which("node") or "node"
    done = subprocess.run(
        [
            node,
            str(EXAMPLE / "tests" / "drive.mjs"),
            f"{page_origin}/index.html?api={api}&token={TOKEN}&conversation=web-1",
            str(screenshot),
            "What's the weather in Paris?",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.strip().splitlines()[-1])
    assert shown["state"] == "turn ended: completed", shown
    assert shown["problems"] == [], shown
    assert shown["deltas"] > 1, shown  # the text arrived in pieces, as it streamed
    assert any(tool.startswith("tool get_weather(") and "→" in tool for tool in shown["tools"]), shown
    assert any("Paris" in reply for reply in shown["replies"]), shown
    assert screenshot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nweb example screenshot: {screenshot}")
