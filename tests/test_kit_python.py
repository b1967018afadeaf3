"""The Python kit (``turnwire.kit``, docs/api/kit-python.md) at the wire, called as the sidecar
calls it: subscriptions derived from the overridden hooks, HookSession and unary answers and
failures, OnChunks, and the tool host's listing, results, preliminary results, errors and
cancellation. The sidecar driving a kit end to end is the kit conformance suite
(clients/conformance/kits, `make kit-conformance`)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import BaseModel
from support.waiting import wait_until

from turnwire.kit import (
    HookServer,
    ToolHost,
    allow,
    block,
    call_info,
    start,
    substitute,
    tool_input,
    tool_spec,
)
from turnwire.kit import hook_server as kit_hook_server
from turnwire.tools import PythonTool, ToolError, ToolExecution, tool
from turnwire_client.v1 import event_pb2, hooks_pb2, hooks_pb2_grpc, tools_pb2, tools_pb2_grpc

BIG = 2**64 + 1
DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api" / "kit-python.md"


class Policy(HookServer):
    """Blocks `delete`, rewrites `echo`'s input, fails on `explode`; records what it observed."""

    def __init__(self) -> None:
        self.observed: list[str] = []
        self.chunk_kinds: list[str] = []

    async def before_tool_call(
        self, request: hooks_pb2.BeforeToolCallRequest
    ) -> hooks_pb2.BeforeToolCallResponse | None:
        name = request.call.tool_name
        if name == "delete":
            return block("no deleting")
        if name == "explode":
            raise RuntimeError("the policy exploded")
        if name == "echo":
            return allow({**tool_input(request.call), "checked": True})
        if name == "confused":
            return hooks_pb2.BeforeTurnResponse()  # type: ignore[return-value]  # a mistake, on purpose
        return None

    async def after_tool_call(self, request: hooks_pb2.AfterToolCallRequest) -> None:
        self.observed.append(request.call.tool_name)

    async def on_chunks(self, turn: hooks_pb2.TurnInfo, events: AsyncIterator[event_pb2.TurnEvent]) -> None:
        async for event in events:
            self.chunk_kinds.append(f"{turn.request_id}:{event.WhichOneof('event')}")
            return  # leaves the rest unread: the kit drains it


class Slow(BaseModel):
    pass


class Count(BaseModel):
    to: int


started: list[ToolExecution] = []
cancelled: list[ToolExecution] = []
flag_when_cancelled: list[bool] = []


@tool(Slow)
async def wait_forever(input: Slow, execution: ToolExecution) -> Any:
    """Wait until cancelled."""
    started.append(execution)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        flag_when_cancelled.append(execution.cancelled.is_set())
        cancelled.append(execution)
        raise


@tool(Count)
async def count(input: Count, execution: ToolExecution) -> Any:
    """Count to `to`, as preliminary results; the last is the final one."""
    for i in range(1, input.to + 1):
        yield {"i": i, "big": BIG}


@tool(Count)
async def count_then_wait(input: Count, execution: ToolExecution) -> Any:
    """Count to `to` as preliminary results, then wait until cancelled."""
    for i in range(1, input.to + 1):
        yield {"i": i}
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        flag_when_cancelled.append(execution.cancelled.is_set())
        cancelled.append(execution)
        raise
    yield "never"


@tool(Count)
async def refuse(input: Count, execution: ToolExecution) -> Any:
    """Fail."""
    raise ToolError(f"refused {input.to}")


@pytest.fixture
def policy() -> Policy:
    return Policy()


@pytest.fixture
async def channel(policy: Policy) -> AsyncIterator[grpc.aio.Channel]:
    served = await start(hooks=policy, tools=[wait_forever, count, refuse, count_then_wait])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
        yield channel
    await served.stop(0)


