"""An in-process turn engine for tests: real SQLite store, scripted provider, a recorder.

``engine_factory(tmp_path)`` yields ``await factory(scripts=..., tools=...,
middlewares=..., **settings) -> Harness``, the settings flat as before sections existed
(``max_steps=2``, ``lease_seconds=1``; :func:`engine_settings`); the ``make_engine`` fixture in
``tests/conftest.py`` wraps it. The provider wrapper keeps a deep
copy of every ``ModelRequest``, so tests assert what the model was sent.

The scripted model is strict (``turnwire.testing``): a model call past a
script's last step fails the turn, and fails the test when the factory closes,
even if the test never looked at the turn's error. A script meant to repeat
says so with ``repeat=True`` on its last step; ``strict=False`` turns the check
off for one engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage
from google.rpc import status_pb2

from turnwire.hooks import Middleware
from turnwire.providers import ModelRequest, Provider
from turnwire.testing import ScriptedProvider, ScriptStep
from turnwire.tools import PythonTool, ToolExecution
from turnwire.types import ModelChunk
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.config_section import ConfigSection
from turnwire_server.engine import EngineSettings, TurnEngine, TurnHandle, TurnRequest
from turnwire_server.engine.settings import (
    DurabilitySettings,
    EventsSettings,
    LimitsSettings,
    StoreCheckpointSettings,
)
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.sqlite import SqliteStore

# --------------------------------------------------------------------------- harness

MODEL = "scripted:main"
CONV = "conv-1"

_SECTIONS: dict[str, type[ConfigSection]] = {
    "limits": LimitsSettings,
    "events": EventsSettings,
    "durability": DurabilitySettings,
}


def engine_settings(**fields: Any) -> EngineSettings:
    """:class:`EngineSettings` from flat fields: a section's field by its own name
    (``max_steps``, ``lease_seconds``, ``hook_timeline`` …), ``checkpoint_interval_ms`` for
    ``checkpoint.interval_ms``, the rest (``compaction``, ``replica_id`` …) as they are. The
    sections are built without validation, so a test may go below the configuration's bounds
    (a 5 ms checkpoint interval, a one-second lease). Raises :class:`TypeError` for an unknown
    field."""
    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    rest: dict[str, Any] = {}
    for name, value in fields.items():
        section = next((s for s, model in _SECTIONS.items() if name in model.model_fields), None)
        if section is not None:
            values[section][name] = value
        else:
            rest[name] = value
    checkpoint = StoreCheckpointSettings.model_construct(
        **({"interval_ms": rest.pop("checkpoint_interval_ms")} if "checkpoint_interval_ms" in rest else {})
    )
    return EngineSettings(
        checkpoint=checkpoint,
        limits=LimitsSettings.model_construct(**values["limits"]),
        events=EventsSettings.model_construct(**values["events"]),
        durability=DurabilitySettings.model_construct(**values["durability"]),
        **{"default_model": MODEL, **rest},
    )


def _copy(message: message_pb2.Message) -> message_pb2.Message:
    copy = message_pb2.Message()
    copy.CopyFrom(message)
    return copy


class RecordingProvider:
    """Wraps the scripted provider; keeps a deep copy of every request.

    ``before_stream`` (optional) is awaited inside ``stream()`` before the model's
    first chunk, e.g. to read the store while the model is "called".
    """

    name = "scripted"

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.requests: list[ModelRequest] = []
        self.before_stream: Callable[[ModelRequest], Awaitable[None]] | None = None

    @property
    def calls(self) -> int:
        return len(self.requests)

    def has_model(self, model: str) -> bool:
        return self.inner.has_model(model)

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        recorded = ModelRequest(
            model=request.model,
            system=request.system,
            messages=[_copy(m) for m in request.messages],
            tools=list(request.tools),
            tool_choice=request.tool_choice,
            settings=request.settings,
            output_schema=request.output_schema,
            step_number=request.step_number,
            attempt=request.attempt,
        )
        self.requests.append(recorded)
        if self.before_stream is not None:
            await self.before_stream(request)
        async for chunk in self.inner.stream(request):
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Harness:
    engine: TurnEngine
    store: SqliteStore
    provider: RecordingProvider
    chain: MiddlewareChain
    counter: list[int] = field(default_factory=lambda: [0])

    def request(
        self,
        text: str | None = "hi",
        *,
        conversation_id: str = CONV,
        request_id: str | None = None,
        message_id: str | None = None,
        model: str = MODEL,
        continuation: bool = False,
        body: Mapping[str, Any] | None = None,
        skip_unless: Literal["", "history", "assistant_last"] | None = None,
    ) -> TurnRequest:
        self.counter[0] += 1
        n = self.counter[0]
        messages: list[message_pb2.Message] = []
        if text is not None:
            message = message_pb2.Message(id=message_id or f"u{n}", role=message_pb2.ROLE_USER)
            message.parts.add().text.text = text
            messages.append(message)
        return TurnRequest(
            conversation_id=conversation_id,
            request_id=request_id or f"r{n}",
            messages=messages,
            body=body or {},
            model=model,
            continuation=continuation,
            response_type=chat_service_pb2.ChatResponse,
            # As the API asks (ContinueLastTurn); SaveMessages with no messages asks "history".
            skip_unless=("assistant_last" if continuation else "") if skip_unless is None else skip_unless,
        )

    async def start(self, text: str | None = "hi", **kwargs: Any) -> TurnHandle:
        return await self.engine.start(self.request(text, **kwargs))

    async def run(self, text: str | None = "hi", **kwargs: Any) -> list[event_pb2.TurnEvent]:
        return await collect(await self.start(text, **kwargs))


async def collect(
    handle: TurnHandle, on_event: Callable[[str], None] | None = None
) -> list[event_pb2.TurnEvent]:
    """All events of a turn (waits for its task); ``on_event`` gets each event's kind as it arrives."""
    events = []
    async for response in handle:
        events.append(response.event)
        if on_event is not None:
            on_event(response.event.WhichOneof("event") or "")
    await asyncio.wait_for(handle.task, 5)
    return events


