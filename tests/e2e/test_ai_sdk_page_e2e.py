"""A browser page chats through the AI SDK door (docs/api/ai-sdk.md#a-page-with-usechat): the
example ``clients/ai-sdk-example`` (React with ``useChat`` from ``@ai-sdk/react`` and the ``ai``
package's ``DefaultChatTransport``, unmodified, bundled offline by esbuild), served from another
origin (so CORS is exercised), driven in Debian's Chromium by playwright-core
(``clients/ai-sdk-example/tests/drive.mjs``). One message: its text streams in, the sidecar's
calculator shows with its input and output, the page answers the client tool ``get_location``
with ``addToolOutput`` (a button), and the model's answer streams into the same message; then the
turn is read back over gRPC. A screenshot goes to the test's output directory
(``ai-sdk-example.png``; its path is printed).

Before issue 36 the listener had no ``/v1/ai-sdk`` routes: the page's request fails with a 404.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.http_sidecar import http_base, http_sidecar_config
from support.page_server import serving
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token

from turnwire_client import TurnwireClient
from turnwire_client.v1 import message_pb2

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "clients" / "ai-sdk-example"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOKEN = new_token()
CONVERSATION = "ai-sdk-page-1"
QUESTION = "What is 6 * 7, and where am I?"
ANSWER = "You are in Paris, and 6 * 7 = 42."

# The first turn: text with the sidecar's calculator, then the client tool (the turn ends waiting
# for it); the continuation after the page's output runs the follow-up model. Strict: a model call
# the page was not meant to cause fails the turn.
SCRIPTS = {
    "page": [
        {
            "text": "Let me work that out first.",
            "chunk_size": 4,
            "delay_ms": 5,
            "tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}],
        },
        {
            "text": "That is 42. Now I need to know where you are.",
            "chunk_size": 4,
            "tool_calls": [{"name": "get_location", "input": {"precision": "city"}}],
        },
    ],
    "page-answer": [{"text": ANSWER, "chunk_size": 4, "delay_ms": 5}],
}

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM}: `make install-chromium` installs Debian's",
)


@pytest.fixture(scope="module")
def page_origin() -> Iterator[str]:
    """The built page (``make build-ai-sdk-example``), served on a port of its own: another origin."""
    subprocess.run(["npm", "run", "--silent", "build", "-w", "clients/ai-sdk-example"], cwd=ROOT, check=True)
    with serving(EXAMPLE / "dist") as origin:
        yield origin


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, page_origin: str) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("ai-sdk-page-e2e")
    config = http_sidecar_config(
        workdir, {TOKEN: ("page", "tenant-page")}, SCRIPTS, cors={"allow_origins": [page_origin]}
    )
    config["default_model"] = "scripted:page"  # the page sends no model until its field is set
    config["providers"]["scripted"]["strict"] = True
    config["tools"] = {"demo": True}
    with running_sidecar(workdir, config) as process:
        yield process


@pytest.fixture
async def grpc(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN) as opened:
        yield opened


async def test_the_page_streams_a_server_tool_a_client_tool_and_the_answer(
    sidecar: SidecarProcess,
    page_origin: str,
    grpc: TurnwireClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = http_base(sidecar)
    screenshot = tmp_path / "ai-sdk-example.png"
    url = f"{page_origin}/index.html?api={api}&token={TOKEN}&conversation={CONVERSATION}"
    node = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node",
        str(EXAMPLE / "tests" / "drive.mjs"),
        url,
        str(screenshot),
        QUESTION,
        "scripted:page-answer",
        ANSWER,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=180)
    assert node.returncode == 0, err.decode()
    shown = json.loads(out.decode().strip().splitlines()[-1])
    assert shown["problems"] == [], shown
    assert shown["error"] is None, shown

    # Before the share: the first turn ended (ready) with the calculator done, the location asked.
    assert shown["asked"] == {"state": "ready", "tools": ["output-available", "input-available"]}, shown
    assert shown["state"] == "ready", shown
    user, reply = shown["messages"]  # the continuation streamed into the same message
    assert user["role"] == "user" and user["texts"] == [QUESTION], shown
    assert reply["role"] == "assistant", shown
    assert reply["texts"] == [
        "Let me work that out first.",
        "That is 42. Now I need to know where you are.",
        ANSWER,
    ], shown
    calculator, location = reply["tools"]
    assert calculator["name"] == "calculator" and calculator["state"] == "output-available", shown
    assert calculator["shown"].startswith('tool calculator({"expression":"6 * 7"}) → '), shown
    assert '"result":42' in calculator["shown"], shown
    assert location == {
        "name": "get_location",
        "state": "output-available",
        "shown": 'tool get_location({"precision":"city"}) → {"city":"Paris","country":"FR"}',
    }, shown
    assert shown["textUpdates"] > 3, shown  # the text grew in pieces, as it streamed
    assert screenshot.stat().st_size > 10_000

    # The turn over gRPC: the question, the reply with both calls answered, the continuation.
    stored = await grpc.get_conversation(CONVERSATION)
    assert [m.role for m in stored.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_ASSISTANT,
    ]
    calls = {p.tool_call.tool_name: p.tool_call for p in stored.messages[1].parts if p.HasField("tool_call")}
    assert json.loads(calls["calculator"].output_json)["result"] == 42
    assert json.loads(calls["get_location"].output_json) == {"city": "Paris", "country": "FR"}
    assert [p.text.text for p in stored.messages[2].parts if p.HasField("text")] == [ANSWER]
    with capsys.disabled():
        print(f"\nAI SDK example screenshot: {screenshot}")
