"""Claude on Amazon Bedrock and Google Vertex AI: the adapters built from config entries, against
replays in each platform's wire format (Bedrock's AWS event stream, Vertex AI's server-sent events),
with credentials found the platforms' way (AWS environment variables, Google Application Default
Credentials from a file) and the cloud metadata servers switched off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import anthropic
import orjson
import pytest
from anthropic.lib.aws._auth import _get_session
from support import aws_event_stream as aws
from support import cloud_credentials as clouds

from providers.helpers import (
    Stored,
    a_block,
    a_end,
    a_json,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    collect,
    request,
    user,
)
from providers.replay import CASES, ReplayServer, Reply, split_events
from turnwire import types as base
from turnwire.error_classes import classify_error
from turnwire.types import ToolDefinition
from turnwire_server.engine.cost import PriceBook
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.anthropic_platforms import BedrockMessagesProvider, VertexMessagesProvider
from turnwire_server.providers.settings import (
    BedrockProviderSettings,
    ProviderConfigError,
    VertexProviderSettings,
    build_provider,
)

BEDROCK_MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
VERTEX_MODEL = "claude-sonnet-4-5@20250929"
WEATHER = ToolDefinition(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(autouse=True)
def no_cloud_metadata(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Neither SDK may ask a metadata server (it hangs without a network) or read the host's own
    credential files: AWS and Google look only where each test says."""
    for name in clouds.CLEARED:
        monkeypatch.delenv(name, raising=False)
    for name, value in clouds.no_metadata_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    cast(
        Any, _get_session
    ).cache_clear()  # the SDK keeps a boto3 session (and its credentials) per argument set
    yield
    cast(Any, _get_session).cache_clear()


