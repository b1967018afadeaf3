"""The paths of a :class:`~.middleware.RemoteMiddleware` call (docs/semantics.md §4, remote
middleware): the unary RPC, and a message on the turn's ``HookSession`` stream with the same
outcomes and accounting (metrics, breaker, logs), each within the call's one deadline.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from turnwire_server.remote_hooks import convert, metrics
from turnwire_server.remote_hooks.breaker import CircuitBreaker
from turnwire_server.remote_hooks.session import (
    HookSession,
    SessionBroken,
    TurnSessions,
    failure_kind,
    posted_due,
)

_T = TypeVar("_T")


class ResendUnary(Exception):
    """A session call to make again as a unary RPC, with what remains of its deadline (an earlier
    call of the stream timed out before the server took this one)."""


class HookCallFailed(Exception):
    """A remote hook call failed; ``kind`` labels the metric (``deadline_exceeded``,
    ``unavailable``, … ``invalid_response``, ``breaker_open``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class HookCalls:
    """Mixed into :class:`~.middleware.RemoteMiddleware`, which provides the attributes below.

    Every call has one deadline, from when the turn asked for it (docs/semantics.md §4,
    "Deadlines"): its timer on the stream is what remains of it, and a call made again as a unary
    RPC (:class:`ResendUnary`: queued behind a call whose deadline passed) gets what remains then.
    """

    if TYPE_CHECKING:
        breaker: CircuitBreaker
        server: str
        settings: Any
        _stub: Any
        _sessions: TurnSessions
        _background: set[asyncio.Task[Any]]

        def _metrics(self, hook: str) -> tuple[Any, Any]: ...
        def _failed_open(self, hook: str, failure: HookCallFailed, *, mode: str = "open") -> None: ...
        def _trace_context(self) -> Mapping[str, str]: ...
        def _metadata(self, request_id: str) -> tuple[tuple[str, str], ...]: ...

    async def _unary(
        self,
        hook: str,
        rpc: str,
        request: Any,
        request_id: str,
        read: Callable[[Any], _T],
        *,
        started: float,
        deadline: float,
    ) -> _T:
        """The unary RPC of a call :meth:`_call` let through (the breaker allowed it, the call
        counted), with the time left until ``deadline``; none left fails it at once as
        ``deadline_exceeded`` without an RPC. ``started`` (``time.perf_counter()``): when the
        turn asked for it, for the latency histogram. Raises :class:`HookCallFailed`."""
        duration = self._metrics(hook)[1]
        try:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._expired(hook, rpc)
            response = await getattr(self._stub, rpc)(
                request, timeout=remaining, metadata=self._metadata(request_id)
            )
            if response is None:
                # grpc.aio logs a response that does not decode and hands back None.
                raise convert.InvalidResponse("the response is not a decodable protobuf message")
            result = read(response)
        except HookCallFailed:
            raise
        except grpc.aio.AioRpcError as error:
            self.breaker.failed()
            kind = error.code().name.lower()
            metrics.ERRORS.labels(self.server, hook, kind).inc()
            raise HookCallFailed(kind, f"{rpc} failed: {error.code().name}: {error.details()}") from None
        except convert.InvalidResponse as error:
            self.breaker.failed()
            metrics.ERRORS.labels(self.server, hook, "invalid_response").inc()
            raise HookCallFailed("invalid_response", f"{rpc} answered something unusable: {error}") from None
        except asyncio.CancelledError:
            self.breaker.released()  # the turn was cancelled: no outcome to count
            raise
        except Exception as error:
            # Anything else the call or the conversion raised: a failed call all the same.
            self.breaker.failed()
            metrics.ERRORS.labels(self.server, hook, "internal").inc()
            raise HookCallFailed("internal", f"{rpc} failed: {type(error).__name__}: {error}") from error
        finally:
            duration.observe(time.perf_counter() - started)
        self.breaker.succeeded()
        return result

    async def _session_call(
        self,
        session: HookSession,
        hook: str,
        rpc: str,
        request: Any,
        *,
        request_id: str,
        read: Callable[[Any], _T],
        post: bool,
        started: float,
        deadline: float,
    ) -> _T:
        """:meth:`_call` on the turn's ``HookSession``; the same outcomes and accounting. The call
        fails at ``deadline`` (``time.monotonic()``) unanswered; raises :class:`ResendUnary` when
        the stream broke before the server took it (the caller makes it a unary RPC, with what
        remains of ``deadline``, and accounts for it then)."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._observe_duration(hook, started)
            raise self._expired(hook, rpc)
        try:
            queue = session.post if post else session.send
            call_id, future = queue(rpc, request, self._trace_context())
        except SessionBroken:
            raise ResendUnary from None  # it broke before this call went out
        if post:
            remaining = posted_due(remaining, self.settings.deadline_seconds)
        timer = session.expire_after(call_id, future, remaining)
        if post:
            done = functools.partial(
                self._posted, call_id=call_id, hook=hook, rpc=rpc, request=request, request_id=request_id,
                started=started, deadline=deadline, timer=timer,
            )  # fmt: skip
            future.add_done_callback(done)
            return None  # type: ignore[return-value]  # observing hooks read nothing
        try:
            response = await future
            result = read(response)
        except asyncio.CancelledError:
            self.breaker.released()  # the turn was cancelled: no outcome to count; its stream ends
            session.break_(RuntimeError("the turn was cancelled"))
            self._observe_duration(hook, started)
            raise
        except SessionBroken as broken:
            self._sessions.unary(request_id)
            if _resendable(broken, call_id):
                raise ResendUnary from None  # timed by the unary RPC: one duration per call
            self._observe_duration(hook, started)
            raise self._session_failed(hook, rpc, request_id, broken) from None
        except Exception as error:
            self._observe_duration(hook, started)
            raise self._session_failed(hook, rpc, request_id, error) from None
        finally:
            timer.cancel()
        self._observe_duration(hook, started)
        self.breaker.succeeded()
        return result

    def _observe_duration(self, hook: str, started: float) -> None:
        self._metrics(hook)[1].observe(time.perf_counter() - started)

    def _posted(
        self,
        future: asyncio.Future[Any],
        *,
        call_id: int,
        hook: str,
        rpc: str,
        request: Any,
        request_id: str,
        started: float,
        deadline: float,
        timer: asyncio.TimerHandle,
    ) -> None:
        """The answer of a posted (not awaited) observing call: the same accounting and logs; a
        call the stream broke under before the server took it is sent again as a unary RPC, in
        the background, with what remains of its ``deadline``."""
        timer.cancel()
        if future.cancelled():
            self._observe_duration(hook, started)
            self.breaker.released()
        elif (error := future.exception()) is None:
            self._observe_duration(hook, started)
            self.breaker.succeeded()
        elif isinstance(error, SessionBroken) and _resendable(error, call_id):
            self._sessions.unary(request_id)
            resend = self._resend_posted(hook, rpc, request, request_id, started=started, deadline=deadline)
            task = asyncio.get_running_loop().create_task(resend)
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            self._observe_duration(hook, started)
            self._failed_open(hook, self._session_failed(hook, rpc, request_id, error))

    async def _resend_posted(
        self, hook: str, rpc: str, request: Any, request_id: str, *, started: float, deadline: float
    ) -> None:
        """A posted observing call as the unary RPC (already let through by the breaker and
        counted); fails open."""
        try:
            await self._unary(
                hook, rpc, request, request_id, read_nothing, started=started, deadline=deadline
            )
        except HookCallFailed as failure:
            self._failed_open(hook, failure)

    def _expired(self, hook: str, rpc: str) -> HookCallFailed:
        """A call whose deadline passed before it could be sent (it waited behind calls the
        server did not answer in time): failed, counted as the deadline (``deadline_exceeded``)
        once, without an RPC."""
        self.breaker.failed()
        metrics.ERRORS.labels(self.server, hook, "deadline_exceeded").inc()
        return HookCallFailed(
            "deadline_exceeded",
            f"{rpc} failed: DEADLINE_EXCEEDED: its deadline passed before it could be sent",
        )

    def _session_failed(self, hook: str, rpc: str, request_id: str, error: BaseException) -> HookCallFailed:
        """Count a failed session call as :meth:`_call` counts a failed RPC; a broken stream makes
        the turn's later calls unary."""
        self.breaker.failed()
        if isinstance(error, SessionBroken):
            self._sessions.unary(request_id)
        kind, text = failure_kind(error)
        metrics.ERRORS.labels(self.server, hook, kind).inc()
        return HookCallFailed(kind, f"{rpc} (HookSession) failed: {text}")


def _resendable(broken: SessionBroken, call_id: int) -> bool:
    """Whether call ``call_id``, failed with ``broken``, is made again as a unary RPC: the server
    did not take it (it was queued behind the call whose deadline passed), or the stream was one
    kept from an earlier turn that failed before any answer of this turn (docs/semantics.md §4)."""
    return (broken.call_id is not None and broken.call_id < call_id) or broken.stale


def read_nothing(response: Any) -> None:
    """The ``read`` of an observing hook's call: its answer carries nothing to use."""
    return None
