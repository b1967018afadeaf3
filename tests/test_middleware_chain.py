"""The middleware chain driven by a real engine (docs/semantics.md §3-§4).

Hook order (the onion: request path first to last, response path last to
first), tool-call decisions, hook error rules, config merge rules, and the
TurnConfig fields that act today.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from support.engine_harness import (
    CONV,
    MODEL,
    EngineFactory,
    Harness,
    collect,
    detail,
    end_of,
    kinds,
    make_tool,
    of_kind,
    text_of,
    tool_parts,
    value,
)

from turnwire.hooks import (
    ChatError,
    ChatErrorContext,
    ChatResponseContext,
    ChunkContext,
    Middleware,
    StepConfig,
    StepContext,
    StepFinishContext,
    StopWhen,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
    TurnTimeout,
)
from turnwire.testing import (
    ScriptedError,
    ScriptedToolCall,
    ScriptStep,
)
from turnwire.tools import PythonTool, ToolExecution
from turnwire.types import ModelSettings
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.api.status import TurnwireStatusError

BLOCKED = 'Tool "{name}" was blocked by beforeToolCall.'


Entry = tuple[Any, ...]


class Recorder(Middleware):
    """Records every hook call as ``(name, hook, detail)`` into a shared log."""

    def __init__(self, name: str, log: list[Entry]) -> None:
        self.name = name
        super().__init__()
        self.log = log
        self.contexts: dict[str, list[Any]] = {}

    def _add(self, hook: str, ctx: Any, detail: Any = None) -> None:
        self.contexts.setdefault(hook, []).append(ctx)
        self.log.append((self.name, hook, detail))

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        self._add("before_turn", ctx)
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        self._add("before_step", ctx, ctx.step_number)
        return None

    async def on_chunk(self, ctx: ChunkContext) -> None:
        chunk = ctx.chunk
        if isinstance(chunk, message_pb2.ToolCallPart):
            detail: Any = ("result", chunk.tool_name, chunk.preliminary)
        else:
            detail = type(chunk).__name__
        self._add("on_chunk", ctx, detail)

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        self._add("before_tool_call", ctx, ctx.tool_name)
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        self._add("after_tool_call", ctx, ctx.tool_name)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self._add("on_step_finish", ctx, ctx.step_number)

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        self._add("on_chat_response", result, result.status)

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self._add("on_chat_error", ctx, ctx.stage)
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
        self._add("classify_chat_error", ctx)
        return None


def both(hook: str, detail: Any = None, *, reverse: bool = False) -> list[Entry]:
    """``A`` then ``B`` (request path), or ``B`` then ``A`` (response path)."""
    names = ("B", "A") if reverse else ("A", "B")
    return [(n, hook, detail) for n in names]


def chunks(*types: Any) -> list[Entry]:
    out: list[Entry] = []
    for t in types:
        out += both("on_chunk", t, reverse=True)
    return out


# --------------------------------------------------------------------------- hook order


async def test_hook_order_for_a_turn_with_one_tool_call(make_engine: EngineFactory) -> None:
    log: list[Entry] = []
    holder: dict[str, Harness] = {}

    async def lookup(input: dict[str, Any], execution: ToolExecution) -> str:
        log.append(("tool", "execute", "lookup"))
        return "found"

    class Last(Recorder):
        async def on_chat_response(self, result: ChatResponseContext) -> None:
            await super().on_chat_response(result)
            h = holder["h"]
            # The assistant message is stored and the lock released before this runs.
            stored = await h.store.load_messages(CONV)
            self.log.append(("check", "stored", [m.id for m in stored]))
            lock = h.store.turn_lock(CONV)
            await asyncio.wait_for(lock.__aenter__(), 1)
            await lock.__aexit__(None, None, None)
            self.log.append(("check", "lock", "free"))

    a, b = Recorder("A", log), Last("B", log)
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(text="Checking.", tool_calls=[ScriptedToolCall(name="lookup", input={"q": 1})]),
                ScriptStep(text="Done."),
            ]
        },
        tools=[make_tool("lookup", lookup)],
        middlewares=[a, b],
    )
    holder["h"] = h
    events = await collect(
        await h.start(body={"from": "test"}),
        lambda kind: log.append(("client", kind, None)) if kind == "turn_end" else None,
    )
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED

    expected = [
        *both("before_turn"),
        *both("before_step", 0),
        *chunks(
            "UsageUpdate",
            "TextStart",
            "TextDelta",
            "TextEnd",
            "ToolInputStart",
            "ToolInputDelta",
            "ToolCall",
            "FinishStep",
        ),
        *both("before_tool_call", "lookup"),
        ("tool", "execute", "lookup"),
        *chunks(("result", "lookup", False)),
        *both("after_tool_call", "lookup", reverse=True),
        *both("on_step_finish", 0, reverse=True),
        *both("before_step", 1),
        *chunks("UsageUpdate", "TextStart", "TextDelta", "TextEnd", "FinishStep"),
        *both("on_step_finish", 1, reverse=True),
        ("B", "on_chat_response", "completed"),
        ("check", "stored", ["u1", "tw-a-r1"]),
        ("check", "lock", "free"),
        ("A", "on_chat_response", "completed"),
        ("client", "turn_end", None),
    ]
    assert log == expected

    # The contexts carry what section 3 says.
    turn_ctx: TurnContext = a.contexts["before_turn"][0]
    assert (turn_ctx.conversation_id, turn_ctx.request_id, turn_ctx.model) == (CONV, "r1", MODEL)
    assert turn_ctx.system == "You are a helpful assistant."
    assert [m.id for m in turn_ctx.messages] == ["u1"]
    assert set(turn_ctx.tools) == {"lookup"}
    assert turn_ctx.continuation is False
    assert dict(turn_ctx.body) == {"from": "test"}

    step1: StepContext = a.contexts["before_step"][1]
    assert len(step1.steps) == 1 and step1.steps[0].step_number == 0
    assert step1.messages[-1].role == message_pb2.ROLE_ASSISTANT

    call_ctx: ToolCallContext = a.contexts["before_tool_call"][0]
    assert (call_ctx.tool_call_id, call_ctx.step_number, dict(call_ctx.input)) == ("call_0_0", 0, {"q": 1})
    assert [m.id for m in call_ctx.messages] == ["u1"]

    result_ctx: ToolCallResultContext = a.contexts["after_tool_call"][0]
    assert result_ctx.success is True
    assert result_ctx.output == "found"
    assert result_ctx.error is None
    assert result_ctx.step_number == 0
    assert result_ctx.duration_ms >= 0

    step0: StepFinishContext = a.contexts["on_step_finish"][0]
    assert step0.text == "Checking."
    assert step0.finish_reason == "tool-calls"
    assert [c.tool_name for c in step0.tool_calls] == ["lookup"]
    assert [c.state for c in step0.tool_results] == [message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE]
    assert a.contexts["on_step_finish"][1].finish_reason == "stop"

    response: ChatResponseContext = a.contexts["on_chat_response"][0]
    stored = await h.store.load_messages(CONV)
    assert response.message == stored[-1]
    assert response.continuation is False and response.error is None


async def test_hook_order_for_two_parallel_tool_calls_of_different_speeds(make_engine: EngineFactory) -> None:
    log: list[Entry] = []

    def sleeper(name: str, seconds: float) -> PythonTool:
        async def run(input: dict[str, Any], execution: ToolExecution) -> str:
            log.append(("tool", "execute", name))
            await asyncio.sleep(seconds)
            log.append(("tool", "done", name))
            return name

        return make_tool(name, run)

    a, b = Recorder("A", log), Recorder("B", log)
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="slow"), ScriptedToolCall(name="fast")]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[sleeper("slow", 0.12), sleeper("fast", 0.02)],
        middlewares=[a, b],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    tool_input = ("ToolInputStart", "ToolInputDelta", "ToolCall")
    expected = [
        *both("before_turn"),
        *both("before_step", 0),
        *chunks("UsageUpdate", *tool_input, *tool_input, "FinishStep"),
        # started in emission order ...
        *both("before_tool_call", "slow"),
        ("tool", "execute", "slow"),
        *both("before_tool_call", "fast"),
        ("tool", "execute", "fast"),
        # ... finished in completion order
        ("tool", "done", "fast"),
        *chunks(("result", "fast", False)),
        *both("after_tool_call", "fast", reverse=True),
        ("tool", "done", "slow"),
        *chunks(("result", "slow", False)),
        *both("after_tool_call", "slow", reverse=True),
        # once, after both
        *both("on_step_finish", 0, reverse=True),
        *both("before_step", 1),
        *chunks("UsageUpdate", "TextStart", "TextDelta", "TextEnd", "FinishStep"),
        *both("on_step_finish", 1, reverse=True),
        *both("on_chat_response", "completed", reverse=True),
    ]
    assert log == expected
    step0: StepFinishContext = a.contexts["on_step_finish"][0]
    assert [c.tool_name for c in step0.tool_calls] == ["slow", "fast"]  # emission order
    durations = {c.tool_name: c.duration_ms for c in a.contexts["after_tool_call"]}
    assert durations["slow"] >= 100 and durations["fast"] < durations["slow"]


# --------------------------------------------------------------------------- tool decisions


class Decide(Middleware):
    """``before_tool_call`` returns ``decision`` (or raises it); records contexts."""

    def __init__(self, name: str, decision: Any = None) -> None:
        self.name = name
        super().__init__()
        self.decision = decision
        self.calls: list[ToolCallContext] = []
        self.results: list[ToolCallResultContext] = []

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        self.calls.append(ctx)
        if isinstance(self.decision, BaseException):
            raise self.decision
        decision: ToolCallDecision | None = self.decision
        return decision

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        self.results.append(ctx)


@dataclass
class EchoSetup:
    h: Harness
    ran: list[dict[str, Any]]


async def _echo_setup(make_engine: EngineFactory, middlewares: Sequence[Middleware]) -> EchoSetup:
    ran: list[dict[str, Any]] = []

    async def echo(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
        ran.append(dict(input))
        return {"echo": input}

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("echo", echo)],
        middlewares=middlewares,
    )
    return EchoSetup(h, ran)


async def test_allow_and_none_run_the_tool_with_the_models_input(make_engine: EngineFactory) -> None:
    first, second = Decide("first", ToolCallDecision.allow()), Decide("second", None)
    s = await _echo_setup(make_engine, [first, second])
    events = await s.h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert s.ran == [{"x": 1}]
    assert len(first.calls) == 1 and len(second.calls) == 1
    assert first.results[0].success is True
    assert first.results[0].output == {"echo": {"x": 1}}


async def test_allow_with_new_input_runs_the_tool_with_it_but_keeps_the_models(
    make_engine: EngineFactory,
) -> None:
    rewrite = Decide("rewrite", ToolCallDecision.allow(input={"x": 2, "added": "yes"}))
    observer = Decide("observer", None)
    s = await _echo_setup(make_engine, [rewrite, observer])
    events = await s.h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED

    assert s.ran == [{"x": 2, "added": "yes"}]  # the tool got the new input
    assert dict(observer.calls[0].input) == {"x": 2, "added": "yes"}  # so did the next middleware
    assert dict(rewrite.calls[0].input) == {"x": 1}
    for m in (rewrite, observer):
        assert dict(m.results[0].input) == {"x": 1}  # after_tool_call keeps the model's
        assert m.results[0].output == {"echo": {"x": 2, "added": "yes"}}
    part = tool_parts((await s.h.store.load_messages(CONV))[-1])[0]
    assert value(part.input) == {"x": 1}  # the stored part keeps the model's
    assert value(part.output) == {"echo": {"x": 2, "added": "yes"}}
    assert value(of_kind(events, "tool_input_available")[0].input) == {"x": 1}


@pytest.mark.parametrize("reason", [None, "The policy forbids echo."])
async def test_block_does_not_run_the_tool_and_the_model_sees_the_reason(
    make_engine: EngineFactory, reason: str | None
) -> None:
    blocker = Decide("blocker", ToolCallDecision.block(reason))
    later = Decide("later", None)
    s = await _echo_setup(make_engine, [blocker, later])
    events = await s.h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    expected = reason if reason is not None else 'Tool "echo" was blocked by beforeToolCall.'

    assert s.ran == []
    assert later.calls == []  # the first block ends the chain
    for m in (blocker, later):  # after_tool_call still runs for every middleware
        assert len(m.results) == 1
        assert m.results[0].success is True
        assert m.results[0].output == expected
        assert m.results[0].error is None
    outputs = of_kind(events, "tool_output_available")
    assert [(o.preliminary, value(o.output)) for o in outputs] == [(False, expected)]
    sent = tool_parts(s.h.provider.requests[1].messages[-1])[0]
    assert sent.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(sent.output) == expected
    stored = tool_parts((await s.h.store.load_messages(CONV))[-1])[0]
    assert stored.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(stored.output) == expected


async def test_substitute_does_not_run_the_tool_and_the_model_sees_the_output(
    make_engine: EngineFactory,
) -> None:
    sub = Decide("sub", ToolCallDecision.substitute({"cached": True, "n": 3}))
    later = Decide("later", ToolCallDecision.block("never reached"))
    s = await _echo_setup(make_engine, [sub, later])
    events = await s.h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert s.ran == []
    assert later.calls == []
    assert sub.results[0].success is True
    assert sub.results[0].output == {"cached": True, "n": 3}
    sent = tool_parts(s.h.provider.requests[1].messages[-1])[0]
    assert sent.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(sent.output) == {"cached": True, "n": 3}


async def test_raising_before_tool_call_is_that_tools_error_and_the_turn_goes_on(
    make_engine: EngineFactory,
) -> None:
    broken = Decide("broken", ValueError("policy service exploded"))
    later = Decide("later", None)
    s = await _echo_setup(make_engine, [broken, later])
    events = await s.h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert s.h.provider.calls == 2
    assert s.ran == []
    assert later.calls == []
    for m in (broken, later):
        assert m.results[0].success is False
        assert m.results[0].output is None
        assert "policy service exploded" in (m.results[0].error or "")
    errors = of_kind(events, "tool_output_error")
    assert len(errors) == 1 and "policy service exploded" in errors[0].error_text
    sent = tool_parts(s.h.provider.requests[1].messages[-1])[0]
    assert sent.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert "policy service exploded" in sent.error_text
    assert text_of((await s.h.store.load_messages(CONV))[-1]) == "ok"


@pytest.mark.parametrize(
    "decision",
    [ToolCallDecision.block(), ToolCallDecision.substitute({"fake": 1})],
    ids=["block", "substitute"],
)
async def test_streaming_tool_through_block_or_substitute_sends_one_preliminary_then_final(
    make_engine: EngineFactory, decision: ToolCallDecision
) -> None:
    ran: list[int] = []

    async def progress(input: dict[str, Any], execution: ToolExecution) -> AsyncIterator[Any]:
        ran.append(1)
        yield {"progress": 1}
        yield {"done": True}

    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="progress")]), ScriptStep(text="k")]},
        tools=[make_tool("progress", progress)],
        middlewares=[Decide("d", decision)],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert ran == []
    expected = BLOCKED.format(name="progress") if decision.action == "block" else {"fake": 1}
    outputs = of_kind(events, "tool_output_available")
    assert [(o.preliminary, value(o.output)) for o in outputs] == [(True, expected), (False, expected)]


# --------------------------------------------------------------------------- hook errors


class Raise(Middleware):
    """Raises from the hooks named in ``hooks`` (``before_step`` only at step ``at_step``)."""

    def __init__(self, name: str, hooks: set[str], at_step: int = 0) -> None:
        self.name = name
        super().__init__()
        self.hooks = hooks
        self.at_step = at_step
        self.errors: list[tuple[BaseException, ChatErrorContext]] = []

    def _maybe(self, hook: str) -> None:
        if hook in self.hooks:
            raise RuntimeError(f"{self.name}.{hook} broke")

    async def before_turn(self, ctx: TurnContext) -> None:
        self._maybe("before_turn")

    async def before_step(self, ctx: StepContext) -> None:
        if ctx.step_number == self.at_step:
            self._maybe("before_step")

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        self._maybe("after_tool_call")

    async def on_chunk(self, ctx: ChunkContext) -> None:
        self._maybe("on_chunk")

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self._maybe("on_step_finish")

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        self._maybe("on_chat_response")

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self.errors.append((ctx.error, ctx))
        return ctx.error


TOOL_SCRIPT = {
    "main": [
        ScriptStep(text="Let me check.", tool_calls=[ScriptedToolCall(name="lookup")]),
        ScriptStep(text="Done."),
    ]
}


async def _lookup(input: dict[str, Any], execution: ToolExecution) -> str:
    return "found"


async def test_before_turn_raising_fails_the_turn_without_a_model_call(make_engine: EngineFactory) -> None:
    log: list[Entry] = []
    rec = Recorder("rec", log)
    broken = Raise("broken", {"before_turn"})
    h = await make_engine(
        scripts=TOOL_SCRIPT, tools=[make_tool("lookup", _lookup)], middlewares=[broken, rec]
    )
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert h.provider.calls == 0
    assert kinds(events) == ["turn_start", "turn_end"]
    assert end.error.code == grpc.StatusCode.INTERNAL.value[0]
    info = detail(end.error, error_details_pb2.ErrorInfo)
    assert info.reason == "HOOK_FAILED"
    assert info.metadata["hook"] == "before_turn"
    assert info.metadata["middleware"] == "broken"
    assert info.metadata["stage"] == "turn"
    # on_chat_error sees the hook's own exception, not a wrapper around it; the client sees its
    # message first, then the middleware (name and class) and hook that raised it; the context
    # names the hook (docs/semantics.md §11).
    assert end.error.message.startswith("broken.before_turn broke (RuntimeError in middleware broken (")
    assert end.error.message.endswith(":Raise), before_turn)")
    original, context = broken.errors[0]
    assert type(original) is RuntimeError and str(original) == "broken.before_turn broke"
    assert (context.middleware, context.hook) == ("broken", "before_turn")
    # the later middleware's before_turn never ran; on_chat_error ran once, stage turn
    assert ("rec", "before_turn", None) not in log
    assert [c.stage for _, c in broken.errors] == ["turn"]
    assert broken.errors[0][1].messages_persisted is True
    assert [(h_, d) for _, h_, d in log if h_ == "on_chat_error"] == [("on_chat_error", "turn")]
    assert [m.role for m in await h.store.load_messages(CONV)] == [message_pb2.ROLE_USER]


async def test_a_raising_hook_is_logged_with_its_traceback_and_class(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Raise("broken", {"before_turn"})
    h = await make_engine(scripts=TOOL_SCRIPT, tools=[make_tool("lookup", _lookup)], middlewares=[broken])
    with caplog.at_level(logging.WARNING, logger="turnwire.middleware"):
        await h.run()
    (record,) = [r for r in caplog.records if r.name == "turnwire.middleware"]
    assert record.exc_info is not None and record.exc_info[1] is broken.errors[0][0]
    assert ":Raise) before_turn raised RuntimeError: broken.before_turn broke" in record.getMessage()


async def test_before_step_raising_fails_with_stage_step_and_keeps_the_partial(
    make_engine: EngineFactory,
) -> None:
    broken = Raise("broken", {"before_step"}, at_step=1)
    h = await make_engine(scripts=TOOL_SCRIPT, tools=[make_tool("lookup", _lookup)], middlewares=[broken])
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert h.provider.calls == 1
    info = detail(end.error, error_details_pb2.ErrorInfo)
    assert info.metadata["stage"] == "step"
    assert info.metadata["hook"] == "before_step"
    assert [c.stage for _, c in broken.errors] == ["step"]
    # step 0's output (text and tool result) is stored
    stored = await h.store.load_messages(CONV)
    assert len(stored) == 2
    assert text_of(stored[1]) == "Let me check."
    part = tool_parts(stored[1])[0]
    assert part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(part.output) == "found"
    assert end.message == stored[1]


@pytest.mark.parametrize("hook", ["after_tool_call", "on_chunk", "on_step_finish", "on_chat_response"])
async def test_observer_hook_errors_are_logged_and_counted_and_the_turn_completes(
    make_engine: EngineFactory, hook: str, caplog: pytest.LogCaptureFixture
) -> None:
    log: list[Entry] = []
    # `first` is listed first, so on the response path it runs after `broken`.
    first = Recorder("first", log)
    broken = Raise("broken", {hook})
    h = await make_engine(
        scripts=TOOL_SCRIPT, tools=[make_tool("lookup", _lookup)], middlewares=[first, broken]
    )
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert not end.HasField("error")
    assert h.provider.calls == 2
    # the middleware after it in the (reversed) order still ran, each time
    observed = [e for e in log if e[1] == hook]
    expected_calls = {
        "after_tool_call": 1,
        "on_step_finish": 2,
        "on_chat_response": 1,
        # step 0: usage update, text start, 3 word deltas, text end, tool input
        # start/delta, tool call, finish (10) + 1 tool result; step 1: 5 model chunks
        "on_chunk": 16,
    }[hook]
    assert len(observed) == expected_calls
    assert h.chain.error_counts[("broken", hook)] == expected_calls
    assert sum(h.chain.error_counts.values()) == expected_calls
    assert any("broken" in r.getMessage() and hook in r.getMessage() for r in caplog.records)
    assert text_of((await h.store.load_messages(CONV))[-1]) == "Let me check.Done."


async def test_on_chat_error_can_replace_what_the_client_sees(make_engine: EngineFactory) -> None:
    class Friendly(Middleware):
        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            return f"Sorry, the assistant is unavailable ({ctx.stage})."

    class Coded(Middleware):
        seen: list[str] = []

        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            # runs first (last in the list): the original error
            self.seen.append(str(ctx.error))
            return ctx.error

    coded = Coded()
    h = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="upstream exploded", status=500))]},
        middlewares=[Friendly(), coded],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.message == "Sorry, the assistant is unavailable (stream)."
    assert coded.seen == ["upstream exploded"]

    class Status(Middleware):
        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            return ChatError("quota used up", code="FAILED_PRECONDITION", reason="QUOTA", metadata={"k": "v"})

    h2 = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="upstream exploded", status=500))]},
        middlewares=[Status()],
        db="second.db",
    )
    end2 = end_of(await h2.run())
    assert end2.status == event_pb2.TURN_STATUS_ERROR
    assert end2.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert end2.error.message == "quota used up"
    assert detail(end2.error, error_details_pb2.ErrorInfo).reason == "QUOTA"


async def test_classify_chat_error_first_non_none_wins_last_to_first(make_engine: EngineFactory) -> None:
    calls: list[str] = []
    seen: list[Any] = []

    class Classify(Middleware):
        def __init__(self, name: str, result: Any) -> None:
            self.name = name
            super().__init__()
            self.result = result

        async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
            calls.append(self.name)
            if isinstance(self.result, BaseException):
                raise self.result
            return self.result

        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            seen.append((self.name, ctx.classification))
            return ctx.error

    h = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="429 tokens per minute", status=429))]},
        middlewares=[
            Classify("m1", "fatal"),
            Classify("m2", "rate_limit"),
            Classify("m3", RuntimeError("classifier down")),
            Classify("m4", None),
        ],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert calls == ["m4", "m3", "m2"]  # m1 never asked
    assert h.chain.error_counts[("m3", "classify_chat_error")] == 1
    # on_chat_error runs last to first, once each, with the classification
    assert seen == [(n, "rate_limit") for n in ("m4", "m3", "m2", "m1")]


# --------------------------------------------------------------------------- the default classifier

OVERFLOW = {
    "main": [
        ScriptStep(
            error=ScriptedError(
                message="prompt is too long: 210000 tokens > 200000 maximum",
                status=400,
                type="invalid_request_error",
            )
        )
    ]
}


class Seen(Middleware):
    """Records the classification ``on_chat_error`` gets."""

    def __init__(self) -> None:
        super().__init__()
        self.classifications: list[Any] = []

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self.classifications.append(ctx.classification)
        return ctx.error


class Gateway(Middleware):
    """A user's classifier: its gateway's overflows are transient; everything else is left to others."""

    async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
        return "transient" if "prompt is too long" in str(ctx.error) else None


async def test_the_default_chain_classifies_an_overflow(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """No middleware configured: the chain holds the default classifier alone, and a provider's
    overflow is classified ``context_overflow`` (the failed turn's record carries it)."""
    h = await make_engine(scripts=OVERFLOW)
    assert [m.name for m in h.chain.middlewares] == ["error_classifier"]
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    (failed,) = [r for r in caplog.records if getattr(r, "event", None) == "chat:request:failed"]
    assert failed.__dict__["classification"] == "context_overflow"


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ("gateway", "transient"),  # a user's classifier wins where it answers
        ("abstaining", "context_overflow"),  # and leaves what it does not answer to the default
        ("gateway, default", "context_overflow"),  # the default placed after it is asked first
        ("default, gateway", "transient"),
        ("subclass", "fatal"),  # a subclass replaces the default
    ],
)
async def test_a_user_classifier_overrides_the_default(
    make_engine: EngineFactory, listed: str, expected: str
) -> None:
    from turnwire.middlewares import ErrorClassifier

    class Abstaining(Middleware):
        async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
            return None

    class Stricter(ErrorClassifier):
        async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
            coarse = await super().classify_chat_error(ctx)
            return "fatal" if coarse == "context_overflow" else coarse

    seen = Seen()
    make = {
        "gateway": Gateway,
        "abstaining": Abstaining,
        "default": ErrorClassifier,
        "subclass": Stricter,
    }
    middlewares = [make[name.strip()]() for name in listed.split(",")]
    h = await make_engine(scripts=OVERFLOW, middlewares=[seen, *middlewares])
    classifiers = [m for m in h.chain.middlewares if isinstance(m, ErrorClassifier)]
    assert len(classifiers) == 1  # never a second default beside one the user placed
    end_of(await h.run())
    assert seen.classifications == [expected]


