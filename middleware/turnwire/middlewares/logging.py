"""``HookLogger``: one structured log line per hook call, with timings.

Options (config ``options:``):

``level`` (``"info"``)
    Log level name (``debug``, ``info``, ``warning``, …) or number.
``logger`` (``"turnwire.hooks"``)
    Logger name.
``include_chunks`` (``true``)
    Count ``on_chunk`` calls per chunk kind and log the counts once per step, in
    the ``on_step_finish`` line. ``false`` leaves ``on_chunk`` unimplemented, so
    the logger costs nothing per chunk.

Rule (docs/semantics.md §3, ``on_chunk``: "never do I/O per call in it
without batching"): never one line per chunk; chunks are counted in memory and
summarized at ``on_step_finish``. The logger wraps nothing and changes nothing:
its decision hooks return ``None`` and ``on_chat_error`` returns the error it got.

Every line carries ``conversation_id``, ``request_id`` and ``t_ms``: milliseconds
since this logger's ``before_turn`` for that request (its own position in the
turn, measured with ``time.perf_counter``). ``on_step_finish`` adds ``step_ms``
(since its ``before_step``) and ``on_chat_response`` ``turn_ms``. The fields are
also attached to the record as ``record.hook`` and ``record.hook_fields`` (a dict)
for JSON log formatters.

Where to list it: last, to log each request-path context with the earlier
middlewares' changes applied (response-path hooks then reach it first). A call
that an earlier middleware blocks or substitutes ends the ``before_tool_call``
chain before the logger (section 4), so only its ``after_tool_call`` is logged;
list the logger first to see every ``before_tool_call``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

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

_MAX_TRACKED_TURNS = 1024
"""Turn clocks kept at most (a turn that neither responds nor errors is evicted oldest first)."""


@dataclass(slots=True)
class _TurnClock:
    started: float
    step_started: float
    chunks: Counter[type] = field(default_factory=Counter)


class _Ids(Protocol):
    """What every hook context carries that each line logs."""

    @property
    def conversation_id(self) -> str: ...

    @property
    def request_id(self) -> str: ...


def _ms_since(start: float) -> float:
    """Milliseconds from ``start`` (a ``time.perf_counter`` value) to now, to the microsecond."""
    return round((time.perf_counter() - start) * 1000.0, 3)


def _error_text(error: BaseException | str) -> str:
    """An error as logged: a text as is, an exception as ``Type: message``."""
    return error if isinstance(error, str) else f"{type(error).__name__}: {error}"


def _call_fields(ctx: ToolCallContext | ToolCallResultContext) -> dict[str, Any]:
    """The fields that name a tool call in its lines: ``step``, ``tool``, ``tool_call_id``."""
    return {"step": ctx.step_number, "tool": ctx.tool_name, "tool_call_id": ctx.tool_call_id}


def _kind_name(kind: type) -> str:
    """``TextDelta`` → ``text_delta``; a tool result (``ToolCallPart``) → ``tool_result``."""
    if kind.__name__ == "ToolCallPart":
        return "tool_result"
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in kind.__name__).lstrip("_")


def _level(value: str | int) -> int:
    if isinstance(value, int):
        return value
    number = logging.getLevelName(value.upper())
    if not isinstance(number, int):
        raise ValueError(f"level: unknown log level {value!r} (use debug, info, warning or error)")
    return number


class HookLogger(Middleware):
    """Logs every hook call it receives (see the module docstring for options and fields).

    Raises :class:`ValueError` at construction for an unknown ``level``.
    """

    def __init__(
        self, *, level: str | int = "info", logger: str = "turnwire.hooks", include_chunks: bool = True
    ) -> None:
        """See the module docstring for the options."""
        super().__init__(level=level, logger=logger, include_chunks=include_chunks)
        self.include_chunks = include_chunks
        self.level = _level(level)
        self.log = logging.getLogger(logger)
        self._turns: OrderedDict[str, _TurnClock] = OrderedDict()

    # --- output ----------------------------------------------------------------------

    def _emit(self, hook: str, ctx: _Ids, **fields: Any) -> None:
        request_id = ctx.request_id
        turn = self._turns.get(request_id)
        record: dict[str, Any] = {"conversation_id": ctx.conversation_id, "request_id": request_id}
        if turn is not None:
            record["t_ms"] = _ms_since(turn.started)
        record.update(fields)
        text = " ".join(f"{key}={value!r}" for key, value in record.items())
        self.log.log(self.level, "%s %s", hook, text, extra={"hook": hook, "hook_fields": record})

    def _enabled(self) -> bool:
        return self.log.isEnabledFor(self.level)

    # --- hooks -----------------------------------------------------------------------

    def implemented_hooks(self) -> frozenset[str]:
        """Every hook; ``on_chunk`` only with ``include_chunks`` (otherwise chunks cost nothing)."""
        hooks = super().implemented_hooks()
        return hooks if self.include_chunks else hooks - {"on_chunk"}

    async def configure_session(self, ctx: SessionContext) -> None:
        """Log that the session started (once per process); set nothing up (``None``)."""
        if self._enabled():
            self.log.log(
                self.level, "configure_session", extra={"hook": "configure_session", "hook_fields": {}}
            )

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Start this turn's clock; log model, continuation, sizes and the body's keys."""
        now = time.perf_counter()
        self._turns[ctx.request_id] = _TurnClock(started=now, step_started=now)
        self._turns.move_to_end(ctx.request_id)
        while len(self._turns) > _MAX_TRACKED_TURNS:
            self._turns.popitem(last=False)
        if self._enabled():
            self._emit(
                "before_turn",
                ctx,
                model=ctx.model,
                continuation=ctx.continuation,
                messages=len(ctx.messages),
                tools=sorted(ctx.tools),
                system_chars=len(ctx.system),
                body_keys=sorted(ctx.body),
            )
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """Log the step about to run; start its clock."""
        turn = self._turns.get(ctx.request_id)
        if turn is not None:
            turn.step_started = time.perf_counter()
        if self._enabled():
            self._emit("before_step", ctx, step=ctx.step_number, model=ctx.model, messages=len(ctx.messages))
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """Log the call (tool, id, step, the input's keys; never the input's values)."""
        if self._enabled():
            self._emit("before_tool_call", ctx, **_call_fields(ctx), input_keys=sorted(ctx.input))
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """Log the outcome: success, ``duration_ms`` and the error text on failure."""
        if self._enabled():
            fields = _call_fields(ctx)
            fields.update(success=ctx.success, duration_ms=round(ctx.duration_ms, 3))
            if not ctx.success:
                fields["error"] = ctx.error
            self._emit("after_tool_call", ctx, **fields)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """Log the step's finish reason, usage, tool calls, ``step_ms`` and the chunk counts."""
        turn = self._turns.get(ctx.request_id)
        counts: Counter[type] = Counter()
        step_ms = None
        if turn is not None:
            counts, turn.chunks = turn.chunks, Counter()
            step_ms = _ms_since(turn.step_started)
        if self._enabled():
            fields: dict[str, Any] = {
                "step": ctx.step_number,
                "finish_reason": str(ctx.finish_reason),
                "input_tokens": ctx.usage.input_tokens,
                "output_tokens": ctx.usage.output_tokens,
                "tool_calls": [call.tool_name for call in ctx.tool_calls],
                "response_model": ctx.response_model,
                "step_ms": step_ms,
            }
            if self.options["include_chunks"]:
                fields["chunks"] = sum(counts.values())
                fields["chunk_kinds"] = {_kind_name(kind): n for kind, n in counts.items()}
            self._emit("on_step_finish", ctx, **fields)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Log how the turn ended (status, parts, ``turn_ms``); drop its clock."""
        turn = self._turns.get(ctx.request_id)
        if self._enabled():
            turn_ms = None if turn is None else _ms_since(turn.started)
            self._emit(
                "on_chat_response",
                ctx,
                status=ctx.status,
                continuation=ctx.continuation,
                parts=len(ctx.message.parts),
                turn_ms=turn_ms,
            )
        self._turns.pop(ctx.request_id, None)

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """Log the error being classified; classify nothing (``None``)."""
        if self._enabled():
            self._emit("classify_chat_error", ctx, stage=ctx.stage, error=_error_text(ctx.error))
        return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """Log the failure (stage, ``messages_persisted``, classification); return ``error`` unchanged."""
        if self._enabled():
            self._emit(
                "on_chat_error",
                ctx,
                stage=ctx.stage,
                messages_persisted=ctx.messages_persisted,
                classification=ctx.classification,
                error=_error_text(ctx.error),
            )
        return ctx.error

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Count this chunk by kind; the counts are logged at ``on_step_finish``."""
        turn = self._turns.get(ctx.request_id)
        if turn is not None:
            turn.chunks[type(ctx.chunk)] += 1
