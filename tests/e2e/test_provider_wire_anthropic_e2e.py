"""Issue 30 items 3, 9, 10 (Anthropic) end to end: a real ``turnwire serve`` on the official
``anthropic`` SDK, pointed at a replay server that speaks the Messages API's wire format. Each test
checks the stored message (``GetConversation``) and the body of the *next* request against the
API's rules: every ``tool_use`` answered by a ``tool_result`` in the next turn with ``tools``
defined; every ``server_tool_use`` followed by its result unless it ends the request (a paused
turn, https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons#pause-turn).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from providers.helpers import a_blocks, a_text_stream
from providers.replay import CASES, ReplayServer, Reply
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

MODEL = "anthropic:claude-test"
EXTRA = Path(__file__).resolve().parents[1] / "providers" / "cases_extra" / "sse"
PAUSED = (CASES / "sse" / "anthropic_pause_turn_server_tool.sse").read_bytes()
CONTINUED = (EXTRA / "anthropic_pause_turn_continued.sse").read_bytes()
PTC = (EXTRA / "anthropic_message_start_content_ptc.sse").read_bytes()
SEARCH = {"type": "web_search_20250305", "name": "web_search"}
PAUSED_CALL = "srvtoolu_01Ab4cD7eF0gH3iJ6kL9mN2p"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, replay: ReplayServer) -> Iterator[SidecarProcess]:
    config = {
        "default_model": MODEL,
        "providers": {
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "E2E_A_KEY",
                "base_url": replay.url,
                # The bodies compared here are the API's own shapes; the sidecar's cache breakpoints
                # are tested in test_prompt_cache_e2e.py.
                "prompt_caching": "off",
                "max_retries": 0,
                "timeout_seconds": 10,
            }
        },
        "tools": {"demo": False},  # a turn with no server tools of its own
        "middleware": [{"path": "support.provider_options:ProviderOptionsFromBody"}],
    }
    env = {"E2E_A_KEY": "sk-ant-dummy", **pythonpath_env()}
    with running_sidecar(tmp_path_factory.mktemp("anthropic-wire-e2e"), config, env) as process:
        yield process


def _queue(replay: ReplayServer, *streams: bytes) -> None:
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(*(Reply.sse(stream) for stream in streams))


def _types(turn: dict[str, Any]) -> list[str]:
    return [block["type"] for block in a_blocks(turn)]


def _kinds(message: message_pb2.Message) -> list[str]:
    kinds: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind is None:
            continue
        if kind == "tool_call" and part.tool_call.provider_executed:
            kinds.append(f"provider-executed {part.tool_call.tool_name}")
        elif kind != "step_start":
            kinds.append(kind)
    return kinds


async def test_a_paused_web_search_continues_in_the_same_turn(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    _queue(replay, PAUSED, CONTINUED, a_text_stream("3.3 is not out yet."))
    conversation = f"paused-{next(_ids)}"
    body = {"provider_options": {"anthropic": {"tools": [SEARCH]}}}
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "What is new in example-lib 3.2?", body=body))
        stored = await client.get_conversation(conversation)
        later = await collect(client.chat(conversation, "And 3.3?", body=body))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    assert later.ok, (later.error, sidecar.log_text())
    finishes = [
        e.step_finish.raw_finish_reason for e in result.events if e.WhichOneof("event") == "step_finish"
    ]
    assert finishes == ["pause_turn", "end_turn"]

    reply = stored.messages[-1]
    assert reply == result.message
    # The server call and its result (given in the next step) are one provider-executed call.
    assert _kinds(reply) == ["text", "provider-executed web_search", "text"]
    (search,) = [p.tool_call for p in reply.parts if p.WhichOneof("kind") == "tool_call"]
    assert search.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert result.text == "I'll search for the latest release notes.\n\nVersion 3.2 adds streaming export."

    # The continuation step: the paused assistant turn is the request's last, its call's input whole.
    continuation = replay.requests[1].json
    assert continuation["tools"] == [SEARCH]
    last = continuation["messages"][-1]
    assert last["role"] == "assistant"
    assert a_blocks(last)[1] == {
        "type": "server_tool_use",
        "id": PAUSED_CALL,
        "name": "web_search",
        "input": {"query": "example-lib 3.2 release notes"},
    }
    # The next turn: the call and its result go back as a pair, in the order they came.
    turns = replay.requests[2].json["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert _types(turns[1]) == ["text", "server_tool_use", "web_search_tool_result", "text"]
    assert a_blocks(turns[1])[2]["tool_use_id"] == PAUSED_CALL


async def test_calls_given_in_message_start_are_stored_and_their_results_define_tools(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    """Programmatic tool calling gives three of four client calls inside message_start: all four are
    stored waiting for the client. SubmitToolResults without client_tools continues: the request
    holds tool_use/tool_result blocks, so it defines the called tool (tool_choice none)."""
    _queue(replay, PTC, a_text_stream("West leads."))
    conversation = f"ptc-{next(_ids)}"
    tool = chat_service_pb2.ClientTool(name="query_sales", description="Sales of a region")
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat(conversation, "Sales by region?", client_tools=[tool]))
        assert first.ok, (first.error, sidecar.log_text())
        calls = [c for c in first.tool_calls if not c.provider_executed]
        assert [(c.tool_call_id, c.input) for c in calls] == [
            (f"toolu_01PtcSales{i}", {"region": region})
            for i, region in enumerate(["west", "east", "north", "south"])
        ]
        assert {c.state for c in calls} == {"input-available"}
        results = {c.tool_call_id: {"total": 10 + i} for i, c in enumerate(calls)}
        second = await collect(client.submit_tool_results(conversation, results))
        stored = await client.get_conversation(conversation)
    assert second.ok, (second.error, sidecar.log_text())
    first_reply = stored.messages[1]
    states = [
        (p.tool_call.provider_executed, p.tool_call.state)
        for p in first_reply.parts
        if p.WhichOneof("kind") == "tool_call"
    ]
    # The code execution call never got its result from Anthropic: interrupted, as any call left so.
    assert (
        states
        == [(True, message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR)]
        + [(False, message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE)] * 4
    )
    assert "I'll check every region's sales." in [p.text.text for p in first_reply.parts if p.text.text]

    body = replay.requests[1].json
    assert [t["name"] for t in body["tools"]] == ["query_sales"]
    assert body["tool_choice"] == {"type": "none"}
    turns = body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    uses = [b["id"] for b in a_blocks(turns[1]) if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for b in a_blocks(turns[2]) if b["type"] == "tool_result"]
    assert uses == answered == list(results)
    # The code execution call has no result in that turn: it cannot go back before one.
    assert "server_tool_use" not in _types(turns[1])
