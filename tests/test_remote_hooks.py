"""Remote middleware against a real TurnHooksService (grpc.aio, in this process) and an
in-process engine: call order, decisions, config changes, error hooks, failure modes, the
breaker and OnChunks batching. docs/semantics.md §3, §4 (remote middleware). Calls are counted
where they arrive: in the hook server (``support.hook_server``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from prometheus_client import REGISTRY
from support.engine_harness import (
    MODEL,
    EngineFactory,
    Harness,
    echo,
    end_of,
    make_tool,
    text_of,
    tool_parts,
)
from support.hook_server import RecordingHookServer, abort, serving, sleep_forever
from support.sidecar import free_port
from support.waiting import wait_until

from turnwire.hooks import ChatResponseContext, ConcurrentInput, SessionContext, TurnContext
from turnwire.testing import ScriptedError, ScriptedToolCall, ScriptStep
from turnwire_client.v1 import chat_service_pb2, event_pb2, hooks_pb2, message_pb2
from turnwire_server.redaction import Redactor
from turnwire_server.remote_hooks import RemoteMiddleware, convert
from turnwire_server.remote_hooks.settings import RemoteHookSettings

PARENT = "turnwire-parent-request-id"

TOOL_TURN = [
    ScriptStep(text="Let me check.", tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
    ScriptStep(text="Done."),
]

SCRIPTS = {"main": TOOL_TURN, "other": [ScriptStep(text="From the other model.")]}

TURN_RPCS = [
    "BeforeTurn",
    "BeforeStep",
    "BeforeToolCall",
    "AfterToolCall",
    "OnStepFinish",
    "BeforeStep",
    "OnStepFinish",
    "OnChatResponse",
]
"""The hook RPCs of a :data:`TOOL_TURN` turn, in order, for a server subscribed to every hook."""

RemoteEngine = Callable[..., Awaitable[tuple[Harness, RemoteMiddleware]]]


@pytest.fixture
async def hooks() -> AsyncIterator[tuple[RecordingHookServer, str]]:
    """A hook server subscribed to every hook, and its address."""
    server = RecordingHookServer()
    async with serving(server) as address:
        yield server, address


@pytest.fixture
async def remote_engine(make_engine: EngineFactory) -> AsyncIterator[RemoteEngine]:
    """``await remote_engine(address, scripts=…, **remote settings)``: an engine whose chain is
    one RemoteMiddleware (configured as ``middleware: - remote: {...}`` would be), session
    configured; the middlewares are closed at teardown."""
    made: list[RemoteMiddleware] = []

    async def factory(
        address: str, *, scripts: Any = None, clock: Any = None, redact: Any = str, **settings: Any
    ) -> tuple[Harness, RemoteMiddleware]:
        options = {"clock": clock} if clock is not None else {}
        middleware = RemoteMiddleware(RemoteHookSettings(address=address, **settings), **options)
        made.append(middleware)
        harness = await make_engine(
            scripts=scripts or SCRIPTS,
            tools=[make_tool("echo", echo)],
            middlewares=[middleware],
            redact=redact,
        )
        await harness.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
        return harness, middleware

    yield factory
    for middleware in made:
        await middleware.aclose()


_COUNTED_BEFORE: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}


@pytest.fixture(autouse=True)
def counters_from_here() -> None:
    """Counters as this test began, so :func:`metric` gives what the test counted: the counters
    are the process's, labelled by the hook server's address, and a worker that runs many tests
    gets a port an earlier test's server had (CI: an OnChunks call counted twice)."""
    _COUNTED_BEFORE.clear()
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name.endswith("_total"):
                _COUNTED_BEFORE[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value


def metric(name: str, **labels: str) -> float:
    """The sample ``name`` with ``labels``: a counter's (``*_total``) count since this test began,
    a gauge's value."""
    value = REGISTRY.get_sample_value(name, labels) or 0.0
    if name.endswith("_total"):
        value -= _COUNTED_BEFORE.get((name, tuple(sorted(labels.items()))), 0.0)
    return value


# --- order and contents ---------------------------------------------------------------------


async def test_a_two_step_turn_calls_the_remote_hooks_in_the_order_of_section_4(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    server, address = hooks
    harness, _ = await remote_engine(address)
    events = await harness.run("check", request_id="r-order", body={"team": "blue"})
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED

    unary = [rpc for rpc in server.rpcs() if not rpc.startswith("OnChunks")]
    assert unary == ["GetHookSubscriptions", *TURN_RPCS]
    rpcs = server.rpcs()
    # One OnChunks call for the turn, opened after step 0 began and closed before OnChatResponse.
    assert rpcs.count("OnChunks") == 1
    assert rpcs.index("BeforeStep") < rpcs.index("OnChunks")
    assert rpcs.index("OnChunks:end") < rpcs.index("OnChatResponse")

    calls = {c.rpc: c for c in server.calls}
    assert [c.request.step_number for c in server.calls if c.rpc == "BeforeStep"] == [0, 1]
    assert [c.request.step.step_number for c in server.calls if c.rpc == "OnStepFinish"] == [0, 1]
    for call in server.calls[1:]:
        assert call.metadata.get(PARENT) == "r-order", call.rpc
    before_turn = calls["BeforeTurn"].request
    assert before_turn.turn.request_id == "r-order"
    assert before_turn.turn.conversation_id == "conv-1"
    assert before_turn.turn.attempt == 1
    assert dict(before_turn.turn.body) == {"team": "blue"}
    assert before_turn.model == MODEL
    assert list(before_turn.tool_names) == ["echo"]
    assert not before_turn.messages  # not asked for
    # Every later hook carries the turn's body too.
    assert dict(calls["BeforeToolCall"].request.turn.body) == {"team": "blue"}
    assert json.loads(calls["BeforeToolCall"].request.call.input_json) == {"x": 1}
    after = calls["AfterToolCall"].request
    assert after.success and after.outcome == hooks_pb2.TOOL_CALL_OUTCOME_EXECUTED
    assert json.loads(after.output_json) == {"echo": {"x": 1}}
    first_finish = next(c.request for c in server.calls if c.rpc == "OnStepFinish")
    assert first_finish.step.finish_reason == event_pb2.FINISH_REASON_TOOL_CALLS
    assert list(first_finish.step.tool_names) == ["echo"]
    response = calls["OnChatResponse"].request
    assert response.outcome == hooks_pb2.TURN_OUTCOME_COMPLETED
    assert text_of(response.message) == "Let me check.Done."


async def test_include_messages_sends_the_history_to_before_turn_and_before_step(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer(
        [hooks_pb2.HOOK_BEFORE_TURN, hooks_pb2.HOOK_BEFORE_STEP], include_messages=True
    )
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        assert middleware.implemented_hooks() == {
            "configure_session",
            "before_turn",
            "before_step",
            "on_chat_response",  # local: forgets the turn
        }
        await harness.run("hello there")
    before_turn = next(c.request for c in server.calls if c.rpc == "BeforeTurn")
    assert [text_of(m) for m in before_turn.messages] == ["hello there"]
    before_step = next(c.request for c in server.calls if c.rpc == "BeforeStep")
    assert before_step.messages


async def test_only_subscribed_hooks_are_called(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_BEFORE_TOOL_CALL])
    async with serving(server) as address:
        harness, middleware = await remote_engine(address)
        # before_turn and on_chat_response are kept locally (the turn's body for later calls).
        assert middleware.implemented_hooks() == {
            "configure_session",
            "before_tool_call",
            "before_turn",
            "on_chat_response",
        }
        await harness.run("go")
    assert server.rpcs() == ["GetHookSubscriptions", "BeforeToolCall"]


async def test_a_server_down_at_start_gets_the_listed_hooks_unary_once_it_listens(
    remote_engine: RemoteEngine,
) -> None:
    """docs/hooks.md: an entry that lists its hooks starts without its server; each listed hook's
    call gets the failure mode while the server is down, and reaches it once it listens: the
    listed hooks only (not the server's subscriptions), as unary RPCs (not its HookSession)."""
    port = free_port()
    harness, middleware = await remote_engine(
        f"127.0.0.1:{port}",
        startup_timeout_seconds=0.2,
        hooks=["before_tool_call"],
        failure_mode={"before_tool_call": "closed"},
        breaker={"failure_threshold": 1000},  # the reconnection is waited for here, not the breaker
    )
    (part,) = tool_parts(end_of(await harness.run("go")).message)
    assert json.loads(part.output_json) == (
        f'Tool "echo" was blocked: its policy hook ({middleware.name}) was unavailable.'
    )
    server = RecordingHookServer(hook_session=True)  # subscribes to every hook, offers HookSession
    async with serving(server, port):

        async def reached() -> list[message_pb2.ToolCallPart]:
            parts = tool_parts(end_of(await harness.run("go")).message)
            return parts if server.count("BeforeToolCall") else []

        (part,) = await wait_until(reached, what="a listed hook's call reaching the server")
    assert json.loads(part.output_json) == {"echo": {"x": 1}}  # its answer: no decision, the tool ran
    assert set(server.rpcs()) == {"BeforeToolCall"}
    assert not any(call.stream for call in server.calls)


# --- decisions and changes ------------------------------------------------------------------


def decision(**kind: Any) -> hooks_pb2.BeforeToolCallResponse:
    return hooks_pb2.BeforeToolCallResponse(**kind)


@pytest.mark.parametrize(
    ("answer", "output", "outcome"),
    [
        (decision(allow=hooks_pb2.BeforeToolCallResponse.Allow()), {"echo": {"x": 1}}, "EXECUTED"),
        (
            decision(allow_with_input=hooks_pb2.BeforeToolCallResponse.AllowWithInput(input_json='{"x": 2}')),
            {"echo": {"x": 2}},
            "EXECUTED",
        ),
        (
            decision(block=hooks_pb2.BeforeToolCallResponse.Block(reason="Not today.")),
            "Not today.",
            "BLOCKED",
        ),
        (
            decision(block=hooks_pb2.BeforeToolCallResponse.Block()),
            'Tool "echo" was blocked by beforeToolCall.',
            "BLOCKED",
        ),
        (
            decision(
                substitute=hooks_pb2.BeforeToolCallResponse.Substitute(output_json='{"cached": [1, 2]}')
            ),
            {"cached": [1, 2]},
            "SUBSTITUTED",
        ),
    ],
    ids=["allow", "allow-with-input", "block", "block-default-reason", "substitute"],
)
async def test_each_before_tool_call_decision_is_applied(
    hooks: tuple[RecordingHookServer, str],
    remote_engine: RemoteEngine,
    answer: hooks_pb2.BeforeToolCallResponse,
    output: Any,
    outcome: str,
) -> None:
    server, address = hooks
    server.answers["BeforeToolCall"] = lambda request, context: answer
    harness, _ = await remote_engine(address)
    events = await harness.run("go")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    (part,) = tool_parts(end.message)
    assert part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert json.loads(part.output_json) == output
    assert json.loads(part.input_json) == {"x": 1}  # the stored input stays the model's
    after = next(c.request for c in server.calls if c.rpc == "AfterToolCall")
    assert after.outcome == hooks_pb2.ToolCallOutcome.Value(f"TOOL_CALL_OUTCOME_{outcome}")


async def test_before_turn_and_before_step_changes_are_applied(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    server, address = hooks
    server.answers["BeforeTurn"] = lambda request, context: hooks_pb2.BeforeTurnResponse(
        system=request.system + " Be brief.",
        max_steps=1,
        model_settings=hooks_pb2.ModelSettings(temperature=0.25, headers={"x-team": "blue"}),
    )
    server.answers["BeforeStep"] = lambda request, context: hooks_pb2.BeforeStepResponse(
        model="scripted:other", tool_choice="none"
    )
    harness, _ = await remote_engine(address)
    events = await harness.run("go")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message) == "From the other model."
    (request,) = harness.provider.requests  # max_steps=1
    assert request.system == "You are a helpful assistant. Be brief."
    assert request.model == "other"
    assert request.tool_choice == "none"
    assert request.settings.temperature == 0.25
    assert dict(request.settings.headers or {}) == {"x-team": "blue"}
    # BeforeStep saw the system as BeforeTurn changed it.
    before_step = next(c.request for c in server.calls if c.rpc == "BeforeStep")
    assert before_step.system == "You are a helpful assistant. Be brief."


# --- error hooks ----------------------------------------------------------------------------

FAILING = {"main": [ScriptStep(error=ScriptedError(message="upstream exploded", status=500))]}


async def test_classify_chat_error_and_on_chat_error_round_trip(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    server, address = hooks
    server.answers["ClassifyChatError"] = lambda request, context: hooks_pb2.ClassifyChatErrorResponse(
        classification=hooks_pb2.CHAT_ERROR_CLASSIFICATION_RATE_LIMIT
    )
    info = any_pb2.Any()
    info.Pack(
        error_details_pb2.ErrorInfo(reason="PROVIDER_ERROR", domain="turnwire.dev", metadata={"k": "v"})
    )
    server.answers["OnChatError"] = lambda request, context: hooks_pb2.OnChatErrorResponse(
        error=status_pb2.Status(code=code_pb2.UNAVAILABLE, message="Please try again later.", details=[info])
    )
    harness, _ = await remote_engine(address, scripts=FAILING)
    events = await harness.run("go")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.code == code_pb2.UNAVAILABLE
    assert end.error.message == "Please try again later."
    classify = next(c.request for c in server.calls if c.rpc == "ClassifyChatError")
    assert classify.failure.stage == "stream"
    assert classify.failure.provider_error.http_status == 500
    assert classify.failure.messages_persisted
    on_error = next(c.request for c in server.calls if c.rpc == "OnChatError")
    assert on_error.failure.classification == hooks_pb2.CHAT_ERROR_CLASSIFICATION_RATE_LIMIT
    assert on_error.failure.error.code == code_pb2.UNAVAILABLE  # what the client would have seen
    assert "upstream exploded" in on_error.failure.error.message
    rpcs = server.rpcs(chunks=False)
    assert rpcs.index("ClassifyChatError") < rpcs.index("OnChatError")


async def test_on_chat_error_may_replace_only_the_message(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    server, address = hooks
    server.answers["OnChatError"] = lambda request, context: hooks_pb2.OnChatErrorResponse(message="Sorry.")
    harness, _ = await remote_engine(address, scripts=FAILING)
    end = end_of(await harness.run("go"))
    assert end.error.message == "Sorry."
    assert end.error.code == code_pb2.UNAVAILABLE  # the provider's 500, as mapped (§10)


# --- failures -------------------------------------------------------------------------------


def invalid_json(request: Any, context: Any) -> hooks_pb2.BeforeToolCallResponse:
    return decision(allow_with_input=hooks_pb2.BeforeToolCallResponse.AllowWithInput(input_json="{not json"))


FAILURES: dict[str, Callable[[RecordingHookServer], None]] = {
    "timeout": lambda server: server.answers.__setitem__("BeforeToolCall", sleep_forever),
    "unimplemented": lambda server: server.answers.__setitem__(
        "BeforeToolCall", abort(grpc.StatusCode.UNIMPLEMENTED)
    ),
    "wrong-type": lambda server: server.garbage.add("BeforeToolCall"),
    "invalid-json": lambda server: server.answers.__setitem__("BeforeToolCall", invalid_json),
}
KINDS = {
    "timeout": "deadline_exceeded",
    "unimplemented": "unimplemented",
    "wrong-type": "invalid_response",
    "invalid-json": "invalid_response",
}


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_a_failing_before_tool_call_follows_its_failure_mode(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine, failure: str, mode: str
) -> None:
    server, address = hooks
    FAILURES[failure](server)
    harness, middleware = await remote_engine(
        address, deadline_seconds=0.3, failure_mode={"before_tool_call": mode}
    )
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    (part,) = tool_parts(end.message)
    if mode == "open":  # as if it answered None: the tool ran
        assert json.loads(part.output_json) == {"echo": {"x": 1}}
    else:
        # No answer is "unavailable"; an answer that is an error or unusable is "failed" (before
        # the kit trial every failure said "unavailable", also a hook that was up and threw).
        what = "was unavailable" if failure == "timeout" else "failed"
        assert json.loads(part.output_json) == (
            f'Tool "echo" was blocked: its policy hook ({middleware.name}) {what}.'
        )
    kind = KINDS[failure]
    assert (
        metric("turnwire_remote_hook_errors_total", server=address, hook="before_tool_call", kind=kind) == 1
    ), kind
    assert server.count("BeforeToolCall") == 1
    assert server.count("OnChatResponse") == 1  # the other hooks still ran


@pytest.mark.parametrize("hook", ["before_turn", "before_step"])
@pytest.mark.parametrize("failure", ["timeout", "unimplemented"])
async def test_a_failing_before_turn_or_before_step_fails_the_turn_when_closed(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine, hook: str, failure: str
) -> None:
    server, address = hooks
    rpc = {"before_turn": "BeforeTurn", "before_step": "BeforeStep"}[hook]
    server.answers[rpc] = sleep_forever if failure == "timeout" else abort(grpc.StatusCode.UNIMPLEMENTED)
    harness, middleware = await remote_engine(address, deadline_seconds=0.3, failure_mode={hook: "closed"})
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.code == code_pb2.INTERNAL
    assert f"the hook server gave no usable {hook} answer" in end.error.message
    assert end.error.message.endswith(f"; its failure mode is closed (middleware {middleware.name}, {hook})")
    info = next(
        (d for d in (_error_info(a) for a in end.error.details) if d is not None),
        error_details_pb2.ErrorInfo(),
    )
    assert info.reason == "HOOK_FAILED"
    assert dict(info.metadata) == {"middleware": middleware.name, "hook": hook, "stage": hook[7:]}
    assert harness.provider.calls == 0
    assert server.count("OnChatError") == 1


def _error_info(packed: any_pb2.Any) -> error_details_pb2.ErrorInfo | None:
    info = error_details_pb2.ErrorInfo()
    return info if packed.Unpack(info) else None


@pytest.mark.parametrize("hook", ["before_turn", "before_step"])
async def test_a_failing_before_turn_or_before_step_is_skipped_when_open(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine, hook: str
) -> None:
    server, address = hooks
    server.garbage.add({"before_turn": "BeforeTurn", "before_step": "BeforeStep"}[hook])
    harness, _ = await remote_engine(address, failure_mode="open")
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message) == "Let me check.Done."


async def test_failing_observing_hooks_never_fail_a_turn(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    server, address = hooks
    server.answers["AfterToolCall"] = abort(grpc.StatusCode.INTERNAL, "observer broke")
    server.answers["OnStepFinish"] = sleep_forever
    server.garbage.add("OnChatResponse")
    server.answers["ClassifyChatError"] = lambda request, context: hooks_pb2.ClassifyChatErrorResponse(
        classification=hooks_pb2.ChatErrorClassification.ValueType(99)  # no such value
    )
    harness, _ = await remote_engine(address, deadline_seconds=0.3, failure_mode="closed")
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert server.count("OnStepFinish") == 2 and server.count("OnChatResponse") == 1


# --- breaker --------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_the_breaker_opens_after_repeated_failures_and_closes_when_the_server_answers(
    remote_engine: RemoteEngine,
) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_BEFORE_TURN])
    server.answers["BeforeTurn"] = abort(grpc.StatusCode.UNAVAILABLE, "overloaded")
    clock = FakeClock()
    async with serving(server) as address:
        harness, middleware = await remote_engine(
            address, clock=clock, breaker={"failure_threshold": 2, "open_seconds": 30}
        )
        for _ in range(2):
            assert end_of(await harness.run("go")).status == event_pb2.TURN_STATUS_COMPLETED
        assert middleware.breaker.state == "open"
        assert metric("turnwire_remote_hook_breaker_state", server=address) == 2
        for _ in range(3):  # open: the failure mode at once, no RPC
            assert end_of(await harness.run("go")).status == event_pb2.TURN_STATUS_COMPLETED
        assert server.count("BeforeTurn") == 2
        assert (
            metric(
                "turnwire_remote_hook_errors_total", server=address, hook="before_turn", kind="breaker_open"
            )
            == 3
        )

        del server.answers["BeforeTurn"]  # the server recovers
        clock.now += 30  # the open period is over: the next call is the probe
        await harness.run("go")
        assert server.count("BeforeTurn") == 3
        assert middleware.breaker.state == "closed"  # type: ignore[comparison-overlap]  # mypy keeps the earlier assert's narrowing
        assert metric("turnwire_remote_hook_breaker_state", server=address) == 0
        await harness.run("go")
        assert server.count("BeforeTurn") == 4
        # Closing asks the subscriptions again (the server may have been replaced).
        await wait_until(lambda: server.count("GetHookSubscriptions") == 2, what="re-subscription")


async def test_a_failed_probe_opens_the_breaker_again(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_BEFORE_TURN])
    server.answers["BeforeTurn"] = abort(grpc.StatusCode.UNAVAILABLE)
    clock = FakeClock()
    async with serving(server) as address:
        harness, middleware = await remote_engine(
            address, clock=clock, breaker={"failure_threshold": 1, "open_seconds": 10}
        )
        await harness.run("go")
        assert middleware.breaker.state == "open"
        clock.now += 10
        await harness.run("go")  # the probe fails
        assert server.count("BeforeTurn") == 2
        assert middleware.breaker.state == "open"
        await harness.run("go")
        assert server.count("BeforeTurn") == 2


