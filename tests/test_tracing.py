"""Traces of turns (engine/tracing.py): span names, parents and GenAI attributes, recorded in memory.

The first test runs a sidecar in this process and calls it over gRPC with a ``traceparent`` in the
call's metadata, as a traced client does; the others drive the engine directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span, SpanProcessor
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from support.engine_harness import MODEL, EngineFactory, collect, echo, make_tool, of_kind
from support.hook_server import RecordingHookServer, serving
from support.traces import (
    CALLER_SPAN_ID,
    TRACE_ID,
    TRACEPARENT,
    all_attribute_text,
    memory_tracing,
    named,
    one,
    parent_of,
    span_id,
    traceparent_of,
)
from support.waiting import wait_until

from turnwire.hooks import Middleware, SessionContext, TurnConfig, TurnContext
from turnwire.providers import ModelRequest
from turnwire.testing import ScriptedProvider, ScriptedUsage, ScriptStep
from turnwire.types import ModelChunk
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2
from turnwire_server.app import start
from turnwire_server.config import ConfigError, load_settings
from turnwire_server.engine import TurnRequest
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.tracing import Tracing
from turnwire_server.engine.turn_spec import parse_spec, spec_json
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.remote_hooks.settings import RemoteHookSettings
from turnwire_server.trace_export import SdkSpans, service_resource

WEATHER_SCRIPT = [
    {
        "text": "Let me check.",
        "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
        "usage": {"input_tokens": 11, "output_tokens": 7},
    },
    {"text": "It is sunny in Paris.", "usage": {"input_tokens": 23, "output_tokens": 5}},
]


def _user(text: str) -> message_pb2.Message:
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


async def test_a_two_step_tool_turn_continues_the_callers_trace_with_genai_spans(tmp_path: Path) -> None:
    settings = load_settings(
        None,
        listen="127.0.0.1:0",
        store={"url": f"sqlite:///{tmp_path / 'turnwire.db'}"},
        providers={"scripted": {"type": "scripted", "scripts": {"weather": WEATHER_SCRIPT}}},
        middleware=[{"path": "turnwire.middlewares:HookLogger", "options": {"include_chunks": False}}],
    )
    sidecar = await start(settings)
    tracing, exporter = memory_tracing()
    sidecar.engine.tracing = tracing
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
            stub = chat_service_pb2_grpc.ChatServiceStub(channel)
            call = stub.Chat(
                chat_service_pb2.ChatRequest(
                    conversation_id="conv-traced",
                    message=_user("Weather in Paris?"),
                    model="scripted:weather",
                ),
                metadata=(("traceparent", TRACEPARENT), ("tracestate", "vendor=opaque")),
            )
            events = [response.event async for response in call]
    finally:
        await sidecar.stop()
    assert events[-1].turn_end.status == 1, events[-1]  # COMPLETED
    tool_call_id = of_kind(events, "tool_input_available")[0].tool_call_id
    spans = exporter.get_finished_spans()

    turn = one(spans, "invoke_agent turnwire")
    assert turn.context is not None and turn.parent is not None
    assert (turn.context.trace_id, turn.parent.span_id) == (TRACE_ID, CALLER_SPAN_ID)
    assert turn.parent.is_remote
    assert turn.context.trace_state.to_header() == "vendor=opaque"
    assert turn.kind == SpanKind.INTERNAL
    assert turn.attributes is not None
    assert {key: turn.attributes[key] for key in _TURN_KEYS} == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "turnwire",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "weather",
        "gen_ai.conversation.id": "conv-traced",
        "gen_ai.usage.input_tokens": 34,
        "gen_ai.usage.output_tokens": 12,
        "turnwire.turn.status": "completed",
    }
    assert "turnwire.continuation" not in turn.attributes, "set only on a continuation"

    chats = named(spans, "chat weather")
    assert len(chats) == 2
    tool = one(spans, "execute_tool get_weather")
    for span in (*chats, tool):
        assert span.context is not None and span.context.trace_id == TRACE_ID
        assert parent_of(span) == span_id(turn), f"{span.name} is a child of the turn"
    first, second = chats
    assert first.kind == SpanKind.CLIENT
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.provider.name"] == "scripted"
    assert first.attributes["gen_ai.request.model"] == "weather"
    assert first.attributes["gen_ai.conversation.id"] == "conv-traced"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool-calls",)
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert type(first.attributes["gen_ai.response.finish_reasons"][0]) is str
    assert (
        first.attributes["gen_ai.usage.input_tokens"],
        first.attributes["gen_ai.usage.output_tokens"],
    ) == (11, 7)
    assert (
        second.attributes["gen_ai.usage.input_tokens"],
        second.attributes["gen_ai.usage.output_tokens"],
    ) == (23, 5)
    assert [first.attributes["turnwire.step_number"], second.attributes["turnwire.step_number"]] == [0, 1]
    # Model call, then the tool, then the second model call.
    assert first.end_time is not None and tool.start_time is not None and tool.end_time is not None
    assert second.start_time is not None
    assert first.end_time <= tool.start_time and tool.end_time <= second.start_time

    assert tool.attributes is not None
    assert {key: tool.attributes[key] for key in _TOOL_KEYS} == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.call.id": tool_call_id,
        "gen_ai.tool.type": "function",
        "turnwire.tool.outcome": "executed",
    }

    # Hook calls are spans under what runs them; a tool's hooks under its span.
    assert parent_of(one(spans, "before_turn HookLogger")) == span_id(turn)
    assert [parent_of(s) for s in named(spans, "before_step HookLogger")] == [span_id(turn)] * 2
    assert parent_of(one(spans, "before_tool_call HookLogger")) == span_id(tool)
    assert parent_of(one(spans, "after_tool_call HookLogger")) == span_id(tool)
    assert parent_of(one(spans, "on_chat_response HookLogger")) == span_id(turn)
    hook = one(spans, "before_turn HookLogger")
    assert hook.attributes == {"turnwire.middleware.name": "HookLogger", "turnwire.hook.name": "before_turn"}

    # Content is opt-in: none of it by default.
    assert not any(key.startswith(_CONTENT_KEYS) for span in spans for key in span.attributes or {})
    text = all_attribute_text(spans)
    assert "Paris" not in text and "sunny" not in text


_TURN_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.agent.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "gen_ai.conversation.id",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "turnwire.turn.status",
)
_TOOL_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.tool.name",
    "gen_ai.tool.call.id",
    "gen_ai.tool.type",
    "turnwire.tool.outcome",
)
_CONTENT_KEYS = (
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
)


async def test_message_content_is_recorded_only_when_enabled(make_engine: EngineFactory) -> None:
    tracing, exporter = memory_tracing(capture_content=True)
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(text="Checking.", tool_calls=[{"name": "echo", "input": {"city": "Oslo"}}]),
                ScriptStep(text="Done."),
            ]
        },
        tools=[make_tool("echo", echo)],
        tracing=tracing,
        system_prompt="Be brief.",
    )
    await collect(await h.start("What about Oslo?"))
    spans = exporter.get_finished_spans()
    first = named(spans, "chat main")[0]
    attributes: Any = first.attributes
    assert _json(attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be brief."}]
    assert _json(attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "What about Oslo?"}]}
    ]
    output = _json(attributes["gen_ai.output.messages"])
    assert output[0]["role"] == "assistant" and output[0]["finish_reason"] == "tool-calls"
    assert output[0]["parts"][0] == {"type": "text", "content": "Checking."}
    assert output[0]["parts"][1]["type"] == "tool_call" and output[0]["parts"][1]["arguments"] == {
        "city": "Oslo"
    }
    second_input = _json(named(spans, "chat main")[1].attributes["gen_ai.input.messages"])  # type: ignore[index]
    assert [m["role"] for m in second_input] == ["user", "assistant", "tool"]
    assert second_input[2]["parts"][0]["response"] == {"echo": {"city": "Oslo"}}
    tool: Any = one(spans, "execute_tool echo").attributes
    assert _json(tool["gen_ai.tool.call.arguments"]) == {"city": "Oslo"}
    assert _json(tool["gen_ai.tool.call.result"]) == {"echo": {"city": "Oslo"}}


async def test_a_failed_model_call_marks_its_span_and_the_turn_with_the_error_class(
    make_engine: EngineFactory,
) -> None:
    tracing, exporter = memory_tracing()
    h = await make_engine(
        scripts={"main": [ScriptStep(error={"message": "slow down", "status": 429})]}, tracing=tracing
    )
    await collect(await h.start("hi"))
    spans = exporter.get_finished_spans()
    for span in (one(spans, "chat main"), one(spans, "invoke_agent turnwire")):
        assert span.status.status_code == StatusCode.ERROR, span.name
        assert span.attributes is not None and span.attributes["error.type"] == "rate_limit", span.name
    assert one(spans, "invoke_agent turnwire").attributes["turnwire.turn.status"] == "error"  # type: ignore[index]


async def test_a_step_cut_short_carries_the_usage_its_turn_counts(make_engine: EngineFactory) -> None:
    """A cancelled step and a step an in-stream error ended: before, their ``chat`` spans had no
    usage at all while the turn's span (and ``turnwire_tokens_total``) counted the 1200 and 900
    input tokens the provider reported before the cut, so summing a trace's model calls did not
    give the turn's usage (docs/semantics.md §11)."""
    long = " ".join(f"w{i}" for i in range(200))
    overloaded = {"message": "Overloaded", "status": 529, "type": "overloaded_error", "after_chunks": 2}
    tracing, exporter = memory_tracing()
    h = await make_engine(
        scripts={
            "main": [ScriptStep(text=long, delay_ms=5, usage=ScriptedUsage(input_tokens=1200))],
            "broken": [ScriptStep(text=long, usage=ScriptedUsage(input_tokens=900), error=overloaded)],
        },
        tracing=tracing,
    )
    handle = await h.start("go")

    def cancel_at_first_delta(kind: str) -> None:
        if kind == "text_delta":
            handle.cancel()

    await collect(handle, cancel_at_first_delta)
    await collect(await h.start("go", model="scripted:broken", conversation_id="conv-broken"))
    spans = exporter.get_finished_spans()
    for status, tokens in (("aborted", 1200), ("error", 900)):
        (turn,) = [
            s
            for s in named(spans, "invoke_agent turnwire")
            if _attributes(s)["turnwire.turn.status"] == status
        ]
        (chat,) = [
            s for s in spans if s.name.startswith("chat ") and s.parent and s.parent.span_id == span_id(turn)
        ]
        assert (
            _attributes(chat)["gen_ai.usage.input_tokens"]
            == _attributes(turn)["gen_ai.usage.input_tokens"]
            == tokens
        )


