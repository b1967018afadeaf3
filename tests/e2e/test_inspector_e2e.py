"""The inspector page (docs/inspector.md) in Debian's Chromium, driven by playwright-core
(``clients/inspector/tests/drive.mjs``): a turn of two steps with a tool call, a blocked call and
a provider-executed call is drawn as a Gantt chart whose bars follow the stored timeline
(ListTurns); a tool call expands to its exact output (a big integer intact); a running turn's
chart grows live and is redrawn from the store once it ends; failed turns filter with their
classification; another tenant's token sees none of it; axe-core finds no serious violation.
Screenshots go to the test's output directory (their paths are printed); with
``TURNWIRE_DOCS_SCREENSHOTS=docs/images/inspector`` they are copied there too: the docs' are these.

Before issue 39 the timeline was not stored and there was no page: ListTurns and ``/inspector/``
do not exist.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token

from turnwire_client import TurnwireClient
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "clients" / "inspector" / "tests" / "drive.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
TOKEN = new_token()
OTHER_TOKEN = new_token()
BIG = "123456789012000000000"  # 123456789012 * 1000000000: above 2**53, exact only as text

SCRIPTS: dict[str, Any] = {
    "timed": [
        {
            "reasoning": "The user wants a product and the time.",
            "text": "Let me work that out.",
            "chunk_size": 4,
            "delay_ms": 15,
            "tool_calls": [
                {
                    "id": "call-calc",
                    "name": "calculator",
                    "input": {"expression": "123456789012 * 1000000000"},
                },
                {"id": "call-time", "name": "get_current_time", "input": {"timezone": "UTC"}},
                {
                    "id": "call-search",
                    "name": "web_search",
                    "provider_executed": True,
                    "output": {"hits": 2, "id": 12345678901234567890},
                },
            ],
        },
        {"text": f"The product is {BIG}; the clock is not mine to read.", "chunk_size": 3, "delay_ms": 25},
    ],
    # Step 0 lasts about 3 s: the open page (polling every 1.5 s) attaches during it.
    "slow": [
        {
            "text": "Checking first, one careful word at a time, before I call the calculator.",
            "chunk_size": 4,
            "delay_ms": 150,
            "tool_calls": [{"id": "call-slow", "name": "calculator", "input": {"expression": "6 * 7"}}],
        },
        {"text": "The answer is 42, computed slowly.", "chunk_size": 2, "delay_ms": 150},
    ],
    "failing": [
        {"error": {"message": "slow down", "status": 429, "type": "rate_limit_error", "retryable": False}}
    ],
}

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason=f"no Chromium at {CHROMIUM}: `make install-chromium` installs Debian's",
)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    subprocess.run(["make", "--silent", "build-inspector"], cwd=ROOT, check=True)
    workdir = tmp_path_factory.mktemp("inspector-e2e")
    config = http_sidecar_config(
        workdir, {TOKEN: ("alice", "tenant-a"), OTHER_TOKEN: ("bob", "tenant-b")}, SCRIPTS, inspector=True
    )
    config["default_model"] = "scripted:timed"
    config["providers"]["scripted"]["strict"] = True
    config["tools"] = {"demo": True}
    config["middleware"] = [
        {"path": "turnwire.middlewares:ToolPolicy", "options": {"deny": ["get_current_time"]}}
    ]
    with running_sidecar(workdir, config) as process:
        yield process


@pytest.fixture
async def client(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN) as opened:
        yield opened


async def _turns(
    sidecar: SidecarProcess, conversation_id: str, token: str = TOKEN
) -> list[chat_service_pb2.Turn]:
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        found = await stub.ListTurns(
            chat_service_pb2.ListTurnsRequest(conversation_id=conversation_id),
            metadata=(("authorization", f"Bearer {token}"),),
        )
    return list(found.turns)


async def _start_driver(
    mode: str, sidecar: SidecarProcess, token: str, conversation: str, out: Path, *extra: str
) -> asyncio.subprocess.Process:
    node = shutil.which("node") or "node"
    return await asyncio.create_subprocess_exec(
        node,
        str(DRIVER),
        mode,
        http_base(sidecar),
        token,
        conversation,
        str(out),
        *extra,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def _shown(process: asyncio.subprocess.Process, *, not_found: bool = False) -> dict[str, Any]:
    """What the driver printed last (one JSON line), once it ended well; the page logged no
    error but, with ``not_found``, the browser's line for the API's 404 (NOT_FOUND) answer."""
    stdout, stderr = await asyncio.wait_for(process.communicate(), 180)
    assert process.returncode == 0, stderr.decode()
    shown: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    expected = (
        ["Failed to load resource: the server responded with a status of 404 (Not Found)"]
        if not_found
        else []
    )
    assert shown["problems"] == expected, shown
    return shown


async def _drive(
    mode: str, sidecar: SidecarProcess, token: str, conversation: str, out: Path, *extra: str
) -> dict[str, Any]:
    return await _shown(
        await _start_driver(mode, sidecar, token, conversation, out, *extra), not_found=mode == "tenant"
    )


def _publish(*screenshots: Path) -> None:
    """Copy ``screenshots`` to ``$TURNWIRE_DOCS_SCREENSHOTS`` when set (docs/inspector.md's)."""
    target = os.environ.get("TURNWIRE_DOCS_SCREENSHOTS")
    if target:
        for screenshot in screenshots:
            shutil.copy(screenshot, ROOT / target / screenshot.name)


async def _chat(client: TurnwireClient, conversation: str, text: str, model: str) -> None:
    async for _ in client.chat(conversation, text, model=model):
        pass


def _kind(span: chat_service_pb2.TimelineSpan) -> str:
    return chat_service_pb2.TimelineSpanKind.Name(span.kind).removeprefix("TIMELINE_SPAN_KIND_")


def test_the_page_is_static_files_of_its_own_origin(sidecar: SidecarProcess) -> None:
    """The page's files only (a fixed list: no path names a file), with a policy that loads
    nothing from elsewhere and no token needed to fetch them (they hold no data)."""
    with urllib.request.urlopen(f"{http_base(sidecar)}/inspector/", timeout=30) as page:
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "<title>Turnwire inspector</title>" in page.read().decode()
    for path in ("/inspector/turnwire.yaml", "/inspector/..%2Fturnwire.yaml", "/inspector/tokens.json"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{http_base(sidecar)}{path}", timeout=30)
        assert refused.value.code == 404, path


async def test_the_stored_timeline_of_two_steps_with_tools(
    sidecar: SidecarProcess, client: TurnwireClient
) -> None:
    await _chat(client, "timeline-1", "Multiply, and what time is it?", "scripted:timed")
    (turn,) = await _turns(sidecar, "timeline-1")
    assert turn.status == event_pb2.TURN_STATUS_COMPLETED
    spans = list(turn.timeline.spans)
    starts = [span.start_offset_micros for span in spans]
    assert starts == sorted(starts)  # in the order they started
    kinds = [_kind(span) for span in spans]
    assert kinds[:4] == ["QUEUE", "ATTEMPT", "STEP", "MODEL"], kinds
    steps = [span for span in spans if _kind(span) == "STEP"]
    models = [span for span in spans if _kind(span) == "MODEL"]
    tools = {span.name: span for span in spans if _kind(span) == "TOOL"}
    hooks = [span for span in spans if _kind(span) == "HOOK"]
    assert [span.name for span in steps] == ["step 0", "step 1"]
    assert [span.step_number for span in models] == [0, 1]
    assert {name: span.outcome for name, span in tools.items()} == {
        "calculator": "executed",
        "get_current_time": "blocked",
    }  # the provider ran web_search: not a tool call of the sidecar's
    assert tools["calculator"].tool_call_id == "call-calc"
    assert {(span.name, span.detail) for span in hooks} == {("before_tool_call", "ToolPolicy")}
    assert len(hooks) == 2
    step0, step1 = steps
    model0, model1 = models
    for tool in tools.values():  # after step 0's stream, inside its step, before step 1
        assert model0.start_offset_micros + model0.duration_micros <= tool.start_offset_micros
        assert (
            tool.start_offset_micros + tool.duration_micros
            <= step0.start_offset_micros + step0.duration_micros
        )
        assert tool.start_offset_micros + tool.duration_micros <= step1.start_offset_micros
    # The first token (reasoning) came in step 0's stream; the streams took their scripted delays.
    assert model0.HasField("first_token_offset_micros") and not model1.HasField("first_token_offset_micros")
    assert (
        model0.start_offset_micros
        < model0.first_token_offset_micros
        < model0.start_offset_micros + model0.duration_micros
    )
    assert model1.duration_micros >= 15 * 25_000  # 15 text chunks (45 characters / 3), 25 ms apart
    attempt = spans[1]
    assert (
        attempt.start_offset_micros + attempt.duration_micros
        >= step1.start_offset_micros + step1.duration_micros
    )
    # Offset 0 is the turn's acceptance: its stored start, to the clocks' agreement.
    assert abs(turn.timeline.origin.ToMicroseconds() - turn.start_time.ToMicroseconds()) < 1_000_000


async def test_the_page_draws_the_stored_times_and_the_exact_tool_output(
    sidecar: SidecarProcess, client: TurnwireClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _chat(client, "page-1", "Multiply, and what time is it?", "scripted:timed")
    await _chat(client, "page-1", "Again, faster.", "scripted:failing")  # ends with the scripted 429
    stored = {turn.request_id: turn for turn in await _turns(sidecar, "page-1")}
    shown = await _drive("inspect", sidecar, TOKEN, "page-1", tmp_path, "call-calc")

    assert "page-1" in shown["conversations"]
    drawn = {turn["requestId"]: turn for turn in shown["turns"]}
    assert set(drawn) == set(stored)
    completed = next(turn for turn in stored.values() if turn.status == event_pb2.TURN_STATUS_COMPLETED)
    bars = drawn[completed.request_id]["bars"]
    spans = list(completed.timeline.spans)
    # The bars are the stored spans, in order, with their stored times.
    assert [(bar["kind"], bar["name"], bar["startUs"], bar["durationUs"]) for bar in bars] == [
        (_kind(span), span.name, span.start_offset_micros, span.duration_micros) for span in spans
    ]
    # Drawn to scale: positions and lengths proportional to the stored times.
    origin_x = bars[0]["x"] - bars[0]["startUs"] * (bars[1]["width"] / max(1, bars[1]["durationUs"]))
    scale = bars[1]["width"] / bars[1]["durationUs"]  # the attempt: the longest bar
    for bar in bars:
        assert bar["x"] == pytest.approx(origin_x + bar["startUs"] * scale, abs=0.5), bar
        if bar["durationUs"] * scale > 2:
            assert bar["width"] == pytest.approx(bar["durationUs"] * scale, rel=0.01), bar
    model0 = next(bar for bar in bars if bar["kind"] == "MODEL")
    assert (
        model0["firstTokenX"] is not None
        and model0["x"] < model0["firstTokenX"] < model0["x"] + model0["width"]
    )
    # The tool call expanded: its output exactly as stored, the big integer intact.
    conversation = await client.get_conversation("page-1")
    calc = next(
        part.tool_call
        for message in conversation.messages
        for part in message.parts
        if part.HasField("tool_call") and part.tool_call.tool_call_id == "call-calc"
    )
    assert shown["toolOutput"] == calc.output_json
    assert f'"result":{BIG}' in shown["toolOutput"].replace(" ", "")
    assert "blocked" in shown["badges"] and "provider-executed" in shown["badges"]
    assert "tool calculator" in shown["tooltip"] and "outcome: executed" in shown["tooltip"]
    assert shown["focusedTooltip"].startswith("queue")
    # The failed turn's step and model stream end with its attempt, failed.
    failing = next(turn for turn in stored.values() if turn.status == event_pb2.TURN_STATUS_ERROR)
    cut = {
        _kind(span): span for span in failing.timeline.spans if _kind(span) in ("ATTEMPT", "STEP", "MODEL")
    }
    assert {kind: span.outcome for kind, span in cut.items()} == {
        "ATTEMPT": "failed",
        "STEP": "failed",
        "MODEL": "failed",
    }
    attempt_end = cut["ATTEMPT"].start_offset_micros + cut["ATTEMPT"].duration_micros
    assert cut["STEP"].start_offset_micros + cut["STEP"].duration_micros <= attempt_end
    # Failed only: the 429 turn, with its classification and error.
    (failed,) = shown["failedTurns"]
    assert failed["status"] == "error"
    assert "slow down" in failed["error"] and failed["error"].split(":")[0].isupper(), failed
    serious = [v for v in shown["axe"] if v["impact"] in ("serious", "critical")]
    assert serious == [], shown["axe"]
    for name in ("conversation", "tool-call", "gantt", "failed-turns"):
        assert (tmp_path / f"inspector-{name}.png").stat().st_size > 5_000
    _publish(
        *(
            tmp_path / f"inspector-{name}.png"
            for name in ("conversation", "tool-call", "gantt", "failed-turns")
        )
    )
    with capsys.disabled():
        print(f"\ninspector screenshots: {tmp_path}")


async def test_a_running_turn_is_tailed_live(
    sidecar: SidecarProcess, client: TurnwireClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await _chat(client, "live-1", "Multiply, and what time is it?", "scripted:timed")
    driver = await _start_driver("live", sidecar, TOKEN, "live-1", tmp_path)
    assert driver.stdout is not None
    ready = await asyncio.wait_for(driver.stdout.readline(), 120)
    assert ready.strip() == b"ready", ready
    submitted = await client.submit_messages("live-1", "Work slowly.", model="scripted:slow")
    request_id = submitted.submission.submission_id
    shown = await _shown(driver)
    samples = shown["samples"]
    assert samples[0]["bars"] < samples[-1]["bars"], samples  # the chart grew as events came
    assert "TOOL" in samples[-1]["kinds"] and samples[-1]["kinds"].count("STEP") == 2, samples
    after, _ = shown["after"]
    assert after["status"] == "completed" and not after["live"]
    stored, _ = await _turns(sidecar, "live-1")
    assert stored.request_id == request_id
    assert [bar["durationUs"] for bar in after["bars"]] == [
        span.duration_micros for span in stored.timeline.spans
    ]
    assert (tmp_path / "inspector-live.png").stat().st_size > 5_000
    _publish(tmp_path / "inspector-live.png")
    with capsys.disabled():
        print(f"\ninspector live screenshot: {tmp_path / 'inspector-live.png'}")


async def test_the_open_page_follows_a_changed_fragment_to_another_conversation(
    sidecar: SidecarProcess, client: TurnwireClient, tmp_path: Path
) -> None:
    """docs/inspector.md: the address's fragment names the conversation. A fragment changed in
    the open tab (a link to ``#conversation=…``, the address bar) opens that conversation, and
    Back the one before; before the fresh-user trial the page read it only at load."""
    await _chat(client, "hash-a", "Multiply, and what time is it?", "scripted:timed")
    await _chat(client, "hash-b", "Multiply, and what time is it?", "scripted:timed")
    await _chat(client, "hash-b", "Again, faster.", "scripted:failing")
    stored = {
        conversation: [turn.request_id for turn in await _turns(sidecar, conversation)]
        for conversation in ("hash-a", "hash-b")
    }
    messages = {
        conversation: [message.id for message in (await client.get_conversation(conversation)).messages]
        for conversation in ("hash-a", "hash-b")
    }
    assert len(stored["hash-b"]) == 2 and messages["hash-a"] != messages["hash-b"]
    shown = await _drive("hash", sidecar, TOKEN, "hash-a", tmp_path, "hash-b")
    for step, conversation in (("first", "hash-a"), ("changed", "hash-b"), ("back", "hash-a")):
        page = shown[step]
        assert page["address"] == f"#conversation={conversation}", (step, page)
        assert page["title"] == conversation and page["current"] == [conversation], (step, page)
        assert page["messages"] == messages[conversation], (step, page)
        assert sorted(page["turns"]) == sorted(stored[conversation]), (step, page)


async def test_another_tenant_sees_none_of_it(
    sidecar: SidecarProcess, client: TurnwireClient, tmp_path: Path
) -> None:
    await _chat(client, "private-1", "Multiply, and what time is it?", "scripted:timed")
    assert await _turns(sidecar, "private-1", OTHER_TOKEN) == []
    shown = await _drive("tenant", sidecar, OTHER_TOKEN, "private-1", tmp_path)
    assert shown["conversations"] == []
    assert shown["messages"] == 0 and shown["turns"] == 0
    assert "not_found" in shown["status"], shown