# --------------------------------------------------------------------------- merge rules


def _tool(name: str) -> PythonTool:
    async def run(input: dict[str, Any], execution: ToolExecution) -> str:
        return name

    return make_tool(name, run)


class Configure(Middleware):
    def __init__(self, name: str, config: TurnConfig | None) -> None:
        self.name = name
        super().__init__()
        self.config = config
        self.seen: list[TurnContext] = []

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        self.seen.append(ctx)
        return self.config


async def test_turn_config_merge_with_two_middlewares(make_engine: EngineFactory) -> None:
    m1 = Configure(
        "m1",
        TurnConfig(
            system="system one",
            model_settings=ModelSettings(
                temperature=0.1,
                top_p=0.5,
                headers={"a": "1", "b": "1"},
                provider_options={"x": 1, "nested": {"keep": True}},
            ),
            tools={"t1": _tool("t1")},
        ),
    )
    m2 = Configure(
        "m2",
        TurnConfig(
            system="system two",
            model_settings=ModelSettings(
                temperature=0.2, headers={"b": "2"}, provider_options={"y": 2, "nested": {"other": 1}}
            ),
            tools={"t2": _tool("t2")},
        ),
    )
    h = await make_engine(tools=[_tool("base")], middlewares=[m1, m2])
    assert end_of(await h.run()).status == event_pb2.TURN_STATUS_COMPLETED
    request = h.provider.requests[0]
    assert request.system == "system two"  # later replaces
    assert request.settings.temperature == 0.2
    assert request.settings.top_p == 0.5  # kept when the later one leaves it unset
    assert sorted(t.name for t in request.tools) == ["base", "t1", "t2"]  # additive
    assert dict(request.settings.headers or {}) == {"a": "1", "b": "2"}  # shallow merge
    # shallow: a nested dict is replaced, not merged
    assert dict(request.settings.provider_options or {}) == {"x": 1, "y": 2, "nested": {"other": 1}}
    # m2 saw m1's changes applied
    assert m2.seen[0].system == "system one"
    assert set(m2.seen[0].tools) == {"base", "t1"}
    assert m1.seen[0].system == "You are a helpful assistant."


