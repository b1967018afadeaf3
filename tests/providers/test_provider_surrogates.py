"""A character split across two stream deltas (docs/semantics.md §11), through each official SDK against
the replay server: an emoji written as a JSON surrogate pair whose halves arrive in two events
(``"Smile \\ud83d"`` then ``"\\ude00 done"``), or a UTF-8 character whose bytes are split over two events.

Every adapter joins the halves, in text, reasoning and tool-input deltas; a half that never gets its
partner becomes U+FFFD. The stream never fails for it, and what it yields can be stored (protobuf refuses
lone surrogates).
"""

from __future__ import annotations

from typing import Any

import pytest

from providers.helpers import (
    Collected,
    Stored,
    a_block,
    a_delta,
    a_end,
    a_json,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_call,
    c_chunk,
    chat_sse,
    collect,
    escaped,
    r_response,
    request,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ToolDefinition

SEARCH = ToolDefinition("search", "", {"type": "object", "properties": {"q": {"type": "string"}}})
# Markers replaced by raw JSON escapes after serializing (orjson cannot write lone surrogates).
PAIR = {"HIGH": "\\ud83d", "LOW": "\\ude00"}
SMILE = "Smile \U0001f600 done"
LONE = "lone \ufffd"


def _check(result: Collected) -> None:
    assert result.error is None, result.error
    stored = Stored().step(result.chunks, {c.tool_call_id: "ok" for c in result.calls}).build()
    assert stored.SerializeToString(), "every string the adapter yields can be stored"


def _anthropic() -> bytes:
    return escaped(
        anthropic_sse(
            a_start(),
            a_block(0, {"type": "thinking", "thinking": "", "signature": ""}),
            a_delta(0, {"type": "thinking_delta", "thinking": "Think HIGH"}),
            a_delta(0, {"type": "thinking_delta", "thinking": "LOW ok"}),
            a_delta(0, {"type": "signature_delta", "signature": "sig"}),
            a_stop(0),
            a_block(1, {"type": "text", "text": ""}),
            a_text(1, "Smile HIGH"),
            a_text(1, "LOW done"),
            a_stop(1),
            a_block(2, {"type": "text", "text": ""}),
            a_text(2, "lone HIGH"),
            a_stop(2),
            a_block(3, {"type": "tool_use", "id": "toolu_1", "name": "search", "input": {}}),
            a_json(3, '{"q": "Smile HIGH'),
            a_json(3, 'LOW"}'),
            a_stop(3),
            *a_end("tool_use"),
        ),
        PAIR,
    )


def _chat() -> bytes:
    return escaped(
        chat_sse(
            c_chunk({"role": "assistant", "reasoning_content": "Think HIGH"}),
            c_chunk({"reasoning_content": "LOW ok"}),
            c_chunk({"content": "Smile HIGH"}),
            c_chunk({"content": "LOW done"}),
            c_chunk({"tool_calls": [c_call(0, "call_1", "search", '{"q": "Smile HIGH')]}),
            c_chunk({"tool_calls": [c_call(0, arguments='LOW"}')]}),
            c_chunk({}, "tool_calls"),
        ),
        PAIR,
    )


def _responses() -> bytes:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "search", "arguments": ""}
    text_at = {"item_id": "msg_1", "output_index": 1, "content_index": 0}
    summary_at = {"item_id": "rs_1", "output_index": 0, "summary_index": 0}
    return escaped(
        responses_sse(
            {"type": "response.created", "response": r_response()},
            {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
            {"type": "response.reasoning_summary_text.delta", **summary_at, "delta": "Think HIGH"},
            {"type": "response.reasoning_summary_text.delta", **summary_at, "delta": "LOW ok"},
            {"type": "response.output_item.done", "output_index": 0, "item": reasoning},
            {"type": "response.output_item.added", "output_index": 1, "item": message},
            {"type": "response.output_text.delta", **text_at, "delta": "Smile HIGH"},
            {"type": "response.output_text.delta", **text_at, "delta": "LOW done"},
            {"type": "response.output_text.done", **text_at, "text": "Smile HIGHLOW done"},
            {"type": "response.output_item.done", "output_index": 1, "item": message},
            {"type": "response.output_item.added", "output_index": 2, "item": call},
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_1",
                "delta": '{"q": "Smile HIGH',
            },
            {"type": "response.function_call_arguments.delta", "item_id": "fc_1", "delta": 'LOW"}'},
            {
                "type": "response.output_item.done",
                "output_index": 2,
                "item": {**call, "arguments": '{"q": "Smile HIGHLOW"}'},
            },
            {"type": "response.completed", "response": r_response("completed")},
        ),
        PAIR,
    )


