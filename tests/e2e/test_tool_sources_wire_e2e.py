"""Tool sources and provider errors on the wire, through a real ``turnwire serve`` (issue 30, items
13-15): the official SDK adapters talk to replay servers that speak each API's wire format, and the
MCP tools come from a real MCP server process (the ``mcp`` SDK's FastMCP, ``tests/support/mcp_tools.py``)
over streamable HTTP. Each test checks what the client was streamed, what is stored
(``GetConversation``) and the body of the request the provider got next.

- MCP: a server restarted between two turns answers the old ``Mcp-Session-Id`` with 404; the next
  call opens a new session and runs (docs/tools.md). A 700,000-character result, which the SDK
  sends twice in one SSE event, arrives whole.
- An overflow only a smaller ``max_tokens`` fixes: the step is sent again with window - prompt
  (docs/semantics.md §9), for Chat Completions and Anthropic Messages.
- A tool output written through ``AddMessages`` in the deprecated ``output`` field is dropped by
  compaction like any other, so the overflowing turn recovers.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from providers.helpers import (
    a_block,
    a_end,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_call,
    c_chunk,
    chat_sse,
)
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.waiting import wait_until

from turnwire.compaction import ELIDED_OUTPUT
from turnwire.values import value_view
from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

MCP_SERVER = Path(__file__).parent.parent / "support" / "mcp_tools.py"
KEYS = {"E2E_A_KEY": "sk-ant-dummy", "E2E_C_KEY": "sk-chat-dummy"}
MODELS = {"openai": "openai:gpt-test", "anthropic": "anthropic:claude-test"}
_ids = itertools.count(1)


@pytest.fixture
def replays() -> Iterator[dict[str, ReplayServer]]:
    servers = {kind: ReplayServer().start() for kind in MODELS}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


def _config(replays: dict[str, ReplayServer], **extra: Any) -> dict[str, Any]:
    common = {"max_retries": 0, "timeout_seconds": 10}
    return {
        "default_model": MODELS["openai"],
        "providers": {
            "openai": {
                "type": "openai",
                "api_key_env": "E2E_C_KEY",
                "base_url": f"{replays['openai'].url}/v1",
                **common,
            },
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "E2E_A_KEY",
                "base_url": replays["anthropic"].url,
                "default_max_tokens": 128000,
                **common,
            },
        },
        **extra,
    }


def _call(name: str, arguments: dict[str, Any], call_id: str) -> bytes:
    return chat_sse(
        c_chunk({"tool_calls": [c_call(0, call_id, name, json.dumps(arguments))]}), c_chunk({}, "tool_calls")
    )


def _text(kind: str, value: str) -> bytes:
    if kind == "anthropic":
        body = [a_start(), a_block(0, {"type": "text", "text": ""}), a_text(0, value), a_stop(0)]
        return anthropic_sse(*body, *a_end())
    return chat_sse(c_chunk({"content": value}), c_chunk({}, "stop"))


def _tool_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [m for m in body["messages"] if m["role"] == "tool"]


def _stored_call(result: TurnResult, stored: Any) -> message_pb2.ToolCallPart:
    """The one tool call of the turn's stored reply (the last stored message is that reply)."""
    reply: message_pb2.Message = stored.messages[-1]
    assert reply == result.message
    (call,) = [p.tool_call for p in reply.parts if p.HasField("tool_call")]
    return call


# --------------------------------------------------------------------------- MCP over streamable HTTP


class McpHttpServer:
    """The test MCP server over streamable HTTP on one port, restartable in a new process, speaking
    the 2025 protocol revisions (sessions, SSE responses) as servers on older SDKs do."""

    def __init__(self, record: Path) -> None:
        self.record = record
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self) -> None:
        # --legacy: sessions and SSE responses, as most deployed (2025-era) servers answer.
        command = [sys.executable, str(MCP_SERVER), str(self.record), "--http", str(self.port), "--legacy"]
        self.process = subprocess.Popen(command, stderr=subprocess.DEVNULL)

    async def start(self) -> None:
        self._spawn()

        async def up() -> bool:
            try:
                async with httpx2.AsyncClient() as http:
                    await http.get(self.url, timeout=1)
            except httpx2.TransportError:
                return False
            return True

        await wait_until(up, timeout=20, interval=0.1, what="the MCP HTTP server listens")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@pytest.fixture
