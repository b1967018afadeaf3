"""A denied tool call reaches the model as that call's result saying it was denied (docs/semantics.md §6),
through each official SDK against the replay server: never dropped, never a call without a result.

Anthropic Messages sends it as a ``tool_result`` with ``is_error``; Chat Completions as the ``tool``
message of the call; Responses as its ``function_call_output``. The text is the client's reason, or
``Tool execution denied by user`` when it gave none.
"""

from __future__ import annotations

from typing import Any

import pytest

from providers.helpers import TEXT_STREAMS, a_blocks, assistant, collect, request, tool_call, user
from providers.replay import ReplayServer, Reply
from turnwire.types import ToolDefinition
from turnwire_client.v1 import message_pb2
from turnwire_server.store.waiting_calls import DENIED_BY_USER_TEXT, deny_call

DELETE = ToolDefinition("delete_file", "", {"type": "object", "properties": {"path": {"type": "string"}}})
ADAPTERS = ["anthropic_provider", "chat_provider", "responses_provider"]


def _denied(call_id: str, reason: str) -> message_pb2.Part:
    part = tool_call(call_id, "delete_file", {"path": "/tmp/x"})
    part.tool_call.approval.id = f"ap-{call_id}"
    deny_call(part.tool_call, reason)
    return part


async def _sent(
    replay: ReplayServer, adapters: dict[str, Any], adapter: str, *messages: message_pb2.Message
) -> Any:
    replay.enqueue(Reply.sse(TEXT_STREAMS[adapter]()))
    result = await collect(adapters[adapter], request(*messages, tools=[DELETE]))
    assert result.error is None, result.error
    return replay.requests[-1].json


def _calls_and_results(body: dict[str, Any], adapter: str) -> tuple[list[str], list[tuple[str, str, bool]]]:
    """(call ids, [(call id, result text, marked as an error)]) of the request, in order."""
    if adapter == "anthropic_provider":
        blocks = [block for turn in body["messages"] for block in a_blocks(turn)]
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        results = [
            (b["tool_use_id"], b.get("content", ""), bool(b.get("is_error")))
            for b in blocks
            if b["type"] == "tool_result"
        ]
        return calls, results
    if adapter == "chat_provider":
        calls = [c["id"] for m in body["messages"] for c in m.get("tool_calls", [])]
        results = [(m["tool_call_id"], m["content"], False) for m in body["messages"] if m["role"] == "tool"]
        return calls, results
    calls = [i["call_id"] for i in body["input"] if i.get("type") == "function_call"]
    results = [
        (i["call_id"], i["output"], False) for i in body["input"] if i.get("type") == "function_call_output"
    ]
    return calls, results


@pytest.mark.parametrize("adapter", ADAPTERS)
async def test_denied_calls_are_sent_as_denial_results_with_the_reason(
    replay: ReplayServer, adapters: dict[str, Any], adapter: str
) -> None:
    history = [
        user("Delete two files."),
        assistant([_denied("call_a", ""), _denied("call_b", "Not that one, it is my thesis.")]),
    ]
    body = await _sent(replay, adapters, adapter, *history)
    calls, results = _calls_and_results(body, adapter)
    assert calls == ["call_a", "call_b"], body
    assert [(call_id, text) for call_id, text, _ in results] == [
        ("call_a", DENIED_BY_USER_TEXT),
        ("call_b", "Not that one, it is my thesis."),
    ]
    if adapter == "anthropic_provider":
        assert all(is_error for _, _, is_error in results), "Anthropic marks a denial as an error result"