def _call(name: str, input: dict[str, Any]) -> hooks_pb2.BeforeToolCallRequest:
    info = hooks_pb2.ToolCallInfo(tool_call_id="c1", tool_name=name, input_json=json.dumps(input))
    return hooks_pb2.BeforeToolCallRequest(turn=hooks_pb2.TurnInfo(request_id="r1"), call=info)


async def test_subscriptions_are_the_overridden_hooks(channel: grpc.aio.Channel) -> None:
    stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
    answer = await stub.GetHookSubscriptions(hooks_pb2.GetHookSubscriptionsRequest())
    assert list(answer.hooks) == [
        hooks_pb2.HOOK_BEFORE_TOOL_CALL,
        hooks_pb2.HOOK_AFTER_TOOL_CALL,
        hooks_pb2.HOOK_ON_CHUNKS,
    ]
    assert answer.hook_session and answer.hook_session_chunks and not answer.include_messages


async def test_unary_decisions_keep_big_integers_and_a_raising_hook_fails_the_call(
    channel: grpc.aio.Channel,
) -> None:
    stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
    blocked = await stub.BeforeToolCall(_call("delete", {}))
    assert blocked.WhichOneof("decision") == "block" and blocked.block.reason == "no deleting"
    edited = await stub.BeforeToolCall(_call("echo", {"n": BIG}))
    assert edited.allow_with_input.input_json == f'{{"n":{BIG},"checked":true}}'
    assert (await stub.BeforeToolCall(_call("other", {}))).WhichOneof("decision") is None
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.BeforeToolCall(_call("explode", {}))
    # UNKNOWN, as gRPC's own servers answer a handler's exception (and the other kits do).
    assert failure.value.code() == grpc.StatusCode.UNKNOWN
    assert failure.value.details() == "the policy exploded"
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await stub.BeforeToolCall(_call("confused", {}))
    assert failure.value.code() == grpc.StatusCode.INTERNAL
    assert failure.value.details() == (
        "hook before_tool_call returned BeforeTurnResponse, not BeforeToolCallResponse or None"
    )


async def test_hook_session_answers_in_order_and_goes_on_after_a_failure(channel: grpc.aio.Channel) -> None:
    stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
    calls = [
        hooks_pb2.HookCall(id=1, before_tool_call=_call("explode", {})),
        hooks_pb2.HookCall(id=2, after_tool_call=hooks_pb2.AfterToolCallRequest(call=_call("x", {}).call)),
        hooks_pb2.HookCall(id=3, before_tool_call=_call("delete", {})),
    ]
    session = stub.HookSession()
    await session.write(hooks_pb2.HookSessionRequest(calls=calls))
    answers = list((await session.read()).answers)  # one response: a request's answers go together
    await session.done_writing()
    assert [a.id for a in answers] == [1, 2, 3]
    assert answers[0].error.code == grpc.StatusCode.UNKNOWN.value[0]
    assert answers[0].error.message == "the policy exploded"
    assert answers[1].WhichOneof("hook") == "after_tool_call"
    assert answers[2].before_tool_call.block.reason == "no deleting"


async def test_on_chunks_sees_the_turn_and_the_unread_rest_is_drained(
    channel: grpc.aio.Channel, policy: Policy
) -> None:
    stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
    text = event_pb2.TurnEvent(text_delta=event_pb2.TextDelta(delta="hi"))
    requests = [
        hooks_pb2.OnChunksRequest(turn=hooks_pb2.TurnInfo(request_id="r9"), events=[text, text]),
        hooks_pb2.OnChunksRequest(events=[text]),
    ]
    assert await stub.OnChunks(iter(requests)) == hooks_pb2.OnChunksResponse()
    assert policy.chunk_kinds == ["r9:text_delta"]


