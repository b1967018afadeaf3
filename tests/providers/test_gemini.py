"""The Gemini adapter: built from config entries (the Gemini API with a key, Vertex AI with
Application Default Credentials), against replays of ``streamGenerateContent?alt=sse`` in Gemini's
wire format (``data:`` lines of ``GenerateContentResponse`` JSON, CRLF-separated as Google sends
them)."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import cloud_credentials as clouds

from providers.helpers import Stored, assistant, collect, request, tool_call, user
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.error_classes import classify_error
from turnwire.types import ToolDefinition
from turnwire_server.engine.cost import PriceBook
from turnwire_server.providers.gemini import GeminiProvider
from turnwire_server.providers.settings import GeminiProviderSettings, ProviderConfigError, build_provider

MODEL = "gemini-2.5-flash"
WEATHER = ToolDefinition(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SIGNATURE = b"\x12\x34gemini-thought-signature"


@pytest.fixture(autouse=True)
def no_cloud_metadata(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    for name in clouds.CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in clouds.no_metadata_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    yield


@pytest.fixture
async def gemini(replay: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[GeminiProvider]:
    """A ``gemini`` entry (the Gemini API) at the replay server, its key in ``GEMINI_API_KEY``."""
    monkeypatch.setenv("GEMINI_API_KEY", "test-gemini-key")
    settings = GeminiProviderSettings(type="gemini", base_url=replay.url, max_retries=0)
    provider = build_provider("gemini", settings)
    assert isinstance(provider, GeminiProvider)
    provider.retry_delay = 0.01
    yield provider
    await provider.aclose()


def response(parts: list[dict[str, Any]], finish: str | None = None, **usage: int) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL, "responseId": "resp-1"}
    if usage:
        body["usageMetadata"] = usage
    return body


def gemini_reply(*responses: dict[str, Any]) -> Reply:
    """A 200 ``text/event-stream`` of ``data:`` events, one chunk each."""
    chunks = [b"data: " + json.dumps(r).encode() + b"\r\n\r\n" for r in responses]
    return Reply(headers={"content-type": "text/event-stream"}, chunks=chunks)


def text_reply(text: str) -> Reply:
    return gemini_reply(
        response([{"text": text[:4]}], promptTokenCount=10, totalTokenCount=10),
        response(
            [{"text": text[4:]}], "STOP", promptTokenCount=10, candidatesTokenCount=5, totalTokenCount=15
        ),
    )


def call_reply() -> Reply:
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}}
    return gemini_reply(
        response([{"text": "Checking."}]),
        response(
            [{**call, "thoughtSignature": base64.b64encode(SIGNATURE).decode()}],
            "STOP",
            promptTokenCount=40,
            cachedContentTokenCount=32,
            candidatesTokenCount=9,
            thoughtsTokenCount=21,
            totalTokenCount=70,
        ),
    )


async def test_text_streams_with_the_key_and_settings(replay: ReplayServer, gemini: GeminiProvider) -> None:
    replay.enqueue(text_reply("Hello from Gemini."))
    result = await collect(
        gemini, request(user("hi"), model=MODEL, settings=base.ModelSettings(temperature=0.2))
    )
    assert result.error is None
    assert [type(c).__name__ for c in result.chunks] == [
        "TextStart",
        "TextDelta",
        "TextDelta",
        "TextEnd",
        "FinishStep",
    ]
    assert result.text == "Hello from Gemini."
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason, finish.response_model) == ("stop", "STOP", MODEL)
    assert (finish.usage.input_tokens, finish.usage.output_tokens, finish.usage.total_tokens) == (10, 5, 15)
    sent = replay.requests[0]
    assert sent.path.endswith(f"/models/{MODEL}:streamGenerateContent?alt=sse")
    assert sent.headers["x-goog-api-key"] == "test-gemini-key"
    body = sent.json
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert body["systemInstruction"]["parts"] == [{"text": "You are terse."}]
    assert body["generationConfig"] == {"temperature": 0.2}


async def test_a_tool_call_round_trip_keeps_its_thought_signature(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    replay.enqueue(call_reply(), text_reply("It is 3 °C in Oslo."))
    question = user("Weather in Oslo?")
    first = await collect(gemini, request(question, model=MODEL, tools=[WEATHER]))
    (call,) = first.calls
    assert (call.tool_call_id, call.tool_name, call.input) == ("s0-call0", "get_weather", {"city": "Oslo"})
    assert first.finish.finish_reason == "tool-calls"
    (declarations,) = (tool["functionDeclarations"] for tool in replay.requests[0].json["tools"])
    (declared,) = declarations
    assert (declared["name"], declared["description"]) == ("get_weather", WEATHER.description)
    # The schema as given (the SDK names the field in snake case, which the API's JSON reads too).
    assert declared["parameters_json_schema"] == dict(WEATHER.input_schema)
    assert replay.requests[0].json["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}
    stored = Stored().step(first.chunks, {"s0-call0": {"temp_c": 3}}).build()
    second = await collect(gemini, request(question, stored, model=MODEL, tools=[WEATHER], step_number=1))
    assert second.text == "It is 3 °C in Oslo."
    contents = replay.requests[1].json["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[1]["parts"] == [
        {"text": "Checking."},
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Oslo"}},
            "thoughtSignature": base64.b64encode(SIGNATURE).decode(),
        },
    ]
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"output": {"temp_c": 3}}}}
    ]


async def test_usage_counts_thoughts_and_cached_input_and_is_priced(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    replay.enqueue(call_reply())
    result = await collect(gemini, request(user("hi"), model=MODEL, tools=[WEATHER]))
    usage = result.finish.usage
    assert (usage.input_tokens, usage.cached_input_tokens) == (40, 32)
    assert (usage.output_tokens, usage.reasoning_tokens, usage.total_tokens) == (30, 21, 70)
    cost = PriceBook().cost(f"gemini:{MODEL}", gemini.type, usage)
    assert cost is not None and cost.usd > 0


async def test_a_call_cut_by_max_tokens_is_never_run(replay: ReplayServer, gemini: GeminiProvider) -> None:
    call = {"functionCall": {"name": "get_weather", "args": {"city": "Os"}}}
    replay.enqueue(gemini_reply(response([call], "MAX_TOKENS", promptTokenCount=5, candidatesTokenCount=8)))
    result = await collect(gemini, request(user("hi"), model=MODEL, tools=[WEATHER]))
    (cut,) = result.of(base.ToolCall)
    assert cut.input is None and cut.error
    assert result.finish.finish_reason == "length"


async def test_resource_exhausted_is_a_retryable_rate_limit_with_its_retry_delay(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Resource exhausted. Please try again later.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
        }
    }
    replay.enqueue(Reply.error(429, body))
    result = await collect(gemini, request(user("hi"), model=MODEL))
    error = result.error
    assert error is not None and error.retryable and not error.in_stream
    assert (error.status, error.type, error.retry_after_seconds) == (429, "RESOURCE_EXHAUSTED", 7.0)
    assert classify_error(error) == "rate_limit"
    assert error.body == body


async def test_a_daily_quota_is_not_retried(replay: ReplayServer, gemini: GeminiProvider) -> None:
    violation = {
        "quotaMetric": "generate_content_requests",
        "quotaId": "GenerateRequestsPerDayPerProjectPerModel",
    }
    details = [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]}]
    body = {
        "error": {
            "code": 429,
            "message": "Quota exceeded.",
            "status": "RESOURCE_EXHAUSTED",
            "details": details,
        }
    }
    replay.enqueue(Reply.error(429, body))
    result = await collect(gemini, request(user("hi"), model=MODEL))
    assert result.error is not None and not result.error.retryable
    assert classify_error(result.error) == "quota_or_billing"


async def test_a_stream_cut_before_its_finish_reason_is_retried_before_any_content(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    cut = gemini_reply(response([], promptTokenCount=10, totalTokenCount=10))
    replay.enqueue(cut)
    failed = await collect(gemini, request(user("hi"), model=MODEL))
    assert failed.error is not None and failed.error.retryable and failed.error.type == "incomplete_stream"
    replay.enqueue(cut, text_reply("Second try."))
    retried = await collect(
        gemini, request(user("hi"), model=MODEL, settings=base.ModelSettings(max_retries=1))
    )
    assert (retried.error, retried.text) == (None, "Second try.")
    # The failed attempt's prompt counts too (docs/semantics.md §11).
    assert retried.finish.usage.input_tokens == 20


async def test_vertex_ai_with_application_default_credentials(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name, value in clouds.cloud_environment(tmp_path, replay.url).items():
        monkeypatch.setenv(name, value)
    settings = GeminiProviderSettings(
        type="gemini",
        vertex=True,
        project="test-project",
        location="us-central1",
        base_url=replay.url,
        max_retries=0,
    )
    provider = build_provider("gemini", settings)
    replay.enqueue(Reply.error(200, clouds.TOKEN_REPLY), text_reply("Hello from Vertex."))
    try:
        result = await collect(provider, request(user("hi"), model=MODEL))
    finally:
        await provider.aclose()
    assert result.error is None and result.text == "Hello from Vertex."
    token, sent = replay.requests
    assert token.path == "/token"
    assert sent.path.endswith(
        f"/projects/test-project/locations/us-central1/publishers/google/models/{MODEL}:streamGenerateContent?alt=sse"
    )
    assert sent.headers["authorization"] == f"Bearer {clouds.GOOGLE_ACCESS_TOKEN}"
    assert "x-goog-api-key" not in sent.headers


def test_the_entry_needs_its_key_or_a_vertex_project() -> None:
    with pytest.raises(ProviderConfigError, match="GEMINI_API_KEY"):
        build_provider("gemini", GeminiProviderSettings(type="gemini"), {})
    with pytest.raises(ProviderConfigError, match="project"):
        build_provider("gemini", GeminiProviderSettings(type="gemini", vertex=True), {})


async def test_unknown_provider_options_are_refused(replay: ReplayServer, gemini: GeminiProvider) -> None:
    options = base.ModelSettings(provider_options={"gemini": {"thinking_budget_typo": 1}})
    result = await collect(gemini, request(user("hi"), model=MODEL, settings=options))
    assert result.error is not None and result.error.type == "invalid_request_error"
    assert "thinking_budget_typo" in result.error.message
    assert replay.requests == []


async def test_closing_the_stream_closes_the_http_response_at_once(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    """A turn cancelled (or a client gone) mid-stream: the SDK's stream and its HTTP response close."""
    delta = b"data: " + json.dumps(response([{"text": "tok "}])).encode() + b"\r\n\r\n"
    replay.enqueue(Reply(headers={"content-type": "text/event-stream"}, delay=0.005, endless=lambda n: delta))
    stream = gemini.stream(request(user("hi"), model=MODEL))
    deltas = 0
    async for chunk in stream:
        deltas += isinstance(chunk, base.TextDelta)
        if deltas == 3:
            break
    await stream.aclose()
    assert await asyncio.to_thread(replay.disconnected.wait, 2.0), "the server kept streaming"
    assert replay.chunks_after_close <= 2