def _attributes(span: Any) -> Any:
    """``span``'s attributes (never None here)."""
    assert span.attributes is not None
    return span.attributes


async def test_a_recovered_turn_starts_a_new_trace_linked_to_its_callers() -> None:
    tracing, exporter = memory_tracing()
    request = TurnRequest(
        conversation_id="c",
        request_id="r",
        messages=[],
        body={},
        model="scripted:demo",
        continuation=True,
        response_type=chat_service_pb2.ChatResponse,
        trace_context={"traceparent": TRACEPARENT},
    )
    with tracing.turn(request, None, attempt=2):
        pass
    with tracing.turn(request, None, attempt=1):
        pass
    recovered, first = exporter.get_finished_spans()
    assert (
        recovered.parent is None and recovered.context is not None and recovered.context.trace_id != TRACE_ID
    )
    assert [(link.context.trace_id, link.context.span_id) for link in recovered.links] == [
        (TRACE_ID, CALLER_SPAN_ID)
    ]
    assert recovered.attributes is not None and recovered.attributes["turnwire.attempt"] == 2
    assert recovered.attributes["turnwire.continuation"] is True
    assert first.parent is not None and first.parent.span_id == CALLER_SPAN_ID and not first.links


async def test_tracing_off_records_nothing_and_sends_no_trace_context(make_engine: EngineFactory) -> None:
    h = await make_engine()
    events = await collect(await h.start("hi"))
    assert events[-1].turn_end.status == 1
    assert not h.engine.tracing.enabled


