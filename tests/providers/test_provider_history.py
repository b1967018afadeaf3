"""Provider-valid history (docs/semantics.md §11), through each official SDK against the replay server:
blank tool results and text blocks become a placeholder or are left out, and same-role neighbours
are merged where the API needs roles to alternate, every tool call keeping exactly one result.

Per adapter: Anthropic Messages needs alternation and non-blank text (it merged and dropped blank text
before; the blank tool results are new); Chat Completions needs both for many OpenAI-compatible servers;
Responses takes items of any role in any order, so only blank content is fixed there.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from providers.helpers import (
    TEXT_STREAMS,
    a_blocks,
    assistant,
    collect,
    request,
    system,
    text,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire.errors import INTERRUPTED_TOOL_ERROR
from turnwire.types import ToolDefinition
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.convert import EMPTY_TOOL_RESULT, EMPTY_USER_TEXT

CLOCK = ToolDefinition("get_time", "", {"type": "object", "properties": {}})
ADAPTERS = ["anthropic_provider", "chat_provider", "responses_provider"]


async def _sent(
    replay: ReplayServer, adapters: dict[str, Any], adapter: str, *messages: message_pb2.Message
) -> dict[str, Any]:
    replay.enqueue(Reply.sse(TEXT_STREAMS[adapter]()))
    result = await collect(adapters[adapter], request(*messages, tools=[CLOCK]))
    assert result.error is None, result.error
    body: dict[str, Any] = replay.requests[-1].json
    return body


def _blank_strings(body: dict[str, Any]) -> list[str]:
    """Every text the request carries as content (text blocks, message contents, tool results) that is
    empty or whitespace only."""
    found: list[str] = []

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, dict):
            for name, item in value.items():
                walk(item, name)
        elif isinstance(value, list):
            for item in value:
                walk(item, key)
        elif isinstance(value, str) and key in ("text", "content", "output") and not value.strip():
            found.append(repr(value))

    walk(body.get("messages") or body.get("input"))
    return found


def _results(body: dict[str, Any], adapter: str) -> list[tuple[str, str]]:
    """(call id, result text) of every tool result in the request, in order."""
    if adapter == "anthropic_provider":
        return [
            (block["tool_use_id"], block.get("content", "<none>"))
            for turn in body["messages"]
            for block in a_blocks(turn)
            if block["type"] == "tool_result"
        ]
    if adapter == "chat_provider":
        return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]
    return [(i["call_id"], i["output"]) for i in body["input"] if i.get("type") == "function_call_output"]


# --- 8: blank tool results and text blocks ------------------------------------------------------------


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_blank_tool_results_get_a_placeholder(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A tool that returned "" or whitespace, or failed with a blank message: the provider gets a short
    placeholder (Anthropic rejects whitespace-only text; compatible servers reject empty content)."""
    history = [
        user("what time is it?"),
        assistant(
            [
                tool_call("c1", "get_time", {}, output=""),
                tool_call("c2", "get_time", {}, output="  \n\t "),
                tool_call("c3", "get_time", {}, error="   "),
            ]
        ),
    ]
    body = await _sent(replay, adapters, adapter, *history)
    results = dict(_results(body, adapter))
    assert results["c1"] == EMPTY_TOOL_RESULT
    assert results["c2"] == EMPTY_TOOL_RESULT
    assert results["c3"] == "The tool call failed."
    assert _blank_strings(body) == []


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_blank_text_blocks_are_not_sent(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """Empty and whitespace-only text in user and assistant messages of the history never reaches the
    provider as content; a user message with nothing else becomes the placeholder."""
    history = [
        user("  "),
        assistant([text(" \n "), tool_call("c1", "get_time", {}, output="noon")], [text("")]),
        user("", "\t"),
        assistant([text("   ")]),
        user("thanks"),
    ]
    body = await _sent(replay, adapters, adapter, *history)
    assert _blank_strings(body) == []
    assert dict(_results(body, adapter)) == {"c1": "noon"}
    sent = json.dumps(body)
    assert EMPTY_USER_TEXT in sent, "a user message with no content is the placeholder"


# --- 9: roles alternate where the API needs it ---------------------------------------------------------


async def test_chat_merges_consecutive_user_messages(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    """SaveMessages([user "part 1", user "part 2"]) then a turn: one user message, not two."""
    body = await _sent(replay, adapters, "chat_provider", user("part 1"), user("part 2"))
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "part 1\n\npart 2"},
    ]


