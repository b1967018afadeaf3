"""Each message's conversion, and each request's state after its messages, are kept between
requests (providers/convert.py ``per_message_cache`` and ``PrefixStates``, issue 17): a request
built from a history whose messages were converted before, or going on from an earlier request's
messages, is the same as one converted afresh; a message replaced by another with the same id is
converted again; and what one request does per request (tool_use ids unique in the request, merged
turns, sorted results) never reaches the kept conversions."""

from __future__ import annotations

import copy
import json
from typing import Any

from providers.helpers import a_blocks
from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CacheBudget
from turnwire_server.providers import anthropic_request, openai_chat_request
from turnwire_server.providers.anthropic_request import _convert_message, convert_messages
from turnwire_server.providers.convert import PrefixStates


def _user(message_id: str, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def _assistant(message_id: str, call_id: str, output: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_ASSISTANT)
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = "checking"
    call = message.parts.add().tool_call
    call.tool_call_id = call_id
    call.tool_name = "get_weather"
    call.input.update({"city": output})
    call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    call.output.string_value = f"sunny in {output}"
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = "done"
    return message


def _uncached(messages: list[message_pb2.Message]) -> tuple[list[str], list[dict[str, Any]]]:
    """The conversion with caches that keep nothing (every message converted afresh)."""
    original, prefixes = anthropic_request._converted, anthropic_request._prefixes
    anthropic_request._converted = _convert_message
    anthropic_request._prefixes = PrefixStates("off", budget=CacheBudget(0))
    try:
        return convert_messages(messages, [])
    finally:
        anthropic_request._converted, anthropic_request._prefixes = original, prefixes


def _history() -> list[message_pb2.Message]:
    # The scripted model numbers calls afresh each turn: the same id in two messages, renamed.
    return [
        _user("u1", "weather in Paris?"),
        _assistant("a1", "call_0_0", "Paris"),
        _user("u2", "and Oslo?"),
        _assistant("a2", "call_0_0", "Oslo"),
        _user("u3", "thanks"),
    ]


def test_a_request_from_kept_conversions_equals_one_converted_afresh() -> None:
    history = _history()
    expected = _uncached(history)
    first = convert_messages(history, [])
    kept = copy.deepcopy(first)
    again = convert_messages([copy.deepcopy(m) for m in history], [])
    assert json.dumps(first) == json.dumps(expected) == json.dumps(again) == json.dumps(kept)
    ids = [b["id"] for turn in again[1] for b in a_blocks(turn) if b["type"] == "tool_use"]
    assert ids == ["call_0_0", "call_0_0_2"]
    results = [b["tool_use_id"] for turn in again[1] for b in a_blocks(turn) if b["type"] == "tool_result"]
    assert results == ids


def test_renaming_in_one_request_does_not_reach_another() -> None:
    history = _history()
    convert_messages(history, [])  # renames a2's call to call_0_0_2
    _, turns = convert_messages(history[3:4], [])  # alone: its own id is free
    assert [b["id"] for b in turns[0]["content"] if b["type"] == "tool_use"] == ["call_0_0"]
    assert turns[1]["content"][0]["tool_use_id"] == "call_0_0"


def _replaced(history: list[message_pb2.Message], index: int, text: str) -> list[message_pb2.Message]:
    """``history`` with message ``index`` replaced by a copy (same id) whose first text is
    ``text``: how every change reaches a request (a checkpoint, a compaction, another replica's
    write: the store hands out a new object; messages are never changed in place)."""
    edited = message_pb2.Message()
    edited.CopyFrom(history[index])
    next(p for p in edited.parts if p.WhichOneof("kind") == "text").text.text = text
    return [*history[:index], edited, *history[index + 1 :]]


def test_a_replaced_message_with_the_same_id_is_converted_again() -> None:
    history = _history()
    convert_messages(history, [])
    openai_chat_request.convert_messages("sys", history, [])
    for index, text in ((2, "and Bergen?"), (3, "rewritten by a checkpoint"), (0, "first, edited")):
        history = _replaced(history, index, text)
        _, turns = convert_messages(history, [])
        assert any(b.get("text") == text for turn in turns for b in a_blocks(turn))
        assert turns == _uncached([copy.deepcopy(m) for m in history])[1]
        chat = openai_chat_request.convert_messages("sys", history, [])
        assert any(text in str(m.get("content")) for m in chat)
        assert chat == _chat_uncached([copy.deepcopy(m) for m in history])


def test_a_request_going_on_from_a_kept_prefix_equals_one_converted_afresh() -> None:
    # Turn after turn the history is the same objects plus new ones (and a step's requests add
    # the reply so far): each request goes on from the longest kept prefix.
    history = _history()
    for turn in range(3):
        reply = _assistant(f"r{turn}", "call_0_0", f"City{turn}")  # the renamed id again
        for messages in (history, [*history, reply]):
            fresh = [copy.deepcopy(m) for m in messages]
            warnings: list[str] = []
            ids: set[str] = set()
            assert convert_messages(messages, warnings, ids) == _uncached(fresh)
            assert ids == {"call_0_0"}
            chat_ids: set[str] = set()
            chat = openai_chat_request.convert_messages("sys", messages, [], chat_ids)
            assert chat == _chat_uncached(fresh) and chat_ids == ids
        assert openai_chat_request.convert_messages("other", history, [])[0]["content"] == "other"
        history = [*history, reply, _user(f"q{turn}", "next?")]


def test_merging_turns_never_grows_a_kept_block_list() -> None:
    first, second = _user("m1", "one"), _user("m2", "two")
    for _ in range(3):
        _, turns = convert_messages([first, second], [])
        assert [b["text"] for b in turns[0]["content"]] == ["one", "two"]
    assert convert_messages([first], [])[1][0]["content"] == "one"


def _chat_uncached(messages: list[message_pb2.Message]) -> list[dict[str, Any]]:
    original, prefixes = openai_chat_request._converted, openai_chat_request._prefixes
    openai_chat_request._converted = openai_chat_request._convert_message
    openai_chat_request._prefixes = PrefixStates("off", budget=CacheBudget(0))
    try:
        return openai_chat_request.convert_messages("sys", messages, [])
    finally:
        openai_chat_request._converted, openai_chat_request._prefixes = original, prefixes


def test_chat_messages_from_kept_conversions_equal_ones_converted_afresh() -> None:
    history = _history()
    twice = _assistant("a3", "dup", "Rome")  # two calls with one id in one step
    call = twice.parts[2].tool_call
    second = twice.parts.add()
    second.CopyFrom(twice.parts[2])
    second.tool_call.output.string_value = "rain in Rome"
    history.append(twice)
    expected = _chat_uncached(history)
    assert json.dumps(openai_chat_request.convert_messages("sys", history, [])) == json.dumps(expected)
    again = openai_chat_request.convert_messages("sys", [copy.deepcopy(m) for m in history], [])
    assert json.dumps(again) == json.dumps(expected)
    tools = [(m["tool_call_id"], m["content"]) for m in again if m["role"] == "tool"]
    assert tools[-2:] == [("dup", "sunny in Rome"), ("dup_2", "rain in Rome")]
    assert call.tool_call_id == "dup"
    alone = openai_chat_request.convert_messages("", history[3:4], [])
    assert [c["id"] for c in alone[0]["tool_calls"]] == ["call_0_0"]


def test_the_conversion_gathers_the_transcripts_call_ids() -> None:
    from turnwire.providers import transcript_call_ids

    history = _history()
    for _ in range(2):  # converted afresh, then from kept conversions
        anthropic_ids: set[str] = set()
        chat_ids: set[str] = set()
        convert_messages(history, [], anthropic_ids)
        openai_chat_request.convert_messages("", history, [], chat_ids)
        assert anthropic_ids == chat_ids == transcript_call_ids(history) == {"call_0_0"}


def test_the_kept_conversions_are_bounded_by_bytes_least_recently_used_first() -> None:
    from turnwire_server.cache_budget import ENTRY_OVERHEAD_BYTES
    from turnwire_server.providers.convert import (
        CACHED_MESSAGE_BYTES,
        CONVERSION_OVERHEAD_BYTES,
        per_message_cache,
    )

    converted: list[str] = []

    def convert(message: message_pb2.Message) -> str:
        converted.append(message.id)
        return message.id

    size = len(_user("m1", "x" * 100).SerializeToString()) + CONVERSION_OVERHEAD_BYTES + ENTRY_OVERHEAD_BYTES
    cached = per_message_cache(convert, "test", CacheBudget(2 * size))
    first, second, third = (_user(f"m{i}", "x" * 100) for i in (1, 2, 3))
    for message in (first, second, first, third, first, second):
        cached(message)
    # m2 was the least recently used when m3 came, then m3 when m2 came back.
    assert converted == ["m1", "m2", "m3", "m2"]
    big = _user("big", "y" * (CACHED_MESSAGE_BYTES + 1))
    cached(big)
    cached(big)
    assert converted[-2:] == ["big", "big"]  # too large to keep