def _json(text: Any) -> Any:
    import json

    return json.loads(text)


async def test_a_remote_hook_server_gets_the_hook_spans_trace_context(make_engine: EngineFactory) -> None:
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
    assert events[-1].turn_end.status == 1
    spans = exporter.get_finished_spans()
    before_turn = [s for s in spans if (s.attributes or {}).get("turnwire.hook.name") == "before_turn"]
    assert len(before_turn) == 1
    (call,) = [c for c in server.calls if c.rpc == "BeforeTurn"]
    assert call.metadata["traceparent"] == traceparent_of(before_turn[0])


async def test_a_submission_started_at_once_continues_the_submitting_calls_trace(tmp_path: Path) -> None:
    settings = load_settings(
        None, listen="127.0.0.1:0", store={"url": f"sqlite:///{tmp_path / 'turnwire.db'}"}
    )
    sidecar = await start(settings)
    tracing, exporter = memory_tracing()
    sidecar.engine.tracing = tracing
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{sidecar.port}") as channel:
            await chat_service_pb2_grpc.ChatServiceStub(channel).SubmitMessages(
                chat_service_pb2.SubmitMessagesRequest(
                    conversation_id="conv-submitted", submission_id="sub-1", messages=[_user("hello")]
                ),
                metadata=(("traceparent", TRACEPARENT),),
            )
            await wait_until(
                lambda: named(exporter.get_finished_spans(), "invoke_agent turnwire"),
                what="the submission's turn span",
            )
    finally:
        await sidecar.stop()
    turn = one(exporter.get_finished_spans(), "invoke_agent turnwire")
    assert turn.context is not None and turn.parent is not None
    assert (turn.context.trace_id, turn.parent.span_id) == (TRACE_ID, CALLER_SPAN_ID)
    assert turn.attributes is not None and turn.attributes["turnwire.request_id"] == "sub-1"


