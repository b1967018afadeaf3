"""The built-in middlewares (``turnwire.middlewares``) driven by a real engine.

Each test builds an in-process engine (``make_engine``: SQLite in ``tmp_path``,
the scripted provider wrapped in a recorder of every ``ModelRequest``; see
``support.engine_harness``) and asserts what the client sees (events), what is
stored, and what the model was sent (docs/semantics.md §3-§4).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from support.engine_harness import (
    CONV,
    MODEL,
    EngineFactory,
    Harness,
    end_of,
    kinds,
    make_tool,
    of_kind,
    text_of,
    tool_parts,
    value,
)

from turnwire.hooks import (
    ChunkContext,
    Middleware,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)
from turnwire.middlewares import (
    CheaperModelOnContinuation,
    HideReasoningOnContinuation,
    HookLogger,
    LimitActiveTools,
    SelectedFileInSystemPrompt,
    StructuredAnswer,
    ToolPolicy,
    ToolResultCache,
)
from turnwire.testing import ScriptedError, ScriptedToolCall, ScriptStep
from turnwire.tools import PythonTool, ToolError, ToolExecution
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.assembly import StartupError, load_middlewares
from turnwire_server.config import MiddlewareEntry

# --------------------------------------------------------------------------- helpers

DEFAULT_SYSTEM = "You are a helpful assistant."


def completed(events: Sequence[event_pb2.TurnEvent]) -> bool:
    """True when the turn ended COMPLETED."""
    return end_of(events).status == event_pb2.TURN_STATUS_COMPLETED


async def last_message(h: Harness) -> message_pb2.Message:
    """The last stored message of the conversation."""
    return (await h.store.load_messages(CONV))[-1]


def tool(name: str, ran: list[tuple[str, dict[str, Any]]], result: Any = None) -> PythonTool:
    """A tool that records ``(name, input)`` and returns ``result`` (default ``{"tool": …, "input": …}``)."""

    async def run(input: dict[str, Any], execution: ToolExecution) -> Any:
        ran.append((name, dict(input)))
        return result if result is not None else {"tool": name, "input": input}

    return make_tool(name, run)


def calls(*specs: tuple[str, dict[str, Any]]) -> ScriptStep:
    """A script step calling each ``(tool, input)`` in order."""
    return ScriptStep(tool_calls=[ScriptedToolCall(name=n, input=i) for n, i in specs])


class Results(Middleware):
    """Keeps every ``after_tool_call`` context."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[ToolCallResultContext] = []

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """Keep the context."""
        self.results.append(ctx)


# --------------------------------------------------------------------------- HookLogger


