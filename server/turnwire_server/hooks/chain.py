"""The ordered middleware chain: the onion of docs/semantics.md §4.

Request-path hooks (``configure_session``, ``before_turn``, ``before_step``,
``before_tool_call``) run first to last; response-path hooks
(``after_tool_call``, ``on_chunk``, ``on_step_finish``, ``on_chat_response``,
``classify_chat_error``, ``on_chat_error``) run last to first. The chain is
built once per process; per hook it keeps only the middlewares that implement
it, so an unimplemented hook costs nothing. Each turn works through a
:class:`TurnHooks` view bound to its (optional) :class:`HookTimeline`. The
default classifier (``turnwire.middlewares.ErrorClassifier``) is in every
chain unless the list places one itself (:func:`with_default_classifier`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from turnwire.errors import DomainError, ErrorDetails
from turnwire.hooks import (
    HOOK_NAMES,
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ChunkContext,
    Middleware,
    SessionConfig,
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
from turnwire.middlewares.error_classifier import ErrorClassifier
from turnwire.types import ModelSettings
from turnwire_client.v1 import error_reason_pb2 as reasons
from turnwire_server.hooks import metrics
from turnwire_server.hooks.readonly import MessagesView
from turnwire_server.hooks.timeline import HookTimeline

log = logging.getLogger("turnwire.middleware")

_ADDITIVE = frozenset({"tools", "stop_when"})
_FIELDWISE = frozenset({"model_settings", "timeout"})
_SHALLOW_MERGED = frozenset({"headers", "provider_options"})
# A step's budget only ever lowers (docs/cost.md, "Budgets in hooks"): the lowest set wins.
_LOWEST = frozenset({"max_step_tokens", "max_step_usd"})
# The hooks whose contexts carry budget states (docs/cost.md, "Budgets in hooks").
_BUDGET_HOOKS = ("before_step", "on_step_finish", "on_chat_response")

_Config = TypeVar("_Config", TurnConfig, StepConfig, ModelSettings)
_Ctx = TypeVar("_Ctx", TurnContext, StepContext)
_Update = TypeVar("_Update", TurnConfig, StepConfig)


def session_failure(error: BaseException) -> str:
    """What start-up says of a ``configure_session`` that raised ``error``: a :class:`HookError`'s
    message names the middleware and the hook already (``policy.configure_session failed: …``);
    anything else (the chain's own check of the answer) gets that prefix."""
    return str(error) if isinstance(error, HookError) else f"configure_session failed: {error}"


class HookError(DomainError):
    """A hook raised where the error ends the turn or the call (``before_turn``, ``before_step``,
    ``before_tool_call``, ``configure_session``): ``INTERNAL``, reason ``HOOK_FAILED``.

    ``middleware`` and ``hook`` name where, ``origin`` the middleware's class as
    ``module:Class`` (empty when unknown); ``__cause__`` is the original error. ``text`` is the
    error's message as ``redact`` masked it: a hook's error is text from outside the engine (a
    remote hook server's answer, a library's exception), masked where it enters, as provider and
    tool errors are (docs/security.md, "Secrets"), so the client's message, the stored turn and
    the spans never carry what the redactor knows to be a secret.
    """

    error_reason = reasons.ERROR_REASON_HOOK_FAILED

    def __init__(
        self,
        middleware: str,
        hook: str,
        error: BaseException,
        origin: str = "",
        redact: Callable[[str], str] = str,
    ) -> None:
        self.text = redact(str(error))
        super().__init__(f"{middleware}.{hook} failed: {self.text}")
        self.middleware = middleware
        self.hook = hook
        self.origin = origin
        self.__cause__ = error

    @property
    def client_message(self) -> str:
        """What the client sees: the hook's own message first (masked), then which middleware and
        hook raised it (``oops (RuntimeError in middleware myapp.hooks:Audit, before_turn)``), so
        a user can find the code to fix without the server log. An error of the sidecar's own
        kinds (a :class:`~turnwire.errors.DomainError`, whose message says what happened: a
        remote hook server that gave no answer) names no Python class."""
        error = self.__cause__ or self
        if isinstance(error, DomainError):
            return f"{self.text} (middleware {self.middleware}, {self.hook})"
        where = self.origin or self.middleware
        if self.origin and self.middleware != self.origin.rpartition(":")[2]:
            where = f"{self.middleware} ({self.origin})"
        return f"{self.text} ({type(error).__name__} in middleware {where}, {self.hook})"

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"middleware": self.middleware, "hook": self.hook})


