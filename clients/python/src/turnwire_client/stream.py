"""A turn's event stream: an async iterator of ``TurnEvent`` that cancels its call when abandoned.

Leaving the iteration early cancels the call (and so the server aborts the turn), by whichever
way the iteration is left: ``async with`` exit, :meth:`TurnStream.cancel`, or the stream being
dropped (``async for … : break`` on a stream not kept in a variable). An async generator cannot
promise that: Python closes it only when the event loop's finalizer gets to it.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import grpc

from turnwire_client.errors import TurnwireError
from turnwire_client.v1 import event_pb2


class TurnStream:
    """The events of one turn-running call, ``TurnEnd`` last.

    Iterate it (``async for event in stream``), or use it as an async context manager to make
    sure the call ends when the block does. Iterating raises :class:`TurnwireError` when the
    call fails. ``Progress`` keepalives (a silent turn's stream sends one per
    ``limits.progress_interval_seconds``; sequence number 0, not part of the turn) are skipped
    unless ``include_progress`` is true.
    """

    __slots__ = ("_call", "_include_progress")

    def __init__(self, call: Any, *, include_progress: bool = False) -> None:
        self._call = call
        self._include_progress = include_progress

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> event_pb2.TurnEvent:
        while True:
            try:
                response = await self._call.read()
            except grpc.aio.AioRpcError as error:
                raise TurnwireError.from_rpc_error(error) from error
            except BaseException:
                self._call.cancel()  # the reader was cancelled or interrupted: end the call too
                raise
            if response is grpc.aio.EOF:
                raise StopAsyncIteration
            event: event_pb2.TurnEvent = response.event
            if self._include_progress or not event.HasField("progress"):
                return event

    def cancel(self) -> bool:
        """Cancel the call (the server aborts the turn, storing its partial reply).

        Returns False when the call had already ended.
        """
        return bool(self._call.cancel())

    async def aclose(self) -> None:
        """Cancel the call if it is still running (so ``contextlib.aclosing`` works too)."""
        self._call.cancel()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._call.cancel()  # a no-op once the call has finished

    def __del__(self) -> None:
        # Dropped without being read to the end: cancel at once rather than when gRPC's own
        # call object is collected.
        call = getattr(self, "_call", None)
        if call is not None and not call.done():
            call.cancel()
