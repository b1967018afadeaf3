"""Every entry of shared/cases/providers/provider_errors.json, served by the replay server, reaches the
engine as one ProviderError with the right status, type/code, retryable, retry-after and raw body;
plus the status families of issue 3 (400, 401, 429 with retry-after, 500, 529) and SDK retries."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest

from providers.helpers import anthropic_http, collect, request
from providers.replay import CASES, ReplayServer, Reply
from turnwire import types as base
from turnwire_server.providers import errors
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider

ENTRIES: list[dict[str, Any]] = orjson.loads((CASES / "provider_errors.json").read_bytes())
BY_ID = {entry["id"]: entry for entry in ENTRIES}

# Retryable means "the same request may succeed later": quotas and over-limit requests are not.
NOT_RETRYABLE = {"E48", "E57"}

CHUNK = (
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,'
    b'"delta":{"content":"Partial"},"finish_reason":null}]}\n\n'
)


def _adapter_for(entry: dict[str, Any]) -> str:
    provider = entry["provider"]
    if provider.startswith("anthropic") or provider.startswith("aws-bedrock (Anthropic"):
        return "anthropic_provider"
    if entry["transport"] == "sse_event_mid_stream" and "event: error" in entry["body"]:
        return "responses_provider"
    return "chat_provider"


def _reply(entry: dict[str, Any]) -> Reply:
    transport = entry["transport"]
    body: str = entry["body"]
    if transport == "http_response":
        return Reply.error(entry["http_status"] or 400, body, entry.get("headers"))
    if transport == "sse_event_mid_stream":
        if "event: error" in body:
            created = (
                b'event: response.created\ndata: {"type":"response.created","response":'
                b'{"id":"resp_1","model":"gpt-5.1","status":"in_progress"}}\n\n'
            )
            return Reply.sse(created + body.encode() + b"\n\n")
        return Reply.sse(CHUNK + body.encode() + b"\n\n")
    if transport == "stream_stop_reason":
        start = (
            b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"claude",'
            b'"usage":{"input_tokens":190000,"output_tokens":1}}}\n\n'
        )
        return Reply.sse(
            start + body.encode() + b'\n\nevent: message_stop\ndata: {"type":"message_stop"}\n\n'
        )
    # Errors that no HTTP API sends as such (a botocore exception, a local relay's text): a plain text
    # line where a chunk should be, after some output.
    return Reply.sse(CHUNK + b"data: " + body.encode() + b"\n\n")


@pytest.mark.parametrize("entry_id", sorted(BY_ID))
async def test_provider_error_entry(entry_id: str, replay: ReplayServer, adapters: dict[str, Any]) -> None:
    entry = BY_ID[entry_id]
    replay.enqueue(_reply(entry))
    result = await collect(adapters[_adapter_for(entry)], request())
    transport = entry["transport"]
    if transport == "stream_stop_reason":  # E05: not an error; a truncated, valid response
        assert result.error is None
        assert result.finish.finish_reason == "length"
        assert result.finish.raw_finish_reason == "model_context_window_exceeded"
        return
    error = result.error
    assert error is not None
    assert not result.of(base.FinishStep)
    raw = errors.parse_body(
        entry["body"].split("data: ", 1)[-1] if transport != "http_response" else entry["body"]
    )
    if transport == "http_response":
        assert error.status == (entry["http_status"] or 400)
        assert error.body == raw
        expected_retryable = error.status in (429, 500, 529) and entry_id not in NOT_RETRYABLE
        assert error.retryable is expected_retryable, error
    else:
        assert error.status == 0
        assert error.body == raw or error.body == entry["body"]
    if isinstance(raw, dict):
        nested = raw.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else raw
        if inner.get("type") and inner.get("type") != "error":
            assert error.type == inner["type"]
        if inner.get("code") is not None:
            assert error.code == str(inner["code"])
        if inner.get("message"):
            assert inner["message"] in error.message
    if "x-amzn-ErrorType" in (entry.get("headers") or {}):
        assert error.type == entry["headers"]["x-amzn-ErrorType"]
    assert error.provider


@pytest.mark.parametrize(
    "case",
    [
        (
            400,
            {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}},
            {},
            False,
            None,
            "invalid_request_error",
        ),
        (
            401,
            {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
            {},
            False,
            None,
            "authentication_error",
        ),
        (
            403,
            {"type": "error", "error": {"type": "permission_error", "message": "no"}},
            {},
            False,
            None,
            "permission_error",
        ),
        (
            404,
            {"type": "error", "error": {"type": "not_found_error", "message": "model: x"}},
            {},
            False,
            None,
            "not_found_error",
        ),
        (
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            {"retry-after": "7"},
            True,
            7.0,
            "rate_limit_error",
        ),
        (
            429,
            {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
            {"retry-after-ms": "1500", "retry-after": "7"},
            True,
            1.5,
            "rate_limit_error",
        ),
        (
            500,
            {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}},
            {},
            True,
            None,
            "api_error",
        ),
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {},
            True,
            None,
            "overloaded_error",
        ),
        (503, "upstream connect error", {"x-should-retry": "false"}, False, None, ""),
    ],
)
async def test_anthropic_status_errors(
    case: tuple[int, Any, dict[str, str], bool, float | None, str],
    replay: ReplayServer,
    anthropic_provider: AnthropicMessagesProvider,
) -> None:
    """(status, body, headers, retryable, retry_after_seconds, type)."""
    status, body, headers, retryable, retry_after_seconds, type_ = case
    replay.enqueue(Reply.error(status, body, headers))
    result = await collect(anthropic_provider, request())
    error = result.error
    assert error is not None and not result.chunks
    assert (error.status, error.type, error.retryable, error.retry_after_seconds) == (
        status,
        type_,
        retryable,
        retry_after_seconds,
    )
    assert error.body == body
    assert error.provider == "anthropic"
    assert len(replay.requests) == 1  # max_retries=0: no SDK retry


@pytest.mark.parametrize("status", [429, 500, 529])
async def test_sdk_retries_error_statuses_before_the_stream(status: int, replay: ReplayServer) -> None:
    client = anthropic.AsyncAnthropic(
        api_key="k", base_url=replay.url, max_retries=2, http_client=anthropic_http()
    )
    provider = AnthropicMessagesProvider("anthropic", client)
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    replay.enqueue(
        Reply.error(status, overloaded, {"retry-after-ms": "1"}),
        Reply.sse("anthropic_text_and_parallel_tool_use_with_ping.sse"),
    )
    result = await collect(provider, request())
    await provider.aclose()
    assert result.error is None
    assert result.text == "I'll check both for you."
    assert [r.headers["x-stainless-retry-count"] for r in replay.requests] == ["0", "1"]


async def test_openai_quota_429_is_not_retryable(replay: ReplayServer, chat_provider: Any) -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    replay.enqueue(Reply.error(429, body))
    result = await collect(chat_provider, request())
    assert result.error is not None
    assert (result.error.status, result.error.code, result.error.retryable) == (
        429,
        "insufficient_quota",
        False,
    )


def test_retry_after_http_date() -> None:
    import email.utils
    import time

    date = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = errors.retry_after_seconds({"retry-after": date})
    assert seconds is not None and 25 < seconds <= 31
    assert errors.retry_after_seconds({"retry-after": "soon"}) is None
    assert errors.retry_after_seconds({}) is None
