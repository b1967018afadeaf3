"""RemoteMiddleware: a hook server (``turnwire.v1.TurnHooksService``) as one entry of the chain.

docs/semantics.md §4 (remote middleware). At ``configure_session`` it asks the server's
``GetHookSubscriptions`` and from then on implements only the hooks subscribed there
(:meth:`RemoteMiddleware.implemented_hooks`), so an unsubscribed hook costs nothing. Each hook
call converts the context to a request snapshot (:mod:`.convert`), carries the metadata
``turnwire-parent-request-id: <request id>`` (a hook calling back into the sidecar meets the
nesting rule, §5) and a deadline: ``deadline_seconds`` in all from when the turn asked for it,
on whatever path it takes (a unary RPC, a ``HookSession`` message and its wait behind earlier
ones, the unary resend of a message the stream gave up, which gets what remains and fails at
once when nothing does); the turn's end (``on_chat_response``: the ``OnChunks`` close, then
``OnChatResponse``) waits one deadline in all (§4, "Deadlines"). A failed call (an RPC error,
the deadline, an answer that cannot be used, or the open breaker) gets its hook's failure mode,
counted once in the metrics and the breaker:

* fail-open (every observing hook, and deciding hooks configured ``open``): logged on the
  ``turnwire.middleware`` logger, counted in the metrics, and the hook behaves as if it answered
  None (``on_chat_error``: the error stays as it was);
* fail-closed: ``before_tool_call`` blocks the call with a reason naming the unavailable policy
  hook; ``before_turn`` / ``before_step`` raise :class:`RemoteHookUnavailable`, so the turn fails
  at stage ``turn`` / ``step`` (``INTERNAL``, reason ``HOOK_FAILED``).

One :class:`~.breaker.CircuitBreaker` per server: while it is open no RPC is made. ``on_chunk``
is fed to one ``OnChunks`` call per turn in batches (:mod:`.chunks`), closed before the turn's
``OnChatResponse``, or, for a server that also sets ``hook_session_chunks``, as batches on the
turn's ``HookSession`` (:mod:`.session_chunks`), in order with its other calls. A server that
offers ``hook_session`` gets a turn's other calls as messages on one ``HookSession`` stream
(:mod:`.session`), opened by the turn's first call: the deciding
hooks and ``OnChatResponse`` wait for their answers, ``AfterToolCall`` and ``OnStepFinish`` do
not (their answers are read as they come; the server answers in order, so a later awaited call
is answered after them). A broken stream turns the rest of the turn's calls into unary RPCs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import grpc
from opentelemetry import propagate, trace

from turnwire.errors import CanonicalCode, DomainError
from turnwire.hooks import (
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
from turnwire_client.metadata import PARENT_REQUEST_METADATA
from turnwire_client.v1 import error_reason_pb2, hooks_pb2, hooks_pb2_grpc
from turnwire_server.remote_hooks import convert, metrics
from turnwire_server.remote_hooks.breaker import BreakerState, CircuitBreaker
from turnwire_server.remote_hooks.calls import HookCallFailed, HookCalls, ResendUnary, read_nothing
from turnwire_server.remote_hooks.channel import channel_for
from turnwire_server.remote_hooks.chunk_calls import ChunkCalls
from turnwire_server.remote_hooks.chunks import ChunkStream, chunk_event
from turnwire_server.remote_hooks.session import HookSession, TurnSessions
from turnwire_server.remote_hooks.session_chunks import SessionChunks
from turnwire_server.remote_hooks.settings import DECIDING_HOOKS, RemoteHookSettings

log = logging.getLogger("turnwire.middleware")

_T = TypeVar("_T")

HOOKS_BY_ENUM = {
    hooks_pb2.HOOK_BEFORE_TURN: "before_turn",
    hooks_pb2.HOOK_BEFORE_STEP: "before_step",
    hooks_pb2.HOOK_BEFORE_TOOL_CALL: "before_tool_call",
    hooks_pb2.HOOK_AFTER_TOOL_CALL: "after_tool_call",
    hooks_pb2.HOOK_ON_STEP_FINISH: "on_step_finish",
    hooks_pb2.HOOK_ON_CHUNKS: "on_chunk",
    hooks_pb2.HOOK_ON_CHAT_RESPONSE: "on_chat_response",
    hooks_pb2.HOOK_CLASSIFY_CHAT_ERROR: "classify_chat_error",
    hooks_pb2.HOOK_ON_CHAT_ERROR: "on_chat_error",
}
"""The ``Hook`` enum of GetHookSubscriptions → the chain's hook name (``OnChunks`` feeds ``on_chunk``)."""

