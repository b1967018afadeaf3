"""Calling a gRPC method in process, through the gRPC server's own interceptors and servicers.

Every door of the HTTP listener (Connect and gRPC-Web here; the doors of issue 36 next) reaches
the RPCs through :class:`InProcessCalls`, never a second implementation: the handlers are the
ones the generated ``add_*_to_server`` functions register on the gRPC server (captured by
:class:`MethodTable`), and each call runs the same interceptor instances in the same order
(:class:`~turnwire_server.api.rpc_observer.RpcObserver`, then
:class:`~turnwire_server.api.access.AccessInterceptor`, then
:class:`~turnwire_server.api.admission.CallGate`). So a call over HTTP is authenticated from its
``authorization`` header, tenant-scoped, rate limited, counted in the gate's slots and the
tenants' shares, counted in the ``grpc_server_*`` metrics, logged and traced exactly as one over
gRPC (docs/http.md#one-service-two-listeners).

The servicer's context is :class:`HttpCallContext`, the part of ``grpc.aio.ServicerContext``
the servicer and the interceptors use: metadata (the HTTP request headers, lowercased; ``-bin``
values base64-decoded, as gRPC does; never ``cookie``), the peer, the deadline, ``abort``
(which raises :class:`CallEnded`, a ``grpc.aio.AbortError``), the status code, done callbacks and
``write`` for response streams. A response stream's writes go through a small bounded queue, so a
reader that stops reading stops the handler's writes (back-pressure, as gRPC's flow control
does); a reader that leaves (the HTTP client disconnected, the deadline passed) cancels the
handler, which then sees ``asyncio.CancelledError`` as it would over gRPC.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from turnwire_client.metadata import EVENT_BATCHES_METADATA
from turnwire_server.api.door_checks import DoorChecks

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""The trailer that carries a status's ``google.rpc.Status`` (gRPC's richer error model)."""
_CODES: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}

Metadata = tuple[tuple[str, str | bytes], ...]
"""gRPC invocation metadata: lowercase keys; ``bytes`` values for keys ending in ``-bin``."""

_NOT_METADATA = frozenset(
    {
        "content-type",
        "content-length",
        "content-encoding",
        "accept-encoding",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "host",
        "upgrade",
        "cookie",  # authentication is the bearer header only: no cookie reaches a servicer
        "connect-protocol-version",
        "connect-timeout-ms",
        "connect-accept-encoding",
        "connect-content-encoding",
        "grpc-timeout",
        "grpc-accept-encoding",
        "grpc-encoding",
        "x-grpc-web",
    }
)
"""HTTP and protocol headers that are not call metadata (gRPC keeps these out of metadata too)."""


def metadata_of(headers: Iterable[tuple[str, str]], *, event_batches: bool = False) -> Metadata:
    """The gRPC metadata of an HTTP request's ``headers`` (see the module docstring). A ``-bin``
    header that is not base64 is dropped, as gRPC drops undecodable binary metadata.
    ``turnwire-event-batches`` is kept only with ``event_batches``: for the Connect door, whose
    caller reads the responses as they are; a door that reads one event a response (OpenAI, AI
    SDK, AG-UI) must never get a batch, whatever its HTTP client sends (docs/semantics.md §10)."""
    found: list[tuple[str, str | bytes]] = []
    for name, value in headers:
        key = name.lower()
        if key in _NOT_METADATA or key.startswith(":"):
            continue
        if key == EVENT_BATCHES_METADATA and not event_batches:
            continue
        if key.endswith("-bin"):
            try:
                found.append((key, base64.b64decode(value + "=" * (-len(value) % 4))))
            except (binascii.Error, ValueError):
                continue
        else:
            found.append((key, value))
    return tuple(found)