async def test_turn_config_merge_with_three_middlewares(make_engine: EngineFactory) -> None:
    calls: list[str] = []

    async def ping(input: dict[str, Any], execution: ToolExecution) -> str:
        calls.append("ping")
        return "pong"

    m1 = Configure(
        "m1",
        TurnConfig(
            model="scripted:first",
            max_steps=7,
            stop_when=[StopWhen(step_count=3)],
            model_settings=ModelSettings(headers={"a": "1"}, provider_options={"p": 1}, seed=1),
        ),
    )
    m2 = Configure("m2", None)  # returning None changes nothing
    m3 = Configure(
        "m3",
        TurnConfig(
            model="scripted:third",
            stop_when=[StopWhen(tool_called="never-called")],
            model_settings=ModelSettings(headers={"c": "3"}, provider_options={"q": 2}),
        ),
    )
    h = await make_engine(
        scripts={
            "main": [ScriptStep(text="main")],
            "first": [ScriptStep(text="first")],
            # Calls ping on every step, up to the turn's max_steps.
            "third": [ScriptStep(tool_calls=[ScriptedToolCall(name="ping")], repeat=True)],
        },
        tools=[make_tool("ping", ping)],
        middlewares=[m1, m2, m3],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    # m3's model replaced m1's; m1's step_count stop still acts next to m3's (additive)
    assert {r.model for r in h.provider.requests} == {"third"}
    assert h.provider.calls == 3 and end.step_count == 3
    assert calls == ["ping"] * 3
    settings = h.provider.requests[0].settings
    assert dict(settings.headers or {}) == {"a": "1", "c": "3"}
    assert dict(settings.provider_options or {}) == {"p": 1, "q": 2}
    assert settings.seed == 1
    assert m2.seen[0].model == "scripted:first"
    assert m3.seen[0].model == "scripted:first"


async def test_step_config_merge_and_per_step_changes(make_engine: EngineFactory) -> None:
    class Step(Middleware):
        def __init__(self, name: str, make: Callable[[StepContext], StepConfig | None]) -> None:
            self.name = name
            super().__init__()
            self.make = make
            self.seen: list[StepContext] = []

        async def before_step(self, ctx: StepContext) -> StepConfig | None:
            self.seen.append(ctx)
            return self.make(ctx)

    s1 = Step(
        "s1",
        lambda ctx: (
            StepConfig(
                system=f"step {ctx.step_number}",
                model_settings=ModelSettings(provider_options={"a": 1, "b": 1}),
            )
            if ctx.step_number == 1
            else None
        ),
    )
    s2 = Step(
        "s2",
        lambda ctx: StepConfig(model_settings=ModelSettings(provider_options={"b": 2}), tool_choice="none"),
    )
    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="ping")]), ScriptStep(text="done")]},
        tools=[_tool("ping")],
        middlewares=[
            Configure(
                "turn",
                TurnConfig(
                    model_settings=ModelSettings(provider_options={"t": 0, "b": 0}), tool_choice="required"
                ),
            ),
            s1,
            s2,
        ],
    )
    assert end_of(await h.run()).status == event_pb2.TURN_STATUS_COMPLETED
    r0, r1 = h.provider.requests
    assert r0.system == "You are a helpful assistant."
    assert r1.system == "step 1"
    assert dict(r0.settings.provider_options or {}) == {"t": 0, "b": 2}
    assert dict(r1.settings.provider_options or {}) == {"t": 0, "a": 1, "b": 2}
    assert r0.tool_choice == "none" and r1.tool_choice == "none"  # step overrides turn
    assert s2.seen[1].system == "step 1"  # s2 saw s1's change