def test_the_turn_spec_keeps_the_callers_trace_context_for_a_recovery() -> None:
    request = TurnRequest(
        conversation_id="c",
        request_id="r",
        messages=[],
        body={},
        model="scripted:demo",
        continuation=False,
        response_type=chat_service_pb2.ChatResponse,
        trace_context={"traceparent": TRACEPARENT},
    )
    assert parse_spec(spec_json(request)).trace_context == {"traceparent": TRACEPARENT}
    untraced = dataclasses.replace(request, trace_context={})
    assert "trace_context" not in spec_json(untraced)
    assert parse_spec(spec_json(untraced)).trace_context == {}


def test_tracing_settings_keep_headers_secret_and_name_a_bad_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNWIRE_TRACING__HEADERS", '{"authorization": "Bearer tok-9d2e"}')
    settings = load_settings(None)
    assert not settings.tracing.enabled, "off by default"
    assert settings.tracing.headers["authorization"].get_secret_value() == "Bearer tok-9d2e"
    assert "tok-9d2e" not in repr(settings) and "tok-9d2e" not in settings.model_dump_json()
    with pytest.raises(ConfigError, match=r"tracing\.sampler_ratio"):
        load_settings(None, tracing={"sampler_ratio": 1.5})


def test_an_endpoint_without_a_scheme_says_how_to_name_the_transport() -> None:
    """``otel-collector:4317`` was taken for TLS: a plaintext collector got no span, and the only
    sign was the exporter's handshake error every few seconds."""
    with pytest.raises(ConfigError, match=r"http://otel-collector:4317 for a plaintext collector"):
        load_settings(None, tracing={"enabled": True, "endpoint": "otel-collector:4317"})
    for endpoint in ("http://otel-collector:4317", "https://otel-collector:4317"):
        assert load_settings(None, tracing={"endpoint": endpoint}).tracing.endpoint == endpoint
    explicit = load_settings(None, tracing={"endpoint": "otel-collector:4317", "insecure": True})
    assert explicit.tracing.insecure is True


def test_the_spans_resource_names_the_service_and_equals_the_sdks_own() -> None:
    resource = service_resource({"service.name": "sidecar-a"})
    plain = Resource(resource.attributes, resource.schema_url)
    assert resource.attributes["service.name"] == "sidecar-a"
    assert resource.attributes["telemetry.sdk.name"] == "opentelemetry"
    # The OTLP encoder groups spans by resource: the kept hash must match the SDK's own.
    assert resource == plain and plain == resource and hash(resource) == hash(plain)
    by_resource: dict[Resource, int] = {resource: 1}
    assert by_resource[plain] == 1


