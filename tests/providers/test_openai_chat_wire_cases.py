"""Chat Completions streams of vendors beyond OpenAI (``cases_extra/sse/openai_chat_*``), replayed
through the official ``openai`` SDK into the adapter: each produces the outcome its
``.expected.json`` gives (text, reasoning, tool calls, finish, usage), with the provider entry
settings the case names; each case's ``source`` says where its shape comes from.

Issue 30: Mistral's ``content`` parts (item 1), usage in vendor fields (item 4), ``<think>`` tags
inline (item 5), a tool name split across deltas (item 6), DeepSeek's ``reasoning_content`` sent
back in a tool loop (item 7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from providers.helpers import Stored, collect, openai_http, request, user
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ToolDefinition
from turnwire_server.providers.openai_chat import OpenAIChatProvider

EXTRA = Path(__file__).resolve().parent / "cases_extra" / "sse"
CASE_NAMES = sorted(path.name.removesuffix(".sse") for path in EXTRA.glob("openai_chat_*.sse"))
FINISH = {"stop": "stop", "tool_calls": "tool-calls", "length": "length"}
WEATHER = ToolDefinition("get_weather", "Weather", {"type": "object", "properties": {"city": {}}})


def _case(name: str) -> dict[str, Any]:
    case: dict[str, Any] = orjson.loads((EXTRA / f"{name}.expected.json").read_bytes())
    return case


async def _provider(replay: ReplayServer, name: str, settings: dict[str, Any]) -> OpenAIChatProvider:
    client = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    return OpenAIChatProvider(name, client, retry_delay=0.01, **settings)


def test_the_chat_cases_are_there() -> None:
    assert len(CASE_NAMES) >= 6, CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
async def test_chat_case(name: str, replay: ReplayServer) -> None:
    case = _case(name)
    expected = case["expected"]
    body = (EXTRA / f"{name}.sse").read_bytes()
    model = orjson.loads(body.split(b"\n", 1)[0].removeprefix(b"data: "))["model"]  # as requested
    provider = await _provider(replay, "vendor", case.get("settings", {}))
    replay.enqueue(Reply.sse(body))
    try:
        result = await collect(provider, request(model=model, tools=[WEATHER]))
    finally:
        await provider.aclose()

    assert result.error is None, result.error
    assert result.text == expected["text"]
    assert result.reasoning == expected.get("reasoning", "")
    calls = [(c.tool_call_id, c.tool_name, c.input, c.error) for c in result.calls]
    assert calls == [(w["id"], w["name"], w["arguments"], None) for w in expected["tool_calls"]]
    for call, want in zip(result.calls, expected["tool_calls"], strict=True):
        if "arguments_raw" in want:
            assert call.raw_input == want["arguments_raw"]
    # A call's input starts streaming under its complete name, once.
    starts = [(s.tool_call_id, s.tool_name) for s in result.of(base.ToolInputStart)]
    assert starts == [(w["id"], w["name"]) for w in expected["tool_calls"]]
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason) == (
        FINISH[expected["finish_reason"]],
        expected["finish_reason_raw"],
    )
    usage = expected["usage"] or {}
    assert finish.usage == base.Usage(
        input_tokens=usage.get("input_tokens", 0),
        output_tokens=usage.get("output_tokens", 0),
        total_tokens=usage.get("total_tokens", 0),
        reasoning_tokens=usage.get("reasoning_tokens", 0),
        cached_input_tokens=usage.get("cached_input_tokens", 0),
    )
    if usage:  # reported as it came, so a step cut short after it still counts it
        assert result.usage_updates[-1] == finish.usage
    # Reasoning and text are separate blocks, in stream order, never open at once.
    kinds = [type(c).__name__ for c in result.chunks if not isinstance(c, base.FinishStep)]
    opened: list[str] = []
    for kind in kinds:
        if kind in ("TextStart", "ReasoningStart"):
            assert not opened, kinds
            opened.append(kind)
        elif kind in ("TextEnd", "ReasoningEnd"):
            opened.pop()
    assert not opened

    if "next_request_assistant" in expected:
        await _check_next_request(replay, case, result.chunks, model)


async def _check_next_request(
    replay: ReplayServer, case: dict[str, Any], chunks: list[Any], model: str
) -> None:
    """The step after the tools ran: its request carries the assistant message the case names."""
    expected = case["expected"]
    provider = await _provider(replay, "vendor", case.get("settings", {}))
    outputs = {call["id"]: {"sky": "clear"} for call in expected["tool_calls"]}
    stored = Stored().step(chunks, outputs).build()
    replay.enqueue(Reply.sse(b'data: {"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n'))
    try:
        await collect(provider, request(user("Weather in Paris?"), stored, model=model, tools=[WEATHER]))
    finally:
        await provider.aclose()
    messages = replay.requests[-1].json["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2] == expected["next_request_assistant"]
