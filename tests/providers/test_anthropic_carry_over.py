"""Issue 30, items 3, 9, 10, 12: what the Anthropic adapter keeps of a stream and sends back.

Streams are replayed through the official ``anthropic`` SDK (tests/providers/replay.py); the next
request is built from the message the engine would store (``Stored``) and checked against the
Messages API's rules. Sources: streaming events and ``message_start``
(https://platform.claude.com/docs/en/build-with-claude/streaming), programmatic tool calling
(https://platform.claude.com/docs/en/agents-and-tools/tool-use/programmatic-tool-calling),
``pause_turn`` (https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons), and
the 400 "Requests which include `tool_use` or `tool_result` blocks must define tools."
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from providers.helpers import (
    Stored,
    a_blocks,
    assistant,
    c_chunk,
    chat_sse,
    collect,
    reasoning,
    request,
    step_start,
    text,
    tool_call,
    user,
)
from providers.replay import CASES, ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ModelSettings, ToolDefinition
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.anthropic_request import HISTORY_TOOL_DESCRIPTION
from turnwire_server.providers.carry_over import (
    ANTHROPIC,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    carries_over,
)
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

EXTRA = Path(__file__).resolve().parent / "cases_extra" / "sse"
SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
PAUSED_CALL = "srvtoolu_01Ab4cD7eF0gH3iJ6kL9mN2p"
SIGNED = {"anthropic": {"type": "thinking"}}
REDACTED = {"anthropic": {"type": "redacted_thinking"}}
RESPONSES_ITEM = {"openai": {"item_id": "rs_1"}}


def _extra(name: str) -> Reply:
    return Reply.sse((EXTRA / name).read_bytes())


def _types(turn: dict[str, Any]) -> list[str]:
    return [block["type"] for block in a_blocks(turn)]


async def test_blocks_given_whole_in_message_start_are_all_kept(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    """Programmatic tool calling: message_start.message.content already holds the text, the code
    execution call and three of the four client calls; the fourth streams at index 5."""
    replay.enqueue(_extra("anthropic_message_start_content_ptc.sse"))
    result = await collect(anthropic_provider, request(user("Sales by region?")))

    assert result.text == "I'll check every region's sales."
    assert [(c.tool_call_id, c.input) for c in result.calls] == [
        (f"toolu_01PtcSales{i}", {"region": region})
        for i, region in enumerate(["west", "east", "north", "south"])
    ]
    assert all(c.error is None for c in result.calls)
    assert result.finish.finish_reason == "tool-calls"
    (executed,) = result.executed
    assert (executed.tool_call_id, executed.tool_name) == ("srvtoolu_01PtcCodeExec7aB3", "code_execution")
    assert executed.provider_metadata is not None
    assert executed.provider_metadata["anthropic"]["call"]["type"] == "server_tool_use"


async def test_a_paused_web_search_goes_back_and_continues(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    """pause_turn: the step says paused; the next request ends with the assistant turn holding the
    text and the server_tool_use with its full input; once the search's result came, both blocks go
    back as a pair before a later user turn."""
    replay.enqueue(Reply.sse((CASES / "sse" / "anthropic_pause_turn_server_tool.sse").read_bytes()))
    question = user("What is new in example-lib 3.2?")
    options = ModelSettings(provider_options={"anthropic": {"tools": [SEARCH]}})
    first = await collect(anthropic_provider, request(question, settings=options))
    assert first.finish.paused and first.finish.raw_finish_reason == "pause_turn"
    assert not first.calls, "a server tool is never a client call"

    stored = Stored().step(first.chunks)
    replay.enqueue(_extra("anthropic_pause_turn_continued.sse"))
    second = await collect(anthropic_provider, request(question, stored.message.snapshot(), settings=options))
    body = replay.requests[1].json
    assert body["tools"] == [SEARCH]
    last = body["messages"][-1]
    assert last["role"] == "assistant", "the paused turn is continued, not answered"
    assert a_blocks(last) == [
        {"type": "text", "text": "I'll search for the latest release notes."},
        {
            "type": "server_tool_use",
            "id": PAUSED_CALL,
            "name": "web_search",
            "input": {"query": "example-lib 3.2 release notes"},
        },
    ]
    assert not second.finish.paused and second.text == "Version 3.2 adds streaming export."

    stored.step(second.chunks)
    replay.enqueue(Reply.sse((CASES / "sse" / "anthropic_pause_turn_server_tool.sse").read_bytes()))
    await collect(
        anthropic_provider,
        request(question, stored.build(), user("And 3.3?"), settings=options),
    )
    turns = replay.requests[2].json["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert _types(turns[1]) == ["text", "server_tool_use", "web_search_tool_result", "text"]
    result_block = a_blocks(turns[1])[2]
    assert result_block["tool_use_id"] == PAUSED_CALL
    assert result_block["content"][0]["encrypted_content"].startswith("EqgfCioIARgB")


async def test_a_server_call_left_unpaired_is_not_sent_before_a_later_turn(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    """A paused reply stored as final (max_steps reached), then the user writes again: the call has
    no result, so it cannot be sent (400 "... was found without a corresponding ... block")."""
    replay.enqueue(Reply.sse((CASES / "sse" / "anthropic_pause_turn_server_tool.sse").read_bytes()))
    first = await collect(anthropic_provider, request(user("Search it.")))
    paused = Stored().step(first.chunks).build()
    replay.enqueue(_extra("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("Search it."), paused, user("Never mind.")))
    turns = replay.requests[1].json["messages"]
    assert [(t["role"], _types(t)) for t in turns] == [
        ("user", ["text"]),
        ("assistant", ["text"]),
        ("user", ["text"]),
    ]


async def test_a_request_with_past_calls_and_no_tools_defines_them(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    """The continuation after SubmitToolResults without client_tools: the history holds tool_use and
    tool_result blocks, so ``tools`` must be there; the model may not call them (tool_choice none)."""
    history = assistant(
        [tool_call("toolu_1", "get_weather", {"city": "Oslo"}, output={"temp": -3})],
        [tool_call("toolu_2", "pick_color", {}, output="blue")],
    )
    replay.enqueue(_extra("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("Weather?"), history))
    body = replay.requests[0].json
    assert body["tools"] == [
        {"name": name, "description": HISTORY_TOOL_DESCRIPTION, "input_schema": {"type": "object"}}
        for name in ("get_weather", "pick_color")
    ]
    assert body["tool_choice"] == {"type": "none"}


async def test_a_request_with_tools_of_its_own_keeps_them_and_its_choice(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    history = assistant([tool_call("toolu_1", "get_weather", {"city": "Oslo"}, output={"temp": -3})])
    clock = ToolDefinition("get_time", "", {"type": "object", "properties": {}})
    replay.enqueue(_extra("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("Weather?"), history, tools=[clock]))
    body = replay.requests[0].json
    assert [t["name"] for t in body["tools"]] == ["get_time"]
    assert body["tool_choice"] == {"type": "auto"}


def _anthropic_history() -> message_pb2.Message:
    """An Anthropic reply: signed thinking, redacted thinking, a finished web search, text."""
    message = assistant(
        [
            reasoning("Let me look.", b"sig-1", metadata=SIGNED),
            reasoning("", b"redacted-data", redacted=True, metadata=REDACTED),
            text("Found it."),
        ]
    )
    blocks: list[dict[str, Any]] = [
        {"type": "server_tool_use", "id": PAUSED_CALL, "name": "web_search", "input": {"query": "q"}},
        {"type": "web_search_tool_result", "tool_use_id": PAUSED_CALL, "content": []},
    ]
    for block in blocks:
        # As issue 30 stored them: a DataPart per block (read on, docs/providers.md).
        data = message.parts.add().data
        data.type = base.PROVIDER_EXECUTED
        data.id = PAUSED_CALL
        data.data.struct_value.update({"api": "anthropic", "block": block})
    return message


def test_the_carry_over_rules_per_api() -> None:
    parts = [p for p in _anthropic_history().parts if p.WhichOneof("kind") != "step_start"]
    kinds = [p.WhichOneof("kind") for p in parts]
    assert kinds == ["reasoning", "reasoning", "text", "data", "data"]
    assert [carries_over(p, ANTHROPIC) for p in parts] == [True] * 5
    for api in (OPENAI_CHAT, OPENAI_RESPONSES):
        assert [carries_over(p, api) for p in parts] == [False, False, True, False, False]
    responses_item = reasoning("summary", b"gAAAA-encrypted", metadata=RESPONSES_ITEM).reasoning
    plain = message_pb2.Part(reasoning=message_pb2.ReasoningPart(text="plain thoughts"))
    responses = message_pb2.Part(reasoning=responses_item)
    assert [carries_over(responses, api) for api in (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES)] == [
        False,
        False,
        True,
    ]
    assert [carries_over(plain, api) for api in (ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES)] == [
        False,
        True,
        False,
    ]


@pytest.mark.parametrize("adapter", ["chat_provider", "responses_provider"])
async def test_an_anthropic_history_sent_to_openai_keeps_only_what_carries_over(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    provider: OpenAIChatProvider | OpenAIResponsesProvider = adapters[adapter]
    if adapter == "chat_provider":
        replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "ok"}, "stop"))))
    else:
        name = "openai_responses_reasoning_and_parallel_function_calls.sse"
        replay.enqueue(Reply.sse((CASES / "sse" / name).read_bytes()))
    await collect(provider, request(user("q"), _anthropic_history(), user("more")))
    raw = replay.requests[0].body
    for marker in (b"sig-1", b"redacted-data", b"web_search", PAUSED_CALL.encode()):
        assert marker not in raw
    assert b"Found it." in raw


async def test_other_apis_reasoning_is_not_sent_to_anthropic(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    history = assistant(
        [
            step_start(),
            reasoning("summary", b"gAAAA-encrypted", metadata=RESPONSES_ITEM),
            reasoning("plain thoughts", b""),
            text("Answer."),
        ]
    )
    replay.enqueue(_extra("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("q"), history, user("more")))
    turns = replay.requests[0].json["messages"]
    assert a_blocks(turns[1]) == [{"type": "text", "text": "Answer."}]