def mcp_http(tmp_path: Path) -> Iterator[McpHttpServer]:
    server = McpHttpServer(tmp_path / "record")
    try:
        yield server
    finally:
        server.stop()


async def _mcp_sidecar(
    sidecar_factory: SidecarFactory, replays: dict[str, ReplayServer], server: McpHttpServer
) -> SidecarProcess:
    config = _config(replays, tools={"mcp": [{"name": "tiny", "url": server.url}]})
    return await sidecar_factory(config, env=KEYS).start()


async def _pid_turn(
    sidecar: SidecarProcess, replay: ReplayServer, conversation: str
) -> tuple[TurnResult, Any]:
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(Reply.sse(_call("pid", {}, "call_pid")), Reply.sse(_text("openai", "Got it.")))
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "Which process?"))
        stored = await client.get_conversation(conversation)
    return result, stored


async def test_a_restarted_mcp_server_gets_a_new_session_and_the_call_runs(
    sidecar_factory: SidecarFactory, replays: dict[str, ReplayServer], mcp_http: McpHttpServer
) -> None:
    await mcp_http.start()
    sidecar = await _mcp_sidecar(sidecar_factory, replays, mcp_http)
    replay = replays["openai"]
    first, _ = await _pid_turn(sidecar, replay, "mcp-before")
    assert first.ok, (first.error, sidecar.log_text())
    (before,) = first.tool_calls
    assert before.state == "output-available"

    # A new process on the same port: it knows no session, so it answers the old id with 404.
    mcp_http.stop()
    await mcp_http.start()
    result, stored = await _pid_turn(sidecar, replay, "mcp-after")

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    (after,) = result.tool_calls
    assert after.state == "output-available", after
    # FastMCP gives an int result as structuredContent {"result": …}, which is the output.
    assert mcp_http.process is not None and after.output == {"result": mcp_http.process.pid}
    assert after.output != before.output
    assert json.loads(_stored_call(result, stored).output_json) == after.output
    # The model's next request carries the new server's answer as the call's result.
    (tool_message,) = _tool_messages(replay.requests[1].json)
    assert tool_message["tool_call_id"] == "call_pid" and json.loads(tool_message["content"]) == after.output


async def test_a_large_mcp_result_arrives_whole(
    sidecar_factory: SidecarFactory, replays: dict[str, ReplayServer], mcp_http: McpHttpServer
) -> None:
    """700,000 characters: about 1.4 MB in one SSE event (text block and ``structuredContent``),
    above the SDK's 1 MiB default, below ``limits.max_tool_output_bytes`` (1 MiB of JSON)."""
    await mcp_http.start()
    sidecar = await _mcp_sidecar(sidecar_factory, replays, mcp_http)
    replay = replays["openai"]
    size = 700_000
    replay.enqueue(Reply.sse(_call("text", {"size": size}, "call_big")), Reply.sse(_text("openai", "Long.")))
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("mcp-big", "A long one, please."))
        stored = await client.get_conversation("mcp-big")

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    (call,) = result.tool_calls
    assert call.state == "output-available", call
    assert call.output == {"result": "x" * size}
    assert json.loads(_stored_call(result, stored).output_json) == {"result": "x" * size}
    (tool_message,) = _tool_messages(replay.requests[1].json)
    assert tool_message["tool_call_id"] == "call_big"
    assert json.loads(tool_message["content"]) == {"result": "x" * size}


# --------------------------------------------------------------------------- max_tokens clamped

OVERFLOWS: dict[str, tuple[dict[str, Any], str, int | None, int]] = {
    # tests/providers/cases/provider_errors.json E09 (OpenAI): 64 in the messages, 8192 in the completion.
    "openai": (
        {
            "error": {
                "message": (
                    "This model's maximum context length is 8192 tokens. However, you requested 8256 tokens "
                    "(64 in the messages, 8192 in the completion). Please reduce the length of the messages "
                    "or completion."
                ),
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        "max_tokens",  # max_tokens_param auto: max_tokens for a server other than api.openai.com
        None,
        8192 - 64,
    ),
    # Anthropic's wording (the shared cases' README), with a reservation above the prompt.
    "anthropic": (
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": (
                    "input length and `max_tokens` exceed context limit: 90000 + 128000 > 200000, "
                    "decrease input length or `max_tokens` and try again"
                ),
            },
        },
        "max_tokens",
        128000,
        200000 - 90000,
    ),
}


