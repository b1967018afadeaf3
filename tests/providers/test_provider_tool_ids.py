"""Tool call identity (docs/semantics.md §11), through each official SDK against the replay server.

A provider may hand out one id twice (two parallel calls with the same id, an id already in the
transcript) or none. Every call of a turn gets its own id: the provider's when it is free, else
``<id>_2`` …; the provider's id is reported in the step's provider metadata. Round trip: the stream
with duplicate ids → both calls complete (as the engine stores them) → the next request pairs each call
with its own result, and nothing says "interrupted".

What the APIs expect on replay: Chat Completions and Responses match a call and its result only within
the request (``tool_call_id`` / ``call_id``), and the Messages API wants ``tool_use`` ids unique in the
request; none needs the provider's original id back, so the unique ids are what is sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from providers.helpers import (
    TEXT_STREAMS,
    Collected,
    Stored,
    a_block,
    a_blocks,
    a_end,
    a_json,
    a_start,
    a_stop,
    anthropic_sse,
    assistant,
    c_call,
    c_chunk,
    chat_sse,
    collect,
    r_response,
    request,
    responses_sse,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.errors import INTERRUPTED_TOOL_ERROR
from turnwire.types import ToolDefinition
from turnwire_client.v1 import message_pb2

WEATHER = ToolDefinition(
    "get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)
OUTPUTS = {"Paris": "sunny in Paris", "Oslo": "snow in Oslo"}


def _anthropic(call_ids: tuple[str, str]) -> bytes:
    events: list[dict[str, Any]] = [a_start()]
    for index, (call_id, city) in enumerate(zip(call_ids, OUTPUTS, strict=True)):
        events += [
            a_block(index, {"type": "tool_use", "id": call_id, "name": "get_weather", "input": {}}),
            a_json(index, '{"city": '),
            a_json(index, f'"{city}"}}'),
            a_stop(index),
        ]
    return anthropic_sse(*events, *a_end("tool_use"))


def _chat(call_ids: tuple[str, str]) -> bytes:
    return chat_sse(
        c_chunk({"role": "assistant", "content": None}),
        c_chunk({"tool_calls": [c_call(0, call_ids[0], "get_weather", "")]}),
        c_chunk({"tool_calls": [c_call(1, call_ids[1], "get_weather", "")]}),
        c_chunk({"tool_calls": [c_call(0, arguments='{"city": "Paris"}')]}),
        c_chunk({"tool_calls": [c_call(1, arguments='{"city": "Oslo"}')]}),
        c_chunk({}, "tool_calls"),
    )


def _responses(call_ids: tuple[str, str]) -> bytes:
    events: list[dict[str, Any]] = [{"type": "response.created", "response": r_response()}]
    for index, (call_id, city) in enumerate(zip(call_ids, OUTPUTS, strict=True)):
        item = {"id": f"fc_{index}", "type": "function_call", "call_id": call_id, "name": "get_weather"}
        arguments = f'{{"city": "{city}"}}'
        events += [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "arguments": ""}},
            {"type": "response.function_call_arguments.delta", "item_id": f"fc_{index}", "delta": arguments},
            {
                "type": "response.output_item.done",
                "output_index": index,
                "item": {**item, "arguments": arguments},
            },
        ]
    events.append({"type": "response.completed", "response": r_response("completed")})
    return responses_sse(*events)


STREAMS = {"anthropic_provider": _anthropic, "chat_provider": _chat, "responses_provider": _responses}
NAMESPACE = {"anthropic_provider": "anthropic", "chat_provider": "openai", "responses_provider": "openai"}


def _replayed(body: dict[str, Any], adapter: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(call ids, (result's call id, result)) as the request carries them, in order."""
    if adapter == "anthropic_provider":
        blocks = [b for turn in body["messages"] for b in a_blocks(turn)]
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        results = [(b["tool_use_id"], b["content"]) for b in blocks if b["type"] == "tool_result"]
    elif adapter == "chat_provider":
        messages = body["messages"]
        calls = [c["id"] for m in messages for c in m.get("tool_calls") or ()]
        results = [(m["tool_call_id"], m["content"]) for m in messages if m["role"] == "tool"]
    else:
        items = body["input"]
        calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
        results = [(i["call_id"], i["output"]) for i in items if i.get("type") == "function_call_output"]
    return calls, results


def _call_args(body: dict[str, Any], adapter: str) -> dict[str, str]:
    """call id → city, as replayed."""
    if adapter == "anthropic_provider":
        blocks = [b for turn in body["messages"] for b in a_blocks(turn)]
        return {b["id"]: b["input"]["city"] for b in blocks if b["type"] == "tool_use"}
    if adapter == "chat_provider":
        calls = [c for m in body["messages"] for c in m.get("tool_calls") or ()]
        return {c["id"]: json.loads(c["function"]["arguments"])["city"] for c in calls}
    items = [i for i in body["input"] if i.get("type") == "function_call"]
    return {i["call_id"]: json.loads(i["arguments"])["city"] for i in items}


async def _round_trip(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any], call_ids: tuple[str, str], *history: Any
) -> tuple[Collected, message_pb2.Message, dict[str, Any]]:
    question = user("Weather in Paris and Oslo?")
    replay.enqueue(Reply.sse(STREAMS[adapter](call_ids)), Reply.sse(TEXT_STREAMS[adapter]()))
    provider = adapters[adapter]
    first = await collect(provider, request(*history, question, tools=[WEATHER]))
    assert first.error is None, first.error
    # What the engine stores: each call with the output of the tool run on its own input.
    outputs = {call.tool_call_id: OUTPUTS[call.input["city"]] for call in first.calls if call.input}
    stored = Stored().step(first.chunks, outputs).build()
    second = await collect(provider, request(*history, question, stored, tools=[WEATHER]))
    assert second.error is None, second.error
    return first, stored, replay.requests[-1].json