class _Started(SpanProcessor):
    """The names of the spans started on the SDK, in the order they started."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.names.append(span.name)


def _recorded() -> tuple[SdkSpans, InMemorySpanExporter, _Started]:
    spans, exporter, started = SdkSpans(), InMemorySpanExporter(), _Started()
    spans.provider.add_span_processor(started)
    spans.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return spans, exporter, started


class _Timed(ScriptedProvider):
    """The scripted model, noting when each step's stream was called (``time.time_ns``) and the
    spans started on the SDK by then."""

    def __init__(self, steps: list[ScriptStep], started: _Started) -> None:
        super().__init__({"m": steps})
        self.calls: list[tuple[int, list[str]]] = []
        self._started = started

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        self.calls.append((time.time_ns(), list(self._started.names)))
        async for chunk in super().stream(request):
            yield chunk


async def test_a_turns_spans_start_on_the_sdk_after_its_first_model_call_with_their_own_times(
    make_engine: EngineFactory,
) -> None:
    spans, exporter, started = _recorded()
    model = _Timed(
        [ScriptStep(text="Checking.", tool_calls=[{"name": "echo", "input": {}}]), ScriptStep(text="Done.")],
        started,
    )
    h = await make_engine(tracing=Tracing(spans), providers={"timed": model}, tools=[make_tool("echo", echo)])
    before = time.time_ns()
    events = await collect(await h.start("hi", model="timed:m"))
    assert events[-1].turn_end.status == 1, events[-1]
    (first_call, started_then), (second_call, _) = model.calls
    # Off the path to the first token: the SDK's span start waits for the first model call's end.
    assert started_then == []
    finished = exporter.get_finished_spans()
    turn, tool = one(finished, "invoke_agent turnwire"), one(finished, "execute_tool echo")
    first, second = named(finished, "chat m")
    # The times are when each operation started and ended, not when the SDK was told.
    assert turn.start_time is not None and turn.end_time is not None
    assert first.start_time is not None and first.end_time is not None
    assert second.start_time is not None and second.end_time is not None
    assert tool.start_time is not None and tool.end_time is not None
    assert before <= turn.start_time <= first.start_time <= first_call <= first.end_time <= tool.start_time
    assert tool.end_time <= second.start_time <= second_call <= second.end_time <= turn.end_time
    assert [parent_of(span) for span in (first, tool, second)] == [span_id(turn)] * 3


async def test_a_turns_spans_start_on_the_sdk_once_its_first_token_was_taken(
    make_engine: EngineFactory,
) -> None:
    spans, exporter, started = _recorded()
    h = await make_engine(
        tracing=Tracing(spans), scripts={"main": [ScriptStep(text="hello there", chunk_size=2)]}
    )
    at_first_token: list[str] | None = None
    async for response in await h.start("hi"):
        if at_first_token is None and response.event.HasField("text_delta"):
            at_first_token = list(started.names)
    assert at_first_token == [], "the SDK's work waits until the first token is out"
    assert started.names[:2] == ["invoke_agent turnwire", "chat main"]
    assert len(exporter.get_finished_spans()) == 2


async def test_a_channel_calls_back_once_its_consumer_comes_back_after_the_watched_item() -> None:
    channel: EventChannel[int] = EventChannel()
    calls: list[str] = []
    channel.put(1)
    channel.put(2)
    channel.when_taken(lambda: calls.append("back"))
    channel.put(3)
    channel.close()
    seen: list[tuple[int, list[str]]] = []
    async for item in channel:
        seen.append((item, list(calls)))
        await asyncio.sleep(0)
    assert seen == [(1, []), (2, []), (3, [])]
    assert calls == ["back"]


class _Annotating(Middleware):
    """Records on its ``before_turn`` hook's span (planned, not started yet): an attribute, an
    event, and a span of its own under it."""

    def __init__(self, tracer: trace.Tracer) -> None:
        super().__init__()
        self.tracer = tracer

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        span = trace.get_current_span()
        span.set_attribute("app.checked", True)
        span.add_event("app.looked")
        with self.tracer.start_as_current_span("app lookup"):
            pass
        return None


async def test_what_a_middleware_records_on_its_hooks_span_before_the_first_token_is_kept(
    make_engine: EngineFactory,
) -> None:
    spans, exporter, _ = _recorded()
    middleware = _Annotating(spans.provider.get_tracer("app"))
    h = await make_engine(tracing=Tracing(spans), middlewares=[middleware])
    events = await collect(await h.start("hi"))
    assert events[-1].turn_end.status == 1, events[-1]
    finished = exporter.get_finished_spans()
    hook, turn = one(finished, "before_turn _Annotating"), one(finished, "invoke_agent turnwire")
    assert hook.attributes == {
        "turnwire.middleware.name": "_Annotating",
        "turnwire.hook.name": "before_turn",
        "app.checked": True,
    }
    assert [event.name for event in hook.events] == ["app.looked"]
    assert parent_of(one(finished, "app lookup")) == span_id(hook)
    assert parent_of(hook) == span_id(turn)
    assert parent_of(one(finished, "chat main")) == span_id(turn)