class GatedChunks(HookServer):
    """An ``on_chunks`` that reads nothing until :attr:`gate` opens and returns once :attr:`finish`
    is set after its input ended (:attr:`ended`); records each run's turn and events."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.finish = asyncio.Event()
        self.ended = False
        self.runs: list[tuple[str, list[str]]] = []
        self.cancelled = 0

    async def on_chunks(self, turn: hooks_pb2.TurnInfo, events: AsyncIterator[event_pb2.TurnEvent]) -> None:
        run: tuple[str, list[str]] = (turn.request_id, [])
        self.runs.append(run)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        async for event in events:
            run[1].append(event.text_delta.delta)
        self.ended = True
        await self.finish.wait()


def _batch(call_id: int, deltas: str, *, turn: str = "", last: bool = False) -> hooks_pb2.HookCall:
    batch = hooks_pb2.OnChunksRequest(
        events=[event_pb2.TurnEvent(text_delta=event_pb2.TextDelta(delta=d)) for d in deltas], last=last
    )
    if turn:
        batch.turn.request_id = turn
    return hooks_pb2.HookCall(id=call_id, parent_request_id="t1", on_chunks=batch)


async def test_chunk_batches_on_the_session_never_wait_for_on_chunks_but_the_last_does() -> None:
    """hooks.proto ``OnChunksRequest.last``: a batch is answered once queued, so the calls after
    it are not held by a slow ``on_chunks``; the last batch is answered once it has returned; a
    batch after that starts the hook again; events past MAX_WAITING_EVENTS are dropped. A
    request's answers come in one response."""
    server = GatedChunks()
    served = await start(hooks=server)
    waiting = kit_hook_server.MAX_WAITING_EVENTS
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            session = hooks_pb2_grpc.TurnHooksServiceStub(channel).HookSession()
            batches = [_batch(1, "ab", turn="t1"), _batch(2, "x" * (waiting + 10)), _batch(3, "c")]
            await session.write(hooks_pb2.HookSessionRequest(calls=batches))
            answers = (await session.read()).answers
            assert [(a.id, a.WhichOneof("hook")) for a in answers] == [(i, "on_chunks") for i in (1, 2, 3)]
            assert server.runs == [("t1", [])]  # answered while the hook reads nothing
            server.gate.set()
            await wait_until(lambda: len(server.runs[0][1]) == waiting)
            assert server.runs[0][1] == ["a", "b", *("x" * (waiting - 2))]  # the rest was dropped
            await session.write(hooks_pb2.HookSessionRequest(calls=[_batch(4, "", last=True)]))
            last = asyncio.ensure_future(session.read())
            await wait_until(lambda: server.ended)  # its input ended: the last batch was taken
            for _ in range(20):
                await asyncio.sleep(0)  # a loop turn for an answer sent too early to arrive
            assert not last.done()  # the hook has not returned yet
            server.finish.set()
            assert [a.id for a in (await last).answers] == [4]
            await session.write(hooks_pb2.HookSessionRequest(calls=[_batch(5, "d", turn="t1", last=True)]))
            assert [a.id for a in (await session.read()).answers] == [5]
            assert server.runs[1] == ("t1", ["d"])  # a new run of the hook for the same turn
            await session.done_writing()
    finally:
        await served.stop(0)


async def test_on_chunks_left_running_when_its_session_ends_is_cancelled() -> None:
    server = GatedChunks()
    served = await start(hooks=server)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            session = hooks_pb2_grpc.TurnHooksServiceStub(channel).HookSession()
            await session.write(hooks_pb2.HookSessionRequest(calls=[_batch(1, "a", turn="t1")]))
            assert (await session.read()).answers[0].id == 1
            await session.done_writing()  # the turn's last batch never comes
            await wait_until(lambda: server.cancelled == 1)
    finally:
        await served.stop(0)


async def test_a_session_batch_for_a_server_without_on_chunks_is_unimplemented() -> None:
    served = await start(hooks=HookServer())  # no hooks
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            session = hooks_pb2_grpc.TurnHooksServiceStub(channel).HookSession()
            await session.write(hooks_pb2.HookSessionRequest(calls=[_batch(1, "a", turn="t1", last=True)]))
            answer = (await session.read()).answers[0]
            assert answer.error.code == grpc.StatusCode.UNIMPLEMENTED.value[0]
            await session.done_writing()
    finally:
        await served.stop(0)