class CallEnded(grpc.aio.AbortError):  # type: ignore[misc]  # grpc is untyped
    """The call ended with a non-OK status: ``code``, ``details`` and the trailing metadata
    (``grpc-status-details-bin`` carries the ``google.rpc.Status`` with its details)."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: Sequence[tuple[str, Any]] = ()
    ):
        super().__init__(details)
        self.code = code
        self.details = details
        self.trailing_metadata = tuple(trailing_metadata)

    @classmethod
    def of_status(cls, status: status_pb2.Status) -> CallEnded:
        """A turn's error (``TurnEnd.error``, a ``google.rpc.Status``) as the call ending it would
        be: its code, message and details, so a door renders a failed turn as it renders a
        refusal (its HTTP status, error body and retry headers)."""
        code = _CODES.get(status.code, grpc.StatusCode.UNKNOWN)
        message = status.message or "the turn failed"
        return cls(code, message, [(STATUS_DETAILS_KEY, status.SerializeToString())])

    def status_details(self) -> Sequence[Any]:
        """The ``google.protobuf.Any`` details (ErrorInfo, BadRequest, RetryInfo …) of the
        ``google.rpc.Status`` in the ``grpc-status-details-bin`` trailer; empty without one."""
        for key, value in self.trailing_metadata:
            if key == STATUS_DETAILS_KEY:
                return tuple(status_pb2.Status.FromString(value).details)
        return ()

    def error_info(self) -> error_details_pb2.ErrorInfo | None:
        """The status's ``google.rpc.ErrorInfo`` (its reason and metadata); None without one."""
        for detail in self.status_details():
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info
        return None


class _CallDetails(NamedTuple):
    """``grpc.HandlerCallDetails``: what an interceptor reads of a call before its request, and
    what its door checked already (:mod:`turnwire_server.api.door_checks`)."""

    method: str
    invocation_metadata: Metadata
    door_checks: DoorChecks | None = None


def peer_of(host: str | None, port: int | str | None) -> str:
    """An HTTP client's address as gRPC names a peer (``context.peer()``): ``ipv4:HOST:PORT``,
    ``ipv6:[HOST]:PORT`` for an IPv6 host (a host with a colon), ``"unknown"`` without a host (a
    unix socket's client)."""
    if not host:
        return "unknown"
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


@dataclass(frozen=True, slots=True)
class DoorCallInfo:
    """What a door knows of one HTTP request: its ``metadata`` (:func:`metadata_of`), the
    ``peer`` (:func:`peer_of`: ``ipv4:ADDRESS:PORT`` or ``ipv6:[ADDRESS]:PORT`` as gRPC writes it,
    or ``"unknown"``), its ``deadline``
    (``time.monotonic()`` seconds; None: none) and ``checks``, what was checked of it already
    (:mod:`turnwire_server.api.door_checks`: its token once verified, its body's nesting once
    bounded). Make every call of one request with the same object, so its token is verified once."""

    metadata: Metadata
    peer: str = "unknown"
    deadline: float | None = None
    checks: DoorChecks = field(default_factory=DoorChecks)