@pytest.mark.parametrize("kind", sorted(OVERFLOWS))
async def test_an_overflow_only_a_smaller_max_tokens_fixes_sends_the_step_again_with_what_fits(
    sidecar_factory: SidecarFactory, replays: dict[str, ReplayServer], kind: str
) -> None:
    error, field, sent, fits = OVERFLOWS[kind]
    replay = replays[kind]
    replay.enqueue(Reply.error(400, error), Reply.sse(_text(kind, "Short enough now.")))
    sidecar = await sidecar_factory(_config(replays), env=KEYS).start()
    conversation = f"clamp-{kind}-{next(_ids)}"
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "Tell me everything.", model=MODELS[kind]))
        stored = await client.get_conversation(conversation)

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    assert result.text == "Short enough now."
    assert [e.WhichOneof("event") for e in result.events].count("step_start") == 1
    assert "attempt_start" not in [e.WhichOneof("event") for e in result.events]
    assert stored.messages[-1] == result.message and len(stored.messages) == 2
    first, again = (request.json for request in replay.requests)
    assert first.get(field) == sent
    assert again[field] == fits and 1 <= fits < (sent or 8192)
    # The same step: only the output reservation changed.
    assert {k: v for k, v in again.items() if k != field} == {k: v for k, v in first.items() if k != field}
    assert "lowered from" in sidecar.log_text()


# --------------------------------------------------------------------------- the deprecated output field


async def test_an_output_stored_in_the_deprecated_field_is_dropped_when_the_turn_overflows(
    sidecar_factory: SidecarFactory, replays: dict[str, ReplayServer]
) -> None:
    compaction = {
        "path": "turnwire.middlewares:ContextCompaction",
        "options": {"strategy": "drop_tool_outputs", "reactive": True},
    }
    sidecar = await sidecar_factory(_config(replays, middleware=[compaction]), env=KEYS).start()
    replay = replays["openai"]
    overflow = {
        "error": {
            "message": (
                "This model's maximum context length is 4096 tokens. However, your messages resulted in "
                "9000 tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    replay.enqueue(Reply.error(400, overflow), Reply.sse(_text("openai", "From what is left.")))
    report = "line of the report\n" * 2000
    user = message_pb2.Message(id="old-u", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "Fetch the report."
    reply = message_pb2.Message(id="old-a", role=message_pb2.ROLE_ASSISTANT)
    call = reply.parts.add().tool_call
    call.tool_call_id, call.tool_name, call.input_json = "call_report", "fetch_report", "{}"
    call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    view = value_view(report)
    assert view is not None
    call.output.CopyFrom(view)  # the old field only, as an older client writes it
    reply.parts.add().text.text = "Here it is."
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages("old-field", [user, reply], allow_missing=True)
        result = await collect(client.chat("old-field", "Summarize it."))
        stored = await client.get_conversation("old-field")

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    (compacted,) = [
        e.context_compacted for e in result.events if e.WhichOneof("event") == "context_compacted"
    ]
    assert compacted.shortened and compacted.strategy == "drop_tool_outputs"
    first, again = (request.json for request in replay.requests)
    (sent_before,) = _tool_messages(first)
    assert sent_before["content"] == report  # the adapters read the old field
    (sent_after,) = _tool_messages(again)
    assert sent_after["tool_call_id"] == "call_report"
    assert sent_after["content"] == ELIDED_OUTPUT.format(size=len(json.dumps(report)))
    # Non-destructive: the stored output is unchanged; the new reply follows it.
    old = next(m for m in stored.messages if m.id == "old-a")
    assert old.parts[0].tool_call.output.string_value == report
    assert stored.messages[-1] == result.message and result.text == "From what is left."
