"""The turn engine's step loop, in process (docs/semantics.md §1-§5, §8 and §10).

Every test builds a real :class:`TurnEngine` on a SQLite store in ``tmp_path``
with the scripted provider wrapped in a recorder that keeps every
``ModelRequest`` it was given.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from support.endless import is_prefix_of_repeats
from support.engine_harness import (
    CONV,
    MODEL,
    EngineFactory,
    Harness,
    collect,
    detail,
    echo,
    end_of,
    kinds,
    make_tool,
    of_kind,
    text_of,
    tool_parts,
    value,
)
from support.waiting import wait_until

from turnwire.errors import ABORTED_TOOL_ERROR, INTERRUPTED_TOOL_ERROR
from turnwire.hooks import ChatResponseContext, Middleware
from turnwire.providers import CONTINUATION_PROMPT, ModelRequest
from turnwire.testing import (
    ScriptedError,
    ScriptedProvider,
    ScriptedToolCall,
    ScriptedUsage,
    ScriptStep,
)
from turnwire.tools import PythonTool, ToolError, ToolExecution
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.api.status import status_error_of
from turnwire_server.engine.errors import (
    AdmissionRefused,
    NestedTurn,
    QueueFull,
    RequestIdInUse,
    ShuttingDown,
)
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store import TurnRecord
from turnwire_server.store.sqlite import SqliteStore

# --------------------------------------------------------------------------- basic turns


async def test_text_only_turn_event_order_status_and_transcript(make_engine: EngineFactory) -> None:
    # delay_ms: the deltas come apart (as a model's stream does), so a reader that keeps up gets
    # each; deltas read in one piece would be merged (docs/semantics.md §10).
    h = await make_engine(scripts={"main": [ScriptStep(text="Hello there, friend.", delay_ms=1)]})
    events = await h.run("hi", request_id="req-a", message_id="user-a")

    n_deltas = kinds(events).count("text_delta")
    assert n_deltas == 3  # one per word
    assert kinds(events) == [
        "turn_start",
        "step_start",
        "text_start",
        *["text_delta"] * n_deltas,
        "text_end",
        "step_finish",
        "turn_end",
    ]
    # Every event carries ids and a gap-free 1-based sequence number.
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    assert {(e.conversation_id, e.request_id) for e in events} == {(CONV, "req-a")}
    start = events[0].turn_start
    assert start.message_id == "tw-a-req-a"
    assert start.continuation is False
    assert start.model == MODEL
    assert "".join(d.delta for d in of_kind(events, "text_delta")) == "Hello there, friend."
    finish = of_kind(events, "step_finish")[0]
    assert finish.step_number == 0
    assert finish.finish_reason == event_pb2.FINISH_REASON_STOP

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert end.step_count == 1
    assert not end.HasField("error")

    stored = await h.store.load_messages(CONV)
    assert [(m.id, m.role) for m in stored] == [
        ("user-a", message_pb2.ROLE_USER),
        ("tw-a-req-a", message_pb2.ROLE_ASSISTANT),
    ]
    assert text_of(stored[0]) == "hi"
    assert text_of(stored[1]) == "Hello there, friend."
    assert end.message == stored[1]
    assert h.provider.calls == 1
    # The model got the default system prompt and the user's message.
    assert h.provider.requests[0].system == "You are a helpful assistant."
    assert [m.id for m in h.provider.requests[0].messages] == ["user-a"]


async def test_multi_step_turn_with_a_tool_call(make_engine: EngineFactory) -> None:
    seen: list[dict[str, Any]] = []

    async def add(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
        seen.append(dict(input))
        assert execution.step_number == 0
        return {"sum": input["a"] + input["b"]}

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(text="Adding.", tool_calls=[ScriptedToolCall(name="add", input={"a": 2, "b": 3})]),
                ScriptStep(text="It is 5."),
            ]
        },
        tools=[make_tool("add", add)],
    )
    events = await h.run("2+3?")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert end.step_count == 2
    assert seen == [{"a": 2, "b": 3}]

    k = kinds(events)
    assert k.count("step_start") == 2 and k.count("step_finish") == 2
    # tool events sit inside step 0, before its step_finish
    first_finish = k.index("step_finish")
    for kind in ("tool_input_start", "tool_input_delta", "tool_input_available", "tool_output_available"):
        assert k.index(kind) < first_finish, kind
    assert of_kind(events, "step_finish")[0].finish_reason == event_pb2.FINISH_REASON_TOOL_CALLS
    output = of_kind(events, "tool_output_available")[0]
    assert output.tool_call_id == "call_0_0"
    assert output.preliminary is False
    assert value(output.output) == {"sum": 5}

    # The second model call carries the first step's tool call and its result.
    assert h.provider.calls == 2
    step1 = h.provider.requests[1]
    assert step1.step_number == 1
    last = step1.messages[-1]
    assert last.role == message_pb2.ROLE_ASSISTANT
    calls = tool_parts(last)
    assert len(calls) == 1
    assert calls[0].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(calls[0].output) == {"sum": 5}

    stored = await h.store.load_messages(CONV)
    assert len(stored) == 2
    reply = stored[1]
    assert [p.WhichOneof("kind") for p in reply.parts] == [
        "step_start",
        "text",
        "tool_call",
        "step_start",
        "text",
    ]
    assert text_of(reply) == "Adding.It is 5."
    part = tool_parts(reply)[0]
    assert part.tool_name == "add"
    assert value(part.input) == {"a": 2, "b": 3}
    assert part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE


async def test_max_steps_reached_completes_after_last_tools_without_another_model_call(
    make_engine: EngineFactory,
) -> None:
    runs: list[int] = []

    async def ping(input: dict[str, Any], execution: ToolExecution) -> str:
        runs.append(execution.step_number)
        return f"pong {execution.step_number}"

    # The script calls the tool on every step (its last step repeats).
    h = await make_engine(
        scripts={"main": [ScriptStep(text="again", tool_calls=[ScriptedToolCall(name="ping")], repeat=True)]},
        tools=[make_tool("ping", ping)],
        max_steps=3,
    )
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert not end.HasField("error")
    assert end.step_count == 3
    assert h.provider.calls == 3  # no 4th model call
    assert runs == [0, 1, 2]  # the last step's tool ran
    assert kinds(events)[-2] == "step_finish"
    assert of_kind(events, "step_finish")[-1].step_number == 2

    stored = (await h.store.load_messages(CONV))[-1]
    calls = tool_parts(stored)
    assert [c.state for c in calls] == [message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE] * 3
    assert value(calls[-1].output) == "pong 2"


async def test_parallel_tool_calls_run_concurrently(make_engine: EngineFactory) -> None:
    spans: dict[str, tuple[float, float]] = {}

    def sleeper(name: str, seconds: float) -> PythonTool:
        async def run(input: dict[str, Any], execution: ToolExecution) -> str:
            started = time.perf_counter()
            await asyncio.sleep(seconds)
            spans[name] = (started, time.perf_counter())
            return name

        return make_tool(name, run)

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="slow"), ScriptedToolCall(name="fast")]),
                ScriptStep(text="both done"),
            ]
        },
        tools=[sleeper("slow", 0.3), sleeper("fast", 0.1)],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED

    # They overlapped: the fast one started before the slow one ended, and the
    # whole tool phase took about max(0.3, 0.1), not the sum.
    assert spans["fast"][0] < spans["slow"][1]
    assert spans["slow"][0] <= spans["fast"][0]  # started in emission order
    phase = max(e for _, e in spans.values()) - min(s for s, _ in spans.values())
    assert phase < 0.38, phase

    # Result events in completion order ...
    outputs = of_kind(events, "tool_output_available")
    assert [o.tool_call_id for o in outputs] == ["call_0_1", "call_0_0"]
    assert [value(o.output) for o in outputs] == ["fast", "slow"]
    # ... stored parts in emission order.
    stored = (await h.store.load_messages(CONV))[-1]
    assert [(c.tool_call_id, c.tool_name) for c in tool_parts(stored)] == [
        ("call_0_0", "slow"),
        ("call_0_1", "fast"),
    ]
    # The next model call saw both results, in emission order.
    sent = tool_parts(h.provider.requests[1].messages[-1])
    assert [(c.tool_name, value(c.output)) for c in sent] == [("slow", "slow"), ("fast", "fast")]


async def test_raising_tool_gives_the_model_its_error_and_the_loop_goes_on(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnwire.tools")

    async def broken(input: dict[str, Any], execution: ToolExecution) -> Any:
        raise RuntimeError("disk on fire")

    async def polite(input: dict[str, Any], execution: ToolExecution) -> Any:
        raise ToolError("try again tomorrow")

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="broken"), ScriptedToolCall(name="polite")]),
                ScriptStep(text="sorry"),
            ]
        },
        tools=[make_tool("broken", broken), make_tool("polite", polite)],
    )
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.calls == 2

    errors = {e.tool_call_id: e.error_text for e in of_kind(events, "tool_output_error")}
    assert errors == {"call_0_0": "disk on fire", "call_0_1": "try again tomorrow"}

    sent = tool_parts(h.provider.requests[1].messages[-1])
    assert [(c.tool_name, c.state, c.error_text) for c in sent] == [
        ("broken", message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR, "disk on fire"),
        ("polite", message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR, "try again tomorrow"),
    ]
    stored = (await h.store.load_messages(CONV))[-1]
    assert [c.state for c in tool_parts(stored)] == [message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR] * 2
    assert text_of(stored) == "sorry"
    # The model sees the message alone; the exception's type is in the log (docs/semantics.md §11).
    assert any("raised RuntimeError: disk on fire" in r.getMessage() for r in caplog.records)


async def test_invalid_tool_input_and_unknown_tool_are_input_errors(make_engine: EngineFactory) -> None:
    executed: list[Any] = []

    async def real(input: dict[str, Any], execution: ToolExecution) -> str:
        executed.append(input)
        return "ran"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    tool_calls=[
                        ScriptedToolCall(name="real", raw_input="{not json"),
                        ScriptedToolCall(name="nope", input={"x": 1}),
                    ]
                ),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("real", real)],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert executed == []  # neither call ran
    assert not of_kind(events, "tool_input_available")
    assert not of_kind(events, "tool_output_available")

    input_errors = {e.tool_call_id: e for e in of_kind(events, "tool_input_error")}
    assert set(input_errors) == {"call_0_0", "call_0_1"}
    bad = input_errors["call_0_0"]
    assert bad.tool_name == "real"
    assert bad.raw_input == "{not json"
    assert bad.error_text.startswith("The tool input is not valid JSON") and "{not json" in bad.error_text
    unknown = input_errors["call_0_1"]
    assert unknown.tool_name == "nope"
    assert "unavailable tool 'nope'" in unknown.error_text
    assert "real" in unknown.error_text  # lists what is available

    # The loop goes on, and the model is told about both errors.
    assert h.provider.calls == 2
    sent = tool_parts(h.provider.requests[1].messages[-1])
    assert [c.state for c in sent] == [message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR] * 2
    stored = (await h.store.load_messages(CONV))[-1]
    parts = tool_parts(stored)
    assert [c.state for c in parts] == [message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR] * 2
    assert parts[0].raw_input == "{not json"
    assert parts[0].error_text == bad.error_text
    assert parts[1].error_text == unknown.error_text


async def test_streaming_tool_sends_preliminary_results_then_the_final_one(
    make_engine: EngineFactory,
) -> None:
    async def progress(input: dict[str, Any], execution: ToolExecution) -> AsyncIterator[Any]:
        for i in (1, 2):
            yield {"progress": i}
            await asyncio.sleep(0.001)
        yield {"done": True}

    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="progress")]), ScriptStep(text="k")]},
        tools=[make_tool("progress", progress)],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    outputs = of_kind(events, "tool_output_available")
    assert [(o.preliminary, value(o.output)) for o in outputs] == [
        (True, {"progress": 1}),
        (True, {"progress": 2}),
        (True, {"done": True}),
        (False, {"done": True}),
    ]
    stored = tool_parts((await h.store.load_messages(CONV))[-1])[0]
    assert stored.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert stored.preliminary is False
    assert value(stored.output) == {"done": True}
    sent = tool_parts(h.provider.requests[1].messages[-1])[0]
    assert value(sent.output) == {"done": True} and sent.preliminary is False


async def test_reasoning_is_streamed_and_stored_by_default(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(reasoning="let me think", reasoning_signature="sig", text="answer")]}
    )
    events = await h.run()
    k = kinds(events)
    assert k[:3] == ["turn_start", "step_start", "reasoning_start"]
    assert k.index("reasoning_end") < k.index("text_start")
    assert "".join(d.delta for d in of_kind(events, "reasoning_delta")) == "let me think"
    stored = (await h.store.load_messages(CONV))[-1]
    reasoning = [p.reasoning for p in stored.parts if p.WhichOneof("kind") == "reasoning"]
    assert len(reasoning) == 1
    assert reasoning[0].text == "let me think"
    assert reasoning[0].signature == b"sig"
    assert text_of(stored) == "answer"


async def test_usage_is_summed_over_steps(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    tool_calls=[ScriptedToolCall(name="echo")],
                    usage=ScriptedUsage(input_tokens=10, output_tokens=3, reasoning_tokens=1),
                ),
                ScriptStep(
                    text="done",
                    usage=ScriptedUsage(input_tokens=20, output_tokens=5, cached_input_tokens=7),
                ),
            ]
        },
        tools=[make_tool("echo", echo)],
    )
    events = await h.run()
    per_step = [(f.usage.input_tokens, f.usage.output_tokens) for f in of_kind(events, "step_finish")]
    assert per_step == [(10, 3), (20, 5)]
    usage = end_of(events).usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (30, 8, 38)
    assert usage.reasoning_tokens == 1
    assert usage.cached_input_tokens == 7


async def test_user_message_is_durable_before_the_model_is_called(make_engine: EngineFactory) -> None:
    h = await make_engine()
    seen: list[list[tuple[str, str]]] = []

    async def read_store(request: ModelRequest) -> None:
        # A fresh connection, not the engine's: the write must be committed.
        with sqlite3.connect(h.store.path) as db:
            rows = db.execute(
                "SELECT id, role FROM messages WHERE conversation_id = ? ORDER BY seq", (CONV,)
            ).fetchall()
        seen.append([(str(i), str(r)) for i, r in rows])
        stored = await h.store.load_messages(CONV)
        assert [m.id for m in stored] == ["u-durable"]

    h.provider.before_stream = read_store
    events = await h.run("remember me", message_id="u-durable")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert len(seen) == 1
    assert [i for i, _ in seen[0]] == ["u-durable"]


# --------------------------------------------------------------------------- serialization


async def test_turns_on_one_conversation_run_fifo_and_never_interleave(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="a b c d", delay_ms=5)]})
    handles = [await h.start(f"q{i}", request_id=f"r{i}", message_id=f"u{i}") for i in (1, 2, 3)]
    results = await asyncio.gather(*(collect(x) for x in handles))
    assert [end_of(e).status for e in results] == [event_pb2.TURN_STATUS_COMPLETED] * 3

    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u1", "tw-a-r1", "u2", "tw-a-r2", "u3", "tw-a-r3"]
    # Each model call saw exactly the transcript before it: no interleaving.
    assert [[m.id for m in r.messages] for r in h.provider.requests] == [
        ["u1"],
        ["u1", "tw-a-r1", "u2"],
        ["u1", "tw-a-r1", "u2", "tw-a-r2", "u3"],
    ]


async def test_full_queue_is_refused_with_resource_exhausted(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text="one two three four", delay_ms=20)]},
        max_queued_turns_per_conversation=1,
    )
    first = await h.start("first", request_id="r-first")
    # Let the first turn take the lock: it is running, not waiting.
    async for response in first:
        if response.event.WhichOneof("event") == "step_start":
            break
    second = await h.start("second", request_id="r-second")  # waits: 1 in the queue
    with pytest.raises(QueueFull) as refused:
        await h.start("third", request_id="r-third")
    mapped = status_error_of(refused.value)
    assert mapped.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    status = mapped.to_status()
    assert detail(status, error_details_pb2.ErrorInfo).reason == "OVERLOADED"
    assert detail(status, error_details_pb2.RetryInfo) is not None
    # Another conversation is not affected.
    other = await h.start("elsewhere", conversation_id="conv-2", request_id="r-other")

    first_rest = await collect(first)
    assert end_of(first_rest).status == event_pb2.TURN_STATUS_COMPLETED
    assert end_of(await collect(second)).status == event_pb2.TURN_STATUS_COMPLETED
    assert end_of(await collect(other)).status == event_pb2.TURN_STATUS_COMPLETED
    ids = [m.id for m in await h.store.load_messages(CONV)]
    assert "u3" not in ids and ids == ["u1", "tw-a-r-first", "u2", "tw-a-r-second"]


async def test_nested_blocking_turn_from_a_tool_fails_with_failed_precondition(
    make_engine: EngineFactory,
) -> None:
    holder: dict[str, Harness] = {}
    outcome: dict[str, Any] = {}

    async def nest(input: dict[str, Any], execution: ToolExecution) -> str:
        h = holder["h"]
        try:
            await h.engine.start(h.request("nested", conversation_id=execution.conversation_id))
        except AdmissionRefused as error:
            assert isinstance(error, NestedTurn)
            mapped = status_error_of(error)
            outcome["code"] = mapped.code
            outcome["message"] = mapped.message
            outcome["reason"] = mapped.reason
            return "refused"
        outcome["code"] = None
        return "started"

    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="nest")]), ScriptStep(text="k")]},
        tools=[make_tool("nest", nest)],
    )
    holder["h"] = h
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert outcome["code"] == grpc.StatusCode.FAILED_PRECONDITION
    assert outcome["reason"] == "NESTED_TURN"
    assert "cannot be called from inside an active turn" in outcome["message"]
    assert "it would wait for that turn to end" in outcome["message"]
    # What to do instead (docs/semantics.md §5, Nesting): before, the message stopped at the why.
    assert "use SubmitMessages (its turn runs after this one) or AddMessages" in outcome["message"]
    stored = await h.store.load_messages(CONV)
    assert len(stored) == 2  # the nested turn stored nothing


# --------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize(
    ("cut", "reason"), [("cancel", None), ("shutdown", "SHUTTING_DOWN"), ("delete", "CONVERSATION_DELETED")]
)
async def test_a_turn_cut_mid_stream_aborts_keeps_the_partial_text_and_gets_on_chat_response(
    make_engine: EngineFactory, cut: str, reason: str | None
) -> None:
    """A turn stopped mid-stream ends ABORTED with the text streamed so far as its reply, stored
    (unless its conversation was deleted), and on_chat_response fires for it (docs/semantics.md
    §3) whatever stopped it: a cancel, the server's shutdown (grace over) or a conversation's
    deletion, the last two with the reason in its TurnEnd."""
    responses: list[ChatResponseContext] = []

    class Observe(Middleware):
        async def on_chat_response(self, result: ChatResponseContext) -> None:
            responses.append(result)

    # Streams "w0 … w9 " over and over until the turn is stopped: it cannot end on its own first.
    words = "".join(f"w{i} " for i in range(10))
    h = await make_engine(
        scripts={"main": [ScriptStep(text=words, delay_ms=5, until_cancelled=True)]}, middlewares=[Observe()]
    )
    handle = await h.start("go")

    async def stop() -> None:
        if cut == "cancel":
            handle.cancel()
        elif cut == "shutdown":
            await h.engine.drain(0)
        else:
            await h.engine.cancel_conversation(CONV)

    events: list[event_pb2.TurnEvent] = []
    stopping: asyncio.Future[None] | None = None
    async for response in handle:
        events.append(response.event)
        if stopping is None and kinds(events).count("text_delta") == 3:
            stopping = asyncio.ensure_future(stop())
    await asyncio.wait_for(handle.task, 5)
    assert stopping is not None
    await stopping

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    if reason is not None:
        detail = error_details_pb2.ErrorInfo()
        assert end.error.details[0].Unpack(detail) and detail.reason == reason
    streamed = "".join(d.delta for d in of_kind(events, "text_delta"))
    assert len(streamed) >= len("w0 w1 w2 ") and is_prefix_of_repeats(streamed, words)
    assert text_of(end.message) == streamed
    assert [r.status for r in responses] == ["aborted"]
    assert responses[0].message.id == end.message.id
    if cut == "delete":
        return
    stored = await h.store.load_messages(CONV)
    assert [m.role for m in stored] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert end.message == stored[1]
    with sqlite3.connect(h.store.path) as db:
        assert db.execute("SELECT state FROM turns").fetchall() == [("aborted",)]


async def test_cancel_during_a_tool_stores_it_as_errored(make_engine: EngineFactory) -> None:
    started = asyncio.Event()
    saw: dict[str, Any] = {}

    async def slow(input: dict[str, Any], execution: ToolExecution) -> str:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            saw["cancelled_flag"] = execution.cancelled.is_set()
            raise
        return "never"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    text="working",
                    tool_calls=[ScriptedToolCall(name="slow"), ScriptedToolCall(name="quick")],
                )
            ]
        },
        tools=[make_tool("slow", slow), make_tool("quick", echo)],
    )
    handle = await h.start("go")
    await asyncio.wait_for(started.wait(), 5)
    cancelled: list[bool] = []

    def cancel_once_quick_is_done(kind: str) -> None:
        # Only "quick" can produce a result: "slow" sleeps until it is cancelled.
        if kind == "tool_output_available" and not cancelled:
            cancelled.append(h.engine.cancel(handle.request_id))

    events = await collect(handle, on_event=cancel_once_quick_is_done)
    assert cancelled == [True]
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert saw == {"cancelled_flag": True}

    stored = (await h.store.load_messages(CONV))[-1]
    assert text_of(stored) == "working"
    calls = {c.tool_name: c for c in tool_parts(stored)}
    assert calls["slow"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert calls["slow"].error_text == ABORTED_TOOL_ERROR
    assert calls["quick"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    # Cancelling a finished turn is a no-op.
    assert h.engine.cancel(handle.request_id) is False
    assert h.engine.cancel("no-such-request") is False


# --------------------------------------------------------------------------- provider errors


@pytest.mark.parametrize(
    ("error", "code", "retry_seconds"),
    [
        (
            ScriptedError(message="overloaded", status=529, retryable=True, after_chunks=3),
            grpc.StatusCode.UNAVAILABLE,
            1.0,
        ),
        (
            ScriptedError(
                message="rate limited",
                status=429,
                type="rate_limit_error",
                retry_after_seconds=2.5,
                after_chunks=3,
            ),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            2.5,
        ),
        (
            ScriptedError(message="rate limited", status=429, type="rate_limit_error", after_chunks=3),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            None,  # any delay: a rate limit is always worth retrying later
        ),
    ],
    ids=["529-retryable", "429-retry-after", "429-plain"],
)
async def test_provider_error_mid_stream_ends_in_error_and_stores_the_partial(
    make_engine: EngineFactory, error: ScriptedError, code: grpc.StatusCode, retry_seconds: float | None
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="a b c d e f", error=error)]})
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.code == code.value[0]
    assert error.message in end.error.message
    info = detail(end.error, error_details_pb2.ErrorInfo)
    assert info.reason == "PROVIDER_ERROR"
    assert info.domain == "turnwire.dev"
    assert info.metadata["http_status"] == str(error.status)
    retry = detail(end.error, error_details_pb2.RetryInfo)
    assert retry is not None, "no RetryInfo"
    if retry_seconds is not None:
        assert retry.retry_delay.ToMilliseconds() == int(retry_seconds * 1000)
    else:
        assert retry.retry_delay.ToMilliseconds() > 0

    streamed = "".join(d.delta for d in of_kind(events, "text_delta"))
    assert streamed == "a b "
    stored = await h.store.load_messages(CONV)
    assert [m.role for m in stored] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert text_of(stored[1]) == streamed
    assert end.message == stored[1]
    # nothing after the in-stream error
    assert kinds(events)[-2] == "text_delta"


# --------------------------------------------------------------------------- continuation


async def test_continue_last_turn_skips_when_the_last_message_is_not_the_assistants(
    make_engine: EngineFactory,
) -> None:
    hooks: list[str] = []

    class Spy(Middleware):
        async def before_turn(self, ctx: Any) -> None:
            hooks.append("before_turn")

        async def on_chat_response(self, result: Any) -> None:
            hooks.append("on_chat_response")

    h = await make_engine(
        scripts={
            "main": [ScriptStep(text="x")],
            "fail": [ScriptStep(error=ScriptedError(message="down", status=503))],
        },
        middlewares=[Spy()],
    )
    # No conversation at all.
    events = await h.run(None, conversation_id="empty", continuation=True)
    assert end_of(events).status == event_pb2.TURN_STATUS_SKIPPED
    # Nothing was stored, so nothing is acknowledged: no TurnStart, and the end says why.
    assert kinds(events) == ["turn_end"]
    assert detail(end_of(events).error, error_details_pb2.ErrorInfo).reason == "NOTHING_TO_CONTINUE"
    assert "the conversation has no messages" in end_of(events).error.message
    assert await h.store.load_messages("empty") == ()

    # Only a user message (its turn failed before any output).
    failed = await h.run("hello?", model="scripted:fail")
    assert end_of(failed).status == event_pb2.TURN_STATUS_ERROR
    before = await h.store.load_messages(CONV)
    assert [m.role for m in before] == [message_pb2.ROLE_USER]
    hooks.clear()
    calls = h.provider.calls

    events = await h.run(None, continuation=True)
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_SKIPPED
    assert not end.HasField("message")
    assert end.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    # It says how to have the waiting message answered (trial 4).
    assert "the last message is the user's and has no reply yet" in end.error.message
    assert "SaveMessages with no messages" in end.error.message
    assert h.provider.calls == calls  # no model call
    assert hooks == []  # no hooks
    assert await h.store.load_messages(CONV) == before
    with sqlite3.connect(h.store.path) as db:
        assert db.execute("SELECT count(*) FROM turns").fetchone() == (1,)  # only the failed one


async def test_continue_last_turn_sends_the_prompt_and_stores_a_new_message(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="part one")]})
    await h.run("write", request_id="r-first", message_id="u-first")
    h.provider.inner.scripts["main"] = ScriptedProvider({"x": [ScriptStep(text="part two")]}).scripts["x"]

    events = await h.run(None, request_id="r-cont", continuation=True)
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert events[0].turn_start.continuation is True

    sent = h.provider.requests[-1].messages
    assert [m.id for m in sent[:-1]] == ["u-first", "tw-a-r-first"]
    prompt = sent[-1]
    assert prompt.role == message_pb2.ROLE_USER
    assert text_of(prompt) == CONTINUATION_PROMPT

    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u-first", "tw-a-r-first", "tw-a-r-cont"]
    assert text_of(stored[1]) == "part one"  # the previous one is untouched
    assert text_of(stored[2]) == "part two"
    assert all(text_of(m) != CONTINUATION_PROMPT for m in stored)  # the prompt is never stored


# --------------------------------------------------------------------------- coalescing


async def test_text_coalescing_sends_fewer_deltas_with_the_same_text(make_engine: EngineFactory) -> None:
    text = "The quick brown fox jumps over the lazy dog."
    # Deltas 1 ms apart: without coalescing a reader that keeps up gets each (merging needs them
    # unread); the 50 ms window sends them as one or a few.
    script = {"main": [ScriptStep(text=text, chunk_size=1, delay_ms=1)]}
    plain = await make_engine(scripts=script, db="plain.db")
    coalesced = await make_engine(scripts=script, db="coalesced.db", text_coalesce_ms=50)

    plain_events = await plain.run()
    coalesced_events = await coalesced.run()
    plain_deltas = of_kind(plain_events, "text_delta")
    coalesced_deltas = of_kind(coalesced_events, "text_delta")
    assert len(plain_deltas) == len(text)
    assert 1 <= len(coalesced_deltas) < len(plain_deltas)
    assert "".join(d.delta for d in coalesced_deltas) == text
    assert [e.sequence_number for e in coalesced_events] == list(range(1, len(coalesced_events) + 1))
    k = kinds(coalesced_events)
    assert k.index("text_start") < k.index("text_delta") < k.index("text_end")
    assert text_of((await coalesced.store.load_messages(CONV))[-1]) == text


# --------------------------------------------------------------------------- recovery and repair


def _unresolved_reply(message_id: str) -> message_pb2.Message:
    reply = message_pb2.Message(id=message_id, role=message_pb2.ROLE_ASSISTANT)
    reply.create_time.GetCurrentTime()
    reply.parts.add().step_start.SetInParent()
    reply.parts.add().text.text = "Let me look."
    call = reply.parts.add().tool_call
    call.tool_call_id = "call-lost"
    call.tool_name = "lookup"
    call.input.update({"q": "x"})
    call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    return reply


def _user(message_id: str, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.create_time.GetCurrentTime()
    message.parts.add().text.text = text
    return message


async def test_recover_marks_running_turns_interrupted_and_repairs_tool_calls(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    import datetime as dt

    # A process "crashed" mid-turn: the turn row is running and a checkpoint holds
    # a tool call without a result.
    crashed = SqliteStore(tmp_path / "turnwire.db")
    await crashed.open()
    record = TurnRecord(
        request_id="r-crash",
        conversation_id=CONV,
        assistant_message_id="tw-a-r-crash",
        continuation=False,
        model=MODEL,
        state="running",
        start_time=dt.datetime.now(dt.UTC),
    )
    await crashed.start_turn(record, [_user("u-crash", "look it up")])
    await crashed.save_message(CONV, _unresolved_reply("tw-a-r-crash"))
    await crashed.close()

    h = await make_engine()
    assert len(await h.store.running_turns()) == 1
    assert await h.engine.recover() == 1
    assert await h.store.running_turns() == []
    with sqlite3.connect(h.store.path) as db:
        assert db.execute(
            "SELECT state, recovery_count FROM turns WHERE request_id = 'r-crash'"
        ).fetchall() == [("interrupted", 0)], "no recovery data (spec): left interrupted, no recovery spent"
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u-crash", "tw-a-r-crash"]
    assert text_of(stored[1]) == "Let me look."
    call = tool_parts(stored[1])[0]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert call.error_text == INTERRUPTED_TOOL_ERROR
    assert value(call.input) == {"q": "x"}
    assert await h.engine.recover() == 0  # nothing left: never loops


async def test_transcript_repair_runs_before_the_next_turn(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="fresh")]})
    await h.store.save_message(CONV, _user("u-old", "old question"))
    await h.store.save_message(CONV, _unresolved_reply("a-old"))

    events = await h.run("new question", message_id="u-new")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED

    sent = h.provider.requests[0].messages
    assert [m.id for m in sent] == ["u-old", "a-old", "u-new"]
    call = tool_parts(sent[1])[0]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert call.error_text == INTERRUPTED_TOOL_ERROR
    # the repair is stored
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u-old", "a-old", "u-new", "tw-a-r1"]
    repaired = tool_parts(stored[1])[0]
    assert repaired.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert repaired.error_text == INTERRUPTED_TOOL_ERROR


# --------------------------------------------------------------------------- admission, queueing, drain


async def test_cancelling_a_queued_turn_aborts_it_and_stores_nothing(make_engine: EngineFactory) -> None:
    responses: list[str] = []

    class Observe(Middleware):
        async def on_chat_response(self, result: ChatResponseContext) -> None:
            responses.append(result.request_id)

    h = await make_engine(
        scripts={"main": [ScriptStep(text="one two three", delay_ms=20)]}, middlewares=[Observe()]
    )
    first = await h.start("first", request_id="r-first", message_id="u-first")
    queued = await h.start("queued", request_id="r-queued", message_id="u-queued")

    def queued_behind_first() -> bool:
        # "first" holds the conversation's lock (it left the queue), "queued" waits for it.
        return h.engine._queued[CONV] == 1 and h.store._locks.places(CONV) == 2

    await wait_until(queued_behind_first, what="the second turn waits for the first's lock")
    assert h.engine.cancel("r-queued") is True
    queued_events = await collect(queued)
    # Its input was never stored: no TurnStart (the acknowledgement), and the end says so.
    assert kinds(queued_events) == ["turn_end"]
    assert end_of(queued_events).status == event_pb2.TURN_STATUS_ABORTED
    assert detail(end_of(queued_events).error, error_details_pb2.ErrorInfo).reason == "INPUT_NOT_STORED"
    assert not end_of(queued_events).HasField("message")
    assert end_of(await collect(first)).status == event_pb2.TURN_STATUS_COMPLETED
    assert [m.id for m in await h.store.load_messages(CONV)] == ["u-first", "tw-a-r-first"]
    assert responses == ["r-first"]
    # the queue slot was given back
    assert h.engine._queued[CONV] == 0


async def test_admission_errors(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="slow words here", delay_ms=20)]})
    running = await h.start("x", request_id="dup")
    with pytest.raises(RequestIdInUse) as duplicate:
        await h.start("y", request_id="dup", conversation_id="conv-2")
    assert status_error_of(duplicate.value).code == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(UnknownModel) as unknown:
        await h.start("z", model="nosuch:model")
    assert status_error_of(unknown.value).code == grpc.StatusCode.INVALID_ARGUMENT
    assert status_error_of(unknown.value).reason == "UNKNOWN_MODEL"
    assert end_of(await collect(running)).status == event_pb2.TURN_STATUS_COMPLETED
    assert [m.id for m in await h.store.load_messages(CONV)] == ["u1", "tw-a-dup"]


async def test_a_request_id_reused_as_its_turn_end_arrives_is_judged_by_the_store(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller gets TurnEnd while the turn still stores its last stream events; a retry of the
    aborted turn sent at once is not refused as "already running" (CI saw that race): it waits for
    the ending turn and the store accepts the retry of an aborted turn with the same input."""
    from turnwire_server.engine.stream_log import StreamLog

    gate = asyncio.Event()
    finish = StreamLog.finish

    async def gated_finish(self: StreamLog, *, ended: bool = True) -> None:
        await gate.wait()
        await finish(self, ended=ended)

    monkeypatch.setattr(StreamLog, "finish", gated_finish)
    h = await make_engine(scripts={"main": [ScriptStep(text="slow words here and more", delay_ms=20)]})
    first = await h.start("x", request_id="again", message_id="u-again")
    kinds: list[str] = []
    async for response in first:
        kinds.append(response.event.WhichOneof("event") or "")
        if kinds[-1] == "text_delta" and kinds.count("text_delta") == 1:
            first.cancel()
        if kinds[-1] == "turn_end":
            assert response.event.turn_end.status == event_pb2.TURN_STATUS_ABORTED
            break
    retry = asyncio.create_task(h.start("x", request_id="again", message_id="u-again"))
    try:
        await asyncio.sleep(0)
        assert not retry.done()  # waits for the ending turn instead of refusing it
    finally:
        gate.set()
    events = await collect(await retry)
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert [m.id for m in await h.store.load_messages(CONV)] == ["u-again", "tw-a-again"]


