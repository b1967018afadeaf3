"""Fallback across providers from a real ``turnwire serve`` (issue 37; docs/providers.md,
"Fallback across providers").

An Anthropic entry and an OpenAI entry point at two replay servers; ``fallback.models`` sends
``anthropic:claude-haiku-4-5``'s steps to ``openai:gpt-4o``. Anthropic answering 529 (overloaded)
before any output: the step runs on OpenAI, the stream says so with ``AttemptStart``
(``PROVIDER_FALLBACK``, the model), and the step's usage and cost are OpenAI's; a step after a
tool call falls back with the Anthropic history converted for Chat Completions. An invalid
request never falls back. Once the breaker opens, steps go to the fallback without calling
Anthropic.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from providers.helpers import (
    a_block,
    a_end,
    a_json,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_chunk,
    chat_sse,
)
from providers.replay import ReplayServer, Reply
from support.prices import expected_usd
from support.sidecar import SidecarFactory

from turnwire.types import Usage
from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import event_pb2

PRIMARY = "anthropic:claude-haiku-4-5"
FALLBACK = "openai:gpt-4o"
OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


@pytest.fixture
def servers() -> Iterator[tuple[ReplayServer, ReplayServer]]:
    with ReplayServer() as anthropic, ReplayServer() as openai:
        yield anthropic, openai


def _config(anthropic: ReplayServer, openai: ReplayServer, breaker_failures: int = 5) -> dict[str, object]:
    sdk = {"api_key_env": None, "max_retries": 0}
    return {
        "default_model": PRIMARY,
        "providers": {
            "anthropic": {"type": "anthropic", "base_url": anthropic.url, **sdk},
            "openai": {"type": "openai", "base_url": f"{openai.url}/v1", **sdk},
        },
        "fallback": {"models": {PRIMARY: [FALLBACK]}, "breaker_failures": breaker_failures},
    }


def _openai_text(text: str = "Sunny in Paris.") -> Reply:
    usage = {"prompt_tokens": 900, "completion_tokens": 12, "total_tokens": 912}
    return Reply.sse(
        chat_sse(c_chunk({"content": text}), c_chunk({}, "stop"), c_chunk(usage=usage, empty=True))
    )


def _anthropic_tool_call() -> Reply:
    return Reply.sse(
        anthropic_sse(
            a_start(input_tokens=700),
            a_block(0, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
            a_json(0, '{"city": "Paris"}'),
            a_stop(0),
            *a_end("tool_use", output_tokens=20),
        )
    )


def _kinds(result: TurnResult) -> list[str]:
    return [str(event.WhichOneof("event")) for event in result.events]


def _attempt(result: TurnResult) -> event_pb2.AttemptStart:
    (event,) = [e.attempt_start for e in result.events if e.WhichOneof("event") == "attempt_start"]
    return event


async def test_an_overloaded_model_falls_back_before_any_output(
    sidecar_factory: SidecarFactory, servers: tuple[ReplayServer, ReplayServer]
) -> None:
    anthropic, openai = servers
    sidecar = await sidecar_factory(config=_config(anthropic, openai)).start()
    anthropic.enqueue(Reply.error(529, OVERLOADED))
    openai.enqueue(_openai_text())
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("falls-back", "Weather in Paris?"))
        stored = await client.get_conversation("falls-back")
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    assert _kinds(result)[:5] == ["turn_start", "step_start", "attempt_start", "step_start", "text_start"]
    attempt = _attempt(result)
    assert (attempt.attempt, attempt.reason, attempt.model, attempt.appends) == (
        2,
        "PROVIDER_FALLBACK",
        FALLBACK,
        False,
    )
    assert len(anthropic.requests) == 1 and len(openai.requests) == 1
    assert openai.requests[0].json["model"] == "gpt-4o"
    (step,) = [e.step_finish for e in result.events if e.WhichOneof("event") == "step_finish"]
    assert (step.usage.input_tokens, step.usage.output_tokens) == (900, 12)
    usage = Usage(input_tokens=900, output_tokens=12)
    assert step.cost.usd == pytest.approx(expected_usd("openai", "gpt-4o", usage), rel=1e-9)
    assert result.text == "Sunny in Paris."
    assert stored.messages[-1].parts[-1].text.text == "Sunny in Paris."
    # The log says why the step fell back, as the provider answered it.
    assert (
        f"{PRIMARY} failed (transient: HTTP 529 overloaded_error): the step runs on {FALLBACK}"
        in sidecar.log_text()
    )


async def test_a_later_step_falls_back_with_the_history_converted(
    sidecar_factory: SidecarFactory, servers: tuple[ReplayServer, ReplayServer]
) -> None:
    anthropic, openai = servers
    sidecar = await sidecar_factory(config=_config(anthropic, openai)).start()
    anthropic.enqueue(_anthropic_tool_call(), Reply.error(529, OVERLOADED))
    openai.enqueue(_openai_text())
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("tool-then-fallback", "Weather in Paris?"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    attempt = _attempt(result)
    assert attempt.appends and attempt.model == FALLBACK
    assert [p.WhichOneof("kind") for p in attempt.message.parts if p.WhichOneof("kind") != "step_start"] == [
        "tool_call"
    ]
    messages = openai.requests[0].json["messages"]
    calls = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
    assert calls and calls[0]["tool_calls"][0]["function"]["name"] == "get_weather"
    results = [m for m in messages if m["role"] == "tool"]
    assert results and results[0]["tool_call_id"] == calls[0]["tool_calls"][0]["id"]
    assert "Paris" in results[0]["content"]
    assert [e.step_finish.step_number for e in result.events if e.WhichOneof("event") == "step_finish"] == [
        0,
        1,
    ]


async def test_an_invalid_request_never_falls_back(
    sidecar_factory: SidecarFactory, servers: tuple[ReplayServer, ReplayServer]
) -> None:
    anthropic, openai = servers
    sidecar = await sidecar_factory(config=_config(anthropic, openai)).start()
    anthropic.enqueue(
        Reply.error(
            400, {"type": "error", "error": {"type": "invalid_request_error", "message": "bad tools"}}
        )
    )
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("no-fallback", "hi"))
    assert result.status == event_pb2.TURN_STATUS_ERROR
    assert "attempt_start" not in _kinds(result)
    assert openai.requests == []


async def test_an_open_breaker_sends_steps_to_the_fallback_without_a_call(
    sidecar_factory: SidecarFactory, servers: tuple[ReplayServer, ReplayServer]
) -> None:
    anthropic, openai = servers
    sidecar = await sidecar_factory(config=_config(anthropic, openai, breaker_failures=1)).start()
    anthropic.enqueue(Reply.error(529, OVERLOADED))
    openai.enqueue(_openai_text("first"), _openai_text("second"))
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat("breaker-a", "hi"))
        second = await collect(client.chat("breaker-b", "hi"))
    assert first.status == second.status == event_pb2.TURN_STATUS_COMPLETED
    assert "attempt_start" in _kinds(first)
    assert "attempt_start" not in _kinds(second), "no attempt on the open provider: nothing to say"
    assert len(anthropic.requests) == 1, "the open breaker kept the second step off Anthropic"
    # Nothing was attempted, yet the step says which model ran it (the usage and cost are its).
    starts = [e.step_start.model for e in second.events if e.WhichOneof("event") == "step_start"]
    finishes = [e.step_finish.model for e in second.events if e.WhichOneof("event") == "step_finish"]
    assert starts == finishes == [FALLBACK]
    assert second.text == "second"
    assert "provider anthropic: 1 failures in a row" in sidecar.log_text()


def _anthropic_overloaded_mid_stream() -> Reply:
    return Reply.sse(
        anthropic_sse(
            a_start(input_tokens=700),
            a_block(0, {"type": "text", "text": ""}),
            a_text(0, "Partial answer that "),
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        )
    )


@pytest.mark.parametrize("after_output", ["never", "restart"])
async def test_a_failure_after_output_falls_back_only_when_configured(
    sidecar_factory: SidecarFactory, servers: tuple[ReplayServer, ReplayServer], after_output: str
) -> None:
    anthropic, openai = servers
    config = _config(anthropic, openai)
    config["fallback"]["after_output"] = after_output  # type: ignore[index]
    sidecar = await sidecar_factory(config=config).start()
    anthropic.enqueue(_anthropic_overloaded_mid_stream())
    openai.enqueue(_openai_text())
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("mid-stream", "Weather in Paris?"))
        stored = await client.get_conversation("mid-stream")
    deltas = [e.text_delta.delta for e in result.events if e.WhichOneof("event") == "text_delta"]
    assert deltas[0] == "Partial answer that ", "the failed attempt's output reached the client"
    if after_output == "never":
        assert result.status == event_pb2.TURN_STATUS_ERROR
        assert openai.requests == []
        return
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    kinds = _kinds(result)
    at = kinds.index("attempt_start")
    assert kinds[at - 2 : at + 2] == ["text_start", "text_delta", "attempt_start", "step_start"]
    attempt = _attempt(result)
    assert (attempt.reason, attempt.model, attempt.appends) == ("PROVIDER_FALLBACK", FALLBACK, False)
    assert result.text == "Sunny in Paris.", "the dropped partial is not part of the answer"
    assert [p.text.text for p in stored.messages[-1].parts if p.WhichOneof("kind") == "text"] == [
        "Sunny in Paris."
    ]