class HttpCallContext:
    """The servicer context of one in-process call (see the module docstring)."""

    def __init__(self, call: DoorCallInfo, sink: Callable[[Any], Any] | None = None) -> None:
        self._call = call
        self._sink = sink
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._done: list[Callable[[Any], None]] = []
        self._finished = False

    def invocation_metadata(self) -> Metadata:
        """The call's metadata."""
        return self._call.metadata

    @property
    def door_checks(self) -> DoorChecks:
        """What the door checked already of the call's request (:mod:`turnwire_server.api.door_checks`)."""
        return self._call.checks

    def peer(self) -> str:
        """The client's address, as gRPC writes a peer."""
        return self._call.peer

    def time_remaining(self) -> float | None:
        """Seconds to the deadline (may be negative), None without one."""
        deadline = self._call.deadline
        return None if deadline is None else deadline - time.monotonic()

    def code(self) -> grpc.StatusCode | None:
        """The status code set so far (None: not set)."""
        return self._code

    def details(self) -> str:
        """The status message set so far."""
        return self._details

    def set_code(self, code: grpc.StatusCode) -> None:
        """Set the status code the call ends with."""
        self._code = code

    def set_details(self, details: str) -> None:
        """Set the status message the call ends with."""
        self._details = details

    def set_trailing_metadata(self, _metadata: Any) -> None:
        """Accepted and dropped: the servicer sends details only through ``abort_with_status``."""

    async def send_initial_metadata(self, _metadata: Any) -> None:
        """Accepted and dropped (no servicer sends initial metadata)."""

    def auth_context(self) -> dict[str, list[bytes]]:
        """Empty: a caller is known by its bearer token, on both listeners."""
        return {}

    def cancelled(self) -> bool:
        """Whether the call ended before its handler did."""
        return self._finished and self._code is None

    def done(self) -> bool:
        """Whether the call has ended."""
        return self._finished

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Run ``callback(self)`` when the call ends (a gate slot's release, for one)."""
        if self._finished:
            callback(self)
        else:
            self._done.append(callback)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        """End the call with ``code`` and ``details``; raises :class:`CallEnded`."""
        self._code, self._details = code, details
        raise CallEnded(code, details, trailing_metadata or ())

    async def abort_with_status(self, status: grpc.Status) -> None:
        """End the call with a ``grpc.Status`` (details in its trailing metadata); raises
        :class:`CallEnded`."""
        await self.abort(status.code, status.details, status.trailing_metadata)

    async def write(self, message: Any) -> None:
        """Send one response of a response stream (waits while the reader is behind)."""
        if self._sink is None:
            raise RuntimeError("write() on a unary call")
        await self._sink(message)

    def finish(self) -> None:
        """The call ended: run the done callbacks, once."""
        if self._finished:
            return
        self._finished = True
        callbacks, self._done = self._done, []
        for callback in callbacks:
            callback(self)


class MethodTable:
    """The method handlers of servicers, by full method name (``/package.Service/Method``).

    Pass it as the ``server`` of a generated ``add_*Servicer_to_server(servicer, table)``: it
    keeps what that function registers, as a ``grpc.aio.Server`` would."""

    def __init__(self) -> None:
        self._generic: list[Any] = []
        self._handlers: dict[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[Any]) -> None:
        """Keep ``grpc.GenericRpcHandler`` s (what generated code and grpcio-health register)."""
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        """Keep a service's handlers by method name."""
        for name, handler in handlers.items():
            self._handlers[f"/{service}/{name}"] = handler

    def handler(self, method: str) -> Any | None:
        """The handler of ``method``; None when no servicer implements it."""
        found = self._handlers.get(method)
        if found is not None:
            return found
        for generic in self._generic:
            found = generic.service(_CallDetails(method, ()))
            if found is not None:
                self._handlers[method] = found
                return found
        return None


_END = object()

_BUFFERED = 8
"""Responses a stream's handler may write ahead of its reader: a few, so a burst of events does not
cost two task switches each, and still a bound (the engine's own buffer, limits.stream_buffer_events,
is where a slow reader is judged)."""


class InProcessCalls:
    """Run a call of any method in ``table`` through ``interceptors`` (the gRPC server's, in its
    order), with an :class:`HttpCallContext` (see the module docstring).

    Both methods raise :class:`CallEnded` for a call that ends with a non-OK status (refused by
    an interceptor, aborted by the servicer, ``UNIMPLEMENTED`` for an unknown method), and let
    ``asyncio.CancelledError`` through."""

    def __init__(self, table: MethodTable, interceptors: Sequence[Any]) -> None:
        self._table = table
        self._interceptors = tuple(interceptors)

    async def _handler(self, method: str, call: DoorCallInfo) -> Any:
        handler = self._table.handler(method)
        if handler is None:
            raise CallEnded(grpc.StatusCode.UNIMPLEMENTED, f"method {method} is not served here")

        async def innermost(_details: Any) -> Any:
            return handler

        continuation: Callable[[Any], Any] = innermost
        for interceptor in reversed(self._interceptors):
            continuation = functools.partial(interceptor.intercept_service, continuation)
        return await continuation(_CallDetails(method, call.metadata, call.checks))

    async def refusal(self, method: str, call: DoorCallInfo) -> CallEnded | None:
        """How a call of ``method`` with ``call``'s headers is refused before its request is read
        (no valid token: :class:`~turnwire_server.api.access.AccessInterceptor`), else None.

        A door asks before it reads a request body, so a caller without a valid token costs no
        more than its headers, as over gRPC (docs/operate/authentication.md, "What a caller
        without a token can cost"). A refused call runs its refusal here, counted in the metrics
        (under ``method``) and logged as the call would have been; an admitted one runs nothing,
        and the caller its token was verified as is kept in ``call.checks``: the door's calls with
        ``call`` are not verified again. An unknown ``method`` is not refused here: the call says so.
        """
        if self._table.handler(method) is None:
            return None
        handler = await self._handler(method, call)
        if not handler.request_streaming:  # ChatService and Health have no request streams:
            return None  # only a refusal (api/refusal.py) is one
        context = HttpCallContext(call, _discard)
        behavior = handler.stream_stream if handler.response_streaming else handler.stream_unary
        try:
            running = behavior(_nothing(), context)
            if inspect.isasyncgen(running):
                async for _ in running:
                    pass
            else:
                await running
        except CallEnded as ended:
            return ended
        finally:
            context.finish()
        code = context.code()
        return None if code is None or code == grpc.StatusCode.OK else CallEnded(code, context.details())

    async def unary(self, method: str, request: Message, call: DoorCallInfo) -> Message:
        """The response of the unary ``method`` to ``request``."""
        handler = await self._handler(method, call)
        context = HttpCallContext(call)
        try:
            if handler.request_streaming:  # a refusal (api/refusal.py) never reads its request
                response = await handler.stream_unary(_one(request), context)
            else:
                response = await handler.unary_unary(request, context)
        finally:
            context.finish()
        code = context.code()
        if code is not None and code != grpc.StatusCode.OK:
            raise CallEnded(code, context.details())
        return response  # type: ignore[no-any-return]

    async def stream(self, method: str, request: Message, call: DoorCallInfo) -> AsyncIterator[Message]:
        """The responses of the server-streaming ``method`` to ``request``, as they are written.
        Leaving the iteration early (``aclose``, cancellation) cancels the handler."""
        queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=_BUFFERED)
        handler = await self._handler(method, call)
        context = HttpCallContext(call, queue.put)
        failure: list[BaseException] = []

        async def run() -> None:
            argument: Any
            try:
                if handler.request_streaming:
                    behavior, argument = handler.stream_stream, _one(request)
                else:
                    behavior, argument = handler.unary_stream, request
                if inspect.iscoroutinefunction(behavior):
                    await behavior(argument, context)
                else:
                    async for response in behavior(argument, context):
                        await context.write(response)
            except Exception as error:  # the reader raises it, after what was written
                failure.append(error)
            await queue.put(_END)

        task = asyncio.ensure_future(run())
        try:
            while (item := await queue.get()) is not _END:
                yield item
            if failure:
                raise failure[0]
            code = context.code()
            if code is not None and code != grpc.StatusCode.OK:
                raise CallEnded(code, context.details())
        finally:
            if not task.done():
                task.cancel()
                # The handler's own cleanup (a turn stored as cancelled) runs to its end here.
                await asyncio.gather(task, return_exceptions=True)
            context.finish()


async def _one(request: Message) -> AsyncIterator[Message]:
    yield request


async def _nothing() -> AsyncIterator[Message]:
    return
    yield  # an async generator that yields nothing: a refusal never reads its request


async def _discard(_response: Any) -> None:
    """A refusal writes no response."""


__all__ = [
    "STATUS_DETAILS_KEY",
    "CallEnded",
    "DoorCallInfo",
    "HttpCallContext",
    "InProcessCalls",
    "Metadata",
    "MethodTable",
    "metadata_of",
    "peer_of",
]
