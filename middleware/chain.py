"""The ordered middleware chain: the onion of THINK-SEMANTICS.md section 4.

Request-path hooks (``configure_session``, ``before_turn``, ``before_step``,
``before_tool_call``) run first to last; response-path hooks
(``after_tool_call``, ``on_chunk``, ``on_step_finish``, ``on_chat_response``,
``classify_chat_error``, ``on_chat_error``) run last to first. The chain is
built once per process; per hook it keeps only the middlewares that implement
it, so an unimplemented hook costs nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from middleware.base import HOOKS, Middleware, implements
from middleware.context import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseResult,
    ChunkContext,
    StepConfig,
    StepContext,
    StepResult,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)

log = logging.getLogger("turnwire.middleware")

_ADDITIVE = frozenset({"tools", "stop_when"})
_SHALLOW_MERGED = frozenset({"headers", "provider_options"})


class HookError(Exception):
    """A hook raised where the error ends the turn (``before_turn``, ``before_step``).

    ``middleware`` and ``hook`` name where; ``__cause__`` is the original error.
    """

    def __init__(self, middleware: str, hook: str, error: BaseException) -> None:
        super().__init__(f"{middleware}.{hook} failed: {error}")
        self.middleware = middleware
        self.hook = hook
        self.__cause__ = error


@dataclass(slots=True)
class HookTiming:
    """One hook call in a turn's timeline: offsets and durations in milliseconds."""

    middleware: str
    hook: str
    start_ms: float
    duration_ms: float
    failed: bool = False
    calls: int = 1


@dataclass(slots=True)
class HookTimeline:
    """Which hook of which middleware ran, in order, and how long it took.

    ``on_chunk`` calls are folded into one entry per middleware (``calls`` and
    summed ``duration_ms``) so the timeline stays small on long streams.
    """

    origin: float = field(default_factory=time.perf_counter)
    entries: list[HookTiming] = field(default_factory=list)
    _chunk_entries: dict[str, HookTiming] = field(default_factory=dict)

    def add(self, middleware: str, hook: str, started: float, ended: float, failed: bool) -> None:
        """Record one call; ``started``/``ended`` are ``time.perf_counter()`` values."""
        duration = (ended - started) * 1000.0
        if hook == "on_chunk":
            entry = self._chunk_entries.get(middleware)
            if entry is not None:
                entry.calls += 1
                entry.duration_ms += duration
                entry.failed = entry.failed or failed
                return
            entry = HookTiming(middleware, hook, (started - self.origin) * 1000.0, duration, failed)
            self._chunk_entries[middleware] = entry
            self.entries.append(entry)
            return
        self.entries.append(HookTiming(middleware, hook, (started - self.origin) * 1000.0, duration, failed))

    def as_dicts(self) -> list[dict[str, Any]]:
        """The timeline as JSON-ready dicts, in call order."""
        return [dataclasses.asdict(entry) for entry in self.entries]


def merge_turn_config(base: TurnConfig, update: TurnConfig) -> TurnConfig:
    """Merge ``update`` over ``base`` field by field (section 4's rules)."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(TurnConfig):
        value = getattr(update, f.name)
        if value is None:
            continue
        previous = getattr(base, f.name)
        if previous is not None and f.name in _ADDITIVE:
            value = {**previous, **value} if f.name == "tools" else (*previous, *value)
        elif previous is not None and f.name in _SHALLOW_MERGED:
            value = {**previous, **value}
        changes[f.name] = value
    return dataclasses.replace(base, **changes) if changes else base


def merge_step_config(base: StepConfig, update: StepConfig) -> StepConfig:
    """Merge ``update`` over ``base``: later values replace; ``provider_options`` merges shallowly."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(StepConfig):
        value = getattr(update, f.name)
        if value is None:
            continue
        previous = getattr(base, f.name)
        if previous is not None and f.name in _SHALLOW_MERGED:
            value = {**previous, **value}
        changes[f.name] = value
    return dataclasses.replace(base, **changes) if changes else base


