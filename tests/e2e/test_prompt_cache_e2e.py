"""Prompt caching from a real ``turnwire serve`` (issue 37; docs/providers.md, "Prompt caching").

Anthropic, OpenAI Chat Completions and OpenAI Responses entries point at a replay server that
records each request and reports cached tokens. Anthropic requests carry ``cache_control``
breakpoints on the conversation so far, the system prompt and the tools (and nowhere else: the
previous turn's marker is not left behind); OpenAI requests carry one opaque ``prompt_cache_key``
per conversation (the same on every turn, another for another conversation, never the id).
The cached tokens the server reports reach the steps' usage and their cost; ``prompt_caching:
off`` sends no marker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from providers.helpers import (
    a_block,
    a_end,
    a_start,
    a_stop,
    a_text,
    anthropic_sse,
    c_usage_stream,
    r_response,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from support.prices import expected_usd
from support.sidecar import SidecarFactory

from turnwire.types import Usage
from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

EPHEMERAL = {"type": "ephemeral"}


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


def _config(replay: ReplayServer, caching: str = "5m") -> dict[str, object]:
    sdk = {"api_key_env": None, "max_retries": 0}
    return {
        "default_model": "anthropic:claude-haiku-4-5",
        "system_prompt": "You are a careful assistant.",
        "providers": {
            "anthropic": {"type": "anthropic", "base_url": replay.url, "prompt_caching": caching, **sdk},
            "openai": {"type": "openai", "base_url": f"{replay.url}/v1", "prompt_cache_key": "on", **sdk},
            "responses": {
                "type": "openai-responses",
                "base_url": f"{replay.url}/v1",
                "prompt_cache_key": "on",
                **sdk,
            },
        },
    }


def _anthropic_reply(uncached: int, read: int, write: int, output: int, hour: int | None = None) -> Reply:
    """``hour``: of the writes, those kept an hour, reported as the API does (``cache_creation``)."""
    start = a_start(input_tokens=uncached)
    start["message"]["usage"].update(cache_read_input_tokens=read, cache_creation_input_tokens=write)
    if hour is not None:
        by_ttl = {"ephemeral_5m_input_tokens": write - hour, "ephemeral_1h_input_tokens": hour}
        start["message"]["usage"]["cache_creation"] = by_ttl
    return Reply.sse(
        anthropic_sse(
            start,
            a_block(0, {"type": "text", "text": ""}),
            a_text(0, "Hi."),
            a_stop(0),
            *a_end(output_tokens=output),
        )
    )


def _chat_reply(prompt: int, cached: int, output: int) -> Reply:
    return Reply.sse(c_usage_stream(prompt, cached, output))


def _responses_reply() -> Reply:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed", "content": []}
    usage = {
        "input_tokens": 2000,
        "input_tokens_details": {"cached_tokens": 1536},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 2020,
    }
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    return Reply.sse(
        responses_sse(
            {"type": "response.created", "response": r_response()},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**message, "status": "in_progress"},
            },
            {"type": "response.output_text.delta", **where, "delta": "Hi."},
            {"type": "response.output_text.done", **where, "text": "Hi."},
            {"type": "response.output_item.done", "output_index": 0, "item": message},
            {"type": "response.completed", "response": r_response("completed", usage=usage)},
        )
    )


def _markers(body: Any) -> list[str]:
    """Where ``cache_control`` sits in an Anthropic body, as paths."""
    found: list[str] = []

    def walk(value: Any, path: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "cache_control":
                    found.append(path)
                else:
                    walk(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, f"{path}[{index}]")

    walk(body, "")
    return found


async def test_anthropic_requests_carry_breakpoints_and_cached_tokens_reach_usage_and_cost(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    sidecar = await sidecar_factory(config=_config(replay)).start()
    replay.enqueue(
        _anthropic_reply(uncached=300, read=0, write=2500, output=40),
        _anthropic_reply(uncached=120, read=2500, write=400, output=30),
    )
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat("cached", "What is 12 * 7?", model="anthropic:claude-haiku-4-5"))
        second = await collect(client.chat("cached", "And 13 * 7?", model="anthropic:claude-haiku-4-5"))
    bodies = [request.json for request in replay.requests]
    assert len(bodies) == 2
    for body in bodies:
        last = len(body["messages"]) - 1
        assert body["system"] == [
            {"type": "text", "text": "You are a careful assistant.", "cache_control": EPHEMERAL}
        ]
        assert body["tools"], "the demo tools are offered"
        assert body["tools"][-1]["cache_control"] == EPHEMERAL
        tail = body["messages"][last]["content"]
        assert tail[-1]["cache_control"] == EPHEMERAL
        # Exactly three: the previous turn's end is not marked in the next request.
        assert sorted(_markers(body)) == sorted(
            [
                ".system[0]",
                f".tools[{len(body['tools']) - 1}]",
                f".messages[{last}].content[{len(tail) - 1}]",
            ]
        )
    assert len(bodies[1]["messages"]) == 3

    usages = [
        Usage(input_tokens=2800, cache_write_input_tokens=2500, output_tokens=40),
        Usage(input_tokens=3020, cached_input_tokens=2500, cache_write_input_tokens=400, output_tokens=30),
    ]
    for result, usage in zip((first, second), usages, strict=True):
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
        (step,) = [e.step_finish for e in result.events if e.WhichOneof("event") == "step_finish"]
        assert (
            step.usage.input_tokens,
            step.usage.cached_input_tokens,
            step.usage.cache_write_input_tokens,
        ) == (
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.cache_write_input_tokens,
        )
        assert step.cost.usd == pytest.approx(expected_usd("anthropic", "claude-haiku-4-5", usage), rel=1e-9)


async def test_an_hour_long_cache_write_is_priced_at_the_hour_rate(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    """``prompt_caching: 1h``: the markers ask for an hour, and the writes the API reports kept an
    hour reach the step's usage and cost at twice the input price (before: the five-minute rate,
    1.25 times; money trial)."""
    sidecar = await sidecar_factory(config=_config(replay, caching="1h")).start()
    replay.enqueue(_anthropic_reply(uncached=100, read=2000, write=500, output=50, hour=500))
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("hour", "hi", model="anthropic:claude-haiku-4-5"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    (request,) = replay.requests
    assert request.json["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    (step,) = [e.step_finish for e in result.events if e.WhichOneof("event") == "step_finish"]
    assert (step.usage.cache_write_input_tokens, step.usage.cache_write_1h_input_tokens) == (500, 500)
    usage = Usage(
        input_tokens=2600,
        cached_input_tokens=2000,
        cache_write_input_tokens=500,
        cache_write_1h_input_tokens=500,
        output_tokens=50,
    )
    assert step.cost.usd == pytest.approx(expected_usd("anthropic", "claude-haiku-4-5", usage), rel=1e-9)
    # $1 per million input: 100 uncached, 2 000 read at $0.10, 500 written for an hour at $2, 50 out at $5.
    assert step.cost.usd == pytest.approx((100 + 2000 * 0.1 + 500 * 2 + 50 * 5) / 1e6, rel=1e-9)
    assert result.usage.cache_write_1h_input_tokens == 500


async def test_prompt_caching_off_sends_no_breakpoint(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    sidecar = await sidecar_factory(config=_config(replay, caching="off")).start()
    replay.enqueue(_anthropic_reply(uncached=300, read=0, write=0, output=40))
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("uncached", "hi", model="anthropic:claude-haiku-4-5"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    (request,) = replay.requests
    assert _markers(request.json) == []
    assert request.json["system"] == "You are a careful assistant."


@pytest.mark.parametrize(
    ("model", "path"), [("openai:gpt-4o", "/v1/chat/completions"), ("responses:gpt-4o", "/v1/responses")]
)
async def test_openai_requests_carry_one_opaque_cache_key_per_conversation(
    sidecar_factory: SidecarFactory, replay: ReplayServer, model: str, path: str
) -> None:
    sidecar = await sidecar_factory(config=_config(replay)).start()
    reply = _chat_reply if model.startswith("openai") else lambda *_: _responses_reply()
    replay.enqueue(*(reply(2000, 1536, 20) for _ in range(3)))
    async with TurnwireClient(sidecar.target) as client:
        turns = [
            await collect(client.chat(conversation, text, model=model))
            for conversation, text in (("keyed-a", "hi"), ("keyed-a", "again"), ("keyed-b", "hi"))
        ]
    assert [request.path for request in replay.requests] == [path] * 3
    keys = [request.json["prompt_cache_key"] for request in replay.requests]
    assert keys[0] == keys[1] != keys[2], "one key per conversation"
    assert all(len(key) == 32 and "keyed" not in key for key in keys), keys
    assert "keyed-a" not in json.dumps([request.json for request in replay.requests])
    usage = Usage(input_tokens=2000, cached_input_tokens=1536, output_tokens=20)
    for result in turns:
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
        (step,) = [e.step_finish for e in result.events if e.WhichOneof("event") == "step_finish"]
        assert (step.usage.input_tokens, step.usage.cached_input_tokens) == (2000, 1536)
        assert step.cost.usd == pytest.approx(expected_usd("openai", "gpt-4o", usage), rel=1e-9)
