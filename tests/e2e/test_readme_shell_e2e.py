"""The shell blocks of the README and of every docs page run as written, against real sidecars.

Each ``sh`` block of README.md and of the docs site's pages (``docs/**/*.md``) is either run here
(the address ``127.0.0.1:50051`` pointed at a free port, ``.venv/bin/turnwire`` at this
interpreter's ``turnwire``), run by ``tests/test_doc_snippets.py`` (``buf curl``), or listed in
:data:`NOT_RUN` with the reason; a new block fails
:func:`test_every_shell_block_is_run_or_excused` until it is one of these.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from support.sidecar import SidecarFactory, free_port, run_turnwire, spawn_turnwire
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire_client import TlsOptions

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
_SHELL = re.compile(r"^```sh\n(.*?)^```", re.DOTALL | re.MULTILINE)
_ADDRESS = "127.0.0.1:50051"

#: The first line of each block, and who runs it (the page it is on, for the reader).
RUN_HERE = {
    "cli_tour": ".venv/bin/turnwire serve --listen 127.0.0.1:50051",  # docs/getting-started.md
    "replicas": "createdb -h 127.0.0.1 -U postgres turnwire",  # docs/operate/postgresql.md
    "certificates": "# A CA (keep ca.key away from the servers)",  # docs/operate/tls.md
    "tls_cli": "turnwire health --target 127.0.0.1:50051 --tls-ca ca.pem",  # docs/operate/tls.md
}
RUN_ELSEWHERE = {
    "node_modules/.bin/buf curl": "tests/test_doc_snippets.py",  # docs/api/rpcs.md
    # docs/api/http.md, "From curl"
    "curl -sS http://127.0.0.1:8080/turnwire.v1.ChatService/": "tests/e2e/test_http_connect_e2e.py",
    # docs/api/ai-sdk.md, "A page with useChat": the same build, a sidecar with http.listen and CORS for
    # the page's origin, the page served from another port, driven in Chromium
    "make setup build-ai-sdk-example": "tests/e2e/test_ai_sdk_page_e2e.py",
    # docs/install.md: make dist (into a temporary DIST), the wheels into a fresh venv and
    # `turnwire demo`, the npm tarball into a scratch project
    "make dist": "tests/test_release_artifacts.py",
    "python3 -m venv ~/turnwire": "tests/test_release_artifacts.py",
    "npm install /path/to/turnwire/dist/turnwire-client-": "tests/test_release_artifacts.py",
    # docs/api/kit-typescript.md: the page's program compiled by this command line, then served
    "npx tsc --module nodenext": "clients/node/tests/kit_docs.test.mjs",
    # docs/api/kit-python.md: the wheels of make dist into a fresh venv
    "pip install dist/turnwire_sdk-": "tests/test_release_artifacts.py",
    # docs/api/kit-go.md, offline: GOPATH mode on Debian's packages, as tools/go-test.sh builds the
    # Go client and its kit for `make test` (the page's program itself: tests/test_release_artifacts.py)
    "sudo apt-get install -y --no-install-recommends golang-go": "tools/go-test.sh",
}
NOT_RUN = {
    # README.md and docs/getting-started.md
    "make demo": "the README's first screen: CI runs both commands (.ci/run: make test; make demo by hand)",
    # docs/operate/deploy.md
    "docker build": "no container daemon on these machines; tests/test_dockerfile.py checks the Dockerfile",
    # docs/install.md, "The Go client"
    "export GOPROXY=file://": "no module proxy here for the module's requirements; "
    "tests/test_release_artifacts.py builds the same module zip against Debian's packages, vendored",
}


def _blocks() -> list[tuple[Path, str]]:
    """Every ``sh`` block of the pages, with its page."""
    return [(page, match.group(1)) for page in PAGES for match in _SHELL.finditer(page.read_text())]


def _block(key: str) -> list[str]:
    """The commands of the block starting with ``RUN_HERE[key]``: continuation lines joined,
    comments and blank lines dropped."""
    for _page, block in _blocks():
        if block.startswith(RUN_HERE[key]):
            lines = block.replace("\\\n", " ").splitlines()
            return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    raise AssertionError(f"no page has an sh block starting with {RUN_HERE[key]!r}")


def _argv(command: str, target: str) -> list[str]:
    """A page's ``turnwire`` command line (its ``#`` comment dropped) as argv for
    :func:`run_turnwire`, without the program, aimed at ``target``."""
    words = shlex.split(command.partition("  #")[0].replace(_ADDRESS, target))
    assert words[0] in (".venv/bin/turnwire", "turnwire"), command
    return words[1:]


def test_every_shell_block_is_run_or_excused() -> None:
    known = [*RUN_HERE.values(), *RUN_ELSEWHERE, *NOT_RUN]
    blocks = _blocks()
    for page, block in blocks:
        assert any(block.startswith(start) for start in known), (
            f"an sh block of {page.relative_to(REPO)} nobody runs: {block.splitlines()[0]!r}; run it in "
            "this file or say why not in NOT_RUN"
        )
    for start in known:
        assert any(block.startswith(start) for _page, block in blocks), f"no sh block starts with {start!r}"


async def test_the_cli_tour_runs_as_written(sidecar_factory: SidecarFactory, tmp_path: Path) -> None:
    commands = _block("cli_tour")
    serve = _argv(commands[0], "127.0.0.1:0")
    assert serve[:2] == ["serve", "--listen"]  # the sidecar the other lines talk to
    sidecar = await sidecar_factory().start()
    env = {"TURNWIRE_TARGET": sidecar.target}
    # "cancel a running turn": none runs, so exit status 1; "follow a turn": no such turn, exit
    # status 2; "approve a call awaiting approval": the demo's calls need none, so the sidecar
    # refuses it (exit status 2, the reason on stderr); "fork … at that message": the page's message
    # id stands for one of the reader's, so this sidecar has none (exit status 2).
    expected_codes = {"cancel": 1, "resume": 2, "approve": 2, "fork": 2}
    outputs = {}
    for command in commands[1:]:
        args = _argv(command, sidecar.target)
        result = await run_turnwire(*args, env=env)
        assert result.code == expected_codes.get(args[0], 0), (command, result)
        outputs[" ".join(args[:2])] = result.stdout or result.stderr
    assert "get_weather" in outputs["chat my-conversation"]
    assert "What's the weather in Oslo?" in outputs["history my-conversation"]
    assert "my-conversation" in outputs["conversations"]
    assert outputs["health"].strip() == "SERVING"
    assert "store:" in outputs["config show"]
    assert "TOOL_CALL_NOT" in outputs["approve my-conversation"], outputs["approve my-conversation"]
    assert "tw-a-cli-0123456789abcdef" in outputs["fork my-conversation"], outputs["fork my-conversation"]
    assert "0 9 * * *" in outputs["schedule create"], outputs["schedule create"]
    assert "no webhook deliveries" in outputs["webhooks deliveries"], outputs["webhooks deliveries"]


async def test_two_replicas_on_one_postgresql_database_as_written(tmp_path: Path) -> None:
    commands = _block("replicas")
    createdb, serve_lines = commands[0], commands[1:]
    assert createdb.startswith("createdb") and len(serve_lines) == 2
    with postgres_database() as url:  # stands for `createdb ... turnwire`: a fresh database
        targets, processes = [], []
        try:
            for line in serve_lines:
                target = f"127.0.0.1:{free_port()}"
                args = _argv(line.rstrip(" &"), target)
                args = [url if arg.startswith("postgresql://") else arg for arg in args]
                args[args.index("--listen") + 1] = target  # 50051 and 50052 on the page
                processes.append(await spawn_turnwire(*args, env={"TURNWIRE_LIMITS__DRAIN_SECONDS": "0"}))
                targets.append(target)

            async def serving(target: str) -> bool:
                return (await run_turnwire("health", "--target", target)).code == 0

            for target, process in zip(targets, processes, strict=True):
                try:
                    await wait_until(
                        functools.partial(serving, target), timeout=60, what=f"a replica SERVING at {target}"
                    )
                except AssertionError as error:
                    process.kill()
                    log = (await process.communicate())[1].decode()[-3000:]
                    raise AssertionError(f"{error}\n{log}") from None
            chat = await run_turnwire("chat", "shared", "What's the weather in Oslo?", "--target", targets[0])
            assert chat.code == 0, chat
            history = await run_turnwire("history", "shared", "--target", targets[1])
            assert history.code == 0 and "What's the weather in Oslo?" in history.stdout, history
        finally:
            for process in processes:
                if process.returncode is None:
                    process.terminate()
            await asyncio.gather(*(process.wait() for process in processes))


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
async def test_the_certificate_commands_and_the_tls_cli_lines_run_as_written(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    script = "\n".join(_block("certificates"))
    made = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr.decode()
    tls_page = (REPO / "docs" / "operate" / "tls.md").read_text()
    server_tls = yaml.safe_load(re.search(r"```yaml\n(tls:\n.*?)```", tls_page, re.DOTALL).group(1))["tls"]  # type: ignore[union-attr]
    files = {
        key: str(tmp_path / Path(value).name) for key, value in server_tls.items() if key.endswith("_file")
    }
    mutual = {**server_tls, **files}
    plain_tls = {key: value for key, value in files.items() if key != "client_ca_file"}
    client = TlsOptions(
        ca_file=str(tmp_path / "ca.pem"),
        cert_file=str(tmp_path / "client.pem"),
        key_file=str(tmp_path / "client.key"),
        server_name="turnwire.internal",
    )
    mtls = await sidecar_factory({"tls": mutual}, workdir=tmp_path / "mtls", tls=client).start()
    tls = await sidecar_factory(
        {"tls": plain_tls},
        workdir=tmp_path / "tls",
        tls=TlsOptions(ca_file=client.ca_file, server_name="turnwire.internal"),
    ).start()
    health_line, chat_line = _block("tls_cli")
    args = _argv(health_line, mtls.target)
    health = await _in(tmp_path, args, {})
    assert health.returncode == 0 and health.stdout.strip() == "SERVING", health
    env_part, _, command = chat_line.partition(" turnwire ")
    env = dict(pair.split("=", 1) for pair in shlex.split(env_part))
    args = _argv("turnwire " + command, tls.target)
    chat = await _in(tmp_path, args, {**env, "TURNWIRE_TARGET": tls.target})
    assert chat.returncode == 0 and "42" in chat.stdout, chat


async def _in(cwd: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``turnwire ARGS`` run in ``cwd`` (the page's relative file names), off the event loop."""
    import sys

    environment = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")} | env
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "turnwire_server", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