# --------------------------------------------------------------------------- TurnConfig fields


async def test_turn_config_model_system_and_sampling_reach_the_request(make_engine: EngineFactory) -> None:
    config = TurnConfig(
        model="scripted:other",
        system="Be terse.",
        model_settings=ModelSettings(
            max_output_tokens=123,
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            presence_penalty=0.1,
            frequency_penalty=0.2,
            stop_sequences=["END"],
            seed=42,
            max_retries=2,
            headers={"x-h": "v"},
            provider_options={"anthropic": {"thinking": {"budget": 1000}}},
        ),
        timeout=TurnTimeout(total_seconds=12.5),
    )
    steps: list[StepContext] = []

    class Watch(Middleware):
        async def before_step(self, ctx: StepContext) -> None:
            steps.append(ctx)

    h = await make_engine(
        scripts={"main": [ScriptStep(text="main")], "other": [ScriptStep(text="from other")]},
        middlewares=[Configure("c", config), Watch()],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    request = h.provider.requests[0]
    assert request.model == "other"
    assert request.system == "Be terse."
    assert steps[0].model == "scripted:other" and steps[0].system == "Be terse."
    s = request.settings
    assert (s.max_output_tokens, s.temperature, s.top_p, s.top_k) == (123, 0.7, 0.9, 40)
    assert (s.presence_penalty, s.frequency_penalty, list(s.stop_sequences or [])) == (0.1, 0.2, ["END"])
    assert (s.seed, s.max_retries, s.timeout_seconds) == (42, 2, 12.5)
    assert dict(s.headers or {}) == {"x-h": "v"}
    assert dict(s.provider_options or {}) == {"anthropic": {"thinking": {"budget": 1000}}}
    assert "".join(d.delta for d in of_kind(events, "text_delta")) == "from other"


async def test_active_tools_and_tool_choice(make_engine: EngineFactory) -> None:
    ran: list[str] = []

    def tracked(name: str) -> PythonTool:
        async def run(input: dict[str, Any], execution: ToolExecution) -> str:
            ran.append(name)
            return name

        return make_tool(name, run)

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="a"), ScriptedToolCall(name="c")]),
                ScriptStep(text="done"),
            ]
        },
        tools=[tracked("a"), tracked("b"), tracked("c")],
        middlewares=[Configure("c", TurnConfig(active_tools=["a", "b"], tool_choice="b"))],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    request = h.provider.requests[0]
    assert [t.name for t in request.tools] == ["a", "b"]
    assert request.tool_choice == "b"
    assert ran == ["a"]  # c is not active: not run
    errors = of_kind(events, "tool_input_error")
    assert [(e.tool_name, "unavailable tool 'c'" in e.error_text) for e in errors] == [("c", True)]


