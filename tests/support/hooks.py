"""Test-only middlewares, loaded by a real server process as ``support.hooks:ClassName``.

The sidecar runs with its working directory in a temp dir, so an end-to-end
test passes ``PYTHONPATH`` with this repo's ``tests/`` (see
:func:`pythonpath_env`). Each middleware acts only when the request's ``body``
asks, so one server process serves every test.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from turnwire.hooks import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ChunkContext,
    Middleware,
    SessionContext,
    StepConfig,
    StepContext,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)
from turnwire.types import ModelSettings

TESTS_DIR = Path(__file__).resolve().parent.parent


def pythonpath_env() -> dict[str, str]:
    """``{"PYTHONPATH": …}`` with ``tests/`` first, so a server process can import ``support.hooks``."""
    inherited = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(TESTS_DIR), inherited) if p)}


class ModelFromBody(Middleware):
    """``before_turn``: use ``body["use_model"]`` (``provider:model``) as the turn's model."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(model=body["use_model"])`` when the body names one."""
        model = ctx.body.get("use_model")
        return TurnConfig(model=str(model)) if model else None


class ModelFromMetadata(Middleware):
    """``before_turn``: use ``body["metadata"]["use_model"]`` as the turn's model: what an OpenAI
    door request's ``metadata`` reaches hooks as (docs/api/openai.md)."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(model=…)`` when the body's metadata names one."""
        metadata = ctx.body.get("metadata")
        model = metadata.get("use_model") if isinstance(metadata, dict) else None
        return TurnConfig(model=str(model)) if model else None


class ActiveToolsFromBody(Middleware):
    """``before_turn``: limit the model to ``body["active_tools"]`` (a list of tool names)."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(active_tools=…)`` when the body has the key."""
        if "active_tools" not in ctx.body:
            return None
        return TurnConfig(active_tools=[str(name) for name in ctx.body["active_tools"]])


class ProviderOptionsFromBody(Middleware):
    """``before_turn``: use ``body["provider_options"]`` as the turn's provider options."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """``TurnConfig(model_settings=ModelSettings(provider_options=…))`` when the body has them."""
        options = ctx.body.get("provider_options")
        if not isinstance(options, dict):
            return None
        return TurnConfig(model_settings=ModelSettings(provider_options=options))


class EveryHook(Middleware):
    """Implements every hook as a no-op, so a hook timeline shows where it ran; ``label`` names it."""

    def __init__(self, *, label: str = "") -> None:
        """``label``: the middleware's name in timelines and logs (default: the class name)."""
        super().__init__(label=label)
        if label:
            self.name = label

    async def configure_session(self, ctx: SessionContext) -> None:
        """No-op."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """No change."""
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """No change."""
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """No decision."""
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """No-op."""

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """No-op."""

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """No-op."""

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        """No-op."""

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """The error unchanged."""
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """No classification."""
        return None


class RecordResponses(Middleware):
    """``on_chat_response``: append ``"<label> <request_id> <status>"`` to the file ``path``
    (one line per call), so a test can see from outside that this middleware's hook ran."""

    def __init__(self, *, label: str, path: str) -> None:
        """``label`` names the lines; ``path`` is the file to append to."""
        super().__init__(label=label, path=path)
        self.name = label
        self.path = Path(path)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Record the call."""
        with self.path.open("a") as out:
            out.write(f"{self.name} {ctx.request_id} {ctx.status}\n")


class SlowResponse(Middleware):
    """``on_chat_response`` that takes ``seconds``: a window for cancels to land in it."""

    def __init__(self, *, seconds: float) -> None:
        """``seconds``: how long the hook takes."""
        super().__init__(seconds=seconds)
        self.seconds = seconds

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Take a while."""
        await asyncio.sleep(self.seconds)


class BlockToolsFromBody(Middleware):
    """``before_tool_call``: block the tools named in the turn's ``body["block_tools"]`` (with the
    reason ``"blocked by the test policy"``), substitute those in ``body["substitute_tools"]``.
    The body is kept per request id from ``before_turn``,
    since a tool call's context does not carry it."""

    REASON = "blocked by the test policy"

    def __init__(self) -> None:
        """No options."""
        super().__init__()
        self._blocked: dict[str, set[str]] = {}
        self._substituted: dict[str, set[str]] = {}

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Remember which tools this turn blocks."""
        names = ctx.body.get("block_tools")
        if names:
            self._blocked[ctx.request_id] = {str(name) for name in names}
        substituted = ctx.body.get("substitute_tools")
        if substituted:
            self._substituted[ctx.request_id] = {str(name) for name in substituted}
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """Block a named tool; substitute ``{"substituted": true}`` for one named in
        ``body["substitute_tools"]``."""
        if ctx.tool_name in self._blocked.get(ctx.request_id, ()):
            return ToolCallDecision.block(self.REASON)
        if ctx.tool_name in self._substituted.get(ctx.request_id, ()):
            return ToolCallDecision.substitute({"substituted": True})
        return None

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Forget the turn."""
        self._blocked.pop(ctx.request_id, None)
        self._substituted.pop(ctx.request_id, None)


