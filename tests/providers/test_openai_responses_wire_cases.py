"""Responses streams of servers beyond OpenAI's own shapes (``cases_extra/sse/openai_responses_*``),
replayed through the official ``openai`` SDK into the adapter: each produces the outcome its
``.expected.json`` gives (text and its blocks, reasoning, tool calls, finish, usage, error), and the
message the engine stores from it goes back on the next request exactly as ``next_request_input``
says, with the provider entry ``settings`` the case names. Each case's ``source`` says where its
shape comes from.

Issue 30: item ids that change from event to event (item 2), a text-only reasoning item that a
DeepSeek tool loop needs back (item 7), a reasoning item that no item followed in its step (item 8).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from providers.helpers import Stored, collect, openai_http, r_text_stream, request, user
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ToolDefinition
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

EXTRA = Path(__file__).resolve().parent / "cases_extra" / "sse"
CASE_NAMES = sorted(path.name.removesuffix(".sse") for path in EXTRA.glob("openai_responses_*.sse"))
FINISH = {"stop": "stop", "tool_calls": "tool-calls", "length": "length"}
WEATHER = ToolDefinition("get_weather", "Weather", {"type": "object", "properties": {"city": {}}})


def _case(name: str) -> dict[str, Any]:
    case: dict[str, Any] = orjson.loads((EXTRA / f"{name}.expected.json").read_bytes())
    return case


def test_the_responses_cases_are_there() -> None:
    assert len(CASE_NAMES) >= 3, CASE_NAMES


@pytest.mark.parametrize("name", CASE_NAMES)
async def test_responses_case(name: str, replay: ReplayServer) -> None:
    case = _case(name)
    expected = case["expected"]
    body = (EXTRA / f"{name}.sse").read_bytes()
    model = _model(body)
    client = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIResponsesProvider("vendor", client, retry_delay=0.01, **case.get("settings", {}))
    question = user(case.get("question", "hi"))
    replay.enqueue(Reply.sse(body), Reply.sse(r_text_stream("ok")))
    try:
        result = await collect(provider, request(question, model=model, tools=[WEATHER]))
        # What the engine stores from these chunks, then the next request built from it.
        stored = Stored().step(result.chunks, case.get("tool_outputs", {})).build()
        after = [user(case["next_user"])] if "next_user" in case else []
        await collect(provider, request(question, stored, *after, model=model, tools=[WEATHER]))
    finally:
        await provider.aclose()

    assert result.text == expected["text"]
    assert len(result.of(base.TextStart)) == expected.get("text_blocks", len(result.of(base.TextStart)))
    assert result.reasoning == expected.get("reasoning", "")
    if "reasoning_blocks" in expected:
        assert len(result.of(base.ReasoningStart)) == expected["reasoning_blocks"]
        assert len(result.of(base.ReasoningEnd)) == expected["reasoning_blocks"]
    assert [(c.tool_call_id, c.tool_name, c.raw_input, c.input) for c in result.calls] == [
        (want["call_id"], want["name"], want["arguments_raw"], want["arguments"])
        for want in expected["tool_calls"]
    ]
    executed = [c.tool_call_id for c in result.executed]
    assert executed == expected.get("provider_executed", []), "calls the provider ran (issue 31)"
    error = expected.get("error")
    if error is None:
        assert result.error is None, result.error
        assert result.finish.finish_reason == FINISH[expected["finish_reason"]]
        assert result.finish.raw_finish_reason == expected["finish_reason_raw"]
        usage = expected["usage"]
        assert result.finish.usage == base.Usage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            total_tokens=usage["total_tokens"],
            reasoning_tokens=usage.get("reasoning_tokens", 0),
            cached_input_tokens=usage.get("cached_input_tokens", 0),
        )
    else:
        assert result.error is not None, "the stream must fail"
        assert (result.error.type, result.error.code) == (error["type"], error["code"])
    # Stored as streamed: one text part holding the whole answer, the reasoning in one part.
    texts = [p.text.text for p in stored.parts if p.WhichOneof("kind") == "text"]
    assert "".join(texts) == expected["text"] and len(texts) <= 1
    assert replay.requests[1].json["input"] == expected["next_request_input"]


def _model(body: bytes) -> str:
    """The model the stream's ``response.created`` names: what the case's request asked for."""
    first = body.split(b"\ndata: ", 1)[1].split(b"\n", 1)[0]
    return str(orjson.loads(first)["response"]["model"])