async def test_max_steps_from_turn_config(make_engine: EngineFactory) -> None:
    h = await make_engine(
        # Calls ping on every step: only max_steps ends the turn.
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="ping")], repeat=True)]},
        tools=[_tool("ping")],
        middlewares=[Configure("c", TurnConfig(max_steps=2))],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.calls == 2 and end.step_count == 2
    parts = tool_parts((await h.store.load_messages(CONV))[-1])
    assert [p.state for p in parts] == [message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE] * 2


@pytest.mark.parametrize(
    ("stop", "expected_calls"),
    [(StopWhen(tool_called="finish"), 2), (StopWhen(step_count=3), 3)],
    ids=["tool_called", "step_count"],
)
async def test_stop_when(make_engine: EngineFactory, stop: StopWhen, expected_calls: int) -> None:
    ran: list[str] = []

    def tracked(name: str) -> PythonTool:
        async def run(input: dict[str, Any], execution: ToolExecution) -> str:
            ran.append(name)
            return name

        return make_tool(name, run)

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="work")]),
                ScriptStep(tool_calls=[ScriptedToolCall(name="finish")]),
                ScriptStep(tool_calls=[ScriptedToolCall(name="work")]),
                ScriptStep(tool_calls=[ScriptedToolCall(name="work")]),
            ]
        },
        tools=[tracked("work"), tracked("finish")],
        middlewares=[Configure("c", TurnConfig(stop_when=[stop]))],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.calls == expected_calls
    assert len(ran) == expected_calls  # the stopping step's tools ran
    assert ran[:2] == ["work", "finish"]