def middleware_origin(middleware: Middleware) -> str:
    """``module:Class`` of ``middleware``, the form a config ``path`` names it by."""
    kind = type(middleware)
    return f"{kind.__module__}:{kind.__qualname__}"


def merge_config(base: _Config, update: _Config) -> _Config:
    """Merge ``update`` over ``base`` field by field (docs/semantics.md §4).

    ``None`` leaves a field as it was; ``tools`` and ``stop_when`` add;
    ``model_settings`` and ``timeout`` merge field by field; ``headers`` and
    ``provider_options`` merge shallowly; ``max_step_tokens`` and ``max_step_usd`` keep the
    lower; anything else replaces.
    """
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(update):
        value: Any = getattr(update, f.name)
        if value is None:
            continue
        previous: Any = getattr(base, f.name)
        if previous is not None:
            if f.name in _ADDITIVE:
                value = {**previous, **value} if f.name == "tools" else (*previous, *value)
            elif f.name in _SHALLOW_MERGED:
                value = {**previous, **value}
            elif f.name in _FIELDWISE:
                value = merge_config(previous, value)
            elif f.name in _LOWEST:
                value = min(previous, value)
        changes[f.name] = value
    return dataclasses.replace(base, **changes) if changes else base


def with_default_classifier(middlewares: Sequence[Middleware]) -> tuple[Middleware, ...]:
    """``middlewares`` with the default ``classify_chat_error`` first, unless they hold an
    :class:`ErrorClassifier` (or a subclass) already: first in the list, it is asked last, so any
    other classifier wins where it answers (turnwire/middlewares/error_classifier.py)."""
    if any(isinstance(m, ErrorClassifier) for m in middlewares):
        return tuple(middlewares)
    return (ErrorClassifier(), *middlewares)


class MiddlewareChain:
    """An ordered list of middlewares and the rules for calling their hooks.

    Errors swallowed by the rules of docs/semantics.md §3 are
    logged with the middleware's name and counted in :attr:`error_counts` by
    ``(middleware, hook)``.
    """

    def __init__(self, middlewares: Sequence[Middleware] = ()) -> None:
        self.middlewares = with_default_classifier(middlewares)
        self.error_counts: Counter[tuple[str, str]] = Counter()
        self._index()
        self._untimed = TurnHooks(self, None)

    def _index(self) -> None:
        """Per hook, the middlewares that implement it (read again after ``configure_session``,
        where a middleware may learn its hooks: a remote hook server's subscriptions)."""
        implemented = [(m, m.implemented_hooks()) for m in self.middlewares]
        self.forward = {hook: tuple(m for m, hooks in implemented if hook in hooks) for hook in HOOK_NAMES}
        self.reverse = {hook: tuple(reversed(ms)) for hook, ms in self.forward.items()}
        #: True when some middleware implements ``on_chunk``; the engine skips
        #: building chunk contexts entirely otherwise.
        self.observes_chunks = bool(self.forward["on_chunk"])
        #: True when some middleware implements a hook whose context carries budget states
        #: (``StepContext``: its own and its steps', ``StepFinishContext``,
        #: ``ChatResponseContext``); the engine builds none otherwise.
        self.sees_budgets = any(self.forward[hook] for hook in _BUDGET_HOOKS)

    def for_turn(
        self,
        timeline: HookTimeline | None = None,
        spans: HookSpans | None = None,
        redact: Callable[[str], str] = str,
    ) -> TurnHooks:
        """The hooks as one turn calls them, recording into ``timeline`` when given, each call in a
        span of ``spans`` when given, a hook's error masked by ``redact`` (:class:`HookError`)."""
        if timeline is None and spans is None and redact is str:
            return self._untimed
        return TurnHooks(self, timeline, spans, redact)

    async def configure_session(self, ctx: SessionContext) -> SessionConfig:
        """Run every ``configure_session`` once, first to last; a later middleware's non-None
        fields replace an earlier one's. Afterwards each middleware's ``implemented_hooks()`` is
        read again (call this before the first turn). Raises :class:`HookError` (a hook raised, or returned
        something other than a SessionConfig or None)."""
        merged = SessionConfig()
        for m in self.forward["configure_session"]:
            try:
                config = await m.configure_session(ctx)
                if config is not None and not isinstance(config, SessionConfig):
                    raise TypeError(f"configure_session returned {type(config).__name__}, not SessionConfig")
            except Exception as error:
                metrics.HOOK_ERRORS.labels(m.name, "configure_session").inc()
                raise HookError(m.name, "configure_session", error, middleware_origin(m)) from error
            if config is not None and config.compaction is not None:
                merged = dataclasses.replace(merged, compaction=config.compaction)
        self._index()
        return merged

    def swallowed(self, middleware: Middleware, hook: str, error: BaseException) -> None:
        """Log and count an error that the rules swallow."""
        self.error_counts[(middleware.name, hook)] += 1
        metrics.HOOK_ERRORS.labels(middleware.name, hook).inc()
        log.warning(
            "middleware %s (%s) %s raised %s: %s",
            middleware.name,
            middleware_origin(middleware),
            hook,
            type(error).__name__,
            error,
            exc_info=error,
            extra={"middleware": middleware.name, "hook": hook},
        )


