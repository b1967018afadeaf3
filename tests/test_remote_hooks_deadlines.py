"""One deadline per remote hook call, queued time included (docs/semantics.md §4, remote
middleware, "Deadlines"): a hook server that never answers holds a hook call at most
``deadline_seconds`` from when the turn asked for it, on every path the call can take (a unary
RPC, a ``HookSession`` message, the unary resend of a message queued behind a call whose deadline
passed, the ``OnChunks`` close), and the turn's end (closing ``OnChunks``, ``OnChatResponse``,
the stream's last answers) waits at most one deadline. Before, a call queued behind a stuck
session call was re-sent with a fresh deadline, and the end waited for ``OnChunks`` and then for
``OnChatResponse``: about twice the deadline each.

Real hook servers (``support.hook_server``, grpc.aio in this process) that never answer; the
bounds leave a margin for a busy machine well below the second deadline the old code took.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from google.protobuf import json_format
from prometheus_client import REGISTRY
from support.engine_harness import MODEL, EngineFactory, Harness, echo, end_of, make_tool
from support.hook_server import RecordingHookServer, serving, sleep_forever
from test_remote_hooks import TOOL_TURN, counters_from_here, metric  # noqa: F401 (a fixture)

from turnwire.hooks import SessionContext
from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.remote_hooks.settings import RemoteHookSettings

DEADLINE = 0.5
"""Seconds: every test's ``deadline_seconds``."""

MARGIN = 0.35
"""Seconds a busy machine may add to one deadline; below the second deadline the old code took."""

ONE_STEP = {"main": [ScriptStep(text="A reply long enough to stream a few chunks.")]}

Timed = Callable[..., Awaitable[tuple[Harness, RemoteMiddleware]]]


@pytest.fixture
async def timed_engine(make_engine: EngineFactory) -> AsyncIterator[Timed]:
    """``await timed_engine(address, scripts, **remote settings)``: an engine with one remote
    middleware (``deadline_seconds`` :data:`DEADLINE`) and the hook timeline on; the
    middlewares are closed at teardown."""
    made: list[RemoteMiddleware] = []

    async def factory(address: str, scripts: Any, **settings: Any) -> tuple[Harness, RemoteMiddleware]:
        middleware = RemoteMiddleware(
            RemoteHookSettings(address=address, deadline_seconds=DEADLINE, **settings)
        )
        made.append(middleware)
        harness = await make_engine(
            scripts=scripts, tools=[make_tool("echo", echo)], middlewares=[middleware], hook_timeline=True
        )
        await harness.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
        return harness, middleware

    yield factory
    for middleware in made:
        await middleware.aclose()


def timeline(end: event_pb2.TurnEnd) -> list[dict[str, Any]]:
    """The turn's hook timeline (``events.hook_timeline``): one dict per hook call."""
    entries: list[dict[str, Any]] = json_format.MessageToDict(end.metadata)["hook_timeline"]
    return entries


def durations(end: event_pb2.TurnEnd, hook: str) -> list[float]:
    """Seconds each call of ``hook`` took, as the chain timed it, in call order."""
    return [entry["duration_ms"] / 1000 for entry in timeline(end) if entry["hook"] == hook]


async def timed_run(harness: Harness) -> tuple[event_pb2.TurnEnd, float]:
    """Run a turn: its ``TurnEnd`` and its wall time in seconds."""
    started = time.perf_counter()
    events = await harness.run("go")
    return end_of(events), time.perf_counter() - started


@pytest.mark.parametrize("hook_session", [True, False], ids=["session", "unary"])
async def test_a_hung_server_holds_the_turns_end_one_deadline_chunks_close_included(
    timed_engine: Timed, hook_session: bool
) -> None:
    # The turn's OnChunks call is ended at its last step's on_step_finish (its deadline runs from
    # then); on_chat_response waits for its close, then calls OnChatResponse: both waited for
    # before TurnEnd (§2 finish, §4), both within one deadline of on_chat_response's start. The
    # server never answers OnChunks, so OnChatResponse gets only what the step's end to
    # on_chat_response left of it (a few ms: sent, or failed at once) and fails by then.
    server = RecordingHookServer(
        [hooks_pb2.HOOK_ON_CHUNKS, hooks_pb2.HOOK_ON_CHAT_RESPONSE], hook_session=hook_session
    )
    server.answers["OnChunks"] = sleep_forever
    server.answers["OnChatResponse"] = sleep_forever
    async with serving(server) as address:
        harness, middleware = await timed_engine(address, ONE_STEP)
        end, elapsed = await timed_run(harness)
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
        assert elapsed < DEADLINE + MARGIN, f"the turn took {elapsed:.2f} s"
        [on_chat_response] = durations(end, "on_chat_response")
        assert DEADLINE * 0.9 <= on_chat_response < DEADLINE + MARGIN
        assert server.count("OnChunks:end") == 1 and server.count("OnChatResponse") <= 1
    for hook in ("on_chunk", "on_chat_response"):
        kind = metric(
            "turnwire_remote_hook_errors_total", server=address, hook=hook, kind="deadline_exceeded"
        )
        assert kind == 1, hook
    assert middleware.breaker.failures == 2  # each failed call once


