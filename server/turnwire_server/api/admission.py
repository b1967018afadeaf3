"""Which calls get to the servicers: the turn limit, malformed requests, and the calls shutdown waits for.

:class:`CallGate` is a ``grpc.aio.ServerInterceptor`` in front of every service.

* **The turn limit.** The turn-running and turn-streaming calls (``Chat``, ``SaveMessages``,
  ``ContinueLastTurn``, ``SubmitToolResults``, ``SubmitToolApprovals``, ``ResumeTurn``,
  ``WatchSubmission``) count against ``limits.max_concurrent_rpcs`` from the
  moment their handler starts until the call ends. Past the limit a call ends at
  once with ``RESOURCE_EXHAUSTED``, ``ErrorInfo`` reason ``OVERLOADED`` and a
  ``RetryInfo``; it never reaches the engine. Nothing else counts: health checks
  and reflection must answer while the server is saturated (a liveness probe
  must not restart a busy, healthy sidecar), and so must the short unary
  ChatService calls (``CancelChat`` most of all: it is how a client sheds load).
  This is the product's limit, not gRPC's: ``grpc.aio.server(maximum_concurrent_rpcs=...)``
  counts every call, health checks included, and refuses without details.
* **Tenant shares** (``tenant_shares:``, authentication on). Within that limit one tenant's
  calls may hold only a share of it: its running turns ``tenant_shares.turn_calls`` of
  ``max_concurrent_rpcs``, and all its counted streams together (the turn-running calls,
  ``ResumeTurn``, ``WatchSubmission``) ``tenant_shares.streams``. Its running turns are its
  turn-running calls plus its turns that run without a caller (disconnect policy CONTINUE
  after the call ended, submissions, recoveries), which the engine reports through
  :meth:`CallGate.hold_turn` (:mod:`turnwire_server.engine.turn_slots`): those are counted
  whatever the share, since they run already, and a tenant at its share has its next
  turn-running call refused. So one tenant's streams or caller-less turns cannot take every
  slot and shut the others out (issue 32 item 5). A call past its tenant's share ends as one
  past the limit (``OVERLOADED``), ErrorInfo metadata ``limit`` naming the share. The tenant
  is the one the access interceptor, which runs first, authenticated
  (:data:`~turnwire_server.api.caller.current_caller`); the anonymous tenant of a server
  without authentication has no share but the limit.
* **Malformed requests.** A request that does not decode as the method's
  request message (of any service: health and reflection too) ends with
  ``INVALID_ARGUMENT``, reason ``INVALID_FIELD`` and a ``BadRequest`` on
  ``(request)`` naming the message type, and one throttled log line
  (:mod:`turnwire_server.api.rpc_logging`), instead of gRPC's ``UNKNOWN`` and
  an ERROR traceback per request. So does a request whose JSON values (``Struct`` fields) nest past
  :data:`~turnwire_server.api.json_depth.MAX_JSON_DEPTH`, naming the field; an HTTP door's call
  whose body the door bounded already is not walked again (:mod:`turnwire_server.api.door_checks`).
* **Draining.** ChatService calls are tracked so that shutdown can wait for
  them, and only them (:meth:`CallGate.wait_idle`): a health ``Watch`` or a
  reflection stream never ends on its own and must not hold shutdown up.

Only asyncio handlers are wrapped (every service of the sidecar is one); a
synchronous handler is passed through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_status import rpc_status

from turnwire_server.access_settings import TenantShareSettings
from turnwire_server.api.caller import current_caller
from turnwire_server.api.door_checks import door_checks
from turnwire_server.api.json_depth import MAX_JSON_DEPTH, too_deep_field
from turnwire_server.api.kept_wrappers import KeptWrappers
from turnwire_server.api.rpc_logging import Throttled, malformed_requests, short
from turnwire_server.api.status import TurnwireStatusError, invalid_argument
from turnwire_server.event_waits import set_within
from turnwire_server.tenant_keys import tenant_of_key

log = logging.getLogger("turnwire.api")

CHAT_SERVICE = "turnwire.v1.ChatService"
TURN_RUNNING_METHODS = frozenset(
    f"/{CHAT_SERVICE}/{name}"
    for name in ("Chat", "SaveMessages", "ContinueLastTurn", "SubmitToolResults", "SubmitToolApprovals")
)
"""The methods that run a turn for their caller."""
FOLLOWING_METHODS = frozenset(f"/{CHAT_SERVICE}/{name}" for name in ("ResumeTurn", "WatchSubmission"))
"""The streams that follow a turn without running one."""
TURN_METHODS = TURN_RUNNING_METHODS | FOLLOWING_METHODS
"""The methods that run or stream a turn: the ones ``limits.max_concurrent_rpcs`` counts (every
ChatService stream)."""

RETRY_AFTER_SECONDS = 1.0
"""The ``RetryInfo`` delay of a call refused for overload."""

Context = Any  # grpc.aio.ServicerContext; grpc is untyped


class CallKind(enum.Enum):
    """How :class:`CallGate` treats a method."""

    TURN = "turn"
    """Runs a turn: counted against the turn limit and both tenant shares, and waited for at shutdown."""
    FOLLOW = "follow"
    """Streams a turn it does not run: counted against the turn limit and the tenant's streams
    share, and waited for at shutdown."""
    TRACKED = "tracked"
    """Not limited; waited for at shutdown (the unary ChatService calls)."""
    FREE = "free"
    """Neither limited nor waited for (health, reflection)."""


def kind_of(method: str) -> CallKind:
    """The :class:`CallKind` of a full method name (``/package.Service/Method``)."""
    if method in TURN_RUNNING_METHODS:
        return CallKind.TURN
    if method in FOLLOWING_METHODS:
        return CallKind.FOLLOW
    if method.startswith(f"/{CHAT_SERVICE}/"):
        return CallKind.TRACKED
    return CallKind.FREE


class _Undecodable:
    """Stands in for a request that failed to decode, so the handler wrapper can refuse it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _MalformedStream(Exception):
    """A message of a request stream failed to decode."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as error:  # whatever the deserializer raises on bad bytes
            return _Undecodable(error)

    return parse


def _too_deep(field: str) -> TurnwireStatusError:
    """INVALID_ARGUMENT for a request whose JSON value ``field`` nests past the limit
    (:mod:`turnwire_server.api.json_depth`): refused before anything runs or is stored."""
    return invalid_argument(
        [
            (
                field,
                f"nests JSON objects and arrays more than {MAX_JSON_DEPTH} levels deep; flatten it "
                f"(at most {MAX_JSON_DEPTH} levels)",
            )
        ]
    )


def _depth_unchecked(context: Context) -> bool:
    """Whether the call's JSON nesting is still to check: always over gRPC and Connect; not for a
    door call whose body the door bounded already (:mod:`turnwire_server.api.door_checks`)."""
    checks = door_checks(context)
    return checks is None or not checks.json_depth


def _request_type(deserializer: Callable[[bytes], Any] | None) -> str:
    message_class = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_class, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return name if isinstance(name, str) else "request"


_COUNTED = (CallKind.TURN, CallKind.FOLLOW)


@dataclass
class _TenantCalls:
    """One tenant's counted calls and caller-less turns running now."""

    turn_calls: int = 0
    streams: int = 0
    unattended_turns: int = 0
    """Its turns running without a caller (:meth:`CallGate.hold_turn`)."""

    @property
    def turns(self) -> int:
        """What counts against ``tenant_shares.turn_calls``: turn calls and caller-less turns."""
        return self.turn_calls + self.unattended_turns

    @property
    def idle(self) -> bool:
        """Nothing of the tenant's is counted."""
        return not (self.streams or self.unattended_turns)