END_HOOKS = frozenset({"on_chat_response", "on_chat_error"})
"""The turn's end hooks: observed, the turn's ``TurnEnd`` does not wait for them."""

OBSERVABLE_HOOKS = END_HOOKS.union(DECIDING_HOOKS)
"""The hooks a server may say it only observes (``GetHookSubscriptionsResponse.observed_hooks``):
the deciding ones (their answers ignored, not waited for) and the turn's end hooks."""

_NO_ANSWER = frozenset({"unavailable", "deadline_exceeded", "breaker_open"})
"""Failure kinds where no answer came (the server unreachable, too slow, its breaker open): a
closed ``before_tool_call`` says its hook "was unavailable"; any other kind (an error status, an
unusable answer) says it "failed", so the reader looks at the hook, not the network."""

MAX_TRACKED_TURNS = 10_000
"""Turns whose ``TurnInfo`` (body, continuation, attempt) is kept between ``before_turn`` and
``on_chat_response``; past it the oldest is forgotten (a turn that never reached
``on_chat_response``), and its later requests carry only the ids."""


class RemoteHookUnavailable(DomainError):
    """A fail-closed ``before_turn`` / ``before_step`` could not get an answer: the turn fails
    (the hook chain reports it as the :class:`~turnwire_server.hooks.chain.HookError` it causes)."""

    error_reason = error_reason_pb2.ERROR_REASON_HOOK_FAILED
    status_code = CanonicalCode.UNAVAILABLE
    retryable = True