async def test_the_tool_host_lists_runs_streams_and_fails_tools(channel: grpc.aio.Channel) -> None:
    stub = tools_pb2_grpc.ToolExecutorServiceStub(channel)
    listing = await stub.ListTools(tools_pb2.ListToolsRequest())
    assert [t.name for t in listing.tools] == ["wait_forever", "count", "refuse", "count_then_wait"]
    assert dict(listing.tools[1].input_schema)["required"] == ["to"]
    assert listing.instance_id

    async def run(name: str, input_json: str) -> list[tuple[str, str]]:
        request = tools_pb2.ExecuteToolRequest(tool_name=name, input_json=input_json, request_id="r1")
        return [
            (m.WhichOneof("result"), getattr(m, m.WhichOneof("result")))
            async for m in stub.ExecuteTool(request)
        ]

    streamed = await run("count", '{"to": 3}')
    assert streamed == [
        ("preliminary_output_json", f'{{"i":1,"big":{BIG}}}'),
        ("preliminary_output_json", f'{{"i":2,"big":{BIG}}}'),
        ("output_json", f'{{"i":3,"big":{BIG}}}'),
    ]
    assert await run("refuse", '{"to": 7}') == [("error", "refused 7")]
    [(kind, text)] = await run("count", '{"to": "many"}')
    assert kind == "error" and "invalid input for tool 'count'" in text
    assert await run("count", "[1]") == [("error", "The tool input is not a JSON object: '[1]'")]
    assert await run("nothing", "{}") == [("error", "this host has no tool 'nothing'")]


async def test_a_cancelled_call_cancels_the_tool(channel: grpc.aio.Channel) -> None:
    stub = tools_pb2_grpc.ToolExecutorServiceStub(channel)
    call = stub.ExecuteTool(
        tools_pb2.ExecuteToolRequest(
            tool_name="wait_forever", tool_call_id="c7", idempotency_key="tw-k-1", rerun=True
        )
    )
    reading = asyncio.ensure_future(call.read())
    await wait_until(lambda: any(e.tool_call_id == "c7" for e in started), what="the tool's start")
    flag_when_cancelled.clear()
    cancelled.clear()
    call.cancel()
    executions = await wait_until(lambda: list(cancelled), what="the tool's cancellation")
    assert executions[0].tool_call_id == "c7" and executions[0].idempotency_key == "tw-k-1"
    assert executions[0].rerun, "a re-run after a crash is told so (docs/semantics.md §8)"
    assert executions[0].cancelled.is_set()
    # Set before the tool got its CancelledError, as for a tool in the sidecar's own process
    # (before: set only once the error had left the tool).
    assert flag_when_cancelled == [True]
    reading.cancel()


async def test_a_cancelled_call_cancels_a_streaming_tool_with_its_flag_set(channel: grpc.aio.Channel) -> None:
    stub = tools_pb2_grpc.ToolExecutorServiceStub(channel)
    call = stub.ExecuteTool(
        tools_pb2.ExecuteToolRequest(tool_name="count_then_wait", tool_call_id="c8", input_json='{"to": 2}')
    )
    first = await call.read()  # the first yield is sent once the second came
    assert first.preliminary_output_json == '{"i":1}'
    reading = asyncio.ensure_future(call.read())
    flag_when_cancelled.clear()
    cancelled.clear()
    call.cancel()
    executions = await wait_until(lambda: list(cancelled), what="the streaming tool's cancellation")
    assert executions[0].tool_call_id == "c8" and flag_when_cancelled == [True]
    reading.cancel()