def kinds(events: Sequence[event_pb2.TurnEvent]) -> list[str]:
    return [e.WhichOneof("event") or "" for e in events]


def of_kind(events: Sequence[event_pb2.TurnEvent], kind: str) -> list[Any]:
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


def end_of(events: Sequence[event_pb2.TurnEvent]) -> event_pb2.TurnEnd:
    assert events, "no events"
    assert events[-1].WhichOneof("event") == "turn_end", kinds(events)
    assert kinds(events).count("turn_end") == 1
    return events[-1].turn_end


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def tool_parts(message: message_pb2.Message) -> list[message_pb2.ToolCallPart]:
    return [p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"]


def value(v: Any) -> Any:
    return json_format.MessageToDict(v)


def detail(status: status_pb2.Status, kind: type[ProtoMessage]) -> Any:
    for packed in status.details:
        if packed.Is(kind.DESCRIPTOR):
            out = kind()
            packed.Unpack(out)
            return out
    return None


def make_tool(
    name: str,
    function: Callable[[dict[str, Any], ToolExecution], Any],
    schema: Mapping[str, Any] | None = None,
) -> PythonTool:
    return PythonTool(name, f"the {name} tool", function, input_schema=schema or {"type": "object"})


async def echo(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
    """A tool function returning ``{"echo": input}`` (use with ``make_tool``)."""
    return {"echo": input}


EngineFactory = Callable[..., Awaitable[Harness]]


@contextlib.asynccontextmanager
async def engine_factory(tmp_path: Path) -> AsyncIterator[EngineFactory]:
    """``await make_engine(scripts=..., tools=..., middlewares=..., context_window=...,
    tracing=..., providers=..., strict=True, **settings)`` (flat, :func:`engine_settings`);
    ``context_window`` is the scripted model's (tokens); ``providers`` are added beside
    ``scripted``; ``tracing`` records spans; ``strict`` makes the scripted model refuse a step its
    script does not have.

    Raises (on exit, after the engines drained):
        AssertionError: a strict scripted model got a call its script did not expect; the
            message lists each one (script, step number, script length).
    """
    stores: list[SqliteStore] = []
    engines: list[TurnEngine] = []
    scripted: list[ScriptedProvider] = []

    async def factory(
        scripts: Mapping[str, Sequence[ScriptStep]] | None = None,
        tools: Sequence[Any] = (),
        middlewares: Sequence[Middleware] = (),
        db: str = "turnwire.db",
        context_window: int | None = None,
        *,
        tracing: Tracing = TRACING_OFF,
        providers: Mapping[str, Provider] | None = None,
        strict: bool = True,
        **settings: Any,
    ) -> Harness:
        store = SqliteStore(tmp_path / db)
        await store.open()
        stores.append(store)
        inner = ScriptedProvider(
            scripts or {"main": [ScriptStep(text="hello")]}, context_window=context_window, strict=strict
        )
        scripted.append(inner)
        provider = RecordingProvider(inner)
        chain = MiddlewareChain(list(middlewares))
        engine = TurnEngine(
            store=store,
            providers=ProviderRegistry({"scripted": provider, **(providers or {})}),
            tools={t.name: t for t in tools},
            chain=chain,
            settings=engine_settings(**settings),
            error_status=status_of,
            tracing=tracing,
        )
        engines.append(engine)
        return Harness(engine, store, provider, chain)

    yield factory
    for engine in engines:
        await engine.drain(1.0)
    for store in stores:
        await store.close()
    unexpected = [call.message for provider in scripted for call in provider.unexpected_calls]
    if unexpected:
        raise AssertionError(
            "the scripted model got model calls its script did not expect (strict mode; put "
            "repeat=True on a last step that is meant to repeat):\n" + "\n".join(unexpected)
        )