async def test_chat_merges_consecutive_assistant_messages(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """[user, assistant, assistant, user] (what an explicit ContinueLastTurn stores): one assistant
    message, the continued reply going on where it stopped."""
    history = [user("tell me"), assistant([text("Once upon")]), assistant([text(" a time.")]), user("more")]
    body = await _sent(replay, adapters, "chat_provider", *history)
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
    assert body["messages"][2] == {"role": "assistant", "content": "Once upon a time."}


async def test_chat_merging_keeps_every_call_paired_with_its_result(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """Merged runs around tool calls: the calls stay on the assistant message right before their tool
    messages, each call answered once, and user messages around them merged."""
    history = [
        system("Be brief."),
        user("a"),
        user("b", message_pb2.FilePart(media_type="image/png", data=b"PNG")),
        assistant([text("Let me see.")]),
        assistant(
            [text("Checking."), tool_call("c1", "get_time", {}, output="noon")],
            [tool_call("c2", "get_time", {}, output="one")],
        ),
        assistant([text("Done.")]),
        user("ok"),
        user("bye"),
    ]
    body = await _sent(replay, adapters, "chat_provider", *history)
    messages = body["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert messages[0]["content"] == "You are terse.\n\nBe brief."
    assert messages[1]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,UE5H"}},
    ]
    assert messages[2]["content"] == "Let me see.Checking."
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["c1"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "noon"}
    assert [c["id"] for c in messages[4]["tool_calls"]] == ["c2"]
    assert messages[5] == {"role": "tool", "tool_call_id": "c2", "content": "one"}
    assert messages[6] == {"role": "assistant", "content": "Done."}
    assert messages[7] == {"role": "user", "content": "ok\n\nbye"}
    for before, after in itertools.pairwise(messages):
        assert before["role"] != after["role"] or before["role"] == "tool"
    assert INTERRUPTED_TOOL_ERROR not in json.dumps(body)


async def test_anthropic_alternates_too(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    """The Messages API requires alternation as well: the same histories go out as alternating turns
    (it merged same-role turns already), tool results first in the merged user turn."""
    history = [
        user("part 1"),
        user("part 2"),
        assistant([text("Once upon")]),
        assistant([tool_call("c1", "get_time", {}, output="noon")]),
        user("more"),
    ]
    body = await _sent(replay, adapters, "anthropic_provider", *history)
    turns = body["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert turns[0]["content"] == [{"type": "text", "text": "part 1"}, {"type": "text", "text": "part 2"}]
    assert [b["type"] for b in turns[1]["content"]] == ["text", "tool_use"]
    assert turns[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "c1", "content": "noon"},
        {"type": "text", "text": "more"},
    ]


async def test_responses_keeps_items_as_they_are(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    """Responses input items need no alternation: consecutive messages of one role stay separate items."""
    body = await _sent(replay, adapters, "responses_provider", user("part 1"), user("part 2"))
    assert body["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "part 1"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "part 2"}]},
    ]


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_an_empty_text_file_is_not_sent(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A text file with no content would be an empty text block or document: left out, with a warning."""
    empty = message_pb2.FilePart(media_type="text/plain", data=b"", filename="notes.txt")
    replay.enqueue(Reply.sse(TEXT_STREAMS[adapter]()))
    result = await collect(adapters[adapter], request(user("see the notes", empty)))
    assert result.error is None, result.error
    body = replay.requests[-1].json
    assert _blank_strings(body) == []
    assert "notes.txt" not in json.dumps(body)
    assert any("empty" in warning for warning in result.finish.warnings)


async def test_chat_sends_no_empty_stop_sequence(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    from turnwire.types import ModelSettings

    replay.enqueue(Reply.sse(TEXT_STREAMS["chat_provider"]()))
    settings = ModelSettings(stop_sequences=["", "\n\n", ""])
    result = await collect(adapters["chat_provider"], request(settings=settings))
    assert replay.requests[-1].json["stop"] == ["\n\n"]
    assert "empty stop sequences were not sent" in result.finish.warnings