def test_tool_specs_carry_approval_and_timeout_and_refuse_what_cannot_cross() -> None:
    guarded = PythonTool(
        "guarded",
        "Needs approval.",
        lambda i, e: None,
        input_schema={"type": "object"},
        needs_approval=True,
        idempotent=True,
    )
    guarded.timeout_seconds = 2.5  # type: ignore[attr-defined]
    spec = tool_spec(guarded)
    assert spec.requires_approval and spec.timeout.seconds == 2 and spec.timeout.nanos == 500_000_000
    assert spec.idempotent
    by_input = PythonTool(
        "by_input", "", lambda i, e: None, input_schema={"type": "object"}, needs_approval=lambda i: True
    )
    with pytest.raises(ValueError, match="True or False, not a function"):
        tool_spec(by_input)
    with pytest.raises(ValueError, match="two tools have the same name"):
        ToolHost([count, count])
    assert substitute({"n": BIG}).substitute.output_json == f'{{"n":{BIG}}}'


async def test_the_docs_example_decides_and_runs_as_the_page_says() -> None:
    """docs/api/kit-python.md's program, served: its policy and its tool behave as described."""
    code = re.search(r"^```python\n(.*?)^```", DOCS_PAGE.read_text(), re.DOTALL | re.MULTILINE)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "kit_docs_example"}
    exec(compile(code.group(1), "kit-python.md", "exec"), namespace)
    served = await start(hooks=namespace["Policy"](), tools=[namespace["refund"]])
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            hooks = hooks_pb2_grpc.TurnHooksServiceStub(channel)
            big = await hooks.BeforeToolCall(_call("refund", {"order_id": "A1", "amount_cents": 60_000}))
            assert big.block.reason == "refunds above 500 EUR need a human"
            small = await hooks.BeforeToolCall(
                _call("refund", {"order_id": "A1", "amount_cents": 100, "currency": "USD"})
            )
            assert json.loads(small.allow_with_input.input_json) == {
                "order_id": "A1",
                "amount_cents": 100,
                "currency": "EUR",
            }
            turn = await hooks.BeforeTurn(hooks_pb2.BeforeTurnRequest(system="Be brief."))
            assert turn.system == "Be brief.\nAnswer in English."
            tools = tools_pb2_grpc.ToolExecutorServiceStub(channel)
            request = tools_pb2.ExecuteToolRequest(
                tool_name="refund", input_json='{"order_id": "X9", "amount_cents": 5, "currency": "EUR"}'
            )
            assert [m.error async for m in tools.ExecuteTool(request)] == ["order X9 is closed"]
    finally:
        await served.stop(0)


class Traced(HookServer):
    """Answers before_turn with what call_info() saw, as the system prompt."""

    async def before_turn(self, request: hooks_pb2.BeforeTurnRequest) -> hooks_pb2.BeforeTurnResponse:
        info = call_info()
        return hooks_pb2.BeforeTurnResponse(
            system=f"{info.parent_request_id}|{info.trace_context.get('traceparent', '')}"
        )


@tool(Slow)
async def traced_tool(input: Slow, execution: ToolExecution) -> Any:
    """Return what call_info() saw."""
    return {"parent": call_info().parent_request_id, "trace": dict(call_info().trace_context)}


