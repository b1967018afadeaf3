"""The model call's span continues at the provider: each adapter sends the step span's W3C
``traceparent`` with its HTTP request (the SDKs run on httpx2, which no OpenTelemetry HTTP
instrumentation covers, so the adapter adds the header itself)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.engine_harness import EngineFactory, collect
from support.traces import memory_tracing, one, traceparent_of

from providers.helpers import a_text_stream, c_text_stream, r_text_stream
from providers.replay import ReplayServer, Reply
from turnwire.providers import Provider

STREAMS: dict[str, Callable[[str], bytes]] = {
    "anthropic_provider": a_text_stream,
    "chat_provider": c_text_stream,
    "responses_provider": r_text_stream,
}
GENAI_PROVIDER = {
    "anthropic_provider": "anthropic",
    "chat_provider": "openai",
    "responses_provider": "openai",
}


@pytest.mark.parametrize("adapter", list(STREAMS))
async def test_the_upstream_sees_the_step_spans_traceparent(
    adapter: str, adapters: dict[str, Provider], replay: ReplayServer, make_engine: EngineFactory
) -> None:
    provider = adapters[adapter]
    replay.enqueue(Reply.sse(STREAMS[adapter]("Hi.")))
    tracing, exporter = memory_tracing()
    h = await make_engine(tracing=tracing, providers={"upstream": provider})
    events = await collect(await h.start("hi", model="upstream:m"))
    assert events[-1].turn_end.status == 1, events[-1]
    chat = one(exporter.get_finished_spans(), "chat m")
    assert chat.attributes is not None and chat.attributes["gen_ai.provider.name"] == GENAI_PROVIDER[adapter]
    assert len(replay.requests) == 1
    assert replay.requests[0].headers["traceparent"] == traceparent_of(chat)


async def test_no_traceparent_without_tracing(
    anthropic_provider: Provider, replay: ReplayServer, make_engine: EngineFactory
) -> None:
    replay.enqueue(Reply.sse(a_text_stream("Hi.")))
    h = await make_engine(providers={"upstream": anthropic_provider})
    await collect(await h.start("hi", model="upstream:m"))
    assert "traceparent" not in replay.requests[0].headers
