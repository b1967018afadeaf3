"""Provider-valid history end to end (docs/semantics.md §11): a real ``turnwire serve`` with the three
official-SDK adapters, each pointed at a replay server that speaks its API's wire format.

- Tool call identity: a stream whose two parallel calls carry the same id. Both calls run (the demo
  ``get_weather`` for Paris and for Oslo), both are stored complete with their own ids, and the next
  request's history pairs each call with its own result; nothing says "interrupted".
- Alternation: SaveMessages of two user messages, and an explicit ContinueLastTurn that stores two
  assistant messages in a row; the Chat and Anthropic requests that follow alternate their roles.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from providers.helpers import (
    a_block,
    a_blocks,
    a_end,
    a_json,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_call,
    c_chunk,
    chat_sse,
    r_response,
    r_text_stream,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarProcess, running_sidecar

from turnwire.tools import ToolExecution
from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.tools.loading import load_tools

KEYS = {"E2E_A_KEY": "sk-ant-dummy", "E2E_C_KEY": "sk-chat-dummy", "E2E_R_KEY": "sk-resp-dummy"}
MODELS = {
    "anthropic": "anthropic:claude-test",
    "openai": "openai:gpt-test",
    "openai-responses": "openai-responses:gpt-test",
}
CITIES = ("Paris", "Oslo")
SYSTEM = "Be brief."
_WEATHER_TOOL = load_tools(True, [])["get_weather"]
WEATHER = {
    city: asyncio.run(_WEATHER_TOOL.execute({"city": city}, ToolExecution("c", "conv", "req", 0)))
    for city in CITIES
}
_ids = itertools.count(1)


def _two_calls(kind: str, call_id: str) -> bytes:
    """One step calling get_weather for Paris and for Oslo, both calls with the id ``call_id``."""
    args = [f'{{"city": "{city}"}}' for city in CITIES]
    if kind == "anthropic":
        events: list[dict[str, Any]] = [a_start()]
        for index, arguments in enumerate(args):
            block = {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}}
            events += [a_block(index, block), a_json(index, arguments), a_stop(index)]
        return anthropic_sse(*events, *a_end("tool_use"))
    if kind == "openai":
        return chat_sse(
            c_chunk({"tool_calls": [c_call(0, call_id, "get_weather", args[0])]}),
            c_chunk({"tool_calls": [c_call(1, call_id, "get_weather", args[1])]}),
            c_chunk({}, "tool_calls"),
        )
    items: list[dict[str, Any]] = [{"type": "response.created", "response": r_response()}]
    for index, arguments in enumerate(args):
        item = {"id": f"fc_{index}", "type": "function_call", "call_id": call_id, "name": "get_weather"}
        items += [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "arguments": ""}},
            {
                "type": "response.output_item.done",
                "output_index": index,
                "item": {**item, "arguments": arguments},
            },
        ]
    items.append({"type": "response.completed", "response": r_response("completed")})
    return responses_sse(*items)


def _text(kind: str, value: str, *, cut: bool = False) -> bytes:
    """A text-only step; ``cut``: stopped at the output limit (so the turn can be continued)."""
    if kind == "anthropic":
        body = [a_start(), a_block(0, {"type": "text", "text": ""}), a_text(0, value), a_stop(0)]
        return anthropic_sse(*body, *a_end("max_tokens" if cut else "end_turn"))
    if kind == "openai":
        return chat_sse(c_chunk({"content": value}), c_chunk({}, "length" if cut else "stop"))
    return r_text_stream(value)


def _pairs(kind: str, body: dict[str, Any]) -> tuple[dict[str, str], list[tuple[str, dict[str, Any]]]]:
    """(call id → city, [(result's call id, result)]) of a request, in order."""
    if kind == "anthropic":
        blocks = [b for turn in body["messages"] for b in a_blocks(turn)]
        calls = {b["id"]: b["input"]["city"] for b in blocks if b["type"] == "tool_use"}
        results = [(b["tool_use_id"], b["content"]) for b in blocks if b["type"] == "tool_result"]
    elif kind == "openai":
        chat_calls = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        calls = {c["id"]: json.loads(c["function"]["arguments"])["city"] for c in chat_calls}
        results = [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]
    else:
        items = body["input"]
        calls = {
            i["call_id"]: json.loads(i["arguments"])["city"]
            for i in items
            if i.get("type") == "function_call"
        }
        results = [(i["call_id"], i["output"]) for i in items if i.get("type") == "function_call_output"]
    return calls, [(call_id, json.loads(text)) for call_id, text in results]


@dataclass
class Harness:
    sidecar: SidecarProcess
    replays: dict[str, ReplayServer] = field(default_factory=dict)

    def replay(self, kind: str, *streams: bytes) -> ReplayServer:
        server = self.replays[kind]
        server.replies.clear()
        server.requests.clear()
        server.enqueue(*(Reply.sse(stream) for stream in streams))
        return server


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    replays = {kind: ReplayServer().start() for kind in MODELS}
    common = {"max_retries": 0, "timeout_seconds": 10}
    config = {
        "default_model": MODELS["openai"],
        "system_prompt": SYSTEM,
        "providers": {
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "E2E_A_KEY",
                "base_url": replays["anthropic"].url,
                **common,
            },
            "openai": {
                "type": "openai",
                "api_key_env": "E2E_C_KEY",
                "base_url": f"{replays['openai'].url}/v1",
                **common,
            },
            "openai-responses": {
                "type": "openai-responses",
                "api_key_env": "E2E_R_KEY",
                "base_url": f"{replays['openai-responses'].url}/v1",
                **common,
            },
        },
    }
    try:
        with running_sidecar(tmp_path_factory.mktemp("provider-history-e2e"), config, KEYS) as sidecar:
            yield Harness(sidecar, replays)
    finally:
        for server in replays.values():
            server.stop()


@pytest.mark.parametrize("kind", sorted(MODELS))
async def test_parallel_calls_with_one_id_both_run_and_pair_with_their_own_results(
    harness: Harness, kind: str
) -> None:
    duplicate = "toolu_01Dup" if kind == "anthropic" else "call_dup"
    replay = harness.replay(kind, _two_calls(kind, duplicate), _text(kind, "Sunny and snowy."))
    conversation = f"dup-{kind}-{next(_ids)}"
    async with TurnwireClient(harness.sidecar.target) as client:
        result = await collect(client.chat(conversation, "Weather in Paris and Oslo?", model=MODELS[kind]))
        stored = await client.get_conversation(conversation)

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, harness.sidecar.log_text())
    # Both calls complete with their own ids, and both ran on their own input.
    ids = [duplicate, f"{duplicate}_2"]
    starts = [
        e.tool_input_start.tool_call_id for e in result.events if e.WhichOneof("event") == "tool_input_start"
    ]
    outputs = [
        e.tool_output_available for e in result.events if e.WhichOneof("event") == "tool_output_available"
    ]
    assert starts == ids
    assert sorted(o.tool_call_id for o in outputs) == ids
    calls = result.tool_calls
    assert [c.tool_call_id for c in calls] == ids
    assert {c.state for c in calls} == {"output-available"}
    for call, city in zip(calls, CITIES, strict=True):
        assert call.input == {"city": city}
        assert call.output == WEATHER[city]
    assert stored.messages[-1] == result.message

    # The next request pairs each call with its own result, and nothing was "interrupted".
    assert len(replay.requests) == 2
    body = replay.requests[1].json
    replayed, results = _pairs(kind, body)
    assert list(replayed) == ids
    assert [call_id for call_id, _ in results] == ids
    assert [(replayed[call_id], output) for call_id, output in results] == [(c, WEATHER[c]) for c in CITIES]
    assert "interrupted" not in json.dumps(body).lower()


async def test_saved_user_messages_alternate_on_chat(harness: Harness) -> None:
    replay = harness.replay("openai", _text("openai", "Got both parts."))
    conversation = f"parts-{next(_ids)}"
    messages = []
    for text in ("part 1", "part 2"):
        message = message_pb2.Message(role=message_pb2.ROLE_USER)
        message.parts.add().text.text = text
        messages.append(message)
    async with TurnwireClient(harness.sidecar.target) as client:
        result = await collect(client.save_messages(conversation, messages, model=MODELS["openai"]))
    assert result.ok, (result.error, harness.sidecar.log_text())
    (request,) = replay.requests
    assert request.json["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "part 1\n\npart 2"},
    ]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_continued_reply_alternates_in_the_next_request(harness: Harness, kind: str) -> None:
    """ContinueLastTurn stores a second assistant message right after the first: the next request
    carries one assistant turn with the whole reply."""
    replay = harness.replay(
        kind, _text(kind, "Once upon", cut=True), _text(kind, " a time."), _text(kind, "The end.")
    )
    conversation = f"continue-{kind}-{next(_ids)}"
    model = MODELS[kind]
    async with TurnwireClient(harness.sidecar.target) as client:
        first = await collect(client.chat(conversation, "Tell me a story.", model=model))
        second = await collect(client.continue_last_turn(conversation, model=model))
        third = await collect(client.chat(conversation, "More.", model=model))
        stored = await client.get_conversation(conversation)
    assert first.ok and second.ok and third.ok, (first.error, second.error, third.error)
    assert [m.role for m in stored.messages][:3] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_ASSISTANT,
    ]
    body = replay.requests[2].json
    if kind == "openai":
        assert body["messages"] == [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Tell me a story."},
            {"role": "assistant", "content": "Once upon a time."},
            {"role": "user", "content": "More."},
        ]
    else:
        assert [t["role"] for t in body["messages"]] == ["user", "assistant", "user"]
        assert body["messages"][1]["content"] == [
            {"type": "text", "text": "Once upon"},
            {"type": "text", "text": " a time."},
        ]
