"""Behaviour shared by all adapters: SSE framing, cancellation, dropped connections, and retries only
before the first chunk reaches the engine."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from providers.helpers import (
    a_block,
    a_start,
    a_text,
    a_text_stream,
    anthropic_sse,
    c_chunk,
    chat_sse,
    collect,
    r_response,
    request,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ModelSettings
from turnwire_server.providers.sse import iter_sse


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _events(*parts: bytes) -> list[tuple[bytes, bytes]]:
    return [event async for event in iter_sse(_chunks(*parts))]


@pytest.mark.parametrize(
    "parts",
    [
        (b"event: a\ndata: 1\n\ndata: 2\n\n",),
        (b"event: a\r\ndata: 1\r\n\r\ndata: 2\r\n\r\n",),
        (b"event: a\rdata: 1\r\rdata: 2\r\r",),
        (b"event: a\r", b"\ndata: 1\r", b"\n\r", b"\ndata: 2\r\n\r\n"),  # CRLF split across reads
        (b"ev", b"ent: a\nda", b"ta: 1\n", b"\n", b"data: 2\n\n"),
        (b": keep-alive\n\nevent: a\ndata:1\nid: 7\nretry: 100\n\ndata: 2",),  # no final blank line
    ],
)
async def test_sse_framing(parts: tuple[bytes, ...]) -> None:
    assert await _events(*parts) == [(b"a", b"1"), (b"", b"2")]


async def test_sse_multiline_data_and_empty_events() -> None:
    assert await _events(b"data: {\ndata: }\n\nevent: x\n\n\n\ndata:\n\n") == [(b"", b"{\n}"), (b"", b"")]


def _endless(kind: str) -> Reply:
    """A stream that never ends: text deltas every 5 ms until the client hangs up."""
    if kind == "anthropic_provider":
        head = anthropic_sse(a_start(), a_block(0, {"type": "text", "text": ""}))
        return Reply(
            headers={"content-type": "text/event-stream"},
            delay=0.005,
            endless=lambda n: head if n == 0 else anthropic_sse(a_text(0, "tok ")),
        )
    if kind == "chat_provider":
        return Reply(
            headers={"content-type": "text/event-stream"},
            delay=0.005,
            endless=lambda n: chat_sse(c_chunk({"content": "tok "}), done=False),
        )
    delta = {
        "type": "response.output_text.delta",
        "item_id": "m",
        "output_index": 0,
        "content_index": 0,
        "delta": "tok ",
    }
    return Reply(
        headers={"content-type": "text/event-stream"}, delay=0.005, endless=lambda n: responses_sse(delta)
    )


ADAPTERS = ["anthropic_provider", "chat_provider", "responses_provider"]


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_aclose_closes_the_http_stream_at_once(
    kind: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(_endless(kind))
    stream = adapters[kind].stream(request())
    deltas = 0
    async for chunk in stream:
        deltas += isinstance(chunk, base.TextDelta)
        if deltas == 3:
            break
    started = time.monotonic()
    await stream.aclose()
    assert await asyncio.to_thread(replay.disconnected.wait, 2.0), "the server kept streaming"
    assert time.monotonic() - started < 1.0
    assert replay.chunks_after_close <= 2  # what was already in flight, nothing more


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_cancelling_the_consumer_closes_the_stream(
    kind: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(_endless(kind))
    seen = asyncio.Event()

    async def consume() -> None:
        async for chunk in adapters[kind].stream(request()):
            if isinstance(chunk, base.TextDelta):
                seen.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(seen.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await asyncio.to_thread(replay.disconnected.wait, 2.0)


DROPPED = {
    "anthropic_provider": Reply.sse(a_text_stream("one two three"), drop_after=3),
    "chat_provider": Reply.sse(
        chat_sse(c_chunk({"content": "one"}), c_chunk({"content": " two"}), c_chunk({}, "stop")), drop_after=2
    ),
    "responses_provider": Reply.sse(
        responses_sse(
            {"type": "response.created", "response": r_response()},
            {
                "type": "response.output_text.delta",
                "item_id": "m",
                "output_index": 0,
                "content_index": 0,
                "delta": "one",
            },
            {"type": "response.completed", "response": r_response("completed")},
        ),
        drop_after=2,
    ),
}


@pytest.mark.parametrize("kind", ADAPTERS)
async def test_connection_dropped_mid_stream(
    kind: str, replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(DROPPED[kind])
    settings = ModelSettings(max_retries=3)  # must not retry: a chunk already reached the engine
    result = await collect(adapters[kind], request(settings=settings))
    assert result.text.startswith("one")
    assert result.error is not None
    assert (result.error.status, result.error.retryable) == (0, True)
    assert result.error.type in ("connection_error", "incomplete_stream")
    assert not result.of(base.FinishStep)
    assert len(replay.requests) == 1


OVERLOADED_FIRST = anthropic_sse(
    a_start(), {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
)


async def test_error_before_the_first_chunk_is_retried(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.sse(OVERLOADED_FIRST), Reply.sse(a_text_stream("Recovered.")))
    result = await collect(adapters["anthropic_provider"], request(settings=ModelSettings(max_retries=1)))
    assert result.error is None and result.text == "Recovered."
    assert len(replay.requests) == 2
    # The failed attempt's reported usage counts too (docs/semantics.md §11): it is carried
    # into the retry's usage.
    first_attempt = result.usage_updates[0]
    assert result.finish.usage.input_tokens == first_attempt.input_tokens + 10


async def test_error_before_the_first_chunk_without_retries_left(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.sse(OVERLOADED_FIRST))
    result = await collect(adapters["anthropic_provider"], request())  # the client's max_retries is 0
    assert result.error is not None and result.error.type == "overloaded_error" and result.error.retryable
    assert len(replay.requests) == 1


async def test_error_after_the_first_chunk_is_not_retried(
    replay: ReplayServer, adapters: dict[str, Any]
) -> None:
    replay.enqueue(Reply.sse("anthropic_overloaded_error_midstream.sse"), Reply.sse(a_text_stream()))
    result = await collect(adapters["anthropic_provider"], request(settings=ModelSettings(max_retries=2)))
    assert result.error is not None and result.text == "Sure. First, open the settings page and"
    assert len(replay.requests) == 1


async def test_connection_refused(adapters: dict[str, Any]) -> None:
    import anthropic

    from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider

    client = anthropic.AsyncAnthropic(api_key="k", base_url="http://127.0.0.1:9", max_retries=0)
    provider = AnthropicMessagesProvider("anthropic", client)
    result = await collect(provider, request())
    await provider.aclose()
    assert result.error is not None
    assert (result.error.status, result.error.type, result.error.retryable) == (0, "connection_error", True)


@pytest.mark.parametrize("entry", ["anthropic", "openai", "openai-responses"])
async def test_a_refused_connection_is_a_connection_error_not_a_timeout(entry: str) -> None:
    """Through the sidecar's own client (settings.py: the SDKs' aiohttp transport, whose ``openai``
    copy reports every connection failure as ``ConnectTimeout``): a mistyped ``base_url`` must
    read "connection error … refused", not "timeout"."""
    from pydantic import TypeAdapter

    from turnwire_server.providers.settings import ProviderSettings, build_provider

    entry_settings = {"type": entry, "base_url": "http://127.0.0.1:9", "max_retries": 0, "api_key_env": None}
    provider = build_provider(entry, TypeAdapter(ProviderSettings).validate_python(entry_settings), {})
    result = await collect(provider, request())
    await provider.aclose()
    assert result.error is not None
    assert (result.error.status, result.error.type, result.error.retryable) == (0, "connection_error", True)
    assert "127.0.0.1:9" in str(result.error)


async def test_read_timeout_is_a_retryable_timeout(replay: ReplayServer, adapters: dict[str, Any]) -> None:
    replay.enqueue(Reply.sse(a_text_stream(), delay=0.5))
    result = await collect(
        adapters["anthropic_provider"], request(settings=ModelSettings(timeout_seconds=0.1))
    )
    assert result.error is not None
    assert (result.error.status, result.error.type, result.error.retryable) == (0, "timeout", True)
