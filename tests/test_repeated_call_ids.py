"""A provider of one's own that gives two tool calls of a turn one id (docs/semantics.md §11,
"Tool call identity"; docs/providers.md, "Tool call ids"): the built-in adapters rename a repeat
(``turnwire.providers.unique_id``), and the engine fails the step on one that reaches it instead
of pairing a result with the wrong call or overwriting a complete call's input."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

from pydantic import BaseModel
from support.engine_harness import CONV, EngineFactory, end_of, of_kind

from turnwire import types as chunks
from turnwire.providers import ModelRequest
from turnwire.tools import ToolExecution, tool
from turnwire_client.v1 import event_pb2


class Steps:
    """A provider (``chunks:<any>``) that streams one list of chunks per model call."""

    def __init__(self, *steps: Sequence[chunks.ModelChunk]) -> None:
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    def has_model(self, model: str) -> bool:
        return True

    async def stream(self, request: ModelRequest) -> AsyncGenerator[chunks.ModelChunk, None]:
        self.requests.append(request)
        for chunk in self.steps[len(self.requests) - 1]:
            yield chunk

    async def aclose(self) -> None:
        return None


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


async def _repeated(make_engine: EngineFactory, provider: Steps) -> event_pb2.TurnEnd:
    RAN.clear()
    h = await make_engine(providers={"chunks": provider}, tools=[add])
    events = await h.run("add them", model="chunks:m")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR, end
    assert "gave a second tool call of this turn the id 'call_0'" in end.error.message
    stored = (await h.store.load_messages(CONV))[-1]
    calls = [p.tool_call for p in stored.parts if p.WhichOneof("kind") == "tool_call"]
    assert [c.input_json for c in calls if c.tool_call_id == "call_0"] == ['{"a": 1, "b": 2}'], (
        "kept as given"
    )
    assert len(of_kind(events, "tool_input_available")) == 1
    return end


async def test_two_calls_of_one_step_with_one_id_fail_the_step(make_engine: EngineFactory) -> None:
    await _repeated(make_engine, Steps([*_call("call_0", 1, 2), *_call("call_0", 3, 4), TOOL_STEP]))
    assert RAN == [], "no call of the step ran"


async def test_a_later_step_reusing_an_earlier_calls_id_fails(make_engine: EngineFactory) -> None:
    provider = Steps(
        [*_call("call_0", 1, 2, streamed=True), TOOL_STEP],
        [*_call("call_0", 3, 4, streamed=True), TOOL_STEP],  # a server that numbers per response
    )
    await _repeated(make_engine, provider)
    assert RAN == [(1, 2)], "the first step's call ran, the repeat did not"
    assert len(provider.requests) == 2


async def test_a_streamed_call_completing_under_its_own_id_is_no_repeat(make_engine: EngineFactory) -> None:
    RAN.clear()
    provider = Steps(
        [*_call("call_0", 1, 2, streamed=True), *_call("call_1", 3, 4, streamed=True), TOOL_STEP],
        [
            chunks.TextStart("t"),
            chunks.TextDelta("t", "3 and 7"),
            chunks.TextEnd("t"),
            chunks.FinishStep(chunks.FinishReason.STOP),
        ],
    )
    h = await make_engine(providers={"chunks": provider}, tools=[add])
    events = await h.run("add them", model="chunks:m")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert sorted(RAN) == [(1, 2), (3, 4)]