async def test_call_info_gives_the_parent_request_id_and_trace_context() -> None:
    """Unary hooks and tools take the trace context from the metadata, HookSession calls from
    each HookCall; the parent request id comes from the metadata."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    served = await start(hooks=Traced(), tools=[traced_tool])
    metadata = (("turnwire-parent-request-id", "r42"), ("traceparent", parent))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            hooks = hooks_pb2_grpc.TurnHooksServiceStub(channel)
            unary = await hooks.BeforeTurn(hooks_pb2.BeforeTurnRequest(), metadata=metadata)
            assert unary.system == f"r42|{parent}"
            session = hooks.HookSession(metadata=(metadata[0],))
            call = hooks_pb2.HookCall(
                id=1, trace_context={"traceparent": "00-1-2-01"}, before_turn=hooks_pb2.BeforeTurnRequest()
            )
            await session.write(hooks_pb2.HookSessionRequest(calls=[call]))
            assert (await session.read()).answers[0].before_turn.system == "r42|00-1-2-01"
            await session.done_writing()
            tools = tools_pb2_grpc.ToolExecutorServiceStub(channel)
            request = tools_pb2.ExecuteToolRequest(tool_name="traced_tool", input_json="{}")
            [message] = [m async for m in tools.ExecuteTool(request, metadata=metadata)]
            assert json.loads(message.output_json) == {"parent": "r42", "trace": {"traceparent": parent}}
    finally:
        await served.stop(0)
    with pytest.raises(LookupError):
        call_info()


def test_a_hook_can_render_the_error_details_it_is_given() -> None:
    # A fresh interpreter that imports only the kit and the hook messages, as a hook server does:
    # rendering a failed turn's status (its ErrorInfo packed in an Any) raised TypeError "Can not
    # find message descriptor by type_url", so a hook that logged its request failed its call.
    program = """
from google.protobuf import any_pb2, json_format
from turnwire.kit import HookServer
from turnwire_client.v1 import hooks_pb2

info = bytes([0x0A, 5]) + b"OOPS!"  # google.rpc.ErrorInfo{reason: "OOPS!"}, as the sidecar sends it
detail = any_pb2.Any(type_url="type.googleapis.com/google.rpc.ErrorInfo", value=info)
request = hooks_pb2.OnChatErrorRequest()
request.failure.error.code = 3
request.failure.error.details.append(detail)
print(json_format.MessageToJson(request, indent=None))
"""
    done = subprocess.run(
        [sys.executable, "-c", program], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert '"reason": "OOPS!"' in done.stdout


class ObservingSteps(HookServer):
    """Observes before_step, yet answers a change (which the kit empties, with a warning)."""

    observed_hooks = frozenset({"before_step"})

    async def before_step(self, request: hooks_pb2.BeforeStepRequest) -> hooks_pb2.BeforeStepResponse | None:
        return hooks_pb2.BeforeStepResponse(system="a change the sidecar would ignore")


async def test_an_observed_hooks_change_is_answered_empty_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = await start(hooks=ObservingSteps())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
            subscriptions = await stub.GetHookSubscriptions(hooks_pb2.GetHookSubscriptionsRequest())
            assert list(subscriptions.hooks) == [hooks_pb2.HOOK_BEFORE_STEP]
            assert list(subscriptions.observed_hooks) == [hooks_pb2.HOOK_BEFORE_STEP]
            with caplog.at_level(logging.WARNING, logger="turnwire.kit"):
                assert await stub.BeforeStep(hooks_pb2.BeforeStepRequest()) == hooks_pb2.BeforeStepResponse()
                session = stub.HookSession()
                call = hooks_pb2.HookCall(id=1, before_step=hooks_pb2.BeforeStepRequest())
                await session.write(hooks_pb2.HookSessionRequest(calls=[call]))
                (answer,) = (await session.read()).answers
                await session.done_writing()
            assert answer.WhichOneof("hook") == "before_step" and not answer.before_step.ByteSize()
            warnings = [r.getMessage() for r in caplog.records if "is observed" in r.getMessage()]
            assert warnings == ["hook before_step is observed (observed_hooks): its answer is ignored"]
    finally:
        await served.stop(0)


class ObservingTheEnd(HookServer):
    """Observes the turn's end hooks; its on_chat_error answers a change the kit empties."""

    observed_hooks = frozenset({"on_chat_response", "on_chat_error"})

    async def on_chat_response(self, request: hooks_pb2.OnChatResponseRequest) -> None:
        pass

    async def on_chat_error(self, request: hooks_pb2.OnChatErrorRequest) -> hooks_pb2.OnChatErrorResponse:
        return hooks_pb2.OnChatErrorResponse(message="a change the sidecar would ignore")