async def test_thoughts_and_parallel_calls_go_back_as_they_came(
    replay: ReplayServer, gemini: GeminiProvider
) -> None:
    """Thought summaries stream as reasoning; of two parallel calls only the first has a signature
    (Gemini's way), and each goes back as it came; a call another model made gets Google's placeholder."""
    signed = {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}, "thoughtSignature": "c2ln"}
    second = {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}
    replay.enqueue(
        gemini_reply(
            response([{"text": "Two cities, ", "thought": True}]),
            response([{"text": "two calls.", "thought": True}]),
            response(
                [signed, second], "STOP", promptTokenCount=9, candidatesTokenCount=6, thoughtsTokenCount=4
            ),
        ),
        text_reply("Oslo 3 °C, Rome 18 °C."),
    )
    first = await collect(gemini, request(user("Oslo and Rome?"), model=MODEL, tools=[WEATHER]))
    assert first.reasoning == "Two cities, two calls."
    kinds = [type(c).__name__ for c in first.chunks]
    assert kinds[:4] == ["ReasoningStart", "ReasoningDelta", "ReasoningDelta", "ReasoningEnd"]
    assert [c.input for c in first.calls] == [{"city": "Oslo"}, {"city": "Rome"}]
    outputs = {"s0-call0": {"temp_c": 3}, "s0-call1": {"temp_c": 18}}
    stored = Stored().step(first.chunks, outputs).build()
    foreign = assistant([tool_call("toolu_9", "get_weather", {"city": "Paris"}, output={"temp_c": 20})])
    history = request(user("Paris?"), foreign, user("Oslo and Rome?"), stored, model=MODEL, tools=[WEATHER])
    await collect(gemini, history)
    contents = replay.requests[1].json["contents"]
    # Roles alternate: the foreign call's result and the next question are one user turn.
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    assert [next(iter(part)) for part in contents[2]["parts"]] == ["functionResponse", "text"]
    assert contents[1]["parts"] == [
        {
            "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
            "thoughtSignature": base64.b64encode(b"skip_thought_signature_validator").decode(),
        }
    ]
    assert contents[3]["parts"] == [
        {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}, "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
    ]
    assert [p["functionResponse"]["response"] for p in contents[4]["parts"]] == [
        {"output": {"temp_c": 3}},
        {"output": {"temp_c": 18}},
    ]
