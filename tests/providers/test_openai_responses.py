"""The Responses adapter: typed events in, chunks out; reasoning items and function calls round-trip."""

from __future__ import annotations

from typing import Any

from providers.helpers import (
    Stored,
    assistant,
    c_chunk,
    chat_sse,
    collect,
    image,
    r_response,
    reasoning,
    request,
    responses_sse,
    system,
    text,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ModelSettings, ToolDefinition
from turnwire_server.providers.convert import TRUNCATED_TOOL_CALL_ERROR
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

WEATHER = ToolDefinition(
    "get_weather", "Weather", {"type": "object", "properties": {"city": {"type": "string"}}}
)
USAGE = {
    "input_tokens": 30,
    "input_tokens_details": {"cached_tokens": 10},
    "output_tokens": 12,
    "output_tokens_details": {"reasoning_tokens": 4},
    "total_tokens": 42,
}


def _text_events(value: str = "Hi!") -> list[dict[str, Any]]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    return [
        {"type": "response.created", "response": r_response()},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": ""},
        },
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": value,
        },
        {
            "type": "response.output_text.done",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "text": value,
        },
        {"type": "response.output_item.done", "output_index": 0, "item": {**message, "status": "completed"}},
        {"type": "response.completed", "response": r_response("completed", usage=USAGE)},
    ]


async def test_text_only(replay: ReplayServer, responses_provider: OpenAIResponsesProvider) -> None:
    replay.enqueue(Reply.sse(responses_sse(*_text_events("Hi!"))))
    result = await collect(responses_provider, request(user("hello")))
    assert [type(c).__name__ for c in result.chunks] == ["TextStart", "TextDelta", "TextEnd", "FinishStep"]
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason, finish.response_id) == (
        "stop",
        "completed",
        "resp_1",
    )
    assert finish.usage == base.Usage(
        input_tokens=30, output_tokens=12, total_tokens=42, reasoning_tokens=4, cached_input_tokens=10
    )
    sent = replay.requests[0]
    assert sent.path == "/v1/responses"
    assert sent.json == {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hello"}]}],
        "instructions": "You are terse.",
        "store": False,
        "stream": True,
    }


async def test_reasoning_and_calls_round_trip_with_encrypted_content(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    reasoning_item = {"id": "rs_1", "type": "reasoning", "summary": []}
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": "call_1",
        "name": "get_weather",
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": r_response()},
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning_item},
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 0,
            "delta": "Need weather.",
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "item_id": "rs_1",
            "output_index": 0,
            "summary_index": 1,
            "delta": "Call tool.",
        },
        {
            "type": "response.output_item.done",
            "output_index": 0,
            "item": {
                **reasoning_item,
                "encrypted_content": "gAAAA-secret",
                "summary": [{"type": "summary_text", "text": "Need weather."}],
            },
        },
        {"type": "response.output_item.added", "output_index": 1, "item": call},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 1,
            "delta": '{"city"',
        },
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 1,
            "delta": ':"Oslo"}',
        },
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": 1,
            "arguments": '{"city":"Oslo"}',
        },
        {
            "type": "response.output_item.done",
            "output_index": 1,
            "item": {**call, "status": "completed", "arguments": '{"city":"Oslo"}'},
        },
        {"type": "response.completed", "response": r_response("completed", usage=USAGE)},
    ]
    replay.enqueue(Reply.sse(responses_sse(*events)), Reply.sse(responses_sse(*_text_events("Cold."))))
    question = user("Oslo weather?")
    first = await collect(responses_provider, request(question, model="o4-mini", tools=[WEATHER]))
    assert first.reasoning == "Need weather.\n\nCall tool."
    (end,) = first.of(base.ReasoningEnd)
    assert end.signature == b"gAAAA-secret" and not end.redacted
    assert first.calls == [
        base.ToolCall("call_1", "get_weather", {"city": "Oslo"}, raw_input='{"city":"Oslo"}')
    ]
    assert first.finish.finish_reason == "tool-calls"
    assert replay.requests[0].json["include"] == ["reasoning.encrypted_content"]

    stored = Stored().step(first.chunks, {"call_1": {"temp": -2}}).build()
    await collect(
        responses_provider, request(question, stored, model="o4-mini", tools=[WEATHER], step_number=1)
    )
    assert replay.requests[1].json["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "Oslo weather?"}]},
        {
            "type": "reasoning",
            "id": "rs_1",
            "encrypted_content": "gAAAA-secret",
            "summary": [{"type": "summary_text", "text": "Need weather.\n\nCall tool."}],
        },
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp":-2}'},
    ]