async def test_send_reasoning_false_neither_streams_nor_stores_reasoning(make_engine: EngineFactory) -> None:
    steps: list[StepFinishContext] = []

    class Watch(Middleware):
        async def on_step_finish(self, ctx: StepFinishContext) -> None:
            steps.append(ctx)

    h = await make_engine(
        scripts={
            "main": [ScriptStep(reasoning="secret thoughts here", reasoning_signature="s", text="answer")]
        },
        middlewares=[Configure("c", TurnConfig(send_reasoning=False)), Watch()],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert not [k for k in kinds(events) if k.startswith("reasoning")]
    stored = (await h.store.load_messages(CONV))[-1]
    assert [p.WhichOneof("kind") for p in stored.parts] == ["step_start", "text"]
    assert text_of(stored) == "answer"
    assert steps[0].reasoning_text == "" and list(steps[0].reasoning) == []


# --------------------------------------------------------------------------- on_chat_response


async def test_on_chat_response_may_start_the_next_turn_on_the_same_conversation(
    make_engine: EngineFactory,
) -> None:
    """Section 3, Decision: the lock is released before on_chat_response runs, so it may
    start another turn on the same conversation, admitted as the next turn."""
    holder: dict[str, Any] = {}

    class FollowUp(Middleware):
        async def on_chat_response(self, result: ChatResponseContext) -> None:
            if result.request_id != "r1":
                return
            h: Harness = holder["h"]
            try:
                holder["next"] = await h.start("follow-up", request_id="r2")
            except TurnwireStatusError as error:
                holder["error"] = f"{error.code.name}: {error.message}"

    h = await make_engine(middlewares=[FollowUp()])
    holder["h"] = h
    assert end_of(await h.run()).status == event_pb2.TURN_STATUS_COMPLETED
    assert "error" not in holder, holder.get("error")
    follow = await collect(holder["next"])
    assert end_of(follow).status == event_pb2.TURN_STATUS_COMPLETED
    assert [m.id for m in await h.store.load_messages(CONV)] == ["u1", "tw-a-r1", "u2", "tw-a-r2"]


async def test_on_chat_response_fires_for_a_completed_turn_with_an_empty_message(
    make_engine: EngineFactory,
) -> None:
    log: list[Entry] = []
    rec = Recorder("rec", log)
    h = await make_engine(scripts={"main": [ScriptStep(text="")]}, middlewares=[rec])
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert not end.HasField("message")
    assert [m.role for m in await h.store.load_messages(CONV)] == [message_pb2.ROLE_USER]
    responses: list[ChatResponseContext] = rec.contexts["on_chat_response"]
    assert [r.status for r in responses] == ["completed"]
    assert len(responses[0].message.parts) == 0


async def test_on_chat_response_for_an_errored_turn_with_a_partial(make_engine: EngineFactory) -> None:
    log: list[Entry] = []
    rec = Recorder("rec", log)
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(text="a b c d", error=ScriptedError(message="cut", status=502, after_chunks=2))
            ]
        },
        middlewares=[rec],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    hooks = [hook for _, hook, _ in log if hook != "on_chunk"]
    assert hooks == [
        "before_turn",
        "before_step",
        "classify_chat_error",
        "on_chat_error",
        "on_chat_response",
    ]
    response: ChatResponseContext = rec.contexts["on_chat_response"][0]
    assert response.status == "error"
    assert response.error is not None
    assert text_of(response.message) == "a "
    assert response.message == (await h.store.load_messages(CONV))[-1]
