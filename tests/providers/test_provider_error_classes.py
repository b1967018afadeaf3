"""Provider errors decided from structured fields first (docs/semantics.md §3, §11), replayed through
the official SDKs: every entry of the shared ``provider_errors.json`` and of our own
``cases_extra/provider_errors_extra.json`` gets its expected class from ``turnwire.error_classes``, its
coarse classification from the default ``classify_chat_error`` (``ErrorClassifier``), its overflow
remedy, ``in_stream`` exactly when it arrived inside a stream, and one class maps to one gRPC status and
one "retryable" whatever the shape of the body (an overflow as a 400, 413, 422, 500, 503 or inside a 200
stream is INVALID_ARGUMENT, never retryable). Also: details a provider sends with a stop reason (a
refusal's category and explanation) are kept in the step's provider metadata."""

from __future__ import annotations

from typing import Any

import grpc
import orjson
import pytest
from google.rpc import error_details_pb2
from support import aws_event_stream

from providers.helpers import (
    a_block,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_chunk,
    chat_sse,
    cloud_adapter,
    collect,
    r_response,
    request,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from providers.test_provider_errors import ENTRIES, _adapter_for, _reply
from turnwire.error_classes import (
    classify_error,
    classify_fields,
    finish_overflows,
    fitting_output_tokens,
    overflow_remedy,
    overflow_tokens,
)
from turnwire.hooks import ChatErrorContext
from turnwire.middlewares import ErrorClassifier
from turnwire.providers import ProviderError
from turnwire_server.api.status import status_error_of
from turnwire_server.providers import errors

EXTRA_PATH = __import__("pathlib").Path(__file__).parent / "cases_extra" / "provider_errors_extra.json"
EXTRA: list[dict[str, Any]] = orjson.loads(EXTRA_PATH.read_bytes())
ADAPTER = {
    "anthropic": "anthropic_provider",
    "openai": "chat_provider",
    "openai-responses": "responses_provider",
}
CLOUD = frozenset({"bedrock", "vertex", "gemini"})
"""Entries whose adapter is built for them alone (:func:`providers.helpers.cloud_adapter`)."""

CODE = {
    "context_overflow": grpc.StatusCode.INVALID_ARGUMENT,
    "max_output_tokens_invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "request_too_large": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_request_transcript": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid_request": grpc.StatusCode.INVALID_ARGUMENT,
    "rate_limit": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "quota_or_billing": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "server_capacity": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "overloaded": grpc.StatusCode.UNAVAILABLE,
    "server_error": grpc.StatusCode.UNAVAILABLE,
}
"""One gRPC status per class (api/status.py ``_provider_status``)."""

NEVER_RETRYABLE = {"context_overflow", "max_output_tokens_invalid", "request_too_large", "quota_or_billing"}

TRANSIENT = {"overloaded", "server_error", "transient"}
FATAL = {
    "quota_or_billing",
    "max_output_tokens_invalid",
    "request_too_large",
    "invalid_request_transcript",
    "invalid_request",
    "authentication",
    "not_found",
    "invalid_response",
    "server_capacity",
}
"""The documented coarse classes (turnwire/middlewares/error_classifier.py): the rest map to themselves."""

REMEDIES = {"compact", "reduce_max_tokens", "compact_or_reduce_max_tokens"}


async def _shared_error(
    entry: dict[str, Any], replay: ReplayServer, adapters: dict[str, Any]
) -> ProviderError:
    replay.enqueue(_reply(entry))
    result = await collect(adapters[_adapter_for(entry)], request())
    assert result.error is not None, entry["id"]
    return result.error


async def _extra_error(
    entry: dict[str, Any], replay: ReplayServer, adapters: dict[str, Any]
) -> ProviderError:
    if entry["transport"] == "http_response":
        replay.enqueue(Reply.error(entry["http_status"], entry["body"], entry.get("headers")))
    elif entry["transport"] == "event_stream_exception":
        # Bedrock: an exception message of the AWS event stream (its type in :exception-type).
        frame = aws_event_stream.exception(entry["exception_type"], entry["body"])
        replay.enqueue(Reply(headers={"content-type": aws_event_stream.CONTENT_TYPE}, chunks=[frame]))
    else:
        replay.enqueue(Reply.sse(entry["body"].encode()))
    model_request = request(model=entry.get("model", "m"))
    if entry["adapter"] in CLOUD:
        provider = cloud_adapter(entry["adapter"], replay.url)
        try:
            result = await collect(provider, model_request)
        finally:
            await provider.aclose()
    else:
        result = await collect(adapters[ADAPTER[entry["adapter"]]], model_request)
    assert result.error is not None, entry["id"]
    return result.error


SHARED_ERRORS = sorted(e["id"] for e in ENTRIES if e["transport"] != "stream_stop_reason")
OVERFLOWS = [e["id"] for e in ENTRIES if e["expected_classification"] == "context_overflow"]
OVERFLOWS = [i for i in OVERFLOWS if i in SHARED_ERRORS]
EXTRA_OVERFLOWS = [e["id"] for e in EXTRA if e["expected_classification"] == "context_overflow"]
BY_ID = {e["id"]: e for e in [*ENTRIES, *EXTRA]}


def _details(error: ProviderError) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo, float | None]:
    mapped = status_error_of(error)
    status = mapped.to_status()
    info = error_details_pb2.ErrorInfo()
    retry: float | None = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            hint = error_details_pb2.RetryInfo()
            detail.Unpack(hint)
            retry = hint.retry_delay.ToMilliseconds() / 1000
    return mapped.code, info, retry


