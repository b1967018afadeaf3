"""A turn's ``OnChunks`` batches as calls of its ``HookSession`` (``hook_session_chunks``):
docs/semantics.md §4 (remote middleware, "Chunks"), hooks.proto ``OnChunksRequest.last``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import test_remote_hooks
from support.engine_harness import end_of, text_of
from support.hook_server import RecordingHookServer, abort, held, serving
from support.waiting import wait_until
from test_remote_hooks import LONG_TEXT, RemoteEngine, counters_from_here, metric  # noqa: F401 (a fixture)

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks.session import HookSession, SessionBroken
from turnwire_server.remote_hooks.session_chunks import SessionChunks

remote_engine = test_remote_hooks.remote_engine  # the fixture


def _server(*hooks: hooks_pb2.Hook.ValueType) -> RecordingHookServer:
    options: dict[str, Any] = {"hook_session": True, "hook_session_chunks": True, "answers_together": True}
    return RecordingHookServer(hooks, **options) if hooks else RecordingHookServer(**options)


def _kinds(batches: list[Any]) -> list[str]:
    return [str(e.WhichOneof("event")) for b in batches for e in b.events]


async def test_the_batches_ride_the_session_in_order_with_the_turns_other_calls(
    remote_engine: RemoteEngine,
) -> None:
    server = _server()
    async with serving(server) as address:
        # No batch by time here (a slow machine's step may take 50 ms): the order is the calls'.
        harness, middleware = await remote_engine(address, chunks={"max_delay_ms": 10_000})
        assert middleware.session_chunks
        end = end_of(await harness.run("check", request_id="r-chunks"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 1  # no OnChunks call of its own: every call on the one stream
    assert all(c.stream for c in server.calls if c.rpc != "GetHookSubscriptions")
    rpcs = [c.rpc for c in server.calls if c.rpc != "GetHookSubscriptions"]
    # Each step's events before the hooks that follow them; the last batch with the last step's
    # OnStepFinish, before OnChatResponse.
    assert rpcs == [
        "BeforeTurn",
        "BeforeStep",
        "OnChunks",
        "BeforeToolCall",
        "OnChunks",
        "AfterToolCall",
        "OnStepFinish",
        "BeforeStep",
        "OnChunks",
        "OnChunks:end",
        "OnStepFinish",
        "OnChatResponse",
    ], rpcs
    batches = [c.request for c in server.calls if c.rpc == "OnChunks"]
    assert batches[0].turn.request_id == "r-chunks"
    assert not any(b.HasField("turn") for b in batches[1:])
    assert [b.last for b in batches] == [False, False, True]
    kinds = _kinds(batches)
    assert kinds[0] == "step_start" and kinds.count("step_start") == 2
    assert "tool_input_available" in kinds and "tool_output_available" in kinds
    assert kinds[-1] == "step_finish"
    assert "".join(e.text_delta.delta for b in batches for e in b.events if e.HasField("text_delta")) == (
        "Let me check.Done."
    )
    assert metric("turnwire_remote_hook_calls_total", server=address, hook="on_chunk") == 1
    assert metric("turnwire_remote_hook_chunk_batches_total", server=address) == 3
    # The server is told which step ends the turn, as an in-process on_step_finish is.
    assert [c.request.last_step for c in server.calls if c.rpc == "OnStepFinish"] == [False, True]


async def test_turn_end_waits_for_the_last_batchs_answer(remote_engine: RemoteEngine) -> None:
    # The server answers the last batch once its OnChunks handler returned: TurnEnd comes after.
    server = _server()
    release = asyncio.Event()

    async def answer(request: hooks_pb2.OnChunksRequest, context: Any) -> hooks_pb2.OnChunksResponse:
        if request.last:
            await release.wait()
        return hooks_pb2.OnChunksResponse()

    server.answers["OnChunks"] = answer
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        turn = asyncio.create_task(harness.run("check"))
        await wait_until(lambda: any(c.rpc == "OnChunks" and c.request.last for c in server.calls))
        await asyncio.sleep(0)
        assert not turn.done() and server.count("OnChatResponse") == 0
        release.set()
        assert end_of(await turn).status == event_pb2.TURN_STATUS_COMPLETED
    assert server.rpcs()[-2:] == ["OnStepFinish", "OnChatResponse"]


async def test_full_batches_go_at_once_and_unanswered_events_past_the_buffer_are_dropped(
    remote_engine: RemoteEngine,
) -> None:
    # The server holds its first batch's answer: at most buffer_events wait unanswered, the rest
    # of the turn's events are dropped and counted, and the turn is not slowed by them.
    server = _server(hooks_pb2.HOOK_ON_CHUNKS)
    release = asyncio.Event()
    server.answers["OnChunks"] = held(release, hooks_pb2.OnChunksResponse())
    async with serving(server) as address:
        harness, _ = await remote_engine(
            address,
            scripts={"main": [ScriptStep(text=LONG_TEXT, chunk_size=1)]},
            chunks={"max_events": 64, "max_delay_ms": 50, "buffer_events": 128},
        )
        turn = asyncio.create_task(harness.run("go"))
        await wait_until(
            lambda: metric("turnwire_remote_hook_chunk_events_total", server=address, result="dropped") > 0
        )
        release.set()
        end = end_of(await turn)
    assert text_of(end.message) == LONG_TEXT
    sent = metric("turnwire_remote_hook_chunk_events_total", server=address, result="sent")
    dropped = metric("turnwire_remote_hook_chunk_events_total", server=address, result="dropped")
    assert sent <= 128 and sent + dropped >= len(LONG_TEXT)
    batches = [c.request for c in server.calls if c.rpc == "OnChunks"]
    assert all(len(b.events) <= 64 for b in batches) and batches[-1].last


async def test_a_failed_batch_fails_open_and_counts_once(remote_engine: RemoteEngine) -> None:
    server = _server()
    server.answers["OnChunks"] = abort(grpc.StatusCode.INTERNAL, "chunks broke")
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        end = end_of(await harness.run("check"))
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
        assert text_of(end.message) == "Let me check.Done."
    batches = server.count("OnChunks")
    assert (
        metric("turnwire_remote_hook_errors_total", server=address, hook="on_chunk", kind="internal")
        == batches
    )


class _Session:
    """What SessionChunks uses of a HookSession: posted calls recorded, answered by the test."""

    def __init__(self) -> None:
        self.request_id = "r"
        self.calls: list[tuple[str, hooks_pb2.OnChunksRequest, asyncio.Future[Any]]] = []

    def _queue(self, how: str, request: hooks_pb2.OnChunksRequest) -> tuple[int, asyncio.Future[Any]]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.append((how, request, future))
        return len(self.calls), future

    def post(
        self, rpc: str, request: Any, trace_context: Any, *, now: bool = False
    ) -> tuple[int, asyncio.Future[Any]]:
        return self._queue("now" if now else "post", request)

    def expire_after(self, call_id: int, future: Any, seconds: float) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(seconds, lambda: None)


def _chunks(session: _Session, results: list[Any]) -> SessionChunks:
    return SessionChunks(
        session,  # type: ignore[arg-type]
        hooks_pb2.TurnInfo(request_id="r"),
        server="unit",
        max_events=3,
        max_delay_ms=10_000,
        buffer_events=100,
        deadline_seconds=10,
        trace_context=dict,
        on_result=results.append,
    )


def _text(delta: str) -> event_pb2.TurnEvent:
    event = event_pb2.TurnEvent()
    event.text_delta.delta = delta
    return event


async def test_a_full_batch_is_written_at_once_the_rest_rides_the_next_call_and_the_end_is_last() -> None:
    session, results = _Session(), list[BaseException | None]()
    chunks = _chunks(session, results)
    for delta in "abcd":
        chunks.add(0, _text(delta))
    # step_start + a, b: full (3) and written at once; c, d wait for the turn's next call.
    assert [(how, len(r.events), r.last) for how, r, _ in session.calls] == [("now", 3, False)]
    assert session.calls[0][1].turn.request_id == "r" and chunks.buffered
    chunks.end()
    assert [(how, len(r.events), r.last) for how, r, _ in session.calls[1:]] == [("post", 2, True)]
    assert not session.calls[1][1].HasField("turn")
    chunks.add(0, _text("e"))  # after the end: dropped, nothing sent
    assert len(session.calls) == 2 and chunks.ended
    for _, _, future in session.calls:
        future.set_result(hooks_pb2.OnChunksResponse())
    await asyncio.sleep(0)
    assert results == [None, None]


async def test_a_batch_queued_behind_another_calls_deadline_is_not_its_failure() -> None:
    session, results = _Session(), list[BaseException | None]()
    chunks = _chunks(session, results)
    for delta in "ab":
        chunks.add(0, _text(delta))
    chunks.flush()
    ((_, _, future),) = session.calls
    future.set_exception(SessionBroken(TimeoutError("no answer"), call_id=0))  # an earlier call's
    await asyncio.sleep(0)
    assert results == [] and chunks.ended  # dropped with the stream, not counted as its failure
    own = _chunks(session, results)
    own.add(0, _text("x"))
    own.flush()
    session.calls[-1][2].set_exception(SessionBroken(TimeoutError("no answer"), call_id=len(session.calls)))
    await asyncio.sleep(0)
    assert len(results) == 1 and isinstance(results[0], SessionBroken)


async def test_a_turns_batches_never_go_on_the_stream_once_it_carries_a_later_turn() -> None:
    session, results = _Session(), list[BaseException | None]()
    chunks = _chunks(session, results)
    chunks.add(0, _text("a"))
    session.request_id = "later"  # the turn ended without its end reaching here; the stream moved on
    chunks.end()
    assert session.calls == [] and chunks.ended


class _Call:
    """A ``HookSession`` call that records each write (the list of encoded calls) and holds the
    first one until :attr:`release` is set (the writer is busy meanwhile)."""

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []
        self.release = asyncio.Event()

    async def write(self, calls: list[bytes]) -> None:
        self.writes.append(calls)
        await self.release.wait()

    async def read(self) -> Any:
        await asyncio.Event().wait()

    def cancel(self) -> None:
        pass


class _Channel:
    def __init__(self, call: _Call) -> None:
        self.call = call

    def stream_stream(self, method: str, **serializers: Any) -> Any:
        return lambda metadata: self.call


async def test_a_request_holds_at_most_one_awaited_call_its_last() -> None:
    # hooks.proto HookSessionRequest: a server may answer a request's calls together once the
    # last is done, so an awaited call never goes in a request before another call.
    call = _Call()
    session = HookSession(_Channel(call), (), "r")
    request = hooks_pb2.AfterToolCallRequest()
    session.send("BeforeTurn", hooks_pb2.BeforeTurnRequest(), {})  # written at once: the writer is busy
    await wait_until(lambda: len(call.writes) == 1)
    ids = [session.post("AfterToolCall", request, {})[0]]
    ids.append(session.send("BeforeToolCall", hooks_pb2.BeforeToolCallRequest(), {})[0])
    ids.append(session.send("BeforeToolCall", hooks_pb2.BeforeToolCallRequest(), {})[0])
    ids.append(session.post("OnStepFinish", hooks_pb2.OnStepFinishRequest(), {})[0])
    call.release.set()
    await wait_until(lambda: len(call.writes) == 4)
    ids_of = [[hooks_pb2.HookCall.FromString(c).id for c in write] for write in call.writes[1:]]
    assert ids_of == [[ids[0], ids[1]], [ids[2]], [ids[3]]]
    session.break_(RuntimeError("done"))