class ChunkCounter(Middleware):
    """Counts ``on_chunk`` calls per step (the truth the logger's summary must match)."""

    def __init__(self) -> None:
        super().__init__()
        self.per_step: dict[int, int] = {}

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Count one chunk for its step."""
        self.per_step[ctx.step_number] = self.per_step.get(ctx.step_number, 0) + 1


def hook_records(caplog: pytest.LogCaptureFixture, logger: str = "turnwire.hooks") -> list[logging.LogRecord]:
    """The records ``logger`` wrote."""
    return [r for r in caplog.records if r.name == logger]


def logged(records: list[logging.LogRecord]) -> list[tuple[str, dict[str, Any]]]:
    """``(record.hook, record.hook_fields)`` of each hook-logger record."""
    return [(r.__dict__["hook"], r.__dict__["hook_fields"]) for r in records]


async def test_hook_logger_logs_each_hook_once_with_ids_timings_and_a_chunk_summary_per_step(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnwire.hooks")
    ran: list[tuple[str, dict[str, Any]]] = []
    counter = ChunkCounter()
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(text="a b c", tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
                ScriptStep(text="done now"),
            ]
        },
        tools=[tool("echo", ran)],
        middlewares=[counter, HookLogger()],
    )
    assert h.chain.observes_chunks
    events = await h.run(request_id="req-7")
    assert completed(events)

    records = hook_records(caplog)
    assert [hook for hook, _ in logged(records)] == [
        "before_turn",
        "before_step",
        "before_tool_call",
        "after_tool_call",
        "on_step_finish",
        "before_step",
        "on_step_finish",
        "on_chat_response",
    ]
    fields = [f for _, f in logged(records)]
    assert all(f["request_id"] == "req-7" and f["conversation_id"] == CONV for f in fields)
    offsets = [f["t_ms"] for f in fields]
    assert offsets == sorted(offsets) and offsets[0] >= 0  # its own position in the turn, in order
    assert (
        fields[0]["model"] == MODEL and fields[0]["tools"] == ["echo"] and fields[0]["continuation"] is False
    )
    assert fields[2]["tool"] == "echo" and fields[2]["input_keys"] == ["x"]
    assert fields[3]["success"] is True and fields[3]["duration_ms"] >= 0
    # No line per chunk: one count per step, equal to the on_chunk calls that step had.
    assert counter.per_step[0] > 5
    assert fields[4]["chunks"] == counter.per_step[0]
    assert fields[4]["chunk_kinds"]["text_delta"] == 3
    assert fields[4]["chunk_kinds"]["tool_result"] == 1
    assert fields[4]["chunk_kinds"]["tool_call"] == 1
    assert fields[6]["chunks"] == counter.per_step[1]
    assert fields[4]["step_ms"] >= 0 and fields[4]["tool_calls"] == ["echo"]
    assert fields[7]["status"] == "completed" and fields[7]["turn_ms"] >= fields[6]["t_ms"]
    assert "before_tool_call" in records[2].getMessage() and "'req-7'" in records[2].getMessage()


async def test_hook_logger_without_chunks_does_not_observe_chunks(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnwire.hooks")
    h = await make_engine(middlewares=[HookLogger(include_chunks=False)])
    assert not h.chain.observes_chunks  # the engine builds no ChunkContext at all
    assert completed(await h.run())
    finish = [f for hook, f in logged(hook_records(caplog)) if hook == "on_step_finish"]
    assert len(finish) == 1 and "chunks" not in finish[0]


async def test_hook_logger_level_and_logger_name(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.hooks")
    h = await make_engine(middlewares=[HookLogger(level="debug", logger="app.hooks")])
    assert completed(await h.run())
    assert hook_records(caplog, "app.hooks") == []  # debug lines under an INFO logger
    caplog.set_level(logging.DEBUG, logger="app.hooks")
    assert completed(await h.run())
    records = hook_records(caplog, "app.hooks")
    assert records and {r.levelno for r in records} == {logging.DEBUG}
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        HookLogger(level="loud")


async def test_hook_logger_logs_a_failed_turn_and_leaves_the_error_unchanged(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="turnwire.hooks")
    h = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="upstream exploded", status=500))]},
        middlewares=[HookLogger()],
    )
    events = await h.run()
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert "upstream exploded" in end.error.message
    by_hook = dict(logged(hook_records(caplog)))
    assert by_hook["classify_chat_error"]["stage"] == "stream"
    assert by_hook["on_chat_error"]["stage"] == "stream"
    assert by_hook["on_chat_error"]["messages_persisted"] is True
    assert "upstream exploded" in by_hook["on_chat_error"]["error"]


# --------------------------------------------------------------------------- ToolPolicy


_dbs = itertools.count()


async def _policy_turn(
    make_engine: EngineFactory, policy: ToolPolicy, *specs: tuple[str, dict[str, Any]]
) -> tuple[Harness, list[event_pb2.TurnEvent], list[tuple[str, dict[str, Any]]], Results]:
    """One turn (own store) whose first step calls ``specs`` through ``policy``, then says ok."""
    ran: list[tuple[str, dict[str, Any]]] = []
    results = Results()
    names = sorted({name for name, _ in specs})
    h = await make_engine(
        scripts={"main": [calls(*specs), ScriptStep(text="ok")]},
        tools=[tool(name, ran) for name in names],
        middlewares=[policy, results],
        db=f"policy-{next(_dbs)}.db",
    )
    events = await h.run()
    assert completed(events)
    return h, events, ran, results


async def test_tool_policy_deny_list_blocks_with_its_reason_and_the_model_sees_it(
    make_engine: EngineFactory,
) -> None:
    h, events, ran, results = await _policy_turn(
        make_engine, ToolPolicy(deny=["delete"]), ("delete", {"path": "a"}), ("read", {"path": "a"})
    )
    reason = 'Tool "delete" is blocked by the tool policy\'s deny list.'
    assert ran == [("read", {"path": "a"})]
    outputs = {o.tool_call_id: value(o.output) for o in of_kind(events, "tool_output_available")}
    assert outputs["call_0_0"] == reason
    sent = {p.tool_name: p for p in tool_parts(h.provider.requests[1].messages[-1])}
    assert sent["delete"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(sent["delete"].output) == reason
    stored = {p.tool_name: p for p in tool_parts(await last_message(h))}
    assert stored["delete"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(stored["delete"].output) == reason
    blocked = next(r for r in results.results if r.tool_name == "delete")
    assert blocked.success is True and blocked.output == reason


async def test_tool_policy_allow_list_blocks_other_tools(make_engine: EngineFactory) -> None:
    _, events, ran, _ = await _policy_turn(
        make_engine, ToolPolicy(allow=["read"], deny=["read"]), ("read", {}), ("write", {})
    )
    assert ran == []  # deny beats allow
    outputs = [value(o.output) for o in of_kind(events, "tool_output_available")]
    assert sorted(outputs) == [
        'Tool "read" is blocked by the tool policy\'s deny list.',
        'Tool "write" is not in the tool policy\'s allow list.',
    ]
    _, events, ran, _ = await _policy_turn(
        make_engine, ToolPolicy(allow=["read"]), ("read", {}), ("write", {})
    )
    assert ran == [("read", {})]
    by_id = {o.tool_call_id: value(o.output) for o in of_kind(events, "tool_output_available")}
    assert by_id["call_0_1"] == 'Tool "write" is not in the tool policy\'s allow list.'


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (None, 'Tool "delete" is disabled in read-only mode.'),
        ("{name} is disabled in read-only mode", "delete is disabled in read-only mode"),
    ],
)
async def test_tool_policy_read_only_blocks_write_tools_only(
    make_engine: EngineFactory, reason: str | None, expected: str
) -> None:
    policy = ToolPolicy(read_only=True, write_tools=["delete", "write"], reason=reason)
    h, events, ran, _ = await _policy_turn(make_engine, policy, ("delete", {"path": "x"}), ("read", {}))
    assert ran == [("read", {})]
    outputs = {o.tool_call_id: value(o.output) for o in of_kind(events, "tool_output_available")}
    assert outputs["call_0_0"] == expected
    assert value(tool_parts(h.provider.requests[1].messages[-1])[0].output) == expected


def test_tool_policy_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match="read_only: needs write_tools"):
        ToolPolicy(read_only=True)
    with pytest.raises(ValueError, match="deny: must be a list of tool names"):
        ToolPolicy(deny="delete")


# --------------------------------------------------------------------------- ToolResultCache


class Clock:
    """A settable monotonic clock, in seconds."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        """The current time."""
        return self.now


async def test_cache_substitutes_the_second_identical_call_and_after_tool_call_gets_success(
    make_engine: EngineFactory,
) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    cache, results = ToolResultCache(), Results()
    h = await make_engine(
        scripts={
            "main": [
                calls(("lookup", {"q": "a", "n": 1})),
                calls(("lookup", {"n": 1, "q": "a"})),  # same input, keys in another order
                ScriptStep(text="done"),
            ]
        },
        tools=[tool("lookup", ran, result={"answer": 42})],
        middlewares=[results, cache],
    )
    events = await h.run()
    assert completed(events)
    assert ran == [("lookup", {"q": "a", "n": 1})]  # the tool ran once
    assert (cache.hits, cache.misses) == (1, 1)
    assert [(r.success, r.output, r.error) for r in results.results] == [
        (True, {"answer": 42}, None),
        (True, {"answer": 42}, None),
    ]
    outputs = [(o.preliminary, value(o.output)) for o in of_kind(events, "tool_output_available")]
    assert outputs == [(False, {"answer": 42}), (False, {"answer": 42})]
    # The model sees the substituted result like a real one.
    second = tool_parts(h.provider.requests[2].messages[-1])[1]
    assert second.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert value(second.output) == {"answer": 42}


async def test_cache_misses_on_another_input_or_an_unlisted_tool(make_engine: EngineFactory) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    cache = ToolResultCache(tools=["lookup"])
    h = await make_engine(
        scripts={
            "main": [
                calls(("lookup", {"q": "a"}), ("other", {"q": "a"})),
                calls(("lookup", {"q": "b"}), ("other", {"q": "a"})),
                ScriptStep(text="done"),
            ]
        },
        tools=[tool("lookup", ran), tool("other", ran)],
        middlewares=[cache],
    )
    assert completed(await h.run())
    assert sorted(ran, key=repr) == sorted(
        [("lookup", {"q": "a"}), ("other", {"q": "a"}), ("lookup", {"q": "b"}), ("other", {"q": "a"})],
        key=repr,
    )
    assert (cache.hits, cache.misses, len(cache)) == (0, 2, 2)


async def test_cache_entries_expire_after_ttl_seconds(make_engine: EngineFactory) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    clock = Clock()
    cache = ToolResultCache(ttl_seconds=10, clock=clock)
    h = await make_engine(
        scripts={"main": [calls(("lookup", {"q": "a"})), ScriptStep(text="done")]},
        tools=[tool("lookup", ran)],
        middlewares=[cache],
    )
    assert completed(await h.run())
    clock.now += 9.9
    assert completed(await h.run())
    assert len(ran) == 1  # still fresh: substituted
    clock.now += 0.1  # exactly ttl_seconds after it was stored
    assert completed(await h.run())
    assert len(ran) == 2  # expired: the tool ran again
    assert completed(await h.run())
    assert len(ran) == 2 and (cache.hits, cache.misses) == (2, 2)


async def test_cache_keeps_at_most_max_entries_least_recently_used_out(make_engine: EngineFactory) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    cache = ToolResultCache(max_entries=2, ttl_seconds=None)
    a, b, c = (("lookup", {"q": q}) for q in "abc")
    h = await make_engine(
        scripts={
            "main": [calls(a), calls(b), calls(a), calls(c), calls(a), calls(b), ScriptStep(text="done")]
        },
        tools=[tool("lookup", ran)],
        middlewares=[cache],
    )
    assert completed(await h.run())
    # The hit on a made b the least recently used, so c evicted b (not a, the oldest stored).
    assert [i["q"] for _, i in ran] == ["a", "b", "c", "b"]
    assert (cache.hits, len(cache)) == (2, 2)


async def test_cache_never_stores_errors(make_engine: EngineFactory) -> None:
    attempts: list[int] = []

    async def flaky(input: dict[str, Any], execution: ToolExecution) -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ToolError("temporarily unavailable")
        return "fine"

    cache = ToolResultCache()
    h = await make_engine(
        scripts={
            "main": [calls(("flaky", {})), calls(("flaky", {})), calls(("flaky", {})), ScriptStep(text="k")]
        },
        tools=[make_tool("flaky", flaky)],
        middlewares=[cache],
    )
    events = await h.run()
    assert completed(events)
    assert len(attempts) == 2  # the error was not cached; the success was
    assert [e.error_text for e in of_kind(events, "tool_output_error")] == ["temporarily unavailable"]
    assert [value(o.output) for o in of_kind(events, "tool_output_available")] == ["fine", "fine"]


class DecideFirst(Middleware):
    """Blocks or substitutes only the first call it sees, then lets calls through."""

    def __init__(self, decision: ToolCallDecision) -> None:
        super().__init__()
        self.decision = decision
        self.seen = 0

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """The decision for the first call, then None."""
        self.seen += 1
        return self.decision if self.seen == 1 else None


DECISIONS = [ToolCallDecision.block("not now"), ToolCallDecision.substitute({"fake": True})]


@pytest.mark.parametrize("decision", DECISIONS, ids=["block", "substitute"])
async def test_cache_never_stores_a_block_or_substitute_of_an_earlier_middleware(
    make_engine: EngineFactory, decision: ToolCallDecision
) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    cache = ToolResultCache()
    h = await make_engine(
        scripts={
            "main": [calls(("lookup", {"q": "a"})), calls(("lookup", {"q": "a"})), ScriptStep(text="k")]
        },
        tools=[tool("lookup", ran)],
        middlewares=[DecideFirst(decision), cache],
    )
    events = await h.run()
    assert completed(events)
    assert ran == [("lookup", {"q": "a"})]  # the second call ran for real
    assert value(of_kind(events, "tool_output_available")[1].output) == {
        "tool": "lookup",
        "input": {"q": "a"},
    }


@pytest.mark.parametrize("decision", DECISIONS, ids=["block", "substitute"])
async def test_cache_never_stores_a_block_or_substitute_of_a_later_middleware(
    make_engine: EngineFactory, decision: ToolCallDecision
) -> None:
    # Needs the engine to say how a result came about (ToolCallResultContext.outcome):
    # after_tool_call cannot otherwise tell a later middleware's block from a real result.
    ran: list[tuple[str, dict[str, Any]]] = []
    cache = ToolResultCache()
    h = await make_engine(
        scripts={
            "main": [calls(("lookup", {"q": "a"})), calls(("lookup", {"q": "a"})), ScriptStep(text="k")]
        },
        tools=[tool("lookup", ran)],
        middlewares=[cache, DecideFirst(decision)],
    )
    events = await h.run()
    assert completed(events)
    assert ran == [("lookup", {"q": "a"})]  # the second call must run, not replay the first's block
    assert value(of_kind(events, "tool_output_available")[1].output) == {
        "tool": "lookup",
        "input": {"q": "a"},
    }


# --------------------------------------------------------------------------- the seed's examples


async def test_cheaper_model_on_continuation(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text="main answer")], "cheap": [ScriptStep(text="cheap answer")]},
        middlewares=[CheaperModelOnContinuation(model="scripted:cheap")],
    )
    events = await h.run("hi")
    assert completed(events) and h.provider.requests[0].model == "main"
    assert of_kind(events, "step_finish")[0].response_model == "scripted:main"

    events = await h.run(None, continuation=True)
    assert completed(events)
    assert h.provider.requests[1].model == "cheap"
    assert of_kind(events, "step_finish")[0].response_model == "scripted:cheap"
    assert text_of(end_of(events).message) == "cheap answer"
    assert text_of(await last_message(h)) == "cheap answer"


async def test_limit_active_tools(make_engine: EngineFactory) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    names = ["read", "write", "getWeather", "delete"]
    h = await make_engine(
        scripts={"main": [calls(("delete", {}), ("read", {})), ScriptStep(text="ok")]},
        tools=[tool(n, ran) for n in names],
        middlewares=[LimitActiveTools(tools=["read", "write", "getWeather"])],
    )
    events = await h.run()
    assert completed(events)
    assert [t.name for t in h.provider.requests[0].tools] == ["read", "write", "getWeather"]
    assert ran == [("read", {})]
    errors = of_kind(events, "tool_input_error")
    assert [e.tool_name for e in errors] == ["delete"]
    assert "unavailable tool 'delete'" in errors[0].error_text


@pytest.mark.parametrize("key", ["selected_file", "selectedFile"])
async def test_selected_file_in_system_prompt(make_engine: EngineFactory, key: str) -> None:
    h = await make_engine(middlewares=[SelectedFileInSystemPrompt()])
    assert completed(await h.run(body={key: "src/app.py"}))
    assert h.provider.requests[0].system == f"{DEFAULT_SYSTEM}\n\nUser is editing: src/app.py"
    assert completed(await h.run(body={key: ""}))
    assert completed(await h.run())
    assert [r.system for r in h.provider.requests[1:]] == [DEFAULT_SYSTEM, DEFAULT_SYSTEM]


async def test_selected_file_appends_to_the_system_an_earlier_middleware_set(
    make_engine: EngineFactory,
) -> None:
    class Persona(Middleware):
        async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
            return TurnConfig(system="You are a code reviewer.")

    h = await make_engine(middlewares=[Persona(), SelectedFileInSystemPrompt()])
    assert completed(await h.run(body={"selected_file": "README.md"}))
    assert h.provider.requests[0].system == "You are a code reviewer.\n\nUser is editing: README.md"


async def test_hide_reasoning_on_continuation(make_engine: EngineFactory) -> None:
    steps: list[StepFinishContext] = []

    class Steps(Middleware):
        async def on_step_finish(self, ctx: StepFinishContext) -> None:
            steps.append(ctx)

    h = await make_engine(
        scripts={"main": [ScriptStep(reasoning="thinking hard", reasoning_signature="sig", text="answer")]},
        middlewares=[HideReasoningOnContinuation(), Steps()],
    )
    events = await h.run("hi")
    assert completed(events)
    assert "reasoning_delta" in kinds(events)
    assert "reasoning" in [p.WhichOneof("kind") for p in (await last_message(h)).parts]

    events = await h.run(None, continuation=True)
    assert completed(events)
    assert not [k for k in kinds(events) if k.startswith("reasoning")]
    assert [p.WhichOneof("kind") for p in (await last_message(h)).parts] == ["step_start", "text"]
    assert steps[1].reasoning_text == ""


SEVERITY = {
    "type": "object",
    "properties": {"severity": {"type": "string", "enum": ["low", "high"]}},
    "required": ["severity"],
}


async def test_structured_answer_sets_output_and_no_tools_when_the_body_asks(
    make_engine: EngineFactory,
) -> None:
    ran: list[tuple[str, dict[str, Any]]] = []
    h = await make_engine(tools=[tool("search", ran)], middlewares=[StructuredAnswer(schema=SEVERITY)])
    assert completed(await h.run(body={"mode": "structured-answer"}))
    assert completed(await h.run(body={"mode": "chat"}))
    structured, plain = h.provider.requests
    assert structured.output_schema == SEVERITY and list(structured.tools) == []
    assert plain.output_schema is None and [t.name for t in plain.tools] == ["search"]


async def test_structured_answer_with_a_custom_mode_field(make_engine: EngineFactory) -> None:
    h = await make_engine(middlewares=[StructuredAnswer(schema=SEVERITY, mode_field="kind", mode_value=3)])
    assert completed(await h.run(body={"kind": 3}))
    assert completed(await h.run(body={"mode": "structured-answer"}))
    assert [r.output_schema for r in h.provider.requests] == [SEVERITY, None]


# --------------------------------------------------------------------------- loading from config


def test_every_builtin_loads_from_config_entries() -> None:
    entries = [
        MiddlewareEntry(path="turnwire.middlewares:HookLogger", options={"level": "debug"}),
        MiddlewareEntry(path="turnwire.middlewares:ToolPolicy", options={"deny": ["delete"]}),
        MiddlewareEntry(
            path="turnwire.middlewares:ToolResultCache", options={"tools": ["w"], "ttl_seconds": 5}
        ),
        MiddlewareEntry(
            path="turnwire.middlewares:CheaperModelOnContinuation", options={"model": "scripted:c"}
        ),
        MiddlewareEntry(path="turnwire.middlewares:LimitActiveTools", options={"tools": ["a"]}),
        MiddlewareEntry(path="turnwire.middlewares:SelectedFileInSystemPrompt"),
        MiddlewareEntry(path="turnwire.middlewares:HideReasoningOnContinuation"),
        MiddlewareEntry(path="turnwire.middlewares:StructuredAnswer", options={"schema": SEVERITY}),
    ]
    loaded = load_middlewares(entries)
    assert [m.name for m in loaded] == [(e.path or "").rpartition(":")[2] for e in entries]


@pytest.mark.parametrize(
    ("path", "options", "message"),
    [
        ("turnwire.middlewares:ToolPolicy", {"read_only": True}, "read_only: needs write_tools"),
        ("turnwire.middlewares:ToolPolicy", {"denied": ["x"]}, "unexpected keyword argument 'denied'"),
        ("turnwire.middlewares:ToolResultCache", {"max_entries": 0}, "max_entries: must be at least 1"),
        ("turnwire.middlewares:CheaperModelOnContinuation", {}, "missing 1 required keyword-only argument"),
        ("turnwire.middlewares:CheaperModelOnContinuation", {"model": "cheap"}, "must be provider:model"),
    ],
)
def test_bad_options_fail_start_up_with_the_reason(path: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(StartupError, match=message) as raised:
        load_middlewares([MiddlewareEntry(path=path, options=options)])
    assert str(raised.value).startswith(f"middleware[0] {path}:")