async def test_incomplete_at_max_output_tokens(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    call = {
        "id": "fc_1",
        "type": "function_call",
        "arguments": "",
        "call_id": "call_1",
        "name": "get_weather",
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": r_response()},
        {"type": "response.output_item.added", "output_index": 0, "item": call},
        {
            "type": "response.function_call_arguments.delta",
            "item_id": "fc_1",
            "output_index": 0,
            "delta": '{"ci',
        },
        {
            "type": "response.incomplete",
            "response": r_response("incomplete", incomplete_details={"reason": "max_output_tokens"}),
        },
    ]
    replay.enqueue(Reply.sse(responses_sse(*events)))
    result = await collect(responses_provider, request(tools=[WEATHER]))
    assert [(c.input, c.error, c.raw_input) for c in result.calls] == [
        (None, TRUNCATED_TOOL_CALL_ERROR, '{"ci')
    ]
    assert (result.finish.finish_reason, result.finish.raw_finish_reason) == ("length", "max_output_tokens")


async def test_response_failed(replay: ReplayServer, responses_provider: OpenAIResponsesProvider) -> None:
    failed = r_response("failed", error={"code": "server_error", "message": "The server had an error"})
    replay.enqueue(
        Reply.sse(
            responses_sse(
                {"type": "response.created", "response": r_response()},
                {"type": "response.failed", "response": failed},
            )
        )
    )
    result = await collect(responses_provider, request())
    assert result.error is not None
    assert (result.error.status, result.error.code, result.error.retryable) == (0, "server_error", True)


async def test_request_building(replay: ReplayServer, responses_provider: OpenAIResponsesProvider) -> None:
    history = [
        system("Be brief."),
        user("Look", image(b"PNG")),
        assistant(
            [
                reasoning("anthropic thought", b"sig", metadata={"anthropic": {"type": "thinking"}}),
                reasoning("unsigned", metadata={"openai": {"item_id": "rs_9"}}),
                text("Checking."),
                tool_call("c1", "get_weather", {"city": "Oslo"}, error="down"),
            ],
        ),
    ]
    settings = ModelSettings(
        max_output_tokens=64,
        temperature=0.5,
        seed=3,
        stop_sequences=["x"],
        provider_options={"openai-responses": {"reasoning": {"effort": "low"}}},
    )
    replay.enqueue(Reply.sse(responses_sse(*_text_events('{"ok": true}'))))
    result = await collect(
        responses_provider,
        request(
            *history,
            tools=[WEATHER],
            tool_choice="get_weather",
            settings=settings,
            output_schema={"type": "object"},
        ),
    )
    body = replay.requests[0].json
    assert body["input"] == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look"},
                {"type": "input_image", "image_url": "data:image/png;base64,UE5H", "detail": "auto"},
            ],
        },
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "down"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": dict(WEATHER.input_schema),
            "strict": False,
            "description": "Weather",
        }
    ]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "output", "schema": {"type": "object"}, "strict": False}
    }
    assert (body["max_output_tokens"], body["temperature"], body["reasoning"]) == (64, 0.5, {"effort": "low"})
    assert "seed" not in body and "stop" not in body
    assert body["include"] == ["reasoning.encrypted_content"]  # reasoning asked for in provider options
    warnings = result.finish.warnings
    assert any("seed" in w for w in warnings) and any("stop_sequences" in w for w in warnings)


async def test_a_chat_completions_stream_says_to_use_the_openai_type(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    """Newcomer trial (stop 67): an ``openai-responses`` entry on a server that speaks only Chat
    Completions failed with "the stream sent a line that is not JSON: [DONE]", which says
    nothing of the cause; the first chunk now names it and the fix, not retryable."""
    for body in (chat_sse(c_chunk({"content": "Hi"}), c_chunk(finish="stop")), b"data: [DONE]\n\n"):
        replay.enqueue(Reply.sse(body))
        failed = (await collect(responses_provider, request(user("hello")))).error
        assert failed is not None
        assert "a Chat Completions stream" in failed.message
        assert "set this provider's type to openai" in failed.message
        assert not failed.retryable