class _Slot:
    """One admitted call's share of the counts; released exactly once."""

    __slots__ = ("_gate", "_kind", "_released", "_tenant")

    def __init__(self, gate: CallGate, kind: CallKind, tenant: str) -> None:
        self._gate = gate
        self._kind = kind
        self._tenant = tenant
        self._released = False

    def release(self, *_ignored: object) -> None:
        if not self._released:
            self._released = True
            self._gate._release(self._kind, self._tenant)


class CallGate(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Admission for the sidecar's calls (see the module docstring).

    ``max_turn_calls`` is ``limits.max_concurrent_rpcs``; ``tenant_shares`` the share of it each
    tenant's calls may hold (None: no tenant limit). The counts live on the server's event loop;
    the gate is not thread-safe and need not be.
    """

    def __init__(
        self,
        max_turn_calls: int,
        *,
        tenant_shares: TenantShareSettings | None = None,
        retry_after_seconds: float = RETRY_AFTER_SECONDS,
    ) -> None:
        if max_turn_calls < 1:
            raise ValueError(f"max_turn_calls must be at least 1, not {max_turn_calls}")
        self.max_turn_calls = max_turn_calls
        self.tenant_shares = tenant_shares
        self.retry_after_seconds = retry_after_seconds
        self.turn_calls = 0
        """Turn calls (running or following a turn) running now."""
        self.tracked_calls = 0
        """ChatService calls running now (turn calls included)."""
        self.open_calls = 0
        """Calls of any service running now."""
        self.tenant_calls: dict[str, _TenantCalls] = {}
        """Each tenant's counted calls running now (a tenant with none has no entry)."""
        self._idle = asyncio.Event()
        self._idle.set()
        self._overload_reports = Throttled(log)
        self._wrappers = KeptWrappers()

    # --- counts ------------------------------------------------------------------------

    def _admit(self, kind: CallKind, tenant: str) -> _Slot | TurnwireStatusError:
        """A slot for a call of ``kind`` by ``tenant``, or the refusal when it is past its
        tenant's share or the limit (the share first: a tenant at its share is told so,
        whatever the others hold)."""
        if kind in _COUNTED:
            refusal = self._past_share(kind, tenant)
            if refusal is None and self.turn_calls >= self.max_turn_calls:
                refusal = self.overloaded()
            if refusal is not None:
                return refusal
            self.turn_calls += 1
            if tenant:
                calls = self.tenant_calls.setdefault(tenant, _TenantCalls())
                calls.streams += 1
                if kind is CallKind.TURN:
                    calls.turn_calls += 1
        if kind is not CallKind.FREE:
            self.tracked_calls += 1
            self._idle.clear()
        self.open_calls += 1
        return _Slot(self, kind, tenant)

    def _past_share(self, kind: CallKind, tenant: str) -> TurnwireStatusError | None:
        """The refusal of one more call of ``kind`` by ``tenant``, None while within its shares."""
        if not tenant or self.tenant_shares is None:
            return None
        max_turn_calls, max_streams = self.tenant_shares.for_tenant(tenant).calls(self.max_turn_calls)
        calls = self.tenant_calls.get(tenant) or _TenantCalls()
        if calls.streams >= max_streams:
            return self._over_share("streams", max_streams)
        if kind is CallKind.TURN and calls.turns >= max_turn_calls:
            return self._over_share("turn_calls", max_turn_calls)
        return None

    def hold_turn(self, conversation_id: str) -> Callable[[], None]:
        """Count a turn of ``conversation_id`` (a store key) that runs without its caller against
        its tenant's ``tenant_shares.turn_calls``, whatever the share (it runs already); the
        returned release uncounts it, once. The tenant is the key's
        (:func:`~turnwire_server.tenant_keys.tenant_of_key`); the default tenant counts nothing.
        Implements :class:`~turnwire_server.engine.turn_slots.TurnSlots`."""
        tenant = tenant_of_key(conversation_id)
        if not tenant or self.tenant_shares is None:
            return _release_nothing
        self.tenant_calls.setdefault(tenant, _TenantCalls()).unattended_turns += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            calls = self.tenant_calls.get(tenant)
            if calls is not None:
                calls.unattended_turns -= 1
                if calls.idle:
                    del self.tenant_calls[tenant]

        return release

    def _release(self, kind: CallKind, tenant: str) -> None:
        self.open_calls -= 1
        if kind in _COUNTED:
            self.turn_calls -= 1
            calls = self.tenant_calls.get(tenant)
            if calls is not None:
                calls.streams -= 1
                if kind is CallKind.TURN:
                    calls.turn_calls -= 1
                if calls.idle:
                    del self.tenant_calls[tenant]
        if kind is not CallKind.FREE:
            self.tracked_calls -= 1
            if self.tracked_calls == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:  # noqa: ASYNC109
        """Wait until no ChatService call runs, for at most ``timeout`` seconds; whether none does."""
        return await set_within(self._idle, timeout)

    # --- refusals ----------------------------------------------------------------------

    def overloaded(self) -> TurnwireStatusError:
        """The error a turn call past the limit ends with."""
        return TurnwireStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"the server is running its limit of {self.max_turn_calls} turn calls "
            f"(limits.max_concurrent_rpcs); retry after {self.retry_after_seconds:g} s",
            reason="OVERLOADED",
            retry_after_seconds=self.retry_after_seconds,
            metadata={"limit": str(self.max_turn_calls)},
        )

    def _over_share(self, share: str, calls: int) -> TurnwireStatusError:
        """The error of a call past its tenant's ``share`` (``turn_calls`` or ``streams``) of
        ``calls`` calls."""
        what = (
            "turns running (calls that run a turn, and turns that run on without their caller)"
            if share == "turn_calls"
            else "streams open"
        )
        return TurnwireStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"your tenant has {calls} {what}, its share of the server "
            f"(tenant_shares.{share}); end one or retry after {self.retry_after_seconds:g} s",
            reason="OVERLOADED",
            retry_after_seconds=self.retry_after_seconds,
            metadata={"limit": f"tenant_shares.{share}", "calls": str(calls)},
        )

    async def _refuse(self, context: Context, method: str, refusal: TurnwireStatusError) -> None:
        self._overload_reports.event("refused a %s call: %s", method, refusal.message)
        await context.abort_with_status(rpc_status.to_status(refusal.to_status()))

    @staticmethod
    async def _refuse_malformed(context: Context, method: str, request_type: str, error: Exception) -> None:
        malformed_requests.event(
            "malformed request: %s from %s is not a valid %s: %s",
            method,
            _peer(context),
            request_type,
            short(error),
        )
        refusal = invalid_argument(
            [
                (
                    "(request)",
                    f"is not a valid {request_type} ({short(error)}); send a serialized message of "
                    "that type (valid UTF-8 in string fields, nesting within protobuf's limit)",
                )
            ]
        )
        await context.abort_with_status(rpc_status.to_status(refusal.to_status()))

    @contextlib.asynccontextmanager
    async def _admitted(self, context: Context, method: str, kind: CallKind) -> AsyncIterator[None]:
        """Hold a slot for the call's handler; refuse the call (abort) when there is none."""
        slot = self._admit(kind, current_caller.get().tenant)
        if isinstance(slot, TurnwireStatusError):
            await self._refuse(context, method, slot)
            raise AssertionError("unreachable: abort raises")
        # The call's end releases the slot even when the handler is never resumed again.
        context.add_done_callback(slot.release)
        try:
            yield
        finally:
            slot.release()

    # --- the interceptor -----------------------------------------------------------------

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        """The method's handler, wrapped (see the module docstring); None for an unknown method."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        return self._wrappers.wrapper(method, handler, lambda inner: self._wrap(inner, method))

    def _wrap(self, handler: Any, method: str) -> Any:
        kind = kind_of(method)
        deserializer = handler.request_deserializer
        request_type = _request_type(deserializer)
        parse = _tolerant(deserializer) if deserializer is not None else None
        serializer = handler.response_serializer

        async def checked(request: Any, context: Context) -> None:
            if isinstance(request, _Undecodable):
                await self._refuse_malformed(context, method, request_type, request.error)
            elif _depth_unchecked(context) and (too_deep := too_deep_field(request)) is not None:
                await context.abort_with_status(rpc_status.to_status(_too_deep(too_deep).to_status()))

        if not handler.request_streaming and not handler.response_streaming:
            unary_unary = handler.unary_unary
            if not inspect.iscoroutinefunction(unary_unary):
                return handler

            async def guarded_unary_unary(request: Any, context: Context) -> Any:
                await checked(request, context)
                async with self._admitted(context, method, kind):
                    return await unary_unary(request, context)

            return grpc.unary_unary_rpc_method_handler(
                guarded_unary_unary, request_deserializer=parse, response_serializer=serializer
            )

        if not handler.request_streaming:
            unary_stream = handler.unary_stream
            if not _is_async_stream(unary_stream):
                return handler

            async def guarded_unary_stream(request: Any, context: Context) -> None:
                await checked(request, context)
                async with self._admitted(context, method, kind):
                    await _respond(unary_stream, request, context)

            return grpc.unary_stream_rpc_method_handler(
                guarded_unary_stream, request_deserializer=parse, response_serializer=serializer
            )

        # Request streams: messages decode as the handler reads them; a bad one is refused there.
        if handler.response_streaming:
            stream_stream = handler.stream_stream
            if not _is_async_stream(stream_stream):
                return handler

            async def guarded_stream_stream(requests: AsyncIterable[Any], context: Context) -> None:
                try:
                    async with self._admitted(context, method, kind):
                        await _respond(stream_stream, _decoded(requests), context)
                except _MalformedStream as bad:
                    await self._refuse_malformed(context, method, request_type, bad.error)

            return grpc.stream_stream_rpc_method_handler(
                guarded_stream_stream, request_deserializer=deserializer, response_serializer=serializer
            )

        stream_unary = handler.stream_unary
        if not inspect.iscoroutinefunction(stream_unary):
            return handler

        async def guarded_stream_unary(requests: AsyncIterable[Any], context: Context) -> Any:
            try:
                async with self._admitted(context, method, kind):
                    return await stream_unary(_decoded(requests), context)
            except _MalformedStream as bad:
                await self._refuse_malformed(context, method, request_type, bad.error)

        return grpc.stream_unary_rpc_method_handler(
            guarded_stream_unary, request_deserializer=deserializer, response_serializer=serializer
        )


def _release_nothing() -> None:
    return None


def _is_async_stream(behavior: Any) -> bool:
    return inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)


async def _respond(behavior: Any, request: Any, context: Context) -> None:
    """Run a response-streaming handler, writing what it yields.

    A handler written as an async generator is driven here (as gRPC would drive
    it) and closed as soon as the call ends, however it ends, so its cleanup
    (cancelling the turn) runs at once rather than whenever it is collected.
    """
    if inspect.iscoroutinefunction(behavior):
        await behavior(request, context)
        return
    async with contextlib.aclosing(behavior(request, context)) as responses:
        async for response in responses:
            await context.write(response)


async def _decoded(requests: AsyncIterable[Any]) -> AsyncIterator[Any]:
    """``requests``, with a message that fails to decode raised as :class:`_MalformedStream`."""
    iterator = aiter(requests)
    while True:
        try:
            request = await anext(iterator)
        except StopAsyncIteration:
            return
        except DecodeError as error:
            raise _MalformedStream(error) from None
        yield request


def _peer(context: Context) -> str:
    try:
        return short(context.peer())
    except Exception:  # the call is already gone
        return "a client"


__all__ = [
    "CHAT_SERVICE",
    "FOLLOWING_METHODS",
    "RETRY_AFTER_SECONDS",
    "TURN_METHODS",
    "TURN_RUNNING_METHODS",
    "CallGate",
    "CallKind",
    "kind_of",
]