async def test_a_hung_server_holds_on_chat_response_one_deadline_behind_a_posted_observer(
    timed_engine: Timed,
) -> None:
    # On a HookSession, OnStepFinish is posted (not awaited) and OnChatResponse queued behind it.
    # The server answers neither: OnStepFinish's deadline gives the stream up, and OnChatResponse,
    # asked a moment later, gets the rest of its own deadline as a unary RPC, not a new one.
    server = RecordingHookServer(
        [hooks_pb2.HOOK_ON_STEP_FINISH, hooks_pb2.HOOK_ON_CHAT_RESPONSE], hook_session=True
    )
    server.answers["OnStepFinish"] = sleep_forever
    server.answers["OnChatResponse"] = sleep_forever
    async with serving(server) as address:
        harness, middleware = await timed_engine(address, ONE_STEP)
        timed_before = {hook: timed_calls(address, hook) for hook in ("on_step_finish", "on_chat_response")}
        end, elapsed = await timed_run(harness)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert elapsed < DEADLINE + MARGIN, f"the turn took {elapsed:.2f} s"
    [on_chat_response] = durations(end, "on_chat_response")
    assert on_chat_response < DEADLINE + MARGIN
    for hook in ("on_step_finish", "on_chat_response"):
        kind = metric(
            "turnwire_remote_hook_errors_total", server=address, hook=hook, kind="deadline_exceeded"
        )
        assert kind == 1, hook
        # One hook call, one duration, whether or not it was made again as a unary RPC.
        assert timed_calls(address, hook) - timed_before[hook] == 1, hook
    assert middleware.breaker.failures == 2


def timed_calls(address: str, hook: str) -> float:
    """How many durations of ``hook``'s calls the latency histogram holds (all time)."""
    labels = {"server": address, "hook": hook}
    return REGISTRY.get_sample_value("turnwire_remote_hook_call_duration_seconds_count", labels) or 0.0


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_a_deciding_call_queued_behind_a_stuck_observer_gets_what_remains_of_its_deadline(
    timed_engine: Timed, mode: str
) -> None:
    # Step 0's OnStepFinish is posted and never answered; step 1's BeforeStep is queued behind it
    # on the stream and the server would not answer it either. Made again as a unary RPC once the
    # stream is given up, BeforeStep has (almost) nothing left of its deadline: its failure mode
    # applies one deadline after the turn asked for it, not two.
    server = RecordingHookServer(
        [hooks_pb2.HOOK_BEFORE_STEP, hooks_pb2.HOOK_ON_STEP_FINISH], hook_session=True
    )
    server.answers["OnStepFinish"] = sleep_forever

    async def second_step_hangs(request: Any, context: Any) -> Any:
        if request.step_number == 1:
            await sleep_forever(request, context)
        return hooks_pb2.BeforeStepResponse()

    server.answers["BeforeStep"] = second_step_hangs
    async with serving(server) as address:
        harness, middleware = await timed_engine(
            address, {"main": TOOL_TURN}, failure_mode={"before_step": mode}
        )
        timed_before = timed_calls(address, "before_step")
        end, _ = await timed_run(harness)
    _, second = durations(end, "before_step")
    assert second < DEADLINE + MARGIN, f"before_step(1) took {second:.2f} s"
    if mode == "open":
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
    else:
        assert end.status == event_pb2.TURN_STATUS_ERROR
        assert "the hook server gave no usable before_step answer" in end.error.message
    assert (
        metric(
            "turnwire_remote_hook_errors_total", server=address, hook="before_step", kind="deadline_exceeded"
        )
        == 1
    )
    assert metric("turnwire_remote_hook_calls_total", server=address, hook="before_step") == 2
    assert timed_calls(address, "before_step") - timed_before == 2
    # Each hook call failed once and was counted once: OnStepFinish(0), BeforeStep(1), and (open)
    # the turn's second OnStepFinish, a unary RPC since the stream was given up.
    assert middleware.breaker.failures == (3 if mode == "open" else 2)
