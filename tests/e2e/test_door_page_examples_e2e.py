"""The first examples of the HTTP door pages run as written on the sidecar's embedded defaults (the
offline ``scripted:demo`` model, auth off), with only ``http.listen`` set as the pages say:
docs/api/ag-ui.md's ``HttpAgent`` run and docs/api/openai.md's ``openai`` npm call with Node.js,
docs/api/ai-sdk.md's ``useChat`` component bundled by esbuild and clicked in Debian's Chromium
(playwright-core), its page served from another origin (the sidecar's ``http.cors`` allows it).
Each example's address ``127.0.0.1:8080`` is pointed at the test's sidecar.

Before this test the AG-UI page's first example named ``openai:gpt-5-mini``, which the embedded
defaults lack (HTTP 400 ``unknown_model``), and the AI SDK page's called ``useChat`` outside a
component with an undefined ``token``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.http_sidecar import http_base
from support.page_server import serving
from support.sidecar import SidecarProcess, free_port, running_sidecar

REPO = Path(__file__).resolve().parents[2]
NODE = shutil.which("node")
ESBUILD = REPO / "node_modules" / ".bin" / "esbuild"
CHROMIUM = Path("/usr/bin/chromium")
_ADDRESS = "http://127.0.0.1:8080"
_DEMO_ANSWER = "[offline scripted model, no LLM connected] 6 * 7 = 42."

_PAGE = """<!doctype html>
<html><body><div id="root"></div><script type="module" src="app.js"></script></body></html>
"""
_MOUNT = """import { createRoot } from 'react-dom/client';
import { Chat } from './example.tsx';
createRoot(document.getElementById('root')!).render(<Chat />);
"""
# Opens the page, clicks its button, waits for the answer; prints the page's text, the errors it
# raised and the requests that failed, as JSON.
_DRIVE = """import { chromium } from 'playwright-core';
const [url, executablePath, expected] = process.argv.slice(2);
const browser = await chromium.launch({ executablePath, args: ['--no-sandbox'] });
const problems = [];
const shown = (page) => page.evaluate(() => document.body.innerText);
try {
  const page = await browser.newPage();
  page.on('pageerror', (error) => problems.push(String(error)));
  page.on('requestfailed', (request) => problems.push(`${request.url()}: ${request.failure()?.errorText}`));
  await page.goto(url);
  await page.click('button');
  const answered = (text) => document.body.innerText.includes(text);
  try {
    await page.waitForFunction(answered, expected, { timeout: 60_000 });
  } catch (error) {
    throw new Error(`${error}; the page: ${await shown(page)}; problems: ${problems}`);
  }
  console.log(JSON.stringify({ text: await shown(page), problems }));
} finally {
  await browser.close();
}
"""


def _first_block(page: str, language: str) -> str:
    """The first ```` ```language ```` block of ``docs/api/<page>``."""
    found = re.search(
        rf"^```{language}\n(.*?)^```", (REPO / "docs" / "api" / page).read_text(), re.DOTALL | re.M
    )
    assert found, f"docs/api/{page} has no {language} block"
    return found.group(1)


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An empty directory served on a port of its own (another origin than the sidecar's)."""
    directory = tmp_path_factory.mktemp("ai-sdk-page")
    with serving(directory) as origin:
        yield origin, directory


@pytest.fixture(scope="module")
def sidecar(
    tmp_path_factory: pytest.TempPathFactory, page_origin: tuple[str, Path]
) -> Iterator[SidecarProcess]:
    """``turnwire serve`` on its embedded defaults plus ``http.listen`` (and CORS for the page)."""
    http = {"listen": f"127.0.0.1:{free_port()}", "cors": {"allow_origins": [page_origin[0]]}}
    with running_sidecar(tmp_path_factory.mktemp("door-pages"), {"http": http}) as process:
        yield process


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory whose imports resolve through the repository's ``node_modules``."""
    if NODE is None or not (REPO / "node_modules" / "@ag-ui" / "client").exists():
        pytest.skip("needs node and the repository's node_modules: run `make setup`")
    (tmp_path / "node_modules").symlink_to(REPO / "node_modules", target_is_directory=True)
    (tmp_path / "package.json").write_text('{"type": "module", "private": true}\n')
    return tmp_path


def _run_node(project: Path, script: str, *args: str) -> str:
    """Run ``script`` (a file in ``project``) with Node.js; its stdout, failing on a non-zero exit."""
    ran = subprocess.run(
        [str(NODE), script, *args], cwd=project, capture_output=True, text=True, timeout=180, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout


@pytest.mark.parametrize("page", ["ag-ui.md", "openai.md"])
def test_the_first_typescript_example_runs_as_written(
    sidecar: SidecarProcess, project: Path, page: str
) -> None:
    # Plain JavaScript in a ts block: Node.js runs it as a module.
    (project / "example.mjs").write_text(_first_block(page, "ts").replace(_ADDRESS, http_base(sidecar)))
    out = _run_node(project, "example.mjs")
    expected = _DEMO_ANSWER if page == "ag-ui.md" else "[offline scripted model, no LLM connected]"
    assert expected in out, out


def test_the_ai_sdk_page_first_example_runs_in_a_browser(
    sidecar: SidecarProcess, project: Path, page_origin: tuple[str, Path]
) -> None:
    if not CHROMIUM.exists() or not ESBUILD.exists():
        pytest.skip(f"needs {CHROMIUM} (`make install-chromium`) and node_modules/.bin/esbuild")
    origin, served = page_origin
    (project / "example.tsx").write_text(
        _first_block("ai-sdk.md", "tsx").replace(_ADDRESS, http_base(sidecar))
    )
    (project / "mount.tsx").write_text(_MOUNT)
    (project / "drive.mjs").write_text(_DRIVE)
    bundle = [str(ESBUILD), "mount.tsx", "--bundle", "--format=esm", "--jsx=automatic", "--log-level=warning"]
    bundle += ['--define:process.env.NODE_ENV="production"', f"--outfile={served / 'app.js'}"]
    built = subprocess.run(bundle, cwd=project, capture_output=True, text=True, timeout=180, check=False)
    assert built.returncode == 0, built.stderr
    (served / "index.html").write_text(_PAGE)
    out = _run_node(project, "drive.mjs", f"{origin}/index.html", str(CHROMIUM), _DEMO_ANSWER)
    assert '"problems":[]' in out, out
    assert "user: What is 6 * 7?" in out, out