class RecordConcurrentInput(Middleware):
    """Append what ``before_turn`` and ``on_chat_response`` are told about the concurrent-input
    strategy to the file ``path``, one line per call: ``before_turn <request_id> <strategy>
    <stopped request id or ->`` and ``on_chat_response <request_id> <status> <strategy or ->
    <interrupting request id or ->``."""

    def __init__(self, *, path: str) -> None:
        """``path`` is the file to append to."""
        super().__init__(path=path)
        self.path = Path(path)

    def _write(self, line: str) -> None:
        with self.path.open("a") as out:
            out.write(line + "\n")

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Record the strategy the request used and the turn it stopped."""
        applied = ctx.concurrent_input
        strategy, stopped = (applied.strategy, applied.request_id or "-") if applied else ("-", "-")
        self._write(f"before_turn {ctx.request_id} {strategy} {stopped}")
        return None

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Record how the turn ended and whether new input stopped it."""
        by = ctx.concurrent_input
        strategy, request_id = (by.strategy, by.request_id) if by else ("-", "-")
        self._write(f"on_chat_response {ctx.request_id} {ctx.status} {strategy} {request_id}")


class HoldStoreAfterResponse(Middleware):
    """``on_chat_response`` of the turns whose request id starts with ``prefix``: take the store's
    write lock from a connection of its own and keep it until the process dies, so nothing the
    sidecar writes after this hook commits. The TurnEnd is sent after this hook, so a SIGKILL
    once the client has it is a crash right after the TurnEnd was sent, every time
    (docs/semantics.md §8). ``url``: the store, ``sqlite:///PATH`` or ``postgresql://…``."""

    def __init__(self, *, url: str, prefix: str) -> None:
        """``url``: the store the sidecar uses; ``prefix``: which request ids it acts on."""
        super().__init__(url=url, prefix=prefix)
        self.url = url
        self.prefix = prefix
        self._held: list[object] = []  # the locking connections, kept open until the process dies

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Take the write lock (waits for a write in progress to commit)."""
        if not ctx.request_id.startswith(self.prefix):
            return
        if self.url.startswith("sqlite:///"):
            import sqlite3

            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
            conn.execute("BEGIN IMMEDIATE")  # the one writer's lock: every later write waits
            self._held.append(conn)
            return
        import psycopg

        pg = await psycopg.AsyncConnection.connect(self.url)
        await pg.execute("LOCK TABLE turn_streams, turn_events IN ACCESS EXCLUSIVE MODE")
        self._held.append(pg)


class RecordParts(Middleware):
    """``on_step_finish`` and ``on_chat_response``: append one JSON line per call to ``path`` with the
    request id, the hook, and the sources and files it was given (the message's, for
    ``on_chat_response``), so a test sees from outside what the hooks got (issue 31)."""

    def __init__(self, *, path: str) -> None:
        """``path`` is the file to append to."""
        super().__init__(path=path)
        self.path = Path(path)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """Record the step's sources, files and warnings."""
        self._write(ctx.request_id, "on_step_finish", ctx.sources, ctx.files, list(ctx.warnings))

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Record the stored message's sources and files."""
        parts = ctx.message.parts
        sources = [p.source for p in parts if p.WhichOneof("kind") == "source"]
        files = [p.file for p in parts if p.WhichOneof("kind") == "file"]
        self._write(ctx.request_id, "on_chat_response", sources, files, [])

    def _write(self, request_id: str, hook: str, sources: Any, files: Any, warnings: list[str]) -> None:
        line = {
            "request_id": request_id,
            "hook": hook,
            "sources": [json_format.MessageToDict(s) for s in sources],
            "files": [json_format.MessageToDict(f) for f in files],
            "warnings": warnings,
        }
        with self.path.open("a") as out:
            out.write(json.dumps(line) + "\n")