class RemoteMiddleware(ChunkCalls, HookCalls, Middleware):
    """One remote hook server in the chain (see the module docstring).

    ``settings`` is the config entry's ``remote`` section. :attr:`subscribed` is the set of
    hooks the server asked for (empty until ``configure_session``); :attr:`breaker` the server's
    circuit breaker (``clock``: its monotonic clock in seconds, replaceable in tests). Call
    :meth:`aclose` when the sidecar stops.
    """

    def __init__(self, settings: RemoteHookSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.name = settings.name or f"remote:{settings.address}"
        self.settings = settings
        self.server = settings.address
        self.subscribed: frozenset[str] = frozenset()
        self.include_messages = False
        self.breaker = CircuitBreaker(
            settings.breaker.failure_threshold,
            settings.breaker.open_seconds,
            on_change=self._breaker_changed,
            clock=clock,
        )
        metrics.BREAKER_STATE.labels(self.server).set(0)
        self._implemented: frozenset[str] = frozenset({"configure_session"})
        self._background: set[asyncio.Task[Any]] = set()
        self._channel: grpc.aio.Channel | None = None
        self._stub: hooks_pb2_grpc.TurnHooksServiceStub | None = None
        self._turns: OrderedDict[str, hooks_pb2.TurnInfo] = OrderedDict()
        self._streams: OrderedDict[str, ChunkStream | SessionChunks | None] = OrderedDict()
        self.hook_session = False
        self.session_chunks = False  # the turn's chunk batches go on its HookSession
        self.observed: frozenset[str] = frozenset()  # deciding hooks the server only observes
        self._sessions = TurnSessions(settings.deadline_seconds, self._background, self.server)
        self._bound: dict[str, tuple[Any, Any]] = {}  # hook → its calls counter and duration histogram

    def implemented_hooks(self) -> frozenset[str]:
        """``configure_session``, then the subscribed hooks, plus ``before_turn`` and
        ``on_chat_response`` when other turn hooks are subscribed: they keep each turn's
        ``TurnInfo`` and close its ``OnChunks`` call (local calls, no RPC unless subscribed)."""
        return self._implemented

    # --- session ----------------------------------------------------------------------------

    async def configure_session(self, ctx: SessionContext) -> SessionConfig | None:
        """Connect and ask ``GetHookSubscriptions``, waiting up to ``startup_timeout_seconds`` for
        a server that is still starting (not the per-call deadline: a deadline short enough for a
        hook on the way to the first token is too short for a connection's first round trip on a
        busy host). Raises ``RuntimeError`` when it cannot be asked and the entry lists no
        ``hooks`` to fall back on."""
        self._channel = channel_for(self.settings)
        self._stub = hooks_pb2_grpc.TurnHooksServiceStub(self._channel)
        try:
            subscriptions = await self._stub.GetHookSubscriptions(
                hooks_pb2.GetHookSubscriptionsRequest(),
                timeout=self.settings.startup_timeout_seconds,
                wait_for_ready=True,
            )
        except grpc.aio.AioRpcError as error:
            if self.settings.hooks is None:
                raise RuntimeError(
                    f"cannot ask the hook server at {self.server} for its subscriptions "
                    f"({error.code().name}: {error.details()}); start it first, or list its hooks "
                    "under the entry's hooks: to start without it"
                ) from None
            log.warning(
                "hook server %s unreachable at start (%s); calling the configured hooks %s",
                self.server,
                error.code().name,
                ", ".join(self.settings.hooks),
            )
            self._subscribe(frozenset(self.settings.hooks), include_messages=False)
            return None
        self._subscribe(self._hooks_of(subscriptions), include_messages=subscriptions.include_messages)
        self._call_options(subscriptions)
        return None

    def _call_options(self, subscriptions: hooks_pb2.GetHookSubscriptionsResponse) -> None:
        """How the server's subscriptions say to call it: the ``HookSession`` options, and the
        hooks it only observes (``observed_hooks``: posted, never waited for)."""
        self.hook_session = subscriptions.hook_session and self.settings.hook_session
        self.session_chunks = self.hook_session and subscriptions.hook_session_chunks
        self._sessions.reuse = subscriptions.reuse_hook_session
        observed = (
            {HOOKS_BY_ENUM.get(value) for value in subscriptions.observed_hooks}
            & OBSERVABLE_HOOKS
            & self.subscribed
        )
        self.observed = frozenset(hook for hook in observed if hook is not None)
        path = "a unary RPC per call"
        if self.hook_session:
            path = "a HookSession per turn"
            if self._sessions.reuse:
                path = "HookSession streams kept from turn to turn"
            path += ", chunk batches on them" if self.session_chunks else ""
        observing = ", ".join(sorted(self.observed))
        log.info(
            "hook server %s: %s%s", self.server, path, f"; only observes {observing}" if observing else ""
        )
        for hook in sorted(self.observed.intersection(DECIDING_HOOKS)):
            if self.settings.failure_mode.of(hook) == "closed":
                log.warning(
                    "hook server %s only observes %s: its failure mode is open, not the configured closed",
                    self.server,
                    hook,
                )

    def _hooks_of(self, response: hooks_pb2.GetHookSubscriptionsResponse) -> frozenset[str]:
        hooks = set()
        for value in response.hooks:
            name = HOOKS_BY_ENUM.get(value)
            if name is None:
                log.warning("hook server %s subscribed to unknown hook %d; ignored", self.server, value)
            else:
                hooks.add(name)
        return frozenset(hooks)

    def _subscribe(self, hooks: frozenset[str], *, include_messages: bool) -> None:
        self.subscribed = hooks
        configured = self.settings.include_messages
        self.include_messages = include_messages if configured is None else configured
        bookkeeping = {"before_turn", "on_chat_response"} if hooks - {"before_turn"} else set()
        if "on_chunk" in hooks:
            bookkeeping.add("on_step_finish")  # ends the turn's OnChunks call after its last step
        self._implemented = frozenset({"configure_session", *hooks, *bookkeeping})
        log.info(
            "hook server %s: calling %s%s",
            self.server,
            ", ".join(sorted(hooks)) or "no hooks",
            " (with messages)" if self.include_messages else "",
        )

    async def _resubscribe(self) -> None:
        """After the breaker closed again: ask the subscriptions again (the server may have been
        replaced). Hooks it dropped stop being called; new ones need a restart (the chain's
        tables are built at start)."""
        if self._stub is None:
            return
        try:
            response = await self._stub.GetHookSubscriptions(
                hooks_pb2.GetHookSubscriptionsRequest(),
                timeout=self.settings.deadline_seconds,
                metadata=(),
            )
        except grpc.aio.AioRpcError as error:
            log.warning(
                "hook server %s: asking its subscriptions again failed: %s", self.server, error.code().name
            )
            return
        hooks = self._hooks_of(response)
        added = hooks - self.subscribed - self._implemented
        if added:
            log.warning(
                "hook server %s now subscribes to %s; restart the sidecar to call them",
                self.server,
                ", ".join(sorted(added)),
            )
        self.subscribed = hooks & self._implemented
        self._call_options(response)
        configured = self.settings.include_messages
        self.include_messages = response.include_messages if configured is None else configured

    async def aclose(self) -> None:
        """Close the open ``OnChunks`` and ``HookSession`` calls and the channel, once the
        streams of ended turns whose end hooks the server observes took their answers (each
        within its deadline)."""
        try:
            await self._sessions.finish_ended()
        finally:
            # Every stream ended before the next wait: a cancel during the waits leaves none open.
            closing = [s.close() for s in self._streams.values() if s is not None]
            self._streams.clear()
            self._sessions.break_all()
        await asyncio.gather(*closing)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    # --- calls ------------------------------------------------------------------------------

    def _breaker_changed(self, old: BreakerState, new: BreakerState) -> None:
        metrics.BREAKER_STATE.labels(self.server).set(metrics.BREAKER_VALUES[new])
        if new == "open":
            log.warning(
                "hook server %s: circuit breaker open for %g s after %d failure(s); its hooks get "
                "their failure mode without a call",
                self.server,
                self.breaker.open_seconds,
                self.breaker.failures,
            )
        elif new == "closed":
            log.info("hook server %s: circuit breaker closed, the server answers again", self.server)
            task = asyncio.get_running_loop().create_task(self._resubscribe())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def _metadata(self, request_id: str) -> tuple[tuple[str, str], ...]:
        """The call's metadata: the turn's request id, and the current span's W3C trace context
        (the hook's span when tracing is on), so the hook server's spans join the turn's trace."""
        carrier = _trace_context()
        return ((PARENT_REQUEST_METADATA, request_id), *carrier.items())

    def _open_session(self, request_id: str) -> HookSession:
        assert self._channel is not None, "configure_session was not run"
        return HookSession(self._channel, self._metadata(request_id), request_id)

    def _trace_context(self) -> Mapping[str, str]:
        return _trace_context()

    def _metrics(self, hook: str) -> tuple[Any, Any]:
        bound = self._bound.get(hook)
        if bound is None:  # labels() looks up a lock and a dict per call: bound once per hook
            bound = self._bound[hook] = (
                metrics.CALLS.labels(self.server, hook),
                metrics.CALL_DURATION.labels(self.server, hook),
            )
        return bound

    async def _call(
        self,
        hook: str,
        rpc: str,
        request: Any,
        request_id: str,
        read: Callable[[Any], _T],
        *,
        post: bool = False,
        deadline: float | None = None,
    ) -> _T:
        """Send ``request`` with ``rpc`` and return ``read(response)``. Raises :class:`HookCallFailed`
        (counted, and fed to the breaker, once per call) for an open breaker, an RPC error, the
        deadline, an answer that does not decode or cannot be used, or any other error of the
        call. ``deadline`` (a ``time.monotonic()`` value; default ``deadline_seconds`` from now)
        bounds the call on whatever path it takes, the time it waits behind earlier calls of its
        ``HookSession`` included (docs/semantics.md §4, "Deadlines"). ``post`` (an observing
        hook): on a ``HookSession`` return None at once; the answer is accounted for when it
        comes."""
        if deadline is None:
            deadline = time.monotonic() + self.settings.deadline_seconds
        if not self.breaker.allow():
            metrics.ERRORS.labels(self.server, hook, "breaker_open").inc()
            raise HookCallFailed("breaker_open", f"the circuit breaker of {self.server} is open")
        assert self._stub is not None, "configure_session was not run"
        self._metrics(hook)[0].inc()
        started = time.perf_counter()
        session = (
            self._sessions.get(request_id, hook, self._open_session, posted=post)
            if self.hook_session
            else None
        )
        if session is not None:
            if self._streams:
                chunks = self._streams.get(request_id)
                if type(chunks) is SessionChunks and chunks.buffered:
                    chunks.flush()  # the events before the call, in the turn's order
            try:
                return await self._session_call(
                    session, hook, rpc, request,
                    request_id=request_id, read=read, post=post, started=started, deadline=deadline,
                )  # fmt: skip
            except ResendUnary:
                # An earlier call's deadline passed before the server took this one (it answers in
                # order): this call as the unary RPC, with what remains of its own deadline.
                pass
        return await self._unary(hook, rpc, request, request_id, read, started=started, deadline=deadline)

    def _failed_open(self, hook: str, failure: HookCallFailed, *, mode: str = "open") -> None:
        # While the breaker is open every turn would log the same thing: the open is logged once.
        level = logging.DEBUG if failure.kind == "breaker_open" else logging.WARNING
        log.log(
            level,
            "middleware %s.%s failed %s: %s",
            self.name,
            hook,
            mode,
            failure,
            extra={"middleware": self.name, "hook": hook, "kind": failure.kind, "mode": mode},
        )

    def _info(self, conversation_id: str, request_id: str) -> hooks_pb2.TurnInfo:
        info = self._turns.get(request_id)
        return info if info is not None else convert.turn_info(conversation_id, request_id)

    def _failure(self, ctx: ChatErrorContext) -> hooks_pb2.ChatErrorInfo:
        return convert.chat_error_info(ctx, self._info(ctx.conversation_id, ctx.request_id))

    def _unavailable(self, hook: str, failure: HookCallFailed) -> RemoteHookUnavailable:
        return RemoteHookUnavailable(
            # The hook chain's HookError names the middleware (remote:<address>, or its name).
            f"the hook server gave no usable {hook} answer ({failure}); its failure mode is closed"
        )

    # --- deciding hooks ---------------------------------------------------------------------

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Keep the turn's ``TurnInfo``; ``BeforeTurn`` when subscribed (posted and its answer
        ignored when the server only observes it). Raises :class:`RemoteHookUnavailable` when it
        fails closed."""
        info = convert.turn_info_of(ctx)
        self._turns[ctx.request_id] = info
        self._turns.move_to_end(ctx.request_id)
        while len(self._turns) > MAX_TRACKED_TURNS:
            self._turns.popitem(last=False)
        if "before_turn" not in self.subscribed:
            return None
        request = convert.before_turn_request(ctx, info, include_messages=self.include_messages)
        if "before_turn" in self.observed:
            await self._observe("before_turn", "BeforeTurn", request, ctx.request_id, post=True)
            return None
        return await self._configure(
            "before_turn", "BeforeTurn", request, ctx.request_id, convert.turn_config
        )

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """``BeforeStep`` (posted and its answer ignored when the server only observes it). Raises
        :class:`RemoteHookUnavailable` when it fails closed."""
        if "before_step" not in self.subscribed:
            return None
        request = convert.before_step_request(
            ctx, self._info(ctx.conversation_id, ctx.request_id), include_messages=self.include_messages
        )
        if "before_step" in self.observed:
            await self._observe("before_step", "BeforeStep", request, ctx.request_id, post=True)
            return None
        return await self._configure(
            "before_step", "BeforeStep", request, ctx.request_id, convert.step_config
        )

    async def _configure(
        self, hook: str, rpc: str, request: Any, request_id: str, read: Callable[[Any], _T | None]
    ) -> _T | None:
        """A ``before_turn`` / ``before_step`` call: its config, None when it fails open;
        raises :class:`RemoteHookUnavailable` when it fails closed."""
        try:
            return await self._call(hook, rpc, request, request_id, read)
        except HookCallFailed as failure:
            if self.settings.failure_mode.of(hook) == "closed":
                raise self._unavailable(hook, failure) from None
            self._failed_open(hook, failure)
            return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """``BeforeToolCall`` (posted and its answer ignored when the server only observes it);
        failing closed blocks the call, saying whether the policy hook was
        unavailable (unreachable, past its deadline, its breaker open) or failed (it answered an
        error or something unusable): docs/semantics.md §4, "Remote middleware"."""
        if "before_tool_call" not in self.subscribed:
            return None
        request = convert.before_tool_call_request(ctx, self._info(ctx.conversation_id, ctx.request_id))
        if "before_tool_call" in self.observed:
            await self._observe("before_tool_call", "BeforeToolCall", request, ctx.request_id, post=True)
            return None
        try:
            return await self._call(
                "before_tool_call", "BeforeToolCall", request, ctx.request_id, convert.tool_call_decision
            )
        except HookCallFailed as failure:
            if self.settings.failure_mode.of("before_tool_call") == "closed":
                self._failed_open("before_tool_call", failure, mode="closed (the call is blocked)")
                what = "was unavailable" if failure.kind in _NO_ANSWER else "failed"
                return ToolCallDecision.block(
                    f'Tool "{ctx.tool_name}" was blocked: its policy hook ({self.name}) {what}.'
                )
            self._failed_open("before_tool_call", failure)
            return None

    # --- observing hooks (always fail open) -------------------------------------------------

    async def _observe(
        self,
        hook: str,
        rpc: str,
        request: Any,
        request_id: str,
        *,
        post: bool = False,
        deadline: float | None = None,
    ) -> None:
        try:
            await self._call(hook, rpc, request, request_id, read_nothing, post=post, deadline=deadline)
        except HookCallFailed as failure:
            self._failed_open(hook, failure)

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """``AfterToolCall``."""
        if "after_tool_call" in self.subscribed:
            info = self._info(ctx.conversation_id, ctx.request_id)
            request = convert.after_tool_call_request(ctx, info)
            await self._observe("after_tool_call", "AfterToolCall", request, ctx.request_id, post=True)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """``OnStepFinish``; after the turn's last step, the end of its ``OnChunks`` call is sent
        at once (nothing more streams), so its close overlaps the turn's final write instead of
        adding to ``on_chat_response``'s wait."""
        if ctx.last_step and self._streams:
            stream = self._streams.get(ctx.request_id)
            if stream is not None:
                stream.end()
        if "on_step_finish" in self.subscribed:
            info = self._info(ctx.conversation_id, ctx.request_id)
            request = convert.step_finish_request(ctx, info)
            await self._observe("on_step_finish", "OnStepFinish", request, ctx.request_id, post=True)

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Queue the chunk on the turn's ``OnChunks`` call (opened on the turn's first chunk;
        never an RPC per chunk, never waits)."""
        if "on_chunk" not in self.subscribed:
            return
        request_id = ctx.request_id
        if request_id in self._streams:
            stream = self._streams[request_id]
            if stream is not None and stream.ended:
                # Ended at the turn's last step, yet the turn streams again (an attempt recovered
                # after it, §5 stall recovery): the rest goes on a new call.
                self._close_in_background(stream)
                stream = self._open_chunks(ctx.conversation_id, request_id)
        else:
            stream = self._open_chunks(ctx.conversation_id, request_id)
        if stream is None:
            metrics.CHUNK_EVENTS.labels(self.server, "dropped").inc()
            return
        event = chunk_event(ctx.chunk)
        if event is not None:
            stream.add(ctx.step_number, event)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Close the turn's ``OnChunks`` call (so every chunk batch is sent first), then
        ``OnChatResponse`` when subscribed, then end the turn's ``HookSession`` (its posted calls
        answered); forget the turn. All of it within one ``deadline_seconds`` from now: the
        turn's ``TurnEnd`` waits for it (docs/semantics.md §2 finish, §4 "Deadlines"), so what
        the ``OnChunks`` close takes is not left to ``OnChatResponse``, which fails at once
        (``deadline_exceeded``, no RPC) when nothing is left. A server that observes
        ``on_chat_response`` (§4 "Observed hooks") has it sent and its stream ended without the
        turn waiting for the answers."""
        deadline = time.monotonic() + self.settings.deadline_seconds
        if self._streams:
            stream = self._streams.pop(ctx.request_id, None)
            if stream is not None:
                await stream.close()  # its answer waited for deadline_seconds at most
        info = self._turns.pop(ctx.request_id, None) or convert.turn_info(
            ctx.conversation_id, ctx.request_id, continuation=ctx.continuation
        )
        observed = "on_chat_response" in self.observed
        if "on_chat_response" in self.subscribed:
            request = convert.chat_response_request(ctx, info)
            await self._observe(
                "on_chat_response",
                "OnChatResponse",
                request,
                ctx.request_id,
                post=observed,
                deadline=deadline,
            )
        await self._end_session(ctx.request_id, deadline, later=observed)

    async def _end_session(self, request_id: str, deadline: float, *, later: bool) -> None:
        """End the turn's ``HookSession`` after its end hook, the answers still due waited for
        until ``deadline`` (``time.monotonic()``): by the turn, or (``later``: the end hook is
        observed) in the background."""
        if later:
            self._sessions.close_later(request_id, deadline=deadline, after=asyncio.current_task())
        else:
            await self._sessions.close(request_id, wait_seconds=deadline - time.monotonic())

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """``ClassifyChatError``; a failure counts as no classification."""
        if "classify_chat_error" not in self.subscribed:
            return None
        request = hooks_pb2.ClassifyChatErrorRequest(failure=self._failure(ctx))
        try:
            return await self._call(
                "classify_chat_error", "ClassifyChatError", request, ctx.request_id, convert.classification
            )
        except HookCallFailed as failure:
            self._failed_open("classify_chat_error", failure)
            return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """``OnChatError``: the error the client sees; a failure leaves it as it was. Ends the
        turn's ``HookSession`` unless a subscribed ``on_chat_response`` follows
        (``ctx.response_follows``: it comes on the same stream, in order, and ends it). A server that observes
        ``on_chat_error`` has it sent, its answer ignored and its stream ended without the turn
        waiting (docs/semantics.md §4 "Observed hooks")."""
        if "on_chat_error" not in self.subscribed:
            return ctx.error
        deadline = time.monotonic() + self.settings.deadline_seconds  # the call and the stream's end
        chunks = self._streams.get(ctx.request_id) if self._streams else None
        if type(chunks) is SessionChunks:
            chunks.end()  # the turn's last batch before the call that ends its stream
        request = hooks_pb2.OnChatErrorRequest(failure=self._failure(ctx))
        observed = "on_chat_error" in self.observed
        try:
            if observed:
                await self._observe(
                    "on_chat_error", "OnChatError", request, ctx.request_id, post=True, deadline=deadline
                )
                return ctx.error
            return await self._call(
                "on_chat_error",
                "OnChatError",
                request,
                ctx.request_id,
                lambda response: convert.surfaced_error(response, ctx.error),
                deadline=deadline,
            )
        except HookCallFailed as failure:
            self._failed_open("on_chat_error", failure)
            return ctx.error
        finally:
            # An OnChatResponse that follows goes on the stream after this call and ends it.
            if not (ctx.response_follows and "on_chat_response" in self.subscribed):
                await self._end_session(ctx.request_id, deadline, later=observed)


_NO_TRACE: dict[str, str] = {}


def _trace_context() -> dict[str, str]:
    """The current span's W3C trace context, or an empty dict (shared: not to be changed) when
    no span records, so an untraced call builds nothing."""
    if not trace.get_current_span().get_span_context().is_valid:
        return _NO_TRACE
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier
