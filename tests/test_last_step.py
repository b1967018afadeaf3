"""``StepFinishContext.last_step`` (docs/semantics.md §3): ``on_step_finish`` is told when the
turn's steps end with this one, whatever ends them (no tool result to answer, a ``stop_when``
condition, ``max_steps``), and only then; the remote middleware sends the end of the turn's
``OnChunks`` call at that point, so the call's close overlaps the turn's final write instead of
adding to ``on_chat_response`` (issue 33: what a remote hook adds to a turn)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel
from support.engine_harness import EngineFactory, echo, end_of, make_tool, text_of
from support.hook_server import RecordingHookServer, serving
from support.waiting import wait_until

from turnwire.hooks import (
    ChatResponseContext,
    ChunkContext,
    Middleware,
    SessionContext,
    StepFinishContext,
    StopWhen,
    TurnConfig,
    TurnContext,
)
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution, tool
from turnwire.types import FinishReason, TextDelta, Usage
from turnwire_client.v1 import event_pb2, hooks_pb2, message_pb2
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.remote_hooks.chunks import ChunkStream
from turnwire_server.remote_hooks.settings import RemoteHookSettings

MODEL = "scripted:main"
CALL = ScriptStep(text="Checking.", tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})])


class _LastSteps(Middleware):
    """Records (step_number, last_step) of each ``on_step_finish``; ``stop_when`` for the turn."""

    def __init__(self, stop_when: list[StopWhen] | None = None) -> None:
        self.steps: list[tuple[int, bool]] = []
        self._stop_when = stop_when

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        return TurnConfig(stop_when=self._stop_when) if self._stop_when else None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.steps.append((ctx.step_number, ctx.last_step))


async def _steps_of(
    make_engine: EngineFactory, script: list[ScriptStep], **options: Any
) -> list[tuple[int, bool]]:
    recorder = _LastSteps(options.pop("stop_when", None))
    harness = await make_engine(
        scripts={"main": script}, tools=[make_tool("echo", echo)], middlewares=[recorder], **options
    )
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    return recorder.steps


REPEATING = [ScriptStep(text="again", tool_calls=[ScriptedToolCall(name="echo", input={})], repeat=True)]


@pytest.mark.parametrize(
    ("script", "options", "expected"),
    [
        ([CALL, ScriptStep(text="Done.")], {}, [(0, False), (1, True)]),  # no tool result to answer
        ([ScriptStep(text="Hi.")], {}, [(0, True)]),
        (REPEATING, {"max_steps": 3}, [(0, False), (1, False), (2, True)]),
        (REPEATING, {"max_steps": 5, "stop_when": [StopWhen(tool_called="echo")]}, [(0, True)]),
    ],
    ids=["tool-then-answer", "answer", "max-steps", "stop-when"],
)
async def test_only_the_step_the_turns_steps_end_with_is_the_last(
    make_engine: EngineFactory,
    script: list[ScriptStep],
    options: dict[str, Any],
    expected: list[tuple[int, bool]],
) -> None:
    assert await _steps_of(make_engine, script, **options) == expected


class _SeesTheChunksEnded(Middleware):
    """Listed before the remote middleware (``on_step_finish`` runs last to first, so after the
    remote one's): at the last step's ``on_step_finish``, before the turn's final write and
    ``on_chat_response``, the hook server has seen the turn's ``OnChunks`` call end."""

    def __init__(self, server: RecordingHookServer) -> None:
        self.server = server
        self.seen: list[tuple[int, bool]] = []

    def _ended(self) -> bool:
        return any(c.rpc == "OnChunks:end" for c in self.server.calls)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        if ctx.last_step:
            await wait_until(self._ended, timeout=5, what="the OnChunks call ended by the last step's end")
        self.seen.append((ctx.step_number, self._ended()))


async def test_the_turns_onchunks_call_ends_after_its_last_step_before_on_chat_response(
    make_engine: EngineFactory,
) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_ON_CHUNKS, hooks_pb2.HOOK_ON_CHAT_RESPONSE])
    async with serving(server) as address:
        remote = RemoteMiddleware(RemoteHookSettings(address=address))
        observer = _SeesTheChunksEnded(server)
        try:
            harness = await make_engine(
                scripts={"main": [CALL, ScriptStep(text="Done.")]},
                tools=[make_tool("echo", echo)],
                middlewares=[observer, remote],  # on_step_finish runs last to first: remote, then observer
            )
            await harness.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
            end = end_of(await harness.run("go"))
        finally:
            await remote.aclose()
    assert end.status == event_pb2.TURN_STATUS_COMPLETED and text_of(end.message) == "Checking.Done."
    assert observer.seen == [(0, False), (1, True)]
    # Every event still reached the server, the last step's step_finish included, and the call
    # ended once, before OnChatResponse.
    rpcs = [c.rpc for c in server.calls if c.rpc != "GetHookSubscriptions"]
    assert rpcs == ["OnChunks", "OnChunks:end", "OnChatResponse"], rpcs
    (call,) = [c for c in server.calls if c.rpc == "OnChunks"]
    kinds = [e.WhichOneof("event") for r in call.request for e in r.events]
    assert kinds.count("step_finish") == 2 and kinds[-1] == "step_finish"


class _Call:
    """A client-streaming call that records its requests and answers once ended."""

    def __init__(self) -> None:
        self.requests: list[hooks_pb2.OnChunksRequest] = []
        self.ended = False

    async def write(self, request: hooks_pb2.OnChunksRequest) -> None:
        self.requests.append(request)

    async def done_writing(self) -> None:
        self.ended = True

    def __await__(self) -> Any:
        return iter(())

    def cancel(self) -> None:
        pass


async def test_an_event_after_the_chunk_calls_end_is_dropped_and_counted() -> None:
    call = _Call()
    stream = ChunkStream(
        lambda: call,
        hooks_pb2.TurnInfo(request_id="r-late"),
        server="late-test",
        max_events=64,
        max_delay_ms=50,
        buffer_events=16,
        deadline_seconds=5,
        on_result=lambda error: None,
    )
    text = event_pb2.TurnEvent()
    text.text_delta.delta = "before"
    stream.add(0, text)
    stream.end()
    late = event_pb2.TurnEvent()
    late.text_delta.delta = "after"
    stream.add(0, late)
    await stream.close()
    assert call.ended
    sent = [e.text_delta.delta for r in call.requests for e in r.events if e.HasField("text_delta")]
    assert sent == ["before"]
    dropped = REGISTRY.get_sample_value(
        "turnwire_remote_hook_chunk_events_total", {"server": "late-test", "result": "dropped"}
    )
    assert dropped == 1


async def test_chunks_after_the_last_steps_end_go_on_a_new_call() -> None:
    # An attempt recovered after its last step's on_step_finish (a stall there, §5) streams
    # again: its chunks go on a new OnChunks call instead of the ended one.
    server = RecordingHookServer([hooks_pb2.HOOK_ON_CHUNKS, hooks_pb2.HOOK_ON_CHAT_RESPONSE])
    async with serving(server) as address:
        remote = RemoteMiddleware(RemoteHookSettings(address=address))
        try:
            await remote.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))

            def chunk(text: str) -> ChunkContext:
                return ChunkContext("c-late", "r-late", 0, TextDelta(id="t", delta=text))

            await remote.on_chunk(chunk("first attempt"))
            last = StepFinishContext(
                step_number=0, text="first attempt", reasoning=(), reasoning_text="", tool_calls=(),
                tool_results=(), finish_reason=FinishReason.STOP, raw_finish_reason="end_turn", usage=Usage(),
                conversation_id="c-late", request_id="r-late", last_step=True,
            )  # fmt: skip
            await remote.on_step_finish(last)
            await wait_until(lambda: server.count("OnChunks:end") == 1, what="the first call ended")
            await remote.on_chunk(chunk("recovered attempt"))
            await remote.on_chat_response(
                ChatResponseContext(
                    conversation_id="c-late",
                    request_id="r-late",
                    message=message_pb2.Message(),
                    continuation=False,
                    status="completed",
                )
            )
        finally:
            await remote.aclose()
    calls = [c for c in server.calls if c.rpc == "OnChunks"]
    deltas = [
        [e.text_delta.delta for r in c.request for e in r.events if e.HasField("text_delta")] for c in calls
    ]
    assert deltas == [["first attempt"], ["recovered attempt"]]
    assert server.count("OnChunks:end") == 2 and server.rpcs()[-1] == "OnChatResponse"


class _Pay(BaseModel):
    amount: int


@tool(_Pay, needs_approval=lambda input: input["amount"] > 100)
async def _pay(input: _Pay, execution: ToolExecution) -> dict[str, Any]:
    """Pay."""
    return {"paid": input.amount}


async def test_a_step_whose_call_waits_for_approval_is_the_last_though_another_call_ran(
    make_engine: EngineFactory,
) -> None:
    step = ScriptStep(
        tool_calls=[
            ScriptedToolCall(name="_pay", input={"amount": 5}),
            ScriptedToolCall(name="_pay", input={"amount": 500}),
        ]
    )
    recorder = _LastSteps()
    harness = await make_engine(
        scripts={"main": [step, ScriptStep(text="unreachable")]}, tools=[_pay], middlewares=[recorder]
    )
    end_of(await harness.run("pay"))
    assert recorder.steps == [(0, True)]  # a result to answer, but a call waits for the client
