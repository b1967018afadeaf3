"""Who may call what: authentication, tenant scoping and rate limits, as one server interceptor.

:class:`AccessInterceptor` runs before :class:`~turnwire_server.api.admission.CallGate` (so an
unauthenticated or rate-limited call never takes a turn slot). For each call:

1. **Authentication** (``auth.enabled``): the ``authorization`` metadata names a caller
   (:mod:`turnwire_server.api.authentication`), or the call ends ``UNAUTHENTICATED`` before its
   handler runs. Health and reflection stay open unless ``auth.open_health`` /
   ``auth.open_reflection`` are false. The refusal log line (throttled) names the method and the
   reason, never the token. The calls an HTTP door makes for one request verify its token once
   (:mod:`turnwire_server.api.door_checks`).
2. For ChatService calls, the handler runs with :data:`~turnwire_server.api.caller.current_caller`
   set, and
3. **rate limits** (``rate_limits:``): a turn-starting call takes a turn from the principal's
   window, and the token usage its stream reports is charged
   (:mod:`turnwire_server.api.rate_limits`);
4. **tenant scoping**: the request's ids become store keys and everything sent back loses the
   prefix again (:mod:`turnwire_server.api.tenancy`). The servicer's context is wrapped for
   that, so responses written, returned and aborted with all pass through it.

With authentication off and no rate limit set the interceptor is not installed at all.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import Message
from google.rpc import status_pb2
from grpc_health.v1 import health_pb2
from grpc_status import rpc_status

from turnwire_server.api.admission import CHAT_SERVICE
from turnwire_server.api.authentication import Authenticator, AuthError
from turnwire_server.api.caller import ANONYMOUS, Caller, current_caller
from turnwire_server.api.door_checks import door_checks
from turnwire_server.api.rate_limits import RateLimits
from turnwire_server.api.refusal import refusing_handler
from turnwire_server.api.rpc_logging import Throttled
from turnwire_server.api.status import TurnwireStatusError
from turnwire_server.api.tenancy import Tenancy
from turnwire_server.log_context import bind_request

log = logging.getLogger("turnwire.api")

Context = Any  # grpc.aio.ServicerContext; grpc is untyped

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
REFLECTION_SERVICES = frozenset(
    {"grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"}
)

TURN_STARTS = frozenset(
    f"/{CHAT_SERVICE}/{name}"
    for name in (
        "Chat",
        "SaveMessages",
        "ContinueLastTurn",
        "SubmitToolResults",
        "SubmitToolApprovals",
        "SubmitMessages",
    )
)
"""The methods that start a turn: each takes one from the principal's turns-per-minute window."""

