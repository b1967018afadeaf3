"""Hooks a hook server only observes (``GetHookSubscriptionsResponse.observed_hooks``): deciding
hooks posted on the turn's ``HookSession`` instead of waited for, their answers ignored, their
failure mode open; the turn's end hooks sent before ``TurnEnd``, which does not wait for their
answers (docs/semantics.md §4, remote middleware; hooks.proto)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any

import grpc
import pytest
import test_remote_hooks
from support.engine_harness import end_of, text_of
from support.hook_server import RecordingHookServer, abort, held, serving
from support.waiting import wait_until
from test_remote_hooks import FAILING, RemoteEngine, counters_from_here, metric  # noqa: F401 (a fixture)

from turnwire.testing import ScriptedError, ScriptStep
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks import session as session_module
from turnwire_server.remote_hooks.session import HOLD_SECONDS, TurnSessions

remote_engine = test_remote_hooks.remote_engine  # the fixture

BEFORE_STEP = [hooks_pb2.HOOK_BEFORE_STEP]
PARTIAL = {
    "main": [ScriptStep(text="Partly there", error=ScriptedError(message="cut", status=500, after_chunks=1))]
}
"""A turn that fails after its first chunk: its partial reply is stored, so on_chat_response
follows on_chat_error."""


def _change_the_step(request: Any, context: Any) -> hooks_pb2.BeforeStepResponse:
    return hooks_pb2.BeforeStepResponse(system="changed by an observer", model="scripted:other")


@pytest.mark.parametrize("hook_session", [True, False], ids=["session", "unary"])
async def test_an_observed_hooks_answer_is_ignored(remote_engine: RemoteEngine, hook_session: bool) -> None:
    server = RecordingHookServer(hook_session=hook_session, answers_together=True, observed_hooks=BEFORE_STEP)
    server.answers["BeforeStep"] = _change_the_step
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        assert middleware.observed == {"before_step"}
        end = end_of(await harness.run("check"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message) == "Let me check.Done."  # the main model, as if nothing answered
    assert all(r.system == "You are a helpful assistant." for r in harness.provider.requests)
    assert server.count("BeforeStep") == 2
    assert all(c.stream == hook_session for c in server.calls if c.rpc == "BeforeStep")


async def test_on_hook_session_an_observed_hook_is_not_waited_for(remote_engine: RemoteEngine) -> None:
    # The step's model call goes out while the server still holds BeforeStep's answer; the turn's
    # end still waits for every answer (on_chat_response).
    server = RecordingHookServer(hook_session=True, answers_together=True, observed_hooks=BEFORE_STEP)
    release = asyncio.Event()
    server.answers["BeforeStep"] = held(release, hooks_pb2.BeforeStepResponse())
    async with serving(server) as address:
        harness, _ = await remote_engine(address, deadline_seconds=30)
        turn = asyncio.create_task(harness.run("check"))
        # The model is called while the server holds the answer (it gets the call with the turn's
        # next call, or HOLD_SECONDS later).
        await wait_until(lambda: harness.provider.calls >= 1 and server.count("BeforeStep") == 1)
        assert not turn.done()
        release.set()
        assert end_of(await turn).status == event_pb2.TURN_STATUS_COMPLETED
    assert server.rpcs(chunks=False)[-1] == "OnChatResponse"


async def test_an_observed_hook_fails_open_whatever_its_configured_mode(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer(hook_session=True, answers_together=True, observed_hooks=BEFORE_STEP)
    server.answers["BeforeStep"] = abort(grpc.StatusCode.INTERNAL, "the observer broke")
    async with serving(server) as address:
        harness, _ = await remote_engine(address, failure_mode={"before_step": "closed"})
        end = end_of(await harness.run("check"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert (
        metric("turnwire_remote_hook_errors_total", server=address, hook="before_step", kind="internal") == 2
    )


async def test_only_deciding_and_end_hooks_can_be_observed_and_the_start_says_how_the_server_is_called(
    remote_engine: RemoteEngine, caplog: pytest.LogCaptureFixture
) -> None:
    observed = [
        hooks_pb2.HOOK_ON_STEP_FINISH,
        hooks_pb2.HOOK_BEFORE_TOOL_CALL,
        hooks_pb2.HOOK_BEFORE_TURN,
        hooks_pb2.HOOK_ON_CHAT_RESPONSE,
        hooks_pb2.HOOK_CLASSIFY_CHAT_ERROR,
    ]
    server = RecordingHookServer(
        hook_session=True, reuse_hook_session=True, hook_session_chunks=True, observed_hooks=observed
    )
    async with serving(server) as address:
        with caplog.at_level(logging.INFO, logger="turnwire.middleware"):
            _, middleware = await remote_engine(address)
    assert middleware.observed == {"before_tool_call", "before_turn", "on_chat_response"}
    assert (
        f"hook server {address}: HookSession streams kept from turn to turn, chunk batches on them;"
        " only observes before_tool_call, before_turn, on_chat_response" in caplog.messages
    )


async def test_turn_end_does_not_wait_for_an_observed_on_chat_response(remote_engine: RemoteEngine) -> None:
    # The server holds OnChatResponse's answer: the turn ends all the same, the call sent before
    # its end (after the turn's other calls); the stream is kept once the answer comes, and the
    # next turn is carried on it.
    observed = [hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    server = RecordingHookServer(
        hook_session=True, reuse_hook_session=True, answers_together=True, observed_hooks=observed
    )
    release = asyncio.Event()
    server.answers["OnChatResponse"] = held(release, hooks_pb2.OnChatResponseResponse())
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, deadline_seconds=30)
        end = end_of(await harness.run("check"))
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
        await wait_until(lambda: server.count("OnChatResponse") == 1)  # sent, not answered
        assert server.rpcs(chunks=False)[-1] == "OnChatResponse"
        assert metric("turnwire_remote_hook_calls_total", server=address, hook="on_chat_response") == 1
        assert not middleware._sessions._idle  # its answer is still due
        release.set()
        await wait_until(lambda: len(middleware._sessions._idle) == 1)
        assert end_of(await harness.run("again")).status == event_pb2.TURN_STATUS_COMPLETED
    assert server.sessions == 1  # the second turn took the kept stream
    assert not metric("turnwire_remote_hook_errors_total", server=address, hook="on_chat_response")


async def test_an_observed_on_chat_responses_failure_is_logged_and_counted_when_it_comes(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer(
        hook_session=True, answers_together=True, observed_hooks=[hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    )
    server.answers["OnChatResponse"] = abort(grpc.StatusCode.INTERNAL, "the recorder broke")
    async with serving(server) as address:
        harness, _ = await remote_engine(address)
        assert end_of(await harness.run("check")).status == event_pb2.TURN_STATUS_COMPLETED
        await wait_until(
            lambda: (
                metric(
                    "turnwire_remote_hook_errors_total",
                    server=address,
                    hook="on_chat_response",
                    kind="internal",
                )
                == 1
            )
        )


@pytest.mark.parametrize("hook_session", [True, False], ids=["session", "unary"])
async def test_an_observed_on_chat_errors_answer_is_ignored(
    remote_engine: RemoteEngine, hook_session: bool
) -> None:
    # On the stream the errored turn's end does not wait for the server (it holds its answer);
    # on unary RPCs it is awaited; either way its change is ignored.
    server = RecordingHookServer(
        hook_session=hook_session, answers_together=True, observed_hooks=[hooks_pb2.HOOK_ON_CHAT_ERROR]
    )
    release = asyncio.Event()
    if not hook_session:
        release.set()
    server.answers["OnChatError"] = held(release, hooks_pb2.OnChatErrorResponse(message="Sorry."))
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, scripts=FAILING, deadline_seconds=30)
        assert middleware.observed == {"on_chat_error"}
        end = end_of(await harness.run("go"))
        assert end.status == event_pb2.TURN_STATUS_ERROR
        assert "upstream exploded" in end.error.message  # not "Sorry."
        await wait_until(lambda: server.count("OnChatError") == 1)  # written after the turn's end
        release.set()


@pytest.mark.parametrize("observed", [True, False], ids=["observed", "awaited"])
async def test_a_server_of_on_chat_response_alone_is_not_waited_for_when_it_observes_it(
    remote_engine: RemoteEngine, observed: bool
) -> None:
    # Fresh-user trial: its only hook never opened the turn's stream (one call is not worth one),
    # so the observed call went as an awaited unary RPC and TurnEnd waited for it. Posted, it
    # opens the stream (kept for the next turn); awaited, it stays a unary RPC.
    end_only = [hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    server = RecordingHookServer(
        end_only, hook_session=True, reuse_hook_session=True, observed_hooks=end_only if observed else ()
    )
    release = asyncio.Event()
    if not observed:
        release.set()
    server.answers["OnChatResponse"] = held(release, hooks_pb2.OnChatResponseResponse())
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, deadline_seconds=30)
        for prompt in ("check", "again"):
            assert end_of(await harness.run(prompt)).status == event_pb2.TURN_STATUS_COMPLETED
            release.set()  # the first turn ended while its answer was held
            if observed:
                await wait_until(lambda: len(middleware._sessions._idle) == 1)
    assert server.count("OnChatResponse") == 2
    assert [c.stream for c in server.calls if c.rpc == "OnChatResponse"] == [observed, observed]
    assert server.sessions == (1 if observed else 0)


async def test_closing_the_middleware_lets_an_ended_turns_observed_call_be_answered(
    remote_engine: RemoteEngine,
) -> None:
    # Stopping the sidecar must not cut off an OnChatResponse the server is still handling (an
    # awaited one would have held its turn, which the drain waits for).
    end_only = [hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    server = RecordingHookServer(
        end_only, hook_session=True, reuse_hook_session=True, observed_hooks=end_only
    )
    release = asyncio.Event()
    server.answers["OnChatResponse"] = held(release, hooks_pb2.OnChatResponseResponse())
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, deadline_seconds=30)
        assert end_of(await harness.run("check")).status == event_pb2.TURN_STATUS_COMPLETED
        await wait_until(lambda: server.count("OnChatResponse") == 1)
        closing = asyncio.create_task(middleware.aclose())
        # It waits for the held answer (closing at once, it would be done well within this).
        done, _ = await asyncio.wait([closing], timeout=0.5)
        assert not done
        release.set()
        await closing
    # Answered on its stream: not broken by the close (an error counted), nor sent again.
    assert not metric("turnwire_remote_hook_errors_total", server=address, hook="on_chat_response")
    assert [c.stream for c in server.calls if c.rpc == "OnChatResponse"] == [True]


@pytest.mark.parametrize("observed", [True, False], ids=["observed", "awaited"])
async def test_an_errored_turns_end_hooks_go_on_its_one_stream_in_order(
    remote_engine: RemoteEngine, observed: bool
) -> None:
    # An errored turn with a partial reply stored gets on_chat_error, then on_chat_response, both
    # on the turn's one stream, in order: on_chat_error ended the stream, so on_chat_response
    # went as a unary RPC (awaited: the turn waited for it), or, observed, opened a second
    # stream, and the server could handle the two in either order. Observed, the turn ends while
    # the server holds the first answer.
    end_hooks = [hooks_pb2.HOOK_ON_CHAT_ERROR, hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    server = RecordingHookServer(
        [hooks_pb2.HOOK_BEFORE_TURN, *end_hooks],
        hook_session=True,
        reuse_hook_session=True,
        answers_together=True,
        observed_hooks=end_hooks if observed else (),
    )
    release = asyncio.Event()
    if not observed:
        release.set()
    server.answers["OnChatError"] = held(release, hooks_pb2.OnChatErrorResponse())
    server.answers["OnChatResponse"] = held(release, hooks_pb2.OnChatResponseResponse())
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, scripts=PARTIAL, deadline_seconds=30)
        end = end_of(await harness.run("go"))
        assert end.status == event_pb2.TURN_STATUS_ERROR
        # The server handles a stream's calls in order: OnChatResponse once OnChatError is answered.
        await wait_until(lambda: server.count("OnChatError") == 1)
        release.set()
        await wait_until(lambda: server.count("OnChatResponse") == 1 and len(middleware._sessions._idle) == 1)
    assert server.rpcs(chunks=False)[1:] == ["BeforeTurn", "OnChatError", "OnChatResponse"]
    assert all(c.stream for c in server.calls[1:])
    assert server.sessions == 1


async def test_an_errored_turn_whose_server_observes_only_on_chat_error_does_not_wait_for_it(
    remote_engine: RemoteEngine,
) -> None:
    # Fresh-user review: with on_chat_response following (a partial reply stored) the stream was
    # left to it, but unsubscribed it ends the stream as an awaited hook would, so TurnEnd waited
    # for the observed OnChatError's answer. It is the turn's last call: it ends the stream.
    server = RecordingHookServer(
        [hooks_pb2.HOOK_BEFORE_TURN, hooks_pb2.HOOK_ON_CHAT_ERROR],
        hook_session=True,
        reuse_hook_session=True,
        answers_together=True,
        observed_hooks=[hooks_pb2.HOOK_ON_CHAT_ERROR],
    )
    release = asyncio.Event()
    server.answers["OnChatError"] = held(release, hooks_pb2.OnChatErrorResponse())
    async with serving(server) as address:
        harness, middleware = await remote_engine(address, scripts=PARTIAL, deadline_seconds=30)
        turn = asyncio.create_task(harness.run("go"))
        await wait_until(lambda: turn.done() and server.count("OnChatError") == 1)
        # (The partial reply is stored, so on_chat_response runs: the test above sees its call.)
        assert end_of(turn.result()).status == event_pb2.TURN_STATUS_ERROR
        release.set()
        await wait_until(lambda: len(middleware._sessions._idle) == 1)


class _Session:
    """What TurnSessions needs of a HookSession, recording when its calls are written."""

    def __init__(self) -> None:
        self.broken = None
        self.held = False
        self.written: list[float] = []

    def hold(self) -> None:
        self.held = True

    async def finish_turn(self, wait_seconds: float) -> bool:
        self.written.append(time.monotonic())
        return False

    def end(self, seconds: float) -> None:
        pass


async def test_an_observed_end_hooks_calls_are_written_once_the_turns_task_is_done() -> None:
    # On one event loop the writer task of the end calls ran before the turn's own TurnEnd write
    # (and store), which the turn waits for: they now wait for the turn's task, at most
    # HOLD_SECONDS (a task that goes on after its turn, say), their own flush timer held.
    sessions = TurnSessions(30.0, set(), "test-server")
    for request_id, turn_ends in (("ends", True), ("goes-on", False)):
        fake = _Session()
        opened: Any = fake

        def open_session(_: str, opened: Any = opened) -> Any:
            return opened

        assert sessions.get(request_id, "before_turn", open_session) is opened
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = time.monotonic()
        sessions.close_later(request_id, deadline=started + 30.0, after=turn)
        assert fake.held
        await asyncio.sleep(0)  # the background task's first step: it waits
        assert fake.written == []
        if turn_ends:
            turn.set_result(None)
        await wait_until(functools.partial(bool, fake.written))
        if not turn_ends:
            assert fake.written[0] - started >= HOLD_SECONDS * 0.9
    await sessions.finish_ended()


async def test_the_end_calls_wait_for_the_turns_own_task_and_go_when_it_is_done(
    remote_engine: RemoteEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The middleware hands the turn's task (engine.start's "turn <id>") to close_later, and the
    # calls go when it is done: with the 50 ms bound made 30 s they still come at once.
    monkeypatch.setattr(session_module, "HOLD_SECONDS", 30.0)
    afters: list[Any] = []
    close_later = TurnSessions.close_later

    def recording(self: TurnSessions, request_id: str, *, deadline: float, after: Any) -> None:
        afters.append(after)
        close_later(self, request_id, deadline=deadline, after=after)

    monkeypatch.setattr(TurnSessions, "close_later", recording)
    server = RecordingHookServer(
        hook_session=True, answers_together=True, observed_hooks=[hooks_pb2.HOOK_ON_CHAT_RESPONSE]
    )
    async with serving(server) as address:
        harness, _ = await remote_engine(address, deadline_seconds=30)
        assert end_of(await harness.run("check")).status == event_pb2.TURN_STATUS_COMPLETED
        await wait_until(lambda: server.count("OnChatResponse") == 1, timeout=10)
    assert [type(after) for after in afters] == [asyncio.Task]
    assert afters[0].get_name() == "turn r1" and afters[0].done()
