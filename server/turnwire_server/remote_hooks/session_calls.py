"""The ``HookSession`` side of :class:`~.middleware.RemoteMiddleware`'s calls
(docs/semantics.md §4, remote middleware): a call made on the turn's stream, with the same
outcomes and accounting (metrics, breaker, logs) as the unary RPC it replaces.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from turnwire_server.remote_hooks import metrics
from turnwire_server.remote_hooks.breaker import CircuitBreaker
from turnwire_server.remote_hooks.session import HookSession, SessionBroken, TurnSessions, failure_kind

_T = TypeVar("_T")


class ResendUnary(Exception):
    """A session call to make again as a unary RPC (an earlier call of the stream timed out)."""


class HookCallFailed(Exception):
    """A remote hook call failed; ``kind`` labels the metric (``deadline_exceeded``,
    ``unavailable``, … ``invalid_response``, ``breaker_open``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class SessionCalls:
    """Mixed into :class:`~.middleware.RemoteMiddleware`, which provides the attributes below."""

    if TYPE_CHECKING:
        breaker: CircuitBreaker
        server: str
        settings: Any
        _sessions: TurnSessions
        _background: set[asyncio.Task[Any]]

        def _metrics(self, hook: str) -> tuple[Any, Any]: ...
        def _failed_open(self, hook: str, failure: HookCallFailed, *, mode: str = "open") -> None: ...
        async def _observe(
            self, hook: str, rpc: str, request: Any, request_id: str, *, post: bool = False
        ) -> None: ...
        def _trace_context(self) -> Mapping[str, str]: ...

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
    ) -> _T:
        """:meth:`_call` on the turn's ``HookSession``; the same outcomes and accounting."""
        try:
            queue = session.post if post else session.send
            call_id, future = queue(rpc, request, self._trace_context())
        except SessionBroken:
            raise ResendUnary from None  # it broke before this call went out
        timer = session.expire_after(call_id, future, self.settings.deadline_seconds)
        if post:
            done = functools.partial(
                self._posted, call_id=call_id, hook=hook, rpc=rpc, request=request, request_id=request_id,
                started=started, timer=timer,
            )  # fmt: skip
            future.add_done_callback(done)
            return None  # type: ignore[return-value]  # observing hooks read nothing
        try:
            response = await future
            result = read(response)
        except asyncio.CancelledError:
            self.breaker.released()  # the turn was cancelled: no outcome to count; its stream ends
            session.break_(RuntimeError("the turn was cancelled"))
            raise
        except SessionBroken as broken:
            self._sessions.unary(request_id)
            if broken.call_id is not None and broken.call_id < call_id:
                raise ResendUnary from None
            raise self._session_failed(hook, rpc, request_id, broken) from None
        except Exception as error:
            raise self._session_failed(hook, rpc, request_id, error) from None
        finally:
            timer.cancel()
            self._metrics(hook)[1].observe(time.perf_counter() - started)
        self.breaker.succeeded()
        return result

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
        timer: asyncio.TimerHandle,
    ) -> None:
        """The answer of a posted (not awaited) observing call: the same accounting and logs; a
        call the stream broke under before the server took it is sent again as a unary RPC."""
        timer.cancel()
        self._metrics(hook)[1].observe(time.perf_counter() - started)
        if future.cancelled():
            self.breaker.released()
        elif (error := future.exception()) is None:
            self.breaker.succeeded()
        elif isinstance(error, SessionBroken) and error.call_id is not None and error.call_id < call_id:
            self._sessions.unary(request_id)
            self.breaker.released()
            task = asyncio.get_running_loop().create_task(self._observe(hook, rpc, request, request_id))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            self._failed_open(hook, self._session_failed(hook, rpc, request_id, error))

    def _session_failed(self, hook: str, rpc: str, request_id: str, error: BaseException) -> HookCallFailed:
        """Count a failed session call as :meth:`_call` counts a failed RPC; a broken stream makes
        the turn's later calls unary."""
        self.breaker.failed()
        if isinstance(error, SessionBroken):
            self._sessions.unary(request_id)
        kind, text = failure_kind(error)
        metrics.ERRORS.labels(self.server, hook, kind).inc()
        return HookCallFailed(kind, f"{rpc} (HookSession) failed: {text}")