async def test_the_turns_end_hooks_may_be_observed(caplog: pytest.LogCaptureFixture) -> None:
    served = await start(hooks=ObservingTheEnd())
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
            stub = hooks_pb2_grpc.TurnHooksServiceStub(channel)
            subscriptions = await stub.GetHookSubscriptions(hooks_pb2.GetHookSubscriptionsRequest())
            ends = [hooks_pb2.HOOK_ON_CHAT_RESPONSE, hooks_pb2.HOOK_ON_CHAT_ERROR]
            assert list(subscriptions.hooks) == ends
            assert list(subscriptions.observed_hooks) == ends
            with caplog.at_level(logging.WARNING, logger="turnwire.kit"):
                for _ in range(2):
                    answer = await stub.OnChatError(hooks_pb2.OnChatErrorRequest())
                    assert answer == hooks_pb2.OnChatErrorResponse()
            warnings = [r.getMessage() for r in caplog.records if "is observed" in r.getMessage()]
            assert warnings == ["hook on_chat_error is observed (observed_hooks): its answer is ignored"]
    finally:
        await served.stop(0)


def test_observed_hooks_must_be_deciding_hooks_the_server_implements() -> None:
    class Misnamed(HookServer):
        observed_hooks = frozenset({"on_step_finish"})

        async def on_step_finish(self, request: hooks_pb2.OnStepFinishRequest) -> None:
            pass

    class Missing(HookServer):
        observed_hooks = frozenset({"before_turn"})

        async def on_step_finish(self, request: hooks_pb2.OnStepFinishRequest) -> None:
            pass

    class Two(HookServer):
        observed_hooks = frozenset({"after_tool_call", "classify_chat_error"})

        async def after_tool_call(self, request: hooks_pb2.AfterToolCallRequest) -> None:
            pass

    never_waited = r"the sidecar never waits for on_step_finish on a HookSession anyway: leave it out$"
    misnamed = r"on_step_finish is not a hook you can observe \(.*\); " + never_waited
    with pytest.raises(TypeError, match=misnamed):
        Misnamed().servicer()
    with pytest.raises(TypeError) as two:
        Two().servicer()
    assert str(two.value) == (
        "observed_hooks: after_tool_call, classify_chat_error are not hooks you can observe"
        " (before_step, before_tool_call, before_turn, on_chat_error, on_chat_response);"
        " the sidecar never waits for after_tool_call on a HookSession anyway: leave them out"
    )
    with pytest.raises(TypeError, match="before_turn is not implemented by Missing"):
        Missing().servicer()


def test_observed_hooks_of_the_wrong_shape_say_what_to_give() -> None:
    # Fresh-user trial: a plain string was split into letters, the proto's enum values failed
    # with an internal join error.
    class AString(HookServer):
        observed_hooks = "before_step"  # type: ignore[assignment]

        async def before_step(self, request: hooks_pb2.BeforeStepRequest) -> None:
            pass

    class Enums(AString):
        observed_hooks = frozenset({hooks_pb2.HOOK_BEFORE_STEP})  # type: ignore[assignment]

    for server in (AString(), Enums()):
        with pytest.raises(TypeError, match=r"give a set of hook method names, e\.g\. frozenset"):
            server.servicer()


def test_a_method_named_like_a_hook_that_is_none_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    class Misspelt(HookServer):
        async def on_chunk(self, turn: Any, events: Any) -> None:  # the in-process hook's name
            pass

        async def on_chat_responce(self, request: Any) -> None:
            pass

        async def on_step_finish(self, request: hooks_pb2.OnStepFinishRequest) -> None:
            pass

    with caplog.at_level(logging.WARNING, logger="turnwire.kit"):
        Misspelt().servicer()
    warned = sorted(r.getMessage().split(" is no hook")[0] for r in caplog.records)
    assert warned == ["Misspelt.on_chat_responce", "Misspelt.on_chunk"]
