"""A server that answers the streaming request with one complete JSON body instead of a stream (some
OpenAI-compatible servers do when tools are offered), through each official SDK against the replay
server: a well-formed response is one step (text, tool calls, usage, finish reason, the same chunks its
stream would give); a malformed one fails at once with a clear message and is not retried."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import orjson
import pytest

from providers.helpers import anthropic_http, collect, openai_http, request
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ToolDefinition
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

WEATHER = ToolDefinition("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}}})

CHAT_COMPLETION: dict[str, Any] = {
    "id": "chatcmpl-whole",
    "object": "chat.completion",
    "created": 1,
    "model": "qwen2.5-7b-instruct",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "Let me check both.",
                "reasoning_content": "Two cities.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                    },
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52},
}

MESSAGE: dict[str, Any] = {
    "id": "msg_whole",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [
        {"type": "thinking", "thinking": "Two cities.", "signature": "sig"},
        {"type": "text", "text": "Let me check both."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Oslo"}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 40, "output_tokens": 12},
}

RESPONSE: dict[str, Any] = {
    "id": "resp_whole",
    "object": "response",
    "model": "gpt-test",
    "status": "completed",
    "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Two cities."}]},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Let me check both."}],
        },
        {
            "id": "fc_a",
            "type": "function_call",
            "call_id": "call_a",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {
            "id": "fc_b",
            "type": "function_call",
            "call_id": "call_b",
            "name": "get_weather",
            "arguments": '{"city": "Oslo"}',
        },
    ],
    "usage": {"input_tokens": 40, "output_tokens": 12, "total_tokens": 52},
}

WHOLE = {"anthropic": MESSAGE, "openai": CHAT_COMPLETION, "openai-responses": RESPONSE}
IDS = {
    "anthropic": ["toolu_a", "toolu_b"],
    "openai": ["call_a", "call_b"],
    "openai-responses": ["call_a", "call_b"],
}
RAW_FINISH = {"anthropic": "tool_use", "openai": "tool_calls", "openai-responses": "completed"}


@pytest.fixture
async def retrying(replay: ReplayServer) -> AsyncIterator[dict[str, Any]]:
    """The three adapters with SDK retries on (2), so a retry would show as a second request."""
    anthropic_client = anthropic.AsyncAnthropic(
        api_key="k", base_url=replay.url, max_retries=2, http_client=anthropic_http()
    )
    chat_client = openai.AsyncOpenAI(
        api_key="k", base_url=f"{replay.url}/v1", max_retries=2, http_client=openai_http()
    )
    responses_client = openai.AsyncOpenAI(
        api_key="k", base_url=f"{replay.url}/v1", max_retries=2, http_client=openai_http()
    )
    providers: dict[str, Any] = {
        "anthropic": AnthropicMessagesProvider("anthropic", anthropic_client, retry_delay=0.01),
        "openai": OpenAIChatProvider("openai", chat_client, retry_delay=0.01),
        "openai-responses": OpenAIResponsesProvider("openai-responses", responses_client, retry_delay=0.01),
    }
    yield providers
    for provider in providers.values():
        await provider.aclose()


def _json_reply(body: bytes, content_type: str | None = "application/json") -> Reply:
    headers = {"content-type": content_type} if content_type else {}
    return Reply(status=200, headers=headers, body=body)


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", None, "text/event-stream"]
)
@pytest.mark.parametrize("kind", sorted(WHOLE))
async def test_a_whole_response_is_one_step(
    kind: str, content_type: str | None, replay: ReplayServer, retrying: dict[str, Any]
) -> None:
    replay.enqueue(_json_reply(orjson.dumps(WHOLE[kind]), content_type))
    result = await collect(retrying[kind], request(tools=[WEATHER]))
    assert result.error is None, result.error
    assert len(replay.requests) == 1
    assert result.text == "Let me check both."
    assert result.reasoning == "Two cities."
    assert [(c.tool_call_id, c.input) for c in result.calls] == [
        (IDS[kind][0], {"city": "Paris"}),
        (IDS[kind][1], {"city": "Oslo"}),
    ]
    assert [s.tool_call_id for s in result.of(base.ToolInputStart)] == IDS[kind]
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason) == ("tool-calls", RAW_FINISH[kind])
    assert (finish.usage.input_tokens, finish.usage.output_tokens, finish.usage.total_tokens) == (40, 12, 52)
    assert finish.response_id == WHOLE[kind]["id"]


async def test_a_whole_chat_completion_without_calls(replay: ReplayServer, retrying: dict[str, Any]) -> None:
    completion = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "Hi."}, "finish_reason": "stop"}
        ],
    }
    replay.enqueue(_json_reply(orjson.dumps(completion)))
    result = await collect(retrying["openai"], request())
    assert result.error is None
    assert [type(c).__name__ for c in result.chunks] == ["TextStart", "TextDelta", "TextEnd", "FinishStep"]
    assert result.text == "Hi."
    assert result.finish.finish_reason == "stop"
    assert result.finish.usage == base.Usage()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"object": "list", "data": []}',
        b'{"choices": [{"index": 0, "text": "hi"}]}',
        b"[1, 2]",
    ],
    ids=["not-json", "other-object", "no-message", "array"],
)
@pytest.mark.parametrize("kind", sorted(WHOLE))
async def test_a_malformed_whole_response_fails_at_once(
    kind: str, body: bytes, replay: ReplayServer, retrying: dict[str, Any]
) -> None:
    replay.enqueue(*[_json_reply(body) for _ in range(3)])
    result = await collect(retrying[kind], request())
    error = result.error
    assert error is not None
    assert not error.retryable
    assert error.type in ("invalid_response", "invalid_stream_data")
    assert "stream ended" not in error.message
    assert "JSON" in error.message or "not a" in error.message, error.message
    assert len(replay.requests) == 1, "not retried"
    assert not result.chunks


async def test_an_error_object_in_a_200_body_is_the_providers_error(
    replay: ReplayServer, retrying: dict[str, Any]
) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 4096 tokens.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    replay.enqueue(_json_reply(orjson.dumps(body)))
    result = await collect(retrying["openai"], request())
    assert result.error is not None
    assert (result.error.code, result.error.retryable) == ("context_length_exceeded", False)
    assert len(replay.requests) == 1


HTML_PAGE = b"""<!DOCTYPE html>
<html><head><title>Open WebUI</title></head>
<body><div id="app">Loading\xe2\x80\xa6</div></body></html>
"""


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", None, "text/event-stream"])
@pytest.mark.parametrize("kind", sorted(WHOLE))
async def test_an_html_page_answered_with_200_says_check_base_url(
    kind: str, content_type: str | None, replay: ReplayServer, retrying: dict[str, Any]
) -> None:
    """A base_url pointing at a web UI answers 200 with a page: the error names the endpoint, says
    it got an HTML page and what to check, in one line, at once (not retried, not "the stream ended
    before …")."""
    replay.enqueue(*[_json_reply(HTML_PAGE, content_type) for _ in range(3)])
    result = await collect(retrying[kind], request())
    error = result.error
    assert error is not None
    assert (error.type, error.retryable) == ("invalid_response", False)
    assert "an HTML page, not an event stream" in error.message
    assert "check base_url" in error.message
    assert f"POST {replay.url}/" in error.message, error.message
    assert "stream ended" not in error.message
    assert "\n" not in error.message and "Open WebUI" in error.message
    assert len(replay.requests) == 1, "not retried"
    assert not result.chunks
