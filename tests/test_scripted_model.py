"""The scripted model's test options (``turnwire.testing``): strict mode, ``repeat`` on a last step,
and a step that streams until the turn is cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError
from support.engine_harness import CONV, EngineFactory, echo, end_of, make_tool, text_of
from support.waiting import wait_until

from turnwire.compaction import EstimateTokens
from turnwire.providers import ModelRequest, ProviderError
from turnwire.testing import (
    ScriptedError,
    ScriptedProvider,
    ScriptedToolCall,
    ScriptedUsage,
    ScriptStep,
    UnexpectedModelCall,
)
from turnwire.types import FinishStep, TextDelta, ToolCall, ToolDefinition, UsageUpdate
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.providers.settings import ProviderSettings, build_provider

ENTRIES = TypeAdapter(dict[str, ProviderSettings])
CALL = ScriptStep(tool_calls=[ScriptedToolCall(name="echo")])
TWO_CALLS = [
    ScriptStep(tool_calls=[ScriptedToolCall(name="echo"), ScriptedToolCall(name="echo", id="call_0_0")])
]


def request(step_number: int, model: str = "main") -> ModelRequest:
    return ModelRequest(model=model, system="", messages=[], tools=[], step_number=step_number)


async def chunks(provider: ScriptedProvider, step_number: int) -> list[Any]:
    return [chunk async for chunk in provider.stream(request(step_number))]


async def test_a_strict_script_refuses_a_step_past_its_end_and_keeps_the_call() -> None:
    provider = ScriptedProvider({"main": [CALL, ScriptStep(text="done")]}, strict=True)
    assert isinstance((await chunks(provider, 1))[-1], FinishStep)
    with pytest.raises(UnexpectedModelCall) as raised:
        await chunks(provider, 2)
    error = raised.value
    assert (error.script, error.step_number, error.script_steps) == ("main", 2, 2)
    assert "'main'" in error.message and "step 2" in error.message and "has 2 step(s)" in error.message
    assert not error.retryable
    assert provider.unexpected_calls == [error]


async def test_a_lenient_script_repeats_its_last_step() -> None:
    provider = ScriptedProvider({"main": [ScriptStep(text="again")]})
    assert isinstance((await chunks(provider, 5))[-1], FinishStep)
    assert provider.unexpected_calls == []


async def test_repeat_on_the_last_step_opts_a_strict_script_into_repetition() -> None:
    provider = ScriptedProvider({"main": [ScriptStep(text="again", repeat=True)]}, strict=True)
    for step_number in range(4):
        assert isinstance((await chunks(provider, step_number))[-1], FinishStep)
    assert provider.unexpected_calls == []


def test_repeat_is_only_for_the_last_step() -> None:
    with pytest.raises(ValueError, match="only a script's last step repeats"):
        ScriptedProvider({"main": [ScriptStep(text="a", repeat=True), ScriptStep(text="b")]})


async def test_the_harness_is_strict_and_a_turn_past_its_script_ends_in_an_error(
    make_engine: EngineFactory,
) -> None:
    """The ``make_engine`` harness fails a test at teardown on an unexpected call; this test expects
    one, so it empties the list the teardown checks."""
    h = await make_engine(scripts={"main": [CALL]}, tools=[make_tool("echo", echo)])
    events = await h.run("go")
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert "unexpected call" in end_of(events).error.message
    (unexpected,) = h.provider.inner.unexpected_calls
    assert (unexpected.step_number, unexpected.script_steps) == (1, 1)
    h.provider.inner.unexpected_calls.clear()


async def test_until_cancelled_streams_the_text_over_and_over(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="la ", delay_ms=1, until_cancelled=True)]})
    handle = await h.start("sing")
    deltas: list[str] = []

    async def read() -> None:
        async for response in handle:
            if response.event.WhichOneof("event") == "text_delta":
                deltas.append(response.event.text_delta.delta)

    reader = asyncio.create_task(read())
    await wait_until(lambda: len(deltas) >= 20, what="twenty deltas of a text of one word")
    assert h.engine.cancel(handle.request_id)
    await asyncio.wait_for(reader, 5)
    await asyncio.wait_for(handle.task, 5)
    assert set(deltas) == {"la "}
    stored = text_of((await h.store.load_messages(CONV))[-1])
    assert len(stored) >= 60 and stored == "la " * (len(stored) // 3)


async def test_until_cancelled_never_finishes_on_its_own() -> None:
    provider = ScriptedProvider({"main": [ScriptStep(text="a b ", delay_ms=1, until_cancelled=True)]})
    stream = provider.stream(request(0))
    texts = []
    async for chunk in stream:
        assert not isinstance(chunk, FinishStep)
        if isinstance(chunk, TextDelta):
            texts.append(chunk.delta)
        if len(texts) == 50:
            break
    await stream.aclose()
    assert texts == ["a ", "b "] * 25


@pytest.mark.parametrize(
    "step",
    [
        {"text": "x", "until_cancelled": True},  # no delay: a busy loop
        {"delay_ms": 5, "until_cancelled": True},  # no text
        {"text": "x", "delay_ms": 5, "until_cancelled": True, "tool_calls": [{"name": "t"}]},
    ],
)
def test_until_cancelled_needs_a_text_and_a_delay(step: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="until_cancelled"):
        ScriptStep.model_validate(step)


def test_the_yaml_entry_takes_strict_and_builds_a_strict_provider() -> None:
    entries = ENTRIES.validate_python(
        {"scripted": {"strict": True, "scripts": {"main": [{"text": "a"}, {"text": "b", "repeat": True}]}}}
    )
    provider = build_provider("scripted", entries["scripted"])
    assert isinstance(provider, ScriptedProvider) and provider.strict
    lenient = build_provider("scripted", ENTRIES.validate_python({"scripted": {"scripts": {}}})["scripted"])
    assert isinstance(lenient, ScriptedProvider) and not lenient.strict


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"strict": "sometimes"}, "strict"),
        ({"scripts": {"main": [{"text": "a", "repeat": True}, {"text": "b"}]}}, "only a script's last step"),
        ({"scripts": {"main": []}}, "has no steps"),
        ({"scripts": {"main": [{"text": "a", "until_cancelled": True}]}}, "until_cancelled"),
    ],
)
def test_the_yaml_entry_refuses_bad_options(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ENTRIES.validate_python({"scripted": {"type": "scripted", **entry}})


async def test_generated_call_ids_are_unique_in_the_transcript() -> None:
    """Fresh-user trial (stop 49): every turn's steps number from 0, so the demo model gave each
    turn's first call the id ``call_0_0``; a second turn's call waiting for approval then could
    not be answered (the answer matched the first turn's call: TOOL_CALL_NOT_PENDING). A generated
    id is now made unique against the request's transcript, as a real API's is; a script's own id
    is kept as given."""
    earlier = message_pb2.Message(id="a1", role=message_pb2.ROLE_ASSISTANT)
    for taken in ("call_0_0", "call_0_0_2"):
        earlier.parts.add().tool_call.tool_call_id = taken
    provider = ScriptedProvider({"main": TWO_CALLS})
    asked = ModelRequest(model="main", system="", messages=[earlier], tools=[], step_number=0)
    assert await _call_ids(provider, asked) == ["call_0_0_3", "call_0_0"]
    assert await _call_ids(provider, request(0)) == ["call_0_0", "call_0_0"]


async def test_two_turns_calls_get_their_own_ids(make_engine: EngineFactory) -> None:
    """The same through the engine: two turns of one conversation, each calling a tool in its first
    step, store two calls with two ids."""
    h = await make_engine(scripts={"main": [CALL, ScriptStep(text="done")]}, tools=[make_tool("echo", echo)])
    for text in ("one", "two"):
        assert end_of(await h.run(text)).status == event_pb2.TURN_STATUS_COMPLETED
    stored = await h.store.load_messages(CONV)
    ids = [p.tool_call.tool_call_id for m in stored for p in m.parts if p.WhichOneof("kind") == "tool_call"]
    assert ids == ["call_0_0", "call_0_0_2"]


async def _call_ids(provider: ScriptedProvider, asked: ModelRequest) -> list[str]:
    return [chunk.tool_call_id async for chunk in provider.stream(asked) if isinstance(chunk, ToolCall)]


async def test_the_reported_input_counts_the_system_prompt_and_tools_as_the_estimate_does() -> None:
    """A step without scripted input tokens reports what a budget's reservation estimates of the
    request (docs/providers.md, "scripted"): providers count the tool definitions as input, and a
    report that left them out made a demo step's input ~11 tokens against a ~235 reservation."""
    user = message_pb2.Message(id="u1", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "What is the weather in Paris today?"
    schema = {"type": "object", "properties": {"city": {"type": "string", "description": "a city"}}}
    tool = ToolDefinition(
        name="get_weather", description="The weather in a city, now. " * 8, input_schema=schema
    )

    async def reported(tools: tuple[ToolDefinition, ...]) -> tuple[int, int]:
        request = ModelRequest(model="main", system="Be brief.", messages=[user], tools=list(tools))
        chunks = [c async for c in ScriptedProvider({"main": [ScriptStep(text="Sunny.")]}).stream(request)]
        finish = chunks[-1]
        assert isinstance(finish, FinishStep) and finish.usage is not None
        return finish.usage.input_tokens, await EstimateTokens().count(request, None)

    bare, bare_estimate = await reported(())
    with_tool, tool_estimate = await reported((tool,))
    assert (bare, with_tool) == (bare_estimate, tool_estimate)
    assert with_tool > bare + 50  # the tool's definition is counted


async def test_a_step_reports_cache_reads_and_writes_as_scripted() -> None:
    """A script step's ``usage`` takes both cache counts (docs/cost.md prices cache writes at
    ``cache_write_mtok``), so prompt caching's pricing can be tried offline."""
    usage = ScriptedUsage(
        input_tokens=100, output_tokens=5, cached_input_tokens=60, cache_write_input_tokens=30
    )
    finish = (await chunks(ScriptedProvider({"main": [ScriptStep(text="Hi.", usage=usage)]}), 1))[-1]
    assert isinstance(finish, FinishStep) and finish.usage is not None
    assert (finish.usage.cached_input_tokens, finish.usage.cache_write_input_tokens) == (60, 30)


async def test_a_refused_request_reports_no_usage_and_an_in_stream_error_its_input() -> None:
    """``error`` with ``after_chunks: 0`` is a request the provider refused (a 429, a 529), which
    reports no usage (docs/providers.md, "Fallback across providers": a refused call reports no
    usage); one after chunks failed in its stream, after the input was reported."""
    refused = ScriptStep(text="Hello there.", error=ScriptedError(message="overloaded", status=529))
    seen: list[Any] = []
    with pytest.raises(ProviderError) as raised:
        async for chunk in ScriptedProvider({"main": [refused]}).stream(request(1)):
            seen.append(chunk)
    assert not raised.value.in_stream
    assert seen == []
    cut = ScriptStep(
        text="Hello there.", error=ScriptedError(message="overloaded", status=529, after_chunks=1)
    )
    seen = []
    with pytest.raises(ProviderError) as raised:
        async for chunk in ScriptedProvider({"main": [cut]}).stream(request(1)):
            seen.append(chunk)
    assert raised.value.in_stream
    assert isinstance(seen[0], UsageUpdate)  # the input, counted at stream start


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        # Anthropic's API, https://docs.claude.com/en/api/errors: the type it sends with each status.
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (409, "conflict_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),  # another 4xx
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
@pytest.mark.parametrize("after_chunks", [0, 1], ids=["refused", "in-stream"])
async def test_a_scripted_error_has_the_type_and_body_anthropic_sends_with_its_status(
    status: int, error_type: str, after_chunks: int
) -> None:
    step = ScriptStep(text="Hi.", error=ScriptedError(message="no", status=status, after_chunks=after_chunks))
    with pytest.raises(ProviderError) as raised:
        await chunks(ScriptedProvider({"main": [step]}), 0)
    assert (raised.value.status, raised.value.type) == (status, error_type)
    assert raised.value.body == {"type": "error", "error": {"type": error_type, "message": "no"}}


async def test_a_scripted_errors_own_type_wins() -> None:
    step = ScriptStep(error=ScriptedError(message="slow down", status=529, type="rate_limit_error"))
    with pytest.raises(ProviderError) as raised:
        await chunks(ScriptedProvider({"main": [step]}), 0)
    assert raised.value.type == "rate_limit_error"
