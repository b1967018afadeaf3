"""A provider that gives two tool calls of a turn one id (docs/semantics.md §11, "Tool call
identity"; docs/providers.md, "Tool call ids"): the built-in adapters rename a repeat against the
request's transcript (``turnwire.providers.unique_id``), but a provider of one's own may not, and
a ``before_step`` hook may send a transcript without the turn's earlier calls. The engine gives
a repeat that reaches it the first free ``<id>_2`` …, and the call's other chunks follow it: each
call keeps its own input and result."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from support.chunk_steps import Steps
from support.engine_harness import CONV, EngineFactory, end_of, of_kind

from turnwire import types as chunks
from turnwire.tools import ToolExecution, tool
from turnwire_client.v1 import event_pb2, message_pb2


class Numbers(BaseModel):
    a: int
    b: int


RAN: list[tuple[int, int]] = []


@tool(Numbers)
async def add(input: Numbers, execution: ToolExecution) -> int:
    """Add two numbers."""
    RAN.append((input.a, input.b))
    return input.a + input.b


def _call(call_id: str, a: int, b: int, *, streamed: bool = False) -> list[chunks.ModelChunk]:
    complete = chunks.ToolCall(call_id, "add", {"a": a, "b": b}, raw_input=f'{{"a": {a}, "b": {b}}}')
    return [chunks.ToolInputStart(call_id, "add"), complete] if streamed else [complete]


TOOL_STEP = chunks.FinishStep(chunks.FinishReason.TOOL_CALLS)


async def _run(make_engine: EngineFactory, provider: Steps) -> tuple[list[event_pb2.TurnEvent], list[Any]]:
    RAN.clear()
    h = await make_engine(providers={"chunks": provider}, tools=[add])
    events = await h.run("add them", model="chunks:m")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED, end_of(events)
    stored = (await h.store.load_messages(CONV))[-1]
    calls = [p.tool_call for p in stored.parts if p.WhichOneof("kind") == "tool_call"]
    return events, calls


def _answer(text: str) -> list[chunks.ModelChunk]:
    return [chunks.TextStart("t"), chunks.TextDelta("t", text), chunks.TextEnd("t"), DONE]


DONE = chunks.FinishStep(chunks.FinishReason.STOP)


async def test_two_calls_of_one_step_with_one_id_each_keep_their_own(make_engine: EngineFactory) -> None:
    provider = Steps([*_call("call_0", 1, 2), *_call("call_0", 3, 4), TOOL_STEP], _answer("3 and 7"))
    events, calls = await _run(make_engine, provider)
    assert [(c.tool_call_id, c.output_json) for c in calls] == [("call_0", "3"), ("call_0_2", "7")]
    assert sorted(RAN) == [(1, 2), (3, 4)]
    starts = [e.tool_call_id for e in of_kind(events, "tool_input_available")]
    assert starts == ["call_0", "call_0_2"]
    # The next request carries each call with its own result.
    (sent,) = [m for m in provider.requests[1].messages if m.role == message_pb2.ROLE_ASSISTANT][-1:]
    assert [p.tool_call.tool_call_id for p in sent.parts if p.WhichOneof("kind") == "tool_call"] == [
        "call_0",
        "call_0_2",
    ]


async def test_a_later_step_reusing_an_earlier_calls_id_gets_its_own(make_engine: EngineFactory) -> None:
    """A server that numbers its calls per response; the input streams (start, deltas, the
    complete call) under the repeated id, and every chunk of it follows the new one."""
    provider = Steps(
        [*_call("call_0", 1, 2, streamed=True), TOOL_STEP],
        [
            chunks.ToolInputStart("call_0", "add"),
            chunks.ToolInputDelta("call_0", '{"a": 3, '),
            chunks.ToolInputDelta("call_0", '"b": 4}'),
            chunks.ToolCall("call_0", "add", {"a": 3, "b": 4}, raw_input='{"a": 3, "b": 4}'),
            TOOL_STEP,
        ],
        _answer("3 then 7"),
    )
    events, calls = await _run(make_engine, provider)
    assert [(c.tool_call_id, c.output_json) for c in calls] == [("call_0", "3"), ("call_0_2", "7")]
    assert RAN == [(1, 2), (3, 4)]
    deltas = of_kind(events, "tool_input_delta")
    assert {d.tool_call_id for d in deltas} == {"call_0_2"}


async def test_a_streamed_call_completing_under_its_own_id_is_no_repeat(make_engine: EngineFactory) -> None:
    provider = Steps(
        [*_call("call_0", 1, 2, streamed=True), *_call("call_1", 3, 4, streamed=True), TOOL_STEP],
        _answer("3 and 7"),
    )
    _, calls = await _run(make_engine, provider)
    assert [c.tool_call_id for c in calls] == ["call_0", "call_1"]
    assert sorted(RAN) == [(1, 2), (3, 4)]


async def test_a_late_provider_result_goes_to_the_renamed_call(make_engine: EngineFactory) -> None:
    """A provider-executed call renamed in a paused step (Anthropic's ``pause_turn``) gets its
    result in the next step under the provider's id: it goes to the renamed call, not to the
    turn's earlier call of that id."""
    search: list[chunks.ModelChunk] = [
        chunks.ToolInputStart("call_0", "web_search", provider_executed=True),
        chunks.ToolCall("call_0", "web_search", {"q": "x"}, raw_input='{"q": "x"}', provider_executed=True),
    ]
    provider = Steps(
        [*_call("call_0", 1, 2), TOOL_STEP],
        [*search, chunks.FinishStep(chunks.FinishReason.OTHER, paused=True)],
        [chunks.ToolResult("call_0", "web_search", output={"hits": 1}), *_answer("found")],
    )
    _, calls = await _run(make_engine, provider)
    assert [(c.tool_call_id, c.tool_name, c.output_json) for c in calls] == [
        ("call_0", "add", "3"),
        ("call_0_2", "web_search", '{"hits":1}'),
    ]