async def test_reply_is_checkpointed_while_it_streams(make_engine: EngineFactory) -> None:
    text = " ".join(f"w{i}" for i in range(60))
    h = await make_engine(scripts={"main": [ScriptStep(text=text, delay_ms=4)]}, checkpoint_interval_ms=10)
    handle = await h.start("go")
    checkpoints: list[str] = []
    streamed = ""

    async def checkpointed() -> str:
        """The stored reply's text; empty while none is stored."""
        stored = await h.store.load_messages(CONV)
        return text_of(stored[1]) if len(stored) == 2 else ""

    async for response in handle:
        event = response.event
        if event.WhichOneof("event") == "text_delta":
            streamed += event.text_delta.delta
            if len(streamed.split()) == 30:
                # The turn keeps streaming while the first checkpoint of the reply is awaited.
                checkpoints.append(await wait_until(checkpointed, interval=0.002, what="a checkpoint"))
    await asyncio.wait_for(handle.task, 5)
    assert checkpoints, "no checkpoint of the streaming reply was stored mid-stream"
    assert checkpoints[0] and text.startswith(checkpoints[0]) and checkpoints[0] != text
    assert text_of((await h.store.load_messages(CONV))[-1]) == text


async def test_tool_timeout_is_the_tools_error(make_engine: EngineFactory) -> None:
    async def hang(input: dict[str, Any], execution: ToolExecution) -> str:
        await asyncio.sleep(5)
        return "late"

    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="hang")]), ScriptStep(text="ok")]},
        tools=[make_tool("hang", hang)],
        tool_timeout_seconds=0.05,
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    errors = of_kind(events, "tool_output_error")
    assert len(errors) == 1 and "timed out" in errors[0].error_text
    assert h.provider.calls == 2