STREAMS = {"anthropic_provider": _anthropic, "chat_provider": _chat, "responses_provider": _responses}


@pytest.mark.parametrize("adapter", sorted(STREAMS))
async def test_a_pair_split_across_deltas_is_joined(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.sse(STREAMS[adapter]()))
    result = await collect(adapters[adapter], request(tools=[SEARCH]))
    _check(result)
    assert result.reasoning == "Think \U0001f600 ok"
    assert result.text in (SMILE, SMILE + LONE)
    (call,) = result.calls
    assert call.input == {"q": "Smile \U0001f600"}
    streamed = "".join(d.delta for d in result.of(base.ToolInputDelta))
    assert streamed == '{"q": "Smile \U0001f600"}'
    assert result.finish.finish_reason == "tool-calls"


@pytest.mark.parametrize("adapter", sorted(STREAMS))
async def test_a_lone_half_becomes_the_replacement_character(
    adapter: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A high surrogate at the end of a block, a low one at the start of a block, and one in the middle
    of a delta: U+FFFD each, never an error."""
    streams = {
        "anthropic_provider": lambda: anthropic_sse(
            a_start(),
            a_block(0, {"type": "text", "text": ""}),
            a_text(0, "LOW a HIGH b "),
            a_text(0, "end HIGH"),
            a_stop(0),
            *a_end(),
        ),
        "chat_provider": lambda: chat_sse(
            c_chunk({"content": "LOW a HIGH b "}), c_chunk({"content": "end HIGH"}), c_chunk({}, "stop")
        ),
        "responses_provider": lambda: responses_sse(
            {"type": "response.created", "response": r_response()},
            {
                "type": "response.output_text.delta",
                "item_id": "m",
                "content_index": 0,
                "delta": "LOW a HIGH b ",
            },
            {"type": "response.output_text.delta", "item_id": "m", "content_index": 0, "delta": "end HIGH"},
            {"type": "response.output_text.done", "item_id": "m", "content_index": 0, "text": ""},
            {"type": "response.completed", "response": r_response("completed")},
        ),
    }
    replay.enqueue(Reply.sse(escaped(streams[adapter](), PAIR)))
    result = await collect(adapters[adapter], request())
    _check(result)
    assert result.text == "\ufffd a \ufffd b end \ufffd"
    assert result.finish.finish_reason == "stop"


async def test_the_lone_half_in_anthropic_example(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    """A text block that ends on an unpaired high surrogate, then more blocks: U+FFFD at its end only."""
    replay.enqueue(Reply.sse(_anthropic()))
    result = await collect(adapters["anthropic_provider"], request(tools=[SEARCH]))
    _check(result)
    assert result.text == SMILE + LONE


async def test_utf8_bytes_split_across_events_are_joined(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A small server that streams raw bytes cut inside a character: the two halves of U+1F600's UTF-8
    encoding in two events (each invalid UTF-8 alone); a cut that is never completed is U+FFFD."""
    emoji = "\U0001f600".encode()
    body = (
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Smile ' + emoji[:2] + b'"}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"' + emoji[2:] + b' done"}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":" cut ' + emoji[:3] + b'"}}]}\n\n'
        b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    replay.enqueue(Reply.sse(body))
    result = await collect(adapters["chat_provider"], request())
    _check(result)
    assert result.text == SMILE + " cut \ufffd"


async def test_a_line_that_is_not_json_is_a_provider_error_in_every_adapter(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """Not a character split but the same path: a line that is not JSON ends the step with a
    ProviderError (Anthropic and Responses raised a bare decode error, an INTERNAL failure)."""
    for adapter in sorted(STREAMS):
        replay.enqueue(Reply.sse(b"event: message_start\ndata: {not json\n\n"))
        result = await collect(adapters[adapter], request())
        assert result.error is not None, adapter
        assert result.error.type == "invalid_stream_data"
        assert "not JSON" in result.error.message


async def test_a_lone_half_in_an_error_message_can_still_be_reported(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """An error event whose message holds a lone surrogate: the ProviderError (and the gRPC status made
    of it) carries U+FFFD, so the turn's error can be stored and sent."""
    from turnwire_server.api.status import status_error_of

    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded HIGH"}}
    replay.enqueue(Reply.sse(escaped(anthropic_sse(a_start(), error), PAIR)))
    result = await collect(adapters["anthropic_provider"], request())
    assert result.error is not None
    assert result.error.message.endswith("Overloaded \ufffd")
    assert status_error_of(result.error).to_status().SerializeToString()