@pytest.mark.parametrize("entry_id", OVERFLOWS + EXTRA_OVERFLOWS)
async def test_every_overflow_shape_maps_to_one_status(
    entry_id: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """A context overflow is INVALID_ARGUMENT (reason PROVIDER_ERROR, no RetryInfo) and not retryable,
    whatever its HTTP status, headers or body shape, and whether it came as a response or in a stream."""
    entry = BY_ID[entry_id]
    extra = entry_id.startswith("X")
    error = await (_extra_error if extra else _shared_error)(entry, replay, adapters)
    code, info, retry = _details(error)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (entry_id, error)
    assert info.reason == "PROVIDER_ERROR"
    assert retry is None
    assert not error.retryable
    assert len(replay.requests) == 1  # an overflow before the first chunk is not retried either


@pytest.mark.parametrize("entry_id", SHARED_ERRORS + [e["id"] for e in EXTRA])
async def test_each_error_gets_its_class_and_its_status(
    entry_id: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    entry = BY_ID[entry_id]
    extra = entry_id.startswith("X")
    error = await (_extra_error if extra else _shared_error)(entry, replay, adapters)
    expected = entry["expected_classification"]
    assert classify_error(error) == expected, (entry_id, error)
    code, info, retry = _details(error)
    assert info.metadata["provider_error_class"] == expected
    if expected in CODE:
        assert code == CODE[expected], (entry_id, error)
    if expected in NEVER_RETRYABLE:
        assert not error.retryable and retry is None, entry_id
    if "expected_retry_after_seconds" in entry:
        assert error.retryable
        assert error.retry_after_seconds == entry["expected_retry_after_seconds"]
        assert retry == entry["expected_retry_after_seconds"]
    # Whether it came inside a stream (an error event, a line that is not JSON, a stream cut short).
    assert error.in_stream is (entry["transport"] != "http_response"), entry_id
    # The coarse classification, from the default classifier, with a real ChatErrorContext.
    ctx = ChatErrorContext("c1", "r1", error, "stream", messages_persisted=True)
    coarse = await ErrorClassifier().classify_chat_error(ctx)
    assert coarse == ("transient" if expected in TRANSIENT else "fatal" if expected in FATAL else expected)
    # The remedy where the entry gives one of ours; None for every other error.
    remedy = entry.get("remedy")
    expected_remedy = remedy if remedy in REMEDIES else None
    assert overflow_remedy(error) == expected_remedy, (entry_id, overflow_tokens(error))
    if expected == "context_overflow":
        assert remedy in REMEDIES, entry_id
    # The output reservation that fits, where the entry states it (what the engine clamps to).
    if "fitting_output_tokens" in entry:
        assert fitting_output_tokens(error) == entry["fitting_output_tokens"], entry_id
    # Retryable and the status never disagree with the classification.
    if coarse in ("fatal", "context_overflow"):
        assert not error.retryable and retry is None, entry_id
        assert code != grpc.StatusCode.UNAVAILABLE, entry_id
    elif coarse == "transient":
        assert code == grpc.StatusCode.UNAVAILABLE, entry_id
    elif coarse == "rate_limit":
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, entry_id


async def test_a_full_window_finish_is_an_overflow_not_an_error(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    """E05: Anthropic ends a valid, truncated response with ``model_context_window_exceeded``: finish
    ``length`` with the raw reason kept, which :func:`finish_overflows` names an overflow (compact
    before the next call); a plain output limit is not."""
    (entry,) = [e for e in ENTRIES if e["transport"] == "stream_stop_reason"]
    replay.enqueue(_reply(entry))
    result = await collect(adapters[_adapter_for(entry)], request())
    assert result.error is None
    assert result.finish.finish_reason == "length"
    assert finish_overflows(result.finish.raw_finish_reason)
    assert entry["expected_classification"] == "context_overflow"
    assert not any(finish_overflows(raw) for raw in ("max_tokens", "length", "end_turn", "stop", ""))


async def test_non_provider_errors() -> None:
    """Timeouts (the engine's model timeouts are TimeoutErrors) and dropped connections are transient;
    the default classifier leaves any other error (a hook's, a tool's) to others."""
    from turnwire_server.engine.errors import ModelTimeout

    assert classify_error(ModelTimeout("model step 0 exceeded 5 s")) == "transient"
    assert classify_error(ConnectionResetError()) == "transient"
    assert classify_error(ValueError("a hook broke")) == "unknown"
    assert overflow_remedy(ValueError("prompt is too long: 5 tokens > 4 maximum")) is None
    assert overflow_tokens(ValueError("x")) == (None, None, None)
    assert fitting_output_tokens(ValueError("prompt is too long: 5 tokens > 9 maximum")) is None
    classifier = ErrorClassifier()
    for error, expected in [
        (ModelTimeout("t"), "transient"),
        (ValueError("a hook broke"), None),
        (ProviderError("I'm a teapot", status=418), "unknown"),
    ]:
        ctx = ChatErrorContext("c", "r", error, "turn", messages_persisted=True)
        assert await classifier.classify_chat_error(ctx) == expected


def test_structured_fields_win_over_the_message() -> None:
    """The same words, different structured fields, different classes."""
    quota_words = "You exceeded your current quota, please check your plan and billing details."
    assert classify_fields(429, "RESOURCE_EXHAUSTED", "", quota_words) == "quota_or_billing"
    hinted = {
        "error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "3s"}]}
    }
    assert classify_fields(429, "RESOURCE_EXHAUSTED", "", quota_words, hinted) == "rate_limit"
    overflow_words = "Please reduce the length of the messages or completion."
    assert classify_fields(400, "invalid_request_error", "context_length_exceeded", overflow_words) == (
        "context_overflow"
    )
    assert classify_fields(429, "rate_limit_error", "", "reduce the prompt length") == "rate_limit"
    assert classify_fields(400, "", "", "the request exceeds the available context size") == (
        "context_overflow"
    )


def test_an_over_limit_error_is_never_retryable_whatever_its_status() -> None:
    for status in (400, 413, 422, 500, 503, 529):
        error = errors.from_status(
            "p", status, {"x-should-retry": "true"}, {"error": {"code": "context_length_exceeded"}}
        )
        assert not error.retryable, status
        assert status_error_of(error).code == grpc.StatusCode.INVALID_ARGUMENT
    in_stream = errors.from_stream_error(
        "p", {"error": {"type": "server_error", "code": "request_too_large"}}
    )
    assert not in_stream.retryable
    assert status_error_of(in_stream).code == grpc.StatusCode.INVALID_ARGUMENT


# --- details sent with a stop reason ---------------------------------------------------------------------


async def test_anthropic_refusal_stop_details_are_kept(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "This looks like malware development."}
    stream = anthropic_sse(
        a_start(),
        a_block(0, {"type": "text", "text": ""}),
        a_text(0, "I can't help with that."),
        a_stop(0),
        {
            "type": "message_delta",
            "delta": {"stop_reason": "refusal", "stop_sequence": None, "stop_details": details},
            "usage": {"output_tokens": 7},
        },
        {"type": "message_stop"},
    )
    replay.enqueue(Reply.sse(stream))
    result = await collect(adapters["anthropic_provider"], request())
    finish = result.finish
    assert finish.finish_reason == "content-filter"
    assert finish.provider_metadata is not None
    assert finish.provider_metadata["anthropic"]["stop_details"] == details


async def test_anthropic_stop_details_of_a_whole_message_are_kept(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    details = {"type": "refusal", "category": "bio", "explanation": None}
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude",
        "content": [],
        "stop_reason": "refusal",
        "stop_details": details,
        "usage": {"input_tokens": 5, "output_tokens": 0},
    }
    replay.enqueue(Reply(headers={"content-type": "application/json"}, body=orjson.dumps(message)))
    result = await collect(adapters["anthropic_provider"], request())
    assert result.finish.finish_reason == "content-filter"
    assert (result.finish.provider_metadata or {})["anthropic"]["stop_details"] == details


async def test_responses_refusal_and_incomplete_details_are_kept(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    incomplete = {"reason": "content_filter"}
    stream = responses_sse(
        {"type": "response.created", "response": r_response()},
        {"type": "response.refusal.delta", **where, "delta": "I can't "},
        {"type": "response.refusal.delta", **where, "delta": "help with that."},
        {"type": "response.refusal.done", **where, "refusal": "I can't help with that."},
        {
            "type": "response.incomplete",
            "response": r_response("incomplete", incomplete_details=incomplete),
        },
    )
    replay.enqueue(Reply.sse(stream))
    result = await collect(adapters["responses_provider"], request())
    finish = result.finish
    assert finish.finish_reason == "content-filter"
    meta = (finish.provider_metadata or {})["openai"]
    assert meta["refusal"] == "I can't help with that."
    assert meta["incomplete_details"] == incomplete


async def test_chat_content_filter_results_are_kept(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    """Azure OpenAI says why its content filter stopped the step, on the choice."""
    results = {"violence": {"filtered": True, "severity": "high"}}
    last = c_chunk({}, "content_filter")
    last["choices"][0]["content_filter_results"] = results
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "Well"}), last)))
    result = await collect(adapters["chat_provider"], request())
    finish = result.finish
    assert finish.finish_reason == "content-filter"
    assert (finish.provider_metadata or {})["openai"]["content_filter_results"] == results


