"""A turn's event stream: an async iterator of ``TurnEvent`` that cancels its call when abandoned.

Leaving the iteration early cancels the call (and so the server aborts the turn), by whichever
way the iteration is left: ``break`` or an exception out of ``async for`` (also over a stream
kept in a variable), ``async with`` exit, :meth:`TurnStream.cancel`, or the stream being dropped.
Each ``async for`` gets its own iteration object (:class:`_Iteration`) that cancels the call when
the loop lets go of it before the end: CPython drops it as the loop is left, so the cancel is
sent at once. An async generator cannot promise that: Python closes it only when the event
loop's finalizer gets to it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType
from typing import Any, Self

import grpc

from turnwire_client.errors import TurnwireError, explain_unreachable
from turnwire_client.result import TurnResult, collect
from turnwire_client.tls import TlsOptions
from turnwire_client.v1 import event_pb2


class TurnStream:
    """The events of one turn-running call, ``TurnEnd`` last.

    Iterate it (``async for event in stream``), or use it as an async context manager to make
    sure the call ends when the block does. Iterating raises :class:`TurnwireError` when the
    call fails. ``Progress`` keepalives (a silent turn's stream sends one per
    ``limits.progress_interval_seconds``; sequence number 0, not part of the turn) are skipped
    unless ``include_progress`` is true. A call that fails ``UNAVAILABLE`` before any event
    because of a TLS mismatch raises :class:`~turnwire_client.errors.TlsMismatchError`, saying
    what the sidecar wants.
    """

    __slots__ = ("_answered", "_call", "_include_progress", "_more", "_security", "request_id")

    def __init__(
        self,
        call: Any,
        *,
        include_progress: bool = False,
        request_id: str = "",
        security: tuple[str, TlsOptions | None] | None = None,
    ) -> None:
        """Wrap a response-streaming call of a ``grpc.aio`` ``ChatServiceStub``; yield its
        ``Progress`` keepalives too when ``include_progress``. ``security`` (the target and the
        TLS options the channel was opened with; None: unknown) lets a failure before any answer
        be explained as a TLS mismatch."""
        self._call = call
        self._include_progress = include_progress
        self._security = security
        self._answered = False
        self._more: deque[event_pb2.TurnEvent] = deque()  # a batch's events not yet returned
        self.request_id = request_id
        """The turn's request id, known before any event arrives: retry a failed turn under it
        with the same input, cancel it (``cancel_chat``) or re-attach (``resume_turn``)."""

    def __aiter__(self) -> _Iteration:
        """One ``async for`` over the stream: leaving that loop before the end (``break``, an
        exception) cancels the call. ``anext(stream)`` reads an event without that rule."""
        return _Iteration(self)

    async def __anext__(self) -> event_pb2.TurnEvent:
        """The next event (``Progress`` keepalives skipped unless asked for);
        :class:`StopAsyncIteration` after the last one."""
        while True:
            if self._more:
                batched = self._more.popleft()
                if self._include_progress or not batched.HasField("progress"):
                    return batched
                continue
            try:
                response = await self._call.read()
            except grpc.aio.AioRpcError as error:
                failure = TurnwireError.from_rpc_error(error)
                if self._security is not None and not self._answered:
                    # A handshake of its own (blocking, so off the event loop).
                    failure = await asyncio.to_thread(explain_unreachable, failure, *self._security)
                raise failure from error
            except BaseException:
                self._call.cancel()  # the reader was cancelled or interrupted: end the call too
                raise
            if response is grpc.aio.EOF:
                raise StopAsyncIteration
            self._answered = True
            event: event_pb2.TurnEvent = response.event
            if response.more_events:  # an event batch (docs/semantics.md §10)
                self._more.extend(response.more_events)
            if self._include_progress or not event.HasField("progress"):
                return event

    async def collect(self) -> TurnResult:
        """Read the stream to its end and fold it into a :class:`TurnResult` (:func:`collect`);
        raises as :func:`collect` does."""
        return await collect(self)

    def cancel(self) -> bool:
        """Cancel the call (the server aborts the turn, storing its partial reply).

        Returns False when the call had already ended.
        """
        return bool(self._call.cancel())

    async def aclose(self) -> None:
        """Cancel the call if it is still running (so ``contextlib.aclosing`` works too)."""
        self._call.cancel()

    async def __aenter__(self) -> Self:
        """Return the stream itself."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Cancel the call if it is still running."""
        self._call.cancel()  # a no-op once the call has finished

    def __del__(self) -> None:
        # Dropped without being read to the end: cancel at once rather than when gRPC's own call
        # object is collected.
        if hasattr(self, "_call"):  # not when __init__ failed
            self._cancel_if_running()

    def _cancel_if_running(self) -> None:
        """Cancel the call unless it already ended (the stream or one loop over it was left)."""
        if not self._call.done():
            self._call.cancel()


class _Iteration:
    """One ``async for`` over a :class:`TurnStream`: its events, and a cancel of the call when the
    loop drops this object before the stream ended (README, "Cancellation")."""

    __slots__ = ("_stream",)

    def __init__(self, stream: TurnStream) -> None:
        self._stream = stream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> event_pb2.TurnEvent:
        return await self._stream.__anext__()

    def __del__(self) -> None:
        # The loop let go of it: a break, or an exception out of its body. A no-op after the end.
        self._stream._cancel_if_running()
