"""The remote middleware's tests (``test_remote_hooks.py``) again, with the hook server offering
the ``HookSession`` stream: the same order, contents, decisions, deadlines, failure modes and
breaker when a turn's hook calls are messages of one stream (docs/semantics.md §4, remote
middleware), plus what only the stream does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from support.engine_harness import MODEL, EngineFactory, collect, end_of
from support.hook_server import RecordingHookServer, abort, held, serving, sleep_forever
from support.traces import memory_tracing, traceparent_of
from support.waiting import wait_until
from test_remote_hooks import *  # noqa: F403  # every test of the unary path, collected again here
from test_remote_hooks import (  # noqa: F401 (a fixture)
    PARENT,
    TURN_RPCS,
    RemoteEngine,
    counters_from_here,
    metric,
)

from turnwire.hooks import SessionContext
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.remote_hooks import session as session_module
from turnwire_server.remote_hooks.settings import RemoteHookSettings


@pytest.fixture(autouse=True)
def _hook_session() -> Iterator[None]:
    # Answered as the kits answer: a request's answers together, once its last call is done.
    RecordingHookServer.default_hook_session = RecordingHookServer.default_answers_together = True
    yield
    RecordingHookServer.default_hook_session = RecordingHookServer.default_answers_together = False


# --- what only the stream does ------------------------------------------------------------------


async def test_a_turns_hook_calls_are_messages_of_one_hook_session(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer()
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        assert middleware.hook_session
        end = end_of(await harness.run("check", request_id="r-session"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 1
    calls = [c for c in server.calls if c.rpc not in ("GetHookSubscriptions", "OnChunks", "OnChunks:end")]
    assert [(c.rpc, c.stream) for c in calls] == [
        ("BeforeTurn", True),
        ("BeforeStep", True),
        ("BeforeToolCall", True),
        ("AfterToolCall", True),
        ("OnStepFinish", True),
        ("BeforeStep", True),
        ("OnStepFinish", True),
        ("OnChatResponse", True),
    ]
    assert all(c.metadata.get(PARENT) == "r-session" for c in calls)
    assert metric("turnwire_remote_hook_calls_total", server=address, hook="before_step") == 2


async def test_the_turn_ends_without_waiting_for_its_streams_half_close_which_still_comes(
    remote_engine: RemoteEngine,
) -> None:
    # A call's write and the stream's half-close are not waited for (the answer implies the
    # write; nothing of the turn depends on the close): every answer is in when the turn ends,
    # and the server sees its stream end soon after, turn after turn.
    server = RecordingHookServer()
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        for n in range(3):
            end = end_of(await harness.run("check", request_id=f"r-close-{n}"))
            assert end.status == event_pb2.TURN_STATUS_COMPLETED
            assert server.count("OnChatResponse") == n + 1
        await wait_until(lambda: server.sessions_ended == 3, what="the three streams half-closed")
    assert server.sessions == 3


def _turns_of(server: RecordingHookServer) -> list[tuple[str, str]]:
    """(rpc, the turn it named) of every stream call but OnChunks', in order."""
    return [(c.rpc, c.metadata.get(PARENT, "")) for c in server.calls if c.stream]