def _messages_after(view: MessagesView, update: TurnConfig | StepConfig | None) -> Sequence[Any]:
    """The messages after one hook call that saw ``view``: the ones it returned (unchanged copies
    back to their originals), else the viewed ones with its in-place changes (copies) applied."""
    if update is not None and update.messages is not None:
        return view.restore(update.messages)
    return view.settled()


HookSpans = Callable[[str, str], AbstractContextManager[object]]
"""``spans(middleware, hook)``: a context manager around one hook call that records it as a span
(``turnwire_server.engine.tracing.Tracing.hook``); a hook's exception passes through it."""


class TurnHooks:
    """The chain's hooks for one turn: every call timed into the turn's timeline (when kept) and
    traced as a span (when ``spans`` is given; ``on_chunk``, called per chunk, never is)."""

    __slots__ = ("_chain", "_redact", "_spans", "_timeline")

    def __init__(
        self,
        chain: MiddlewareChain,
        timeline: HookTimeline | None,
        spans: HookSpans | None = None,
        redact: Callable[[str], str] = str,
    ) -> None:
        self._chain = chain
        self._timeline = timeline
        self._spans = spans
        self._redact = redact

    @property
    def observes_chunks(self) -> bool:
        """True when some middleware implements ``on_chunk``."""
        return self._chain.observes_chunks

    @property
    def sees_budgets(self) -> bool:
        """True when some middleware implements a hook whose context carries budget states."""
        return self._chain.sees_budgets

    def runs(self, hook: str) -> bool:
        """True when some middleware implements ``hook`` (one of ``HOOK_NAMES``)."""
        return bool(self._chain.forward[hook])

    async def _call(self, m: Middleware, hook: str, ctx: Any, *, swallow: bool) -> Any:
        """Run ``m.<hook>(ctx)``: time it into the timeline, and either raise :class:`HookError`
        or (``swallow``) log, count and return ``None`` when it raises."""
        timeline = self._timeline
        started = time.perf_counter() if timeline is not None else 0.0
        failed = False
        try:
            if self._spans is None or hook == "on_chunk":
                return await self._run(m, hook, ctx)
            with self._spans(m.name, hook):  # its span records the masked HookError
                return await self._run(m, hook, ctx)
        except HookError as wrapped:
            failed = True
            error = wrapped.__cause__ or wrapped
            if not swallow:
                metrics.HOOK_ERRORS.labels(m.name, hook).inc()
                # The traceback goes to the server log only (it passes the log redactor); the
                # client sees HookError.client_message.
                log.warning(
                    "middleware %s (%s) %s raised %s: %s",
                    m.name,
                    wrapped.origin,
                    hook,
                    type(error).__name__,
                    error,
                    exc_info=error,
                    extra={"middleware": m.name, "hook": hook},
                )
                raise
            self._chain.swallowed(m, hook, error)
            return None
        finally:
            if timeline is not None:
                timeline.add(m.name, hook, started, time.perf_counter(), failed)

    async def _run(self, m: Middleware, hook: str, ctx: Any) -> Any:
        """``m.<hook>(ctx)``, its error raised as the :class:`HookError` it is to everything
        outside the hook (its span included), masked by this turn's redactor."""
        try:
            return await getattr(m, hook)(ctx)
        except Exception as error:
            raise HookError(m.name, hook, error, middleware_origin(m), self._redact) from error

    async def before_turn(self, ctx: TurnContext) -> tuple[TurnContext, TurnConfig]:
        """First to last; each sees the earlier changes. Returns the final context and merged config.

        Raises :class:`HookError` when a middleware raises.
        """
        return await self._fold_configs("before_turn", ctx, TurnConfig())

    async def before_step(self, ctx: StepContext) -> StepConfig:
        """First to last; each sees the earlier changes. Raises :class:`HookError`."""
        return (await self._fold_configs("before_step", ctx, StepConfig()))[1]

    async def _fold_configs(self, hook: str, ctx: _Ctx, merged: _Update) -> tuple[_Ctx, _Update]:
        """Run ``hook`` (``before_turn`` or ``before_step``) first to last, each middleware seeing
        the context as the earlier ones left it (model, system, messages and, for a turn, tools);
        returns that context and the configs merged by :func:`merge_config`. Messages returned or
        changed in place (docs/semantics.md §3) replace the ones sent, for this turn or step only.
        """
        for m in self._chain.forward[hook]:
            view = MessagesView(ctx.messages)
            update: Any = await self._call(m, hook, dataclasses.replace(ctx, messages=view), swallow=False)
            messages = _messages_after(view, update)
            if messages is not ctx.messages:  # returned, or changed in place: the model gets these
                merged = dataclasses.replace(merged, messages=messages)
            if update is None:
                if messages is not ctx.messages:
                    ctx = dataclasses.replace(ctx, messages=messages)
                continue
            merged = merge_config(merged, dataclasses.replace(update, messages=None))
            changes: dict[str, Any] = {"messages": messages}
            if update.model is not None:
                changes["model"] = update.model
            if update.system is not None:
                changes["system"] = update.system
            if getattr(update, "tools", None):  # TurnConfig only: tools add up
                changes["tools"] = {**ctx.tools, **update.tools}  # type: ignore[attr-defined]
            ctx = dataclasses.replace(ctx, **changes)
        return ctx, merged

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision:
        """First to last. ``allow(input=…)`` feeds the next middleware; the first block or
        substitute ends the chain. Returns the final decision (``allow`` with the input to run).

        Raises :class:`HookError` when a middleware raises (the engine turns it
        into that call's error result).
        """
        for m in self._chain.forward["before_tool_call"]:
            # Read-only, and nothing to hand changes back to: changed copies are dropped.
            shown = dataclasses.replace(ctx, messages=MessagesView(ctx.messages))
            decision: ToolCallDecision | None = await self._call(m, "before_tool_call", shown, swallow=False)
            if decision is None:
                continue
            if decision.action != "allow":
                return decision
            if decision.input is not None:
                ctx = dataclasses.replace(ctx, input=decision.input)
        return ToolCallDecision.allow(ctx.input)

    async def _notify(self, hook: str, ctx: Any) -> None:
        for m in self._chain.reverse[hook]:
            await self._call(m, hook, ctx, swallow=True)

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """Last to first; errors are logged and counted."""
        if self._chain.reverse["after_tool_call"]:
            await self._notify("after_tool_call", ctx)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """Last to first; errors are logged and counted."""
        if self._chain.reverse["on_step_finish"]:
            await self._notify("on_step_finish", ctx)

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Last to first; errors are logged and counted. Call only when :attr:`observes_chunks`."""
        if self._timeline is not None:
            await self._notify("on_chunk", ctx)
            return
        # Per token: no clock reads and no closures when nobody records a timeline.
        for m in self._chain.reverse["on_chunk"]:
            try:
                await m.on_chunk(ctx)
            except Exception as error:
                self._chain.swallowed(m, "on_chunk", error)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Last to first; errors are logged and counted; the outcome is unchanged."""
        if self._chain.reverse["on_chat_response"]:
            await self._notify("on_chat_response", ctx)

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """Last to first; the first non-None classification wins. A raising hook counts as None."""
        for m in self._chain.reverse["classify_chat_error"]:
            result: ChatErrorClassification | None = await self._call(
                m, "classify_chat_error", ctx, swallow=True
            )
            if result is not None:
                return result
        return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """Last to first; each gets (as ``ctx.error``) the error the one before returned. A raising
        hook leaves the error as it was. Returns what the client should see."""
        current: BaseException | str = ctx.error
        for m in self._chain.reverse["on_chat_error"]:
            error = current if isinstance(current, BaseException) else Exception(current)
            step_ctx = dataclasses.replace(ctx, error=error)
            returned: BaseException | str | None = await self._call(
                m, "on_chat_error", step_ctx, swallow=True
            )
            if returned is not None:
                current = returned
        return current