@pytest.fixture
async def bedrock(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[BedrockMessagesProvider]:
    """A ``bedrock`` entry at the replay server, with AWS keys in the environment."""
    for name, value in clouds.cloud_environment(tmp_path, replay.url).items():
        monkeypatch.setenv(name, value)
    settings = BedrockProviderSettings(type="bedrock", region="us-east-1", base_url=replay.url, max_retries=0)
    provider = build_provider("bedrock", settings)
    assert isinstance(provider, BedrockMessagesProvider)
    provider.retry_delay = 0.01
    yield provider
    await provider.aclose()


@pytest.fixture
async def vertex(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> AsyncIterator[VertexMessagesProvider]:
    """A ``vertex`` entry at the replay server; Application Default Credentials from a file whose
    token endpoint is the replay server (its first reply must be :data:`clouds.clouds.TOKEN_REPLY`)."""
    for name, value in clouds.cloud_environment(tmp_path, replay.url).items():
        monkeypatch.setenv(name, value)
    settings = VertexProviderSettings(
        type="vertex", project="test-project", location="us-east5", base_url=f"{replay.url}/v1", max_retries=0
    )
    provider = build_provider("vertex", settings)
    assert isinstance(provider, VertexMessagesProvider)
    provider.retry_delay = 0.01
    yield provider
    await provider.aclose()


def bedrock_reply(*events: dict[str, Any], tail: list[bytes] | None = None) -> Reply:
    """A 200 ``invoke-with-response-stream`` response: one event-stream message per event."""
    return Reply(headers={"content-type": aws.CONTENT_TYPE}, chunks=[*aws.chunks(events), *(tail or [])])


def text_events(value: str, **start: Any) -> list[dict[str, Any]]:
    return [a_start(**start), a_block(0, {"type": "text", "text": ""}), a_text(0, value), a_stop(0), *a_end()]


def tool_events() -> list[dict[str, Any]]:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
    return [
        a_start(),
        a_block(0, call),
        a_json(0, '{"ci'),
        a_json(0, 'ty": "Oslo"}'),
        a_stop(0),
        *a_end("tool_use"),
    ]


# --- Bedrock -----------------------------------------------------------------------------------


async def test_bedrock_streams_text_signed_with_sigv4(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    replay.enqueue(bedrock_reply(*text_events("Hello from Bedrock.", model=BEDROCK_MODEL)))
    result = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    assert result.error is None
    assert [type(c).__name__ for c in result.chunks] == ["TextStart", "TextDelta", "TextEnd", "FinishStep"]
    assert result.text == "Hello from Bedrock."
    assert (result.finish.finish_reason, result.finish.response_model) == ("stop", BEDROCK_MODEL)
    sent = replay.requests[0]
    assert (sent.method, sent.path) == ("POST", f"/model/{BEDROCK_MODEL}/invoke-with-response-stream")
    auth = sent.headers["authorization"]
    assert (
        auth.startswith(f"AWS4-HMAC-SHA256 Credential={clouds.AWS_ACCESS_KEY_ID}/")
        and "/us-east-1/bedrock/aws4_request" in auth
    )
    assert "x-amz-date" in sent.headers
    body = sent.json
    assert "model" not in body and "stream" not in body  # both are in the URL
    # Prompt caching as on Anthropic: the conversation so far ends with a cache breakpoint.
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ]
    assert body["anthropic_version"]


async def test_bedrock_posts_what_the_sdk_client_itself_sends(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    """The kept-encoding JSON post and the SDK's own ``messages.create`` send the same path and body."""
    replay.enqueue(bedrock_reply(*text_events("a")), bedrock_reply(*text_events("b")))
    model_request = request(user("hi"), model=BEDROCK_MODEL, tools=[WEATHER])
    await collect(bedrock, model_request)
    kwargs = bedrock._prepare(model_request).kwargs
    async with bedrock.client.messages.with_streaming_response.create(stream=True, **kwargs) as response:
        await response.read()
    ours, sdks = replay.requests
    assert ours.path == sdks.path
    assert ours.json == sdks.json


async def test_bedrock_tool_call_round_trip(replay: ReplayServer, bedrock: BedrockMessagesProvider) -> None:
    replay.enqueue(bedrock_reply(*tool_events()), bedrock_reply(*text_events("It is 3 °C in Oslo.")))
    question = user("Weather in Oslo?")
    first = await collect(bedrock, request(question, model=BEDROCK_MODEL, tools=[WEATHER]))
    (call,) = first.calls
    assert (call.tool_call_id, call.tool_name, call.input) == ("toolu_1", "get_weather", {"city": "Oslo"})
    assert first.finish.finish_reason == "tool-calls"
    stored = Stored().step(first.chunks, {"toolu_1": {"temp_c": 3}}).build()
    second = await collect(
        bedrock, request(question, stored, model=BEDROCK_MODEL, tools=[WEATHER], step_number=1)
    )
    assert second.text == "It is 3 °C in Oslo."
    messages = replay.requests[1].json["messages"]
    assert messages[1]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
    ]
    (result,) = messages[2]["content"]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": '{"temp_c":3}',
        "cache_control": {"type": "ephemeral"},
    }


async def test_bedrock_usage_counts_cache_reads_and_writes_and_is_priced(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    start = a_start(input_tokens=12)
    start["message"]["usage"].update(cache_read_input_tokens=2000, cache_creation_input_tokens=300)
    stop = {
        "type": "message_stop",
        "amazon-bedrock-invocationMetrics": {"inputTokenCount": 12, "outputTokenCount": 5},
    }
    events = [start, a_block(0, {"type": "text", "text": ""}), a_text(0, "ok"), a_stop(0), a_end()[0], stop]
    replay.enqueue(bedrock_reply(*events))
    result = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    usage = result.finish.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.cache_write_input_tokens) == (
        2312,
        2000,
        300,
    )
    assert (usage.output_tokens, usage.total_tokens) == (5, 2317)
    cost = PriceBook().cost(f"bedrock:{BEDROCK_MODEL}", bedrock.type, usage)
    assert cost is not None and cost.usd > 0 and cost.price_source.startswith("genai-prices")


async def test_bedrock_throttling_in_the_stream_is_a_retryable_rate_limit(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    throttled = Reply(
        headers={"content-type": aws.CONTENT_TYPE},
        chunks=[aws.exception("throttlingException", "Too many tokens, please wait before trying again.")],
    )
    replay.enqueue(throttled)
    failed = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    error = failed.error
    assert error is not None and error.in_stream and error.retryable
    assert (error.status, error.type) == (0, "throttlingException")
    assert classify_error(error) == "rate_limit"
    # With a retry allowed, the same failure before any content is retried and the step succeeds.
    bedrock.client = bedrock.client.with_options(max_retries=1)
    replay.enqueue(throttled, bedrock_reply(*text_events("second try")))
    retried = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    assert (retried.error, retried.text) == (None, "second try")


async def test_bedrock_http_throttling_and_overflow_errors(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    """Bedrock's error responses name their type in ``x-amzn-ErrorType`` (cases E56, E19)."""
    replay.enqueue(
        Reply.error(
            429,
            {"message": "Too many tokens, please wait before trying again."},
            {"x-amzn-ErrorType": "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"},
        )
    )
    throttled = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    assert throttled.error is not None
    assert (throttled.error.status, throttled.error.type, throttled.error.retryable) == (
        429,
        "ThrottlingException",
        True,
    )
    assert classify_error(throttled.error) == "rate_limit"
    replay.enqueue(
        bedrock_reply(
            a_start(), tail=[aws.exception("validationException", "Input is too long for requested model.")]
        )
    )
    overflow = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    assert overflow.error is not None and not overflow.error.retryable
    assert classify_error(overflow.error) == "context_overflow"


async def test_bedrock_corrupt_message_is_a_retryable_stream_error(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    good = aws.chunk(a_start())
    bad = bytearray(aws.chunk(a_block(0, {"type": "text", "text": ""})))
    bad[-1] ^= 0xFF  # the message checksum no longer matches
    replay.enqueue(Reply(headers={"content-type": aws.CONTENT_TYPE}, chunks=[good, bytes(bad)]))
    result = await collect(bedrock, request(user("hi"), model=BEDROCK_MODEL))
    assert result.error is not None
    assert (result.error.type, result.error.retryable, result.error.in_stream) == (
        "corrupt_stream",
        True,
        True,
    )


async def test_bedrock_without_credentials_fails_the_step_naming_the_chain(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    settings = BedrockProviderSettings(type="bedrock", region="us-east-1", base_url=replay.url, max_retries=0)
    provider = build_provider("bedrock", settings)
    try:
        result = await collect(provider, request(user("hi"), model=BEDROCK_MODEL))
    finally:
        await provider.aclose()
    assert result.error is not None and not result.error.retryable
    assert result.error.type == "authentication_error"
    assert "AWS default chain" in result.error.message
    assert replay.requests == []  # nothing unsigned was sent


def test_bedrock_needs_a_region_from_the_entry_or_the_environment() -> None:
    with pytest.raises(ProviderConfigError, match="region"):
        build_provider("bedrock", BedrockProviderSettings(type="bedrock"))


def test_bedrock_refuses_an_empty_api_key_variable() -> None:
    """The SDK would send an empty ``AWS_BEARER_TOKEN_BEDROCK`` as the bearer token of every request."""
    settings = BedrockProviderSettings(type="bedrock", region="us-east-1")
    with pytest.raises(ProviderConfigError, match="AWS_BEARER_TOKEN_BEDROCK is set but empty"):
        build_provider("bedrock", settings, {"AWS_BEARER_TOKEN_BEDROCK": ""})


# --- Vertex AI ---------------------------------------------------------------------------------


async def test_vertex_streams_text_with_an_adc_token(
    replay: ReplayServer, vertex: VertexMessagesProvider
) -> None:
    replay.enqueue(
        Reply.error(200, clouds.TOKEN_REPLY), Reply.sse(anthropic_sse(*text_events("Hello from Vertex.")))
    )
    result = await collect(vertex, request(user("hi"), model=VERTEX_MODEL))
    assert result.error is None and result.text == "Hello from Vertex."
    token, sent = replay.requests
    assert token.path == "/token" and b"refresh_token=test-refresh" in token.body
    assert sent.path == (
        f"/v1/projects/test-project/locations/us-east5/publishers/anthropic/models/{VERTEX_MODEL}:streamRawPredict"
    )
    assert sent.headers["authorization"] == f"Bearer {clouds.GOOGLE_ACCESS_TOKEN}"
    assert "model" not in sent.json and sent.json["stream"] is True and sent.json["anthropic_version"]


async def test_vertex_posts_what_the_sdk_client_itself_sends(
    replay: ReplayServer, vertex: VertexMessagesProvider
) -> None:
    sse = Reply.sse(anthropic_sse(*text_events("a")))
    replay.enqueue(Reply.error(200, clouds.TOKEN_REPLY), sse, Reply.sse(anthropic_sse(*text_events("b"))))
    model_request = request(user("hi"), model=VERTEX_MODEL, tools=[WEATHER])
    await collect(vertex, model_request)
    kwargs = vertex._prepare(model_request).kwargs
    async with vertex.client.messages.with_streaming_response.create(stream=True, **kwargs) as response:
        await response.read()
    _, ours, sdks = replay.requests
    assert (ours.path, ours.json) == (sdks.path, sdks.json)


async def test_vertex_tool_call_and_usage(replay: ReplayServer, vertex: VertexMessagesProvider) -> None:
    events = tool_events()
    events[0]["message"]["usage"].update(cache_read_input_tokens=50)
    replay.enqueue(Reply.error(200, clouds.TOKEN_REPLY), Reply.sse(anthropic_sse(*events)))
    result = await collect(vertex, request(user("Weather in Oslo?"), model=VERTEX_MODEL, tools=[WEATHER]))
    (call,) = result.calls
    assert (call.tool_name, call.input) == ("get_weather", {"city": "Oslo"})
    usage = result.finish.usage
    assert (usage.input_tokens, usage.cached_input_tokens, usage.output_tokens) == (60, 50, 5)
    assert PriceBook().cost(f"vertex:{VERTEX_MODEL}", vertex.type, usage) is not None


async def test_vertex_resource_exhausted_is_a_retryable_rate_limit(
    replay: ReplayServer, vertex: VertexMessagesProvider
) -> None:
    """Case E59: Vertex AI's 429 ``RESOURCE_EXHAUSTED``, in Google's error shape (a list around it)."""
    body = [
        {
            "error": {
                "code": 429,
                "message": "Resource exhausted. Please try again later.",
                "status": "RESOURCE_EXHAUSTED",
            }
        }
    ]
    replay.enqueue(Reply.error(200, clouds.TOKEN_REPLY), Reply.error(429, json.dumps(body)))
    result = await collect(vertex, request(user("hi"), model=VERTEX_MODEL))
    error = result.error
    assert error is not None and error.retryable
    assert (error.status, error.type) == (429, "RESOURCE_EXHAUSTED")
    assert classify_error(error) == "rate_limit"


async def test_vertex_counts_tokens_through_the_sdk(
    replay: ReplayServer, vertex: VertexMessagesProvider
) -> None:
    replay.enqueue(Reply.error(200, clouds.TOKEN_REPLY), Reply.error(200, {"input_tokens": 42}))
    assert await vertex.count_tokens(request(user("hi"), model=VERTEX_MODEL)) == 42
    assert replay.requests[1].path == (
        "/v1/projects/test-project/locations/us-east5/publishers/anthropic/models/count-tokens:rawPredict"
    )


async def test_vertex_without_credentials_fails_the_step_naming_adc(
    replay: ReplayServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth.compute_engine import _metadata

    # google-auth reads NO_GCE_CHECK when it is first imported, which may have been before this test.
    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)
    settings = VertexProviderSettings(type="vertex", project="p", base_url=f"{replay.url}/v1", max_retries=0)
    provider = build_provider("vertex", settings)
    try:
        result = await collect(provider, request(user("hi"), model=VERTEX_MODEL))
    finally:
        await provider.aclose()
    assert result.error is not None and result.error.type == "authentication_error"
    assert "Application Default Credentials" in result.error.message
    assert replay.requests == []


def test_vertex_needs_a_project_from_the_entry_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ProviderConfigError, match="project"):
        build_provider("vertex", VertexProviderSettings(type="vertex"))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-env")
    provider = build_provider("vertex", VertexProviderSettings(type="vertex"))
    assert isinstance(provider, VertexMessagesProvider)
    assert isinstance(provider.client, anthropic.AsyncAnthropicVertex)
    assert provider.client.project_id == "from-env"


async def test_bedrock_closing_the_stream_closes_the_http_response_at_once(
    replay: ReplayServer, bedrock: BedrockMessagesProvider
) -> None:
    head = b"".join(aws.chunks(text_events("")[:2]))
    delta = aws.chunk(a_text(0, "tok "))
    replay.enqueue(
        Reply(
            headers={"content-type": aws.CONTENT_TYPE},
            delay=0.005,
            endless=lambda n: head if n == 0 else delta,
        )
    )
    stream = bedrock.stream(request(user("hi"), model=BEDROCK_MODEL))
    deltas = 0
    async for chunk in stream:
        deltas += isinstance(chunk, base.TextDelta)
        if deltas == 3:
            break
    await stream.aclose()
    assert await asyncio.to_thread(replay.disconnected.wait, 2.0), "the server kept streaming"
    assert replay.chunks_after_close <= 2


SHARED_ANTHROPIC = sorted(
    path.name.removesuffix(".sse")
    for path in (CASES / "sse").glob("anthropic_*.sse")
    if orjson.loads(path.with_suffix(".expected.json").read_bytes())["expected"].get("error") is None
)


@pytest.mark.parametrize("name", SHARED_ANTHROPIC)
async def test_shared_anthropic_streams_read_the_same_through_bedrock(
    name: str,
    replay: ReplayServer,
    bedrock: BedrockMessagesProvider,
    anthropic_provider: AnthropicMessagesProvider,
) -> None:
    """Each shared Anthropic case, its events sent as Bedrock's ``chunk`` messages, gives the very
    chunks the Anthropic adapter gives for its SSE."""
    body = (CASES / "sse" / f"{name}.sse").read_bytes()
    events = [
        orjson.loads(line.removeprefix(b"data:").strip())
        for event in split_events(body)
        for line in event.splitlines()
        if line.startswith(b"data:")
    ]
    replay.enqueue(Reply.sse(body), bedrock_reply(*events))
    direct = await collect(anthropic_provider, request())
    through_bedrock = await collect(bedrock, request())
    assert direct.error is None and direct.chunks
    assert through_bedrock.chunks == direct.chunks
    assert through_bedrock.usage_updates == direct.usage_updates