async def test_a_reusing_server_gets_turn_after_turn_on_one_stream_each_call_naming_its_turn(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer(reuse_hook_session=True)
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        for n in range(3):
            end = end_of(await harness.run("check", request_id=f"r-reuse-{n}"))
            assert end.status == event_pb2.TURN_STATUS_COMPLETED
        assert server.sessions == 1 and server.sessions_ended == 0  # kept open between turns
        # Each call names its own turn (the stream's metadata names only the first), and a
        # turn's calls come together, in order.
        assert _turns_of(server) == [(rpc, f"r-reuse-{n}") for n in range(3) for rpc in TURN_RPCS]
        await harness.run("check", request_id="r-reuse-3")
    assert server.sessions == 1
    stream_turns = "turnwire_remote_hook_session_turns_total"
    assert metric(stream_turns, server=address, stream="opened") == 1
    assert metric(stream_turns, server=address, stream="kept") == 3


async def test_a_stream_given_up_mid_turn_is_not_reused(remote_engine: RemoteEngine) -> None:
    # Step 0's OnStepFinish never answers: at its deadline the stream is given up (the turn's
    # later calls unary); the next turn opens a new stream and keeps it.
    server = RecordingHookServer(reuse_hook_session=True)

    async def first_turn_hangs(request: Any, context: Any) -> Any:
        if request.turn.request_id == "r-hang":
            await sleep_forever(request, context)
        return hooks_pb2.OnStepFinishResponse()

    server.answers["OnStepFinish"] = first_turn_hangs
    async with serving(server) as address:
        harness, _ = await remote_engine(address, deadline_seconds=0.3, failure_mode="open")
        assert end_of(await harness.run("go", request_id="r-hang")).status == event_pb2.TURN_STATUS_COMPLETED
        for n in range(2):
            end = end_of(await harness.run("go", request_id=f"r-after-{n}"))
            assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 2
    assert metric("turnwire_remote_hook_session_turns_total", server=address, stream="opened") == 2
    assert metric("turnwire_remote_hook_session_turns_total", server=address, stream="kept") == 1
    later = [turn for rpc, turn in _turns_of(server) if turn != "r-hang"]
    assert later == [f"r-after-{n}" for n in range(2) for _ in TURN_RPCS]


async def test_concurrent_turns_get_streams_of_their_own_and_the_idle_ones_are_bounded(
    remote_engine: RemoteEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stream carries one turn at a time: turns at once each open one (never interleaved on
    # one); at their ends at most MAX_IDLE_SESSIONS stay open, the others are half-closed.
    monkeypatch.setattr(session_module, "MAX_IDLE_SESSIONS", 2)
    server = RecordingHookServer(reuse_hook_session=True)
    gate = asyncio.Event()  # every turn is inside its first call before any goes on
    server.answers["BeforeTurn"] = held(gate, hooks_pb2.BeforeTurnResponse())
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        turns = [
            asyncio.ensure_future(
                harness.run("check", request_id=f"r-many-{n}", conversation_id=f"c-many-{n}")
            )
            for n in range(4)
        ]
        await wait_until(lambda: server.count("BeforeTurn") == 4, what="four turns in their BeforeTurn")
        gate.set()
        for turn in turns:
            assert end_of(await turn).status == event_pb2.TURN_STATUS_COMPLETED
        await wait_until(
            lambda: server.sessions_ended == 2, what="the idle streams past the bound half-closed"
        )
        assert server.sessions == 4
        by_stream_order = _turns_of(server)
        for n in range(4):  # each turn's calls, in order
            assert [rpc for rpc, turn in by_stream_order if turn == f"r-many-{n}"] == TURN_RPCS
        end_of(await harness.run("check", request_id="r-many-next"))
    assert server.sessions == 4  # the next turn took a kept stream


async def test_kept_streams_end_when_unused_and_are_not_kept_past_their_age(
    remote_engine: RemoteEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = RecordingHookServer(reuse_hook_session=True)
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        monkeypatch.setattr(session_module, "MAX_IDLE_SECONDS", 0.2)
        end_of(await harness.run("check", request_id="r-idle"))
        await wait_until(lambda: server.sessions_ended == 1, what="the unused kept stream half-closed")
        monkeypatch.setattr(session_module, "MAX_IDLE_SECONDS", 30.0)
        monkeypatch.setattr(session_module, "MAX_STREAM_SECONDS", 0.0)  # every stream too old to keep
        for n in range(2):
            end_of(await harness.run("check", request_id=f"r-old-{n}"))
        await wait_until(lambda: server.sessions_ended == 3, what="each turn's stream half-closed")
    assert server.sessions == 3


class _StopsAfterItsFirstTurn(RecordingHookServer):
    """A server whose HookSession stream fails (as when the server stops) at the first call of a
    later turn than the stream's first, before answering it."""

    async def HookSession(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        first = ""

        async def until_another_turn() -> AsyncIterator[Any]:
            nonlocal first
            async for request in request_iterator:
                for call in request.calls:
                    first = first or call.parent_request_id
                    if call.parent_request_id != first:
                        await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is stopping")
                yield request

        async for response in super().HookSession(until_another_turn(), context):
            yield response


async def test_a_kept_stream_failing_before_the_new_turns_first_answer_sends_its_calls_as_unary_rpcs(
    remote_engine: RemoteEngine,
) -> None:
    server = _StopsAfterItsFirstTurn(reuse_hook_session=True)
    async with serving(server) as address:
        harness, _ = await remote_engine(address, failure_mode="closed")
        assert end_of(await harness.run("check", request_id="r-1")).status == event_pb2.TURN_STATUS_COMPLETED
        end = end_of(await harness.run("check", request_id="r-2"))
        assert end.status == event_pb2.TURN_STATUS_COMPLETED  # not failed closed
        third = end_of(await harness.run("check", request_id="r-3"))
        assert third.status == event_pb2.TURN_STATUS_COMPLETED
    second = [
        (c.rpc, c.stream)
        for c in server.calls
        if c.metadata.get(PARENT) == "r-2" and c.rpc not in ("OnChunks", "OnChunks:end")
    ]
    assert second == [(rpc, False) for rpc in TURN_RPCS]  # every call of r-2 a unary RPC, once
    assert server.sessions == 2  # r-3 opened a new stream
    errors = sum(
        metric("turnwire_remote_hook_errors_total", server=address, hook=hook, kind="unavailable")
        for hook in ("before_turn", "before_step")
    )
    assert errors == 0


async def test_a_server_that_stops_offering_reuse_gets_its_kept_streams_ended(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer(reuse_hook_session=True)
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        end_of(await harness.run("check", request_id="r-kept"))
        server.reuse_hook_session = False
        await middleware._resubscribe()  # as after the breaker closed again
        end_of(await harness.run("check", request_id="r-new"))
        await wait_until(lambda: server.sessions_ended == 2, what="the kept stream and the new one ended")
    assert server.sessions == 2


async def test_a_server_without_hook_session_gets_a_unary_rpc_per_call(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer(hook_session=False)
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        assert not middleware.hook_session
        end = end_of(await harness.run("check"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 0
    assert server.count("BeforeStep") == 2 and not any(c.stream for c in server.calls)


async def test_a_stuck_observer_fails_open_and_the_calls_behind_it_go_unary(
    remote_engine: RemoteEngine,
) -> None:
    # The server answers a stream's calls in order: an OnStepFinish that never answers holds the
    # BeforeStep sent after it. At OnStepFinish's deadline the stream is given up; BeforeStep, not
    # taken by the server, is made as a unary RPC with what remains of its own deadline (little
    # here: whether it still gets an answer is a race, test_remote_hooks_deadlines.py pins the
    # failure), and the turn's later calls are unary RPCs.
    server = RecordingHookServer()
    server.answers["OnStepFinish"] = sleep_forever
    async with serving(server) as address:
        harness, _ = await remote_engine(address, deadline_seconds=0.3, failure_mode="open")
        end = end_of(await harness.run("go", request_id="r-stuck"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    calls = [(c.rpc, c.stream) for c in server.calls if c.rpc in ("BeforeStep", "OnStepFinish")]
    assert [call for call in calls if call[1]] == [("BeforeStep", True), ("OnStepFinish", True)]
    assert calls[-1] == ("OnStepFinish", False)
    assert (
        metric(
            "turnwire_remote_hook_errors_total",
            server=address,
            hook="on_step_finish",
            kind="deadline_exceeded",
        )
        == 2
    )


async def test_failing_observing_hooks_never_fail_a_turn(  # type: ignore[no-redef]  # the stream's own
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    # The unary path's test (test_remote_hooks.py) with the stuck OnStepFinish the last step's:
    # on a stream the calls behind a stuck call wait on it within their own deadlines, so a
    # BeforeStep behind step 0's would get a closed failure mode's outcome (docs/semantics.md §4,
    # "Deadlines"); OnChatResponse behind step 1's is an observer and fails open.
    server, address = hooks
    server.answers["AfterToolCall"] = abort(grpc.StatusCode.INTERNAL, "observer broke")

    async def last_step_hangs(request: Any, context: Any) -> Any:
        if request.step.step_number == 1:
            await sleep_forever(request, context)
        return hooks_pb2.OnStepFinishResponse()

    server.answers["OnStepFinish"] = last_step_hangs
    server.garbage.add("OnChatResponse")
    harness, _ = await remote_engine(address, deadline_seconds=0.3, failure_mode="closed")
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.count("OnStepFinish") == 2
    errors = {
        hook: sum(
            metric("turnwire_remote_hook_errors_total", server=address, hook=hook, kind=kind)
            for kind in ("internal", "deadline_exceeded", "invalid_response")
        )
        for hook in ("after_tool_call", "on_step_finish", "on_chat_response")
    }
    assert errors == {"after_tool_call": 1, "on_step_finish": 1, "on_chat_response": 1}


async def test_hook_session_false_keeps_unary_rpcs_for_a_server_that_offers_the_stream(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer()  # offers it (this module's default)
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, hook_session=False)
        assert not middleware.hook_session
        end = end_of(await harness.run("check"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 0 and server.count("BeforeStep") == 2


async def test_each_call_on_the_stream_carries_its_own_hook_spans_trace_context(
    make_engine: EngineFactory,
) -> None:
    # The stream's metadata is set once, at its opening; every HookCall carries the trace context
    # of its own hook span (trace_context), so each hook's server span joins under the right one.
    tracing, exporter = memory_tracing()
    server = RecordingHookServer()
    async with serving(server) as address:
        middleware = RemoteMiddleware(RemoteHookSettings(address=address))
        try:
            h = await make_engine(middlewares=[middleware], tracing=tracing)
            await h.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
            events = await collect(await h.start("hi"))
        finally:
            await middleware.aclose()
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    spans = exporter.get_finished_spans()
    for hook, rpc in (("before_turn", "BeforeTurn"), ("before_step", "BeforeStep")):
        [span] = [s for s in spans if (s.attributes or {}).get("turnwire.hook.name") == hook]
        [call] = [c for c in server.calls if c.rpc == rpc]
        assert call.stream
        assert call.metadata["traceparent"] == traceparent_of(span), hook
