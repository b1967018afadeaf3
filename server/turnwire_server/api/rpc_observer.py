"""Per-call observability at the RPC boundary: the gRPC server metrics and the log context.

:class:`RpcObserver` is a ``grpc.aio.ServerInterceptor``, installed first so that it sees every
call the way the client does, refusals of the interceptors after it (overload, malformed
requests) included. For each call whose handler starts it counts ``grpc_server_started_total``,
and when the call ends ``grpc_server_handled_total`` with the final code and
``grpc_server_handling_seconds`` (:mod:`turnwire_server.api.metrics`); a response stream is
counted in ``turnwire_open_streams`` while it is open. The final code is the one the handler
set (``abort``, ``set_code``), else ``OK`` when it returned, ``Canceled`` or
``DeadlineExceeded`` when the client went away, ``Unknown`` when it raised (what gRPC sends).

Before the handler runs, the request's ``conversation_id`` and ``request_id`` (or
``submission_id``) fields, where the method's request message has them, become the log context
of the call (:mod:`turnwire_server.log_context`). Calls to methods no service implements never
reach an interceptor and are not counted (as in go-grpc-prometheus).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

import grpc

from turnwire_server.api import metrics
from turnwire_server.api.kept_wrappers import KeptWrappers
from turnwire_server.api.refusal import declared_shape
from turnwire_server.api.rpc_logging import client_gone_types
from turnwire_server.log_context import bind_request

Context = Any  # grpc.aio.ServicerContext; grpc is untyped


class _MethodMetrics:
    """One method's label children, resolved once (a ``labels()`` lookup costs a lock and a dict)."""

    __slots__ = ("handled", "labels", "open_streams", "seconds", "started")

    def __init__(self, full_method: str, handler: Any) -> None:
        service, _, method = full_method.lstrip("/").rpartition("/")
        # The method's own shape: a refusal (api/refusal.py) is request-streaming whatever it refuses.
        request_streaming, response_streaming = declared_shape(handler)
        if request_streaming:
            kind = "bidi_stream" if response_streaming else "client_stream"
        else:
            kind = "server_stream" if response_streaming else "unary"
        self.labels = (kind, service, method)
        self.started = metrics.STARTED.labels(*self.labels)
        self.seconds = metrics.HANDLING_SECONDS.labels(*self.labels)
        # Only response streams: a unary method shows no gauge of its own.
        self.open_streams: Any = metrics.OPEN_STREAMS.labels(service, method) if response_streaming else None
        self.handled: dict[str, Any] = {}

    def ended(self, code: str, started: float) -> None:
        self.seconds.observe(time.perf_counter() - started)
        handled = self.handled.get(code)
        if handled is None:
            handled = self.handled[code] = metrics.HANDLED.labels(*self.labels, code)
        handled.inc()


class RpcObserver(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Metrics and log context for every call (see the module docstring)."""

    def __init__(self) -> None:
        self._gone = client_gone_types()
        self._methods: dict[str, _MethodMetrics] = {}
        self._wrappers = KeptWrappers()

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        """The method's handler, observed; None (unimplemented) passes through uncounted."""
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        return self._wrappers.wrapper(method, handler, lambda inner: self._observed(method, inner))

    def _observed(self, method: str, handler: Any) -> Any:
        observed = self._methods.get(method)
        if observed is None:
            observed = self._methods[method] = _MethodMetrics(method, handler)
        return self._wrap(handler, observed)

    def _code(self, context: Context, error: BaseException | None) -> str:
        code = context.code()
        if isinstance(code, grpc.StatusCode):
            return metrics.CODE_NAMES[code]
        if error is None:
            return "OK"
        if isinstance(error, self._gone):
            remaining = context.time_remaining()
            return "DeadlineExceeded" if remaining is not None and remaining <= 0 else "Canceled"
        return "Unknown"

    def _wrap(self, handler: Any, observed: _MethodMetrics) -> Any:
        deserializer, serializer = handler.request_deserializer, handler.response_serializer

        async def unary(behavior: Any, request: Any, context: Context) -> Any:
            bind_request(request)
            observed.started.inc()
            started = time.perf_counter()
            try:
                response = await behavior(request, context)
            except BaseException as error:
                observed.ended(self._code(context, error), started)
                raise
            observed.ended(self._code(context, None), started)
            return response

        async def streaming(behavior: Any, request: Any, context: Context) -> None:
            observed.started.inc()
            observed.open_streams.inc()
            started = time.perf_counter()
            try:
                await _respond(behavior, request, context)
            except BaseException as error:
                observed.ended(self._code(context, error), started)
                raise
            finally:
                observed.open_streams.dec()
            observed.ended(self._code(context, None), started)

        if not handler.request_streaming and not handler.response_streaming:
            behavior = handler.unary_unary
            if not inspect.iscoroutinefunction(behavior):
                return handler

            async def observed_unary_unary(request: Any, context: Context) -> Any:
                return await unary(behavior, request, context)

            return grpc.unary_unary_rpc_method_handler(
                observed_unary_unary, request_deserializer=deserializer, response_serializer=serializer
            )
        if not handler.request_streaming:
            behavior = handler.unary_stream
            if not _is_async(behavior):
                return handler

            async def observed_unary_stream(request: Any, context: Context) -> None:
                bind_request(request)
                await streaming(behavior, request, context)

            return grpc.unary_stream_rpc_method_handler(
                observed_unary_stream, request_deserializer=deserializer, response_serializer=serializer
            )
        if handler.response_streaming:
            behavior = handler.stream_stream
            if not _is_async(behavior):
                return handler

            async def observed_stream_stream(requests: AsyncIterable[Any], context: Context) -> None:
                await streaming(behavior, requests, context)

            return grpc.stream_stream_rpc_method_handler(
                observed_stream_stream, request_deserializer=deserializer, response_serializer=serializer
            )
        behavior = handler.stream_unary
        if not inspect.iscoroutinefunction(behavior):
            return handler

        async def observed_stream_unary(requests: AsyncIterable[Any], context: Context) -> Any:
            observed.started.inc()
            started = time.perf_counter()
            try:
                response = await behavior(requests, context)
            except BaseException as error:
                observed.ended(self._code(context, error), started)
                raise
            observed.ended(self._code(context, None), started)
            return response

        return grpc.stream_unary_rpc_method_handler(
            observed_stream_unary, request_deserializer=deserializer, response_serializer=serializer
        )


def _is_async(behavior: Any) -> bool:
    return inspect.iscoroutinefunction(behavior) or inspect.isasyncgenfunction(behavior)


async def _respond(behavior: Any, request: Any, context: Context) -> None:
    """Run a response-streaming handler; one written as an async generator is driven here (its
    responses written) and closed as soon as the call ends, as gRPC would drive it."""
    if inspect.iscoroutinefunction(behavior):
        await behavior(request, context)
        return
    async with contextlib.aclosing(behavior(request, context)) as responses:
        async for response in responses:
            await context.write(response)


__all__ = ["RpcObserver"]