# --- OnChunks -------------------------------------------------------------------------------

LONG_TEXT = "abcdefghij" * 60


async def test_chunks_reach_on_chunks_in_batches_on_one_call_per_turn(remote_engine: RemoteEngine) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_ON_CHUNKS])
    async with serving(server) as address:
        harness, _ = await remote_engine(
            address,
            scripts={"main": [ScriptStep(text=LONG_TEXT, chunk_size=1)]},
            chunks={"max_events": 64, "max_delay_ms": 50},
        )
        end = end_of(await harness.run("go"))
        assert text_of(end.message) == LONG_TEXT
    (call,) = [c for c in server.calls if c.rpc == "OnChunks"]
    requests = call.request
    events = [e for r in requests for e in r.events]
    deltas = [e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta"]
    assert "".join(deltas) == LONG_TEXT
    assert len(deltas) == len(LONG_TEXT)
    # Never one message per token: at most 64 events per message.
    assert len(requests) <= len(events) // 64 + 2, [len(r.events) for r in requests]
    assert all(len(r.events) <= 64 for r in requests)
    assert requests[0].turn.request_id and not any(r.HasField("turn") for r in requests[1:])
    assert events[0].WhichOneof("event") == "step_start"
    assert events[-1].WhichOneof("event") == "step_finish"
    assert metric("turnwire_remote_hook_chunk_batches_total", server=address) == len(requests)
    assert metric("turnwire_remote_hook_calls_total", server=address, hook="on_chunk") == 1


def test_the_concurrent_input_strategy_reaches_remote_before_turn_and_on_chat_response() -> None:
    """Issue 18: a hook server sees which strategy applied, as the in-process hooks do."""
    turn = TurnContext(
        conversation_id="c",
        request_id="new",
        system="s",
        messages=[],
        tools={},
        model="scripted:demo",
        continuation=False,
        body={},
        concurrent_input=ConcurrentInput("rollback", "old"),
    )
    request = convert.before_turn_request(turn, convert.turn_info_of(turn), include_messages=False)
    assert request.concurrent_input == hooks_pb2.ConcurrentInput(
        strategy=chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK, request_id="old"
    )
    stopped = ChatResponseContext(
        conversation_id="c",
        request_id="old",
        message=message_pb2.Message(),
        continuation=False,
        status="aborted",
        concurrent_input=ConcurrentInput("interrupt", "new"),
    )
    response = convert.chat_response_request(stopped, convert.turn_info("c", "old"))
    assert response.concurrent_input.strategy == chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT
    assert response.concurrent_input.request_id == "new"
    plain = convert.chat_response_request(
        ChatResponseContext("c", "x", message_pb2.Message(), False, "completed"), convert.turn_info("c", "x")
    )
    assert not plain.HasField("concurrent_input")


async def test_a_hook_servers_error_text_is_masked_and_names_no_sidecar_class(
    hooks: tuple[RecordingHookServer, str], remote_engine: RemoteEngine
) -> None:
    """Fresh-user trial (stop 65): a kit's hook that raised ``password=…`` reached the client and
    the stored turn unmasked, with ``RemoteHookUnavailable`` and the sidecar's own module path in
    the message. The hook server's text is masked where it enters (docs/security.md, "Secrets")
    and the message names the hook server's middleware, not the sidecar's classes."""
    server, address = hooks
    server.answers["BeforeTurn"] = abort(grpc.StatusCode.UNKNOWN, "db password=hunter2 at /srv/policy.py")
    harness, middleware = await remote_engine(
        address, failure_mode={"before_turn": "closed"}, redact=Redactor(()).redact
    )
    end = end_of(await harness.run("go"))
    assert end.status == event_pb2.TURN_STATUS_ERROR
    message = end.error.message
    assert "UNKNOWN: db password=*** at /srv/policy.py" in message, message
    assert (
        "hunter2" not in message
        and "turnwire_server" not in message
        and "RemoteHookUnavailable" not in message
    )
    assert message.endswith(f"(middleware {middleware.name}, before_turn)"), message
    assert harness.provider.calls == 0