async def test_an_overflow_in_a_stream_is_not_retried_even_before_the_first_chunk(
    replay: ReplayServer,
) -> None:
    """A stream error whose type says "server_error" (retryable) but whose code says overflow: the
    adapter does not retry it; a real server error before the first chunk still is."""
    import openai

    from providers.helpers import openai_http
    from turnwire_server.providers.openai_chat import OpenAIChatProvider

    client = openai.AsyncOpenAI(
        api_key="k", base_url=f"{replay.url}/v1", max_retries=2, http_client=openai_http()
    )
    provider = OpenAIChatProvider("openai", client, retry_delay=0.01)
    overflow = {"error": {"message": "", "type": "server_error", "code": "context_length_exceeded"}}
    server = {"error": {"message": "The server had an error", "type": "server_error", "code": None}}
    replay.enqueue(Reply.sse(chat_sse(overflow, done=False)), Reply.sse(chat_sse(overflow, done=False)))
    result = await collect(provider, request())
    assert result.error is not None and not result.error.retryable
    assert len(replay.requests) == 1
    replay.replies.clear()
    replay.enqueue(
        Reply.sse(chat_sse(server, done=False)),
        Reply.sse(chat_sse(c_chunk({"content": "ok"}), c_chunk({}, "stop"))),
    )
    result = await collect(provider, request())
    assert result.error is None and result.text == "ok"
    assert len(replay.requests) == 3
    await provider.aclose()