class MiddlewareChain:
    """An ordered list of middlewares and the rules for calling their hooks.

    Errors swallowed by the rules of section 3 are logged with the
    middleware's name and counted in :attr:`error_counts` by
    ``(middleware, hook)``.
    """

    def __init__(self, middlewares: Sequence[Middleware] = ()) -> None:
        self.middlewares = tuple(middlewares)
        forward = {hook: tuple(m for m in self.middlewares if implements(m, hook)) for hook in HOOKS}
        self._forward = forward
        self._reverse = {hook: tuple(reversed(ms)) for hook, ms in forward.items()}
        self.error_counts: Counter[tuple[str, str]] = Counter()
        #: True when some middleware implements ``on_chunk``; the engine skips
        #: building chunk contexts entirely otherwise.
        self.observes_chunks = bool(forward["on_chunk"])

    def _swallow(self, middleware: Middleware, hook: str, error: BaseException) -> None:
        self.error_counts[(middleware.name, hook)] += 1
        log.warning(
            "middleware %s.%s raised %s: %s",
            middleware.name,
            hook,
            type(error).__name__,
            error,
            extra={"middleware": middleware.name, "hook": hook},
        )

    async def configure_session(self) -> None:
        """Run every ``configure_session`` once, first to last; errors propagate as HookError."""
        for m in self._forward["configure_session"]:
            try:
                await m.configure_session()
            except Exception as error:
                raise HookError(m.name, "configure_session", error) from error

    async def before_turn(
        self, ctx: TurnContext, timeline: HookTimeline | None = None
    ) -> tuple[TurnContext, TurnConfig]:
        """First to last; each sees the earlier changes. Returns the final context and merged config.

        Raises :class:`HookError` when a middleware raises.
        """
        merged = TurnConfig()
        for m in self._forward["before_turn"]:
            started = time.perf_counter()
            try:
                update = await m.before_turn(ctx)
            except Exception as error:
                if timeline is not None:
                    timeline.add(m.name, "before_turn", started, time.perf_counter(), True)
                raise HookError(m.name, "before_turn", error) from error
            if timeline is not None:
                timeline.add(m.name, "before_turn", started, time.perf_counter(), False)
            if update is None:
                continue
            merged = merge_turn_config(merged, update)
            ctx = dataclasses.replace(
                ctx,
                model=update.model if update.model is not None else ctx.model,
                system=update.system if update.system is not None else ctx.system,
                messages=update.messages if update.messages is not None else ctx.messages,
                tools={**ctx.tools, **update.tools} if update.tools else ctx.tools,
            )
        return ctx, merged

    async def before_step(self, ctx: StepContext, timeline: HookTimeline | None = None) -> StepConfig:
        """First to last; each sees the earlier changes. Raises :class:`HookError`."""
        merged = StepConfig()
        for m in self._forward["before_step"]:
            started = time.perf_counter()
            try:
                update = await m.before_step(ctx)
            except Exception as error:
                if timeline is not None:
                    timeline.add(m.name, "before_step", started, time.perf_counter(), True)
                raise HookError(m.name, "before_step", error) from error
            if timeline is not None:
                timeline.add(m.name, "before_step", started, time.perf_counter(), False)
            if update is None:
                continue
            merged = merge_step_config(merged, update)
            ctx = dataclasses.replace(
                ctx,
                model=update.model if update.model is not None else ctx.model,
                system=update.system if update.system is not None else ctx.system,
                messages=update.messages if update.messages is not None else ctx.messages,
            )
        return merged

    async def before_tool_call(
        self, ctx: ToolCallContext, timeline: HookTimeline | None = None
    ) -> ToolCallDecision:
        """First to last. ``allow(input=…)`` feeds the next middleware; the first block or
        substitute ends the chain. Returns the final decision (``allow`` with the input to run).

        Raises :class:`HookError` when a middleware raises (the engine turns it
        into that call's error result).
        """
        for m in self._forward["before_tool_call"]:
            started = time.perf_counter()
            try:
                decision = await m.before_tool_call(ctx)
            except Exception as error:
                if timeline is not None:
                    timeline.add(m.name, "before_tool_call", started, time.perf_counter(), True)
                raise HookError(m.name, "before_tool_call", error) from error
            if timeline is not None:
                timeline.add(m.name, "before_tool_call", started, time.perf_counter(), False)
            if decision is None:
                continue
            if decision.action != "allow":
                return decision
            if decision.input is not None:
                ctx = dataclasses.replace(ctx, input=decision.input)
        return ToolCallDecision.allow(ctx.input)

    async def _notify(self, hook: str, arg: Any, timeline: HookTimeline | None) -> None:
        for m in self._reverse[hook]:
            started = time.perf_counter()
            failed = False
            try:
                await getattr(m, hook)(arg)
            except Exception as error:
                failed = True
                self._swallow(m, hook, error)
            if timeline is not None:
                timeline.add(m.name, hook, started, time.perf_counter(), failed)

    async def after_tool_call(self, ctx: ToolCallResultContext, timeline: HookTimeline | None = None) -> None:
        """Last to first; errors are logged and counted."""
        if self._reverse["after_tool_call"]:
            await self._notify("after_tool_call", ctx, timeline)

    async def on_step_finish(self, ctx: StepResult, timeline: HookTimeline | None = None) -> None:
        """Last to first; errors are logged and counted."""
        if self._reverse["on_step_finish"]:
            await self._notify("on_step_finish", ctx, timeline)

    async def on_chunk(self, ctx: ChunkContext, timeline: HookTimeline | None = None) -> None:
        """Last to first; errors are logged and counted. Call only when :attr:`observes_chunks`."""
        if timeline is not None:
            await self._notify("on_chunk", ctx, timeline)
            return
        # Per token: no clock reads when nobody records a timeline.
        for m in self._reverse["on_chunk"]:
            try:
                await m.on_chunk(ctx)
            except Exception as error:
                self._swallow(m, "on_chunk", error)

    async def on_chat_response(
        self, result: ChatResponseResult, timeline: HookTimeline | None = None
    ) -> None:
        """Last to first; errors are logged and counted; the outcome is unchanged."""
        if self._reverse["on_chat_response"]:
            await self._notify("on_chat_response", result, timeline)

    async def classify_chat_error(
        self,
        error: BaseException | str,
        ctx: ChatErrorContext,
        timeline: HookTimeline | None = None,
    ) -> ChatErrorClassification | None:
        """Last to first; the first non-None classification wins. A raising hook counts as None."""
        for m in self._reverse["classify_chat_error"]:
            started = time.perf_counter()
            failed = False
            result: ChatErrorClassification | None = None
            try:
                result = await m.classify_chat_error(error, ctx)
            except Exception as hook_error:
                failed = True
                self._swallow(m, "classify_chat_error", hook_error)
            if timeline is not None:
                timeline.add(m.name, "classify_chat_error", started, time.perf_counter(), failed)
            if result is not None:
                return result
        return None

    async def on_chat_error(
        self,
        error: BaseException,
        ctx: ChatErrorContext,
        timeline: HookTimeline | None = None,
    ) -> BaseException | str:
        """Last to first; each gets the error the one before returned. A raising hook
        leaves the error as it was. Returns what the client should see."""
        current: BaseException | str = error
        for m in self._reverse["on_chat_error"]:
            started = time.perf_counter()
            failed = False
            try:
                returned = await m.on_chat_error(
                    current if isinstance(current, BaseException) else Exception(current), ctx
                )
                if returned is not None:
                    current = returned
            except Exception as hook_error:
                failed = True
                self._swallow(m, "on_chat_error", hook_error)
            if timeline is not None:
                timeline.add(m.name, "on_chat_error", started, time.perf_counter(), failed)
        return current


def active_tool_names(tools: Mapping[str, Any], active: Sequence[str] | None) -> list[str]:
    """The tool names the model may call: all of ``tools``, limited to ``active`` when given."""
    if active is None:
        return list(tools)
    return [name for name in active if name in tools]