@pytest.mark.parametrize("adapter", sorted(STREAMS))
async def test_two_calls_with_one_id_each_get_their_own(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    duplicate = "toolu_01Same" if adapter == "anthropic_provider" else "call_same"
    first, stored, body = await _round_trip(adapter, replay, adapters, (duplicate, duplicate))

    # Both calls complete, each with its own id and input.
    ids = [call.tool_call_id for call in first.calls]
    assert ids == [duplicate, f"{duplicate}_2"]
    assert [call.input for call in first.calls] == [{"city": "Paris"}, {"city": "Oslo"}]
    assert [s.tool_call_id for s in first.of(base.ToolInputStart)] == ids
    assert first.finish.finish_reason == "tool-calls"
    meta = first.finish.provider_metadata or {}
    assert meta[NAMESPACE[adapter]]["tool_call_ids"] == {f"{duplicate}_2": duplicate}

    # As stored: two complete calls, each with its own result; none still streaming.
    calls = [p.tool_call for p in stored.parts if p.WhichOneof("kind") == "tool_call"]
    assert [c.tool_call_id for c in calls] == ids
    assert {c.state for c in calls} == {message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE}

    # The next request pairs each call with its own result; nothing was "interrupted".
    replayed, results = _replayed(body, adapter)
    assert replayed == ids
    cities = _call_args(body, adapter)
    assert dict(results) == {call_id: OUTPUTS[cities[call_id]] for call_id in replayed}
    assert [call_id for call_id, _ in results] == replayed
    assert INTERRUPTED_TOOL_ERROR not in json.dumps(body)
    assert "interrupted" not in json.dumps(body)


@pytest.mark.parametrize("adapter", sorted(STREAMS))
async def test_an_id_already_in_the_transcript_is_not_reused(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A server that numbers calls per response (``call_0`` every time): the new calls get ids that the
    transcript does not hold, so the earlier turn's call keeps its own result."""
    earlier = [
        user("time?"),
        assistant([tool_call("call_0", "get_weather", {"city": "Rome"}, output="warm")]),
    ]
    first, _, body = await _round_trip(adapter, replay, adapters, ("call_0", "call_1"), *earlier)
    assert [call.tool_call_id for call in first.calls] == ["call_0_2", "call_1"]
    replayed, results = _replayed(body, adapter)
    assert replayed == ["call_0", "call_0_2", "call_1"]
    assert results == [("call_0", "warm"), ("call_0_2", OUTPUTS["Paris"]), ("call_1", OUTPUTS["Oslo"])]


@pytest.mark.parametrize("adapter", sorted(STREAMS))
async def test_a_stored_transcript_with_a_repeated_id_still_pairs_each_call(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """History stored before ids were made unique (or moved from a provider that reuses ids): each call
    and its own result go out under an id no other call of the request has."""
    history = [
        user("weather?"),
        assistant(
            [
                tool_call("call_x", "get_weather", {"city": "Paris"}, output="sunny"),
                tool_call("call_x", "get_weather", {"city": "Oslo"}, output="snow"),
            ]
        ),
        user("and again?"),
        assistant([tool_call("call_x", "get_weather", {"city": "Rome"}, output="warm")]),
        user("thanks"),
    ]
    replay.enqueue(Reply.sse(TEXT_STREAMS[adapter]()))
    result = await collect(adapters[adapter], request(*history, tools=[WEATHER]))
    assert result.error is None, result.error
    body = replay.requests[-1].json
    replayed, results = _replayed(body, adapter)
    assert len(set(replayed)) == 3
    cities = _call_args(body, adapter)
    assert [(cities[call_id], output) for call_id, output in results] == [
        ("Paris", "sunny"),
        ("Oslo", "snow"),
        ("Rome", "warm"),
    ]
    assert [call_id for call_id, _ in results] == replayed


async def test_chat_calls_without_ids_get_ids_unique_across_turns(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A compatible server that sends no ids: the made-up ids do not repeat the previous turn's."""
    earlier = [user("a"), assistant([tool_call("call_s0_0", "get_weather", {"city": "Rome"}, output="warm")])]
    stream = chat_sse(
        c_chunk({"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]}),
        c_chunk({}, "tool_calls"),
    )
    replay.enqueue(Reply.sse(stream))
    result = await collect(adapters["chat_provider"], request(*earlier, user("b"), tools=[WEATHER]))
    assert [call.tool_call_id for call in result.calls] == ["call_s0_0_2"]


async def test_responses_items_with_one_item_id_stay_two_calls(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """Two function_call items with the same item id (and the same call_id): routed by output index,
    both complete with their own arguments and ids."""
    events: list[dict[str, Any]] = [{"type": "response.created", "response": r_response()}]
    for index, city in enumerate(OUTPUTS):
        item = {"id": "fc_same", "type": "function_call", "call_id": "call_same", "name": "get_weather"}
        arguments = f'{{"city": "{city}"}}'
        where = {"item_id": "fc_same", "output_index": index}
        events += [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "arguments": ""}},
            {"type": "response.function_call_arguments.delta", **where, "delta": arguments},
            {"type": "response.function_call_arguments.done", **where, "arguments": arguments},
            {
                "type": "response.output_item.done",
                "output_index": index,
                "item": {**item, "arguments": arguments},
            },
        ]
    events.append({"type": "response.completed", "response": r_response("completed")})
    replay.enqueue(Reply.sse(responses_sse(*events)))
    result = await collect(adapters["responses_provider"], request(tools=[WEATHER]))
    assert [(c.tool_call_id, c.input) for c in result.calls] == [
        ("call_same", {"city": "Paris"}),
        ("call_same_2", {"city": "Oslo"}),
    ]
