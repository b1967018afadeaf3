"""The turn stream of the synchronous client (:class:`SyncTurnStream`), written by hand: gRPC's
sync response stream is an iterator (``next``, ``StopIteration`` at the end) where the async one
is read until ``EOF``, so this is not generated from :mod:`turnwire_client.stream` as the client
is (tools/generate_sync_client.py)."""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import Any, Self

import grpc

from turnwire_client.errors import TurnwireError, explain_unreachable
from turnwire_client.result import TurnResult, collect_sync
from turnwire_client.tls import TlsOptions
from turnwire_client.v1 import event_pb2

__all__ = ["SyncTurnStream"]


class SyncTurnStream:
    """The events of one turn-running call of the synchronous client, ``TurnEnd`` last.

    Iterate it (``for event in stream``), or use it as a context manager so that the call ends
    with the block. Leaving early cancels the call (and, unless the call's ``disconnect`` was
    ``"continue"``, the server aborts the turn): ``break`` or an exception out of ``for``,
    ``with`` exit, :meth:`cancel`, or when the stream is garbage-collected. Iterating raises
    :class:`TurnwireError` when the call fails.
    ``Progress`` keepalives are skipped unless ``include_progress`` is true, as in
    :class:`~turnwire_client.stream.TurnStream`.
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
        """Wrap a response-streaming call of a sync ``ChatServiceStub``; yield its ``Progress``
        keepalives too when ``include_progress``. ``security``: as for
        :class:`~turnwire_client.stream.TurnStream` (a TLS mismatch explained)."""
        self._call = call
        self._include_progress = include_progress
        self._security = security
        self._answered = False
        self._more: deque[event_pb2.TurnEvent] = deque()  # a batch's events not yet returned
        self.request_id = request_id
        """The turn's request id, known before any event arrives: retry a failed turn under it
        with the same input, cancel it (``cancel_chat``) or re-attach (``resume_turn``)."""

    def __iter__(self) -> _Iteration:
        """One ``for`` over the stream: leaving that loop before the end (``break``, an
        exception) cancels the call. ``next(stream)`` reads an event without that rule."""
        return _Iteration(self)

    def __next__(self) -> event_pb2.TurnEvent:
        """The next event (``Progress`` keepalives skipped unless asked for);
        :class:`StopIteration` after the last one."""
        while True:
            if self._more:
                batched = self._more.popleft()
                if self._include_progress or not batched.HasField("progress"):
                    return batched
                continue
            try:
                response = next(self._call)
            except grpc.RpcError as error:
                failure = TurnwireError.from_rpc_error(error)
                if self._security is not None and not self._answered:
                    failure = explain_unreachable(failure, *self._security)
                raise failure from error
            except BaseException:
                self._call.cancel()  # interrupted, or StopIteration at the end: a no-op then
                raise
            self._answered = True
            event: event_pb2.TurnEvent = response.event
            if response.more_events:  # an event batch (docs/semantics.md §10)
                self._more.extend(response.more_events)
            if self._include_progress or not event.HasField("progress"):
                return event

    def collect(self) -> TurnResult:
        """Read the stream to its end and fold it into a :class:`TurnResult`
        (:func:`~turnwire_client.result.collect_sync`)."""
        return collect_sync(self)

    def cancel(self) -> bool:
        """Cancel the call (the server aborts the turn, storing its partial reply).

        Returns False when the call had already ended.
        """
        return bool(self._call.cancel())

    def __enter__(self) -> Self:
        """Return the stream itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Cancel the call if it is still running."""
        self._call.cancel()

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
    """One ``for`` over a :class:`SyncTurnStream`: its events, and a cancel of the call when the
    loop drops this object before the stream ended (as in :mod:`turnwire_client.stream`)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: SyncTurnStream) -> None:
        self._stream = stream

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> event_pb2.TurnEvent:
        return next(self._stream)

    def __del__(self) -> None:
        # The loop let go of it: a break, or an exception out of its body. A no-op after the end.
        self._stream._cancel_if_running()