async def test_drain_cancels_running_turns_after_the_grace_period(make_engine: EngineFactory) -> None:
    started = asyncio.Event()
    saw: dict[str, Any] = {}

    async def slow(input: dict[str, Any], execution: ToolExecution) -> str:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            saw["cancelled_flag"] = execution.cancelled.is_set()
            raise
        return "never"

    h = await make_engine(
        scripts={"main": [ScriptStep(text="working", tool_calls=[ScriptedToolCall(name="slow")])]},
        tools=[make_tool("slow", slow)],
    )
    handle = await h.start("go")
    await asyncio.wait_for(started.wait(), 5)
    t0 = time.perf_counter()
    await h.engine.drain(0.05)
    assert time.perf_counter() - t0 < 2
    events = await collect(handle)
    assert end_of(events).status == event_pb2.TURN_STATUS_ABORTED
    stored = (await h.store.load_messages(CONV))[-1]
    assert text_of(stored) == "working"
    assert tool_parts(stored)[0].error_text == ABORTED_TOOL_ERROR
    with pytest.raises(ShuttingDown) as refused:
        await h.start("after drain")
    assert status_error_of(refused.value).code == grpc.StatusCode.UNAVAILABLE
    # Running tools get the turn's cancellation signal, as with CancelChat.
    assert saw == {"cancelled_flag": True}


@pytest.mark.parametrize("strategy", ["reject", "interrupt"])
async def test_a_place_taken_for_new_input_is_given_up_when_its_turn_never_ran(
    make_engine: EngineFactory, strategy: Any
) -> None:
    """REJECT and INTERRUPT take their place in line at admission (docs/semantics.md §5); a turn
    cancelled before it ran gives it up, so the conversation is not left locked behind it."""
    h = await make_engine(scripts={"main": [ScriptStep(text="ok")]})
    if strategy == "interrupt":  # busy, so the place is taken first in line
        assert end_of(await h.run("earlier")).status == event_pb2.TURN_STATUS_COMPLETED
        h.engine.store._locks.reserve(CONV, "someone")  # type: ignore[attr-defined]
    request = dataclasses.replace(h.request("hi"), concurrent_input=strategy)
    handle = await h.engine.start(request)
    handle.cancel()  # before its task first ran
    assert end_of(await collect(handle)).status == event_pb2.TURN_STATUS_ABORTED
    if strategy == "interrupt":
        h.engine.store._locks.drop("someone")  # type: ignore[attr-defined]
    assert await h.engine.store.queue_head(CONV) is None
    end = end_of(await asyncio.wait_for(h.run("again"), 10))
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