_DETAILS_KEY = "grpc-status-details-bin"


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Authentication, rate limits and tenant scoping (see the module docstring).

    ``authenticator`` None: authentication is off and every caller is
    :data:`~turnwire_server.api.caller.ANONYMOUS`. ``rate_limits`` None: no limit is set.
    ``open_services``: the full names of the services that answer without a token.
    """

    def __init__(
        self,
        authenticator: Authenticator | None,
        rate_limits: RateLimits | None,
        *,
        open_services: frozenset[str] = frozenset(),
    ) -> None:
        self.authenticator = authenticator
        self.rate_limits = rate_limits
        self.open_services = open_services
        self._refusals = Throttled(log)

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        """The method's handler, refused or wrapped as the module docstring says."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        service = method.split("/")[1] if method.count("/") == 2 else ""
        caller = ANONYMOUS
        if self.authenticator is not None and service not in self.open_services:
            metadata = handler_call_details.invocation_metadata
            # A door's HTTP request verifies its token once, whatever number of calls it makes.
            checks = door_checks(handler_call_details)
            verified = checks.caller_for(metadata) if checks is not None else None
            if verified is not None:
                caller = verified
            else:
                try:
                    caller = self.authenticator.authenticate(metadata)
                except AuthError as refusal:
                    cause = f"; {refusal.cause} in a check" if refusal.cause else ""
                    self._refusals.event(
                        "refused %s: %s (%s%s)", method, refusal.reason, refusal.message, cause
                    )
                    return refusing_handler(handler, rpc_status.to_status(refusal.to_status()))
                if checks is not None:
                    checks.verified(metadata, caller)
        if service != CHAT_SERVICE:
            return handler
        return self._wrap(handler, method, caller)

    def _wrap(self, handler: Any, method: str, caller: Caller) -> Any:
        tenancy = Tenancy(caller.tenant) if caller.tenant else None
        limits = self.rate_limits
        starts_turn = limits is not None and method in TURN_STARTS

        async def enter(request: Any, context: Context) -> _CallerContext:
            if starts_turn:
                assert limits is not None
                try:
                    await limits.admit_turn(caller)
                except TurnwireStatusError as refusal:
                    self._refusals.event("refused %s of %r: %s", method, caller.principal, refusal.message)
                    await context.abort_with_status(rpc_status.to_status(refusal.to_status()))
            if tenancy is not None and isinstance(request, Message):  # else the gate refuses it
                tenancy.scope_request(request)
                # The call's lines name its ids as its turn's do: two tenants' "c1" are two keys.
                bind_request(request)
            # Only the call that started a turn charges its tokens: a replay (ResumeTurn,
            # WatchSubmission) would charge the same steps again.
            return _CallerContext(context, caller, tenancy, limits if starts_turn else None)

        if not handler.response_streaming:
            inner_unary = handler.unary_unary

            async def unary_unary(request: Any, context: Context) -> Any:
                reset = current_caller.set(caller)
                try:
                    wrapped = await enter(request, context)
                    response = await inner_unary(request, wrapped)
                    if tenancy is not None and isinstance(response, Message):
                        tenancy.unscope(response)
                    return response
                finally:
                    current_caller.reset(reset)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )

        inner_stream = handler.unary_stream

        async def unary_stream(request: Any, context: Context) -> None:
            reset = current_caller.set(caller)
            try:
                wrapped = await enter(request, context)
                if inspect.iscoroutinefunction(inner_stream):
                    await inner_stream(request, wrapped)
                    return
                async for response in inner_stream(request, wrapped):
                    await wrapped.write(response)
            finally:
                current_caller.reset(reset)

        return grpc.unary_stream_rpc_method_handler(
            unary_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class _CallerContext:
    """The servicer context of one ChatService call, unscoping what goes back (responses written,
    statuses aborted with) and charging the token usage its events report."""

    def __init__(self, context: Context, caller: Caller, tenancy: Tenancy | None, limits: RateLimits | None):
        self._context = context
        self._caller = caller
        self._tenancy = tenancy
        self._limits = limits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def write(self, message: Any) -> None:
        """Send one response (unscoped), charging the tokens of each ``StepFinish`` it holds (its
        ``event`` and, in an event batch, its ``more_events``)."""
        if self._limits is not None:
            event = getattr(message, "event", None)
            if event is not None:
                for one in (event, *message.more_events):
                    if one.HasField("step_finish"):
                        await self._limits.charge_tokens(self._caller, one.step_finish.usage.total_tokens)
        if self._tenancy is not None:
            self._tenancy.unscope(message)
        await self._context.write(message)

    async def abort_with_status(self, status: grpc.Status) -> None:
        """End the call with ``status``, its message and google.rpc details unscoped."""
        await self._context.abort_with_status(self._unscoped(status))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        """End the call with ``code`` and ``details`` (unscoped)."""
        if self._tenancy is not None:
            details = self._tenancy.unscope_text(details)
        await self._context.abort(code, details, trailing_metadata)

    def _unscoped(self, status: grpc.Status) -> grpc.Status:
        if self._tenancy is None:
            return status
        for key, value in status.trailing_metadata or ():
            if key == _DETAILS_KEY:
                proto = status_pb2.Status.FromString(value)
                self._tenancy.unscope_status(proto)
                return rpc_status.to_status(proto)
        return status
