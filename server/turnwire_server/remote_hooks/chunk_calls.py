"""The chunk batches of a :class:`~.middleware.RemoteMiddleware`'s turns (docs/semantics.md §4,
remote middleware, "Chunks"): on the turn's ``HookSession`` for a server that sets
``hook_session_chunks`` (:mod:`.session_chunks`), else on an ``OnChunks`` call of their own
(:mod:`.chunks`); either counted in the metrics and fed to the breaker.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc

from turnwire_server.remote_hooks import metrics
from turnwire_server.remote_hooks.breaker import CircuitBreaker
from turnwire_server.remote_hooks.calls import HookCallFailed
from turnwire_server.remote_hooks.chunks import ChunkStream
from turnwire_server.remote_hooks.session import HookSession, TurnSessions, failure_kind
from turnwire_server.remote_hooks.session_chunks import SessionChunks

MAX_OPEN_CHUNK_CALLS = 1024
"""``OnChunks`` calls open at once per server; past it the oldest is closed (a turn whose
``on_chat_response`` never came, for example one cut short by a shutdown)."""


class ChunkCalls:
    """Mixed into :class:`~.middleware.RemoteMiddleware`, which provides the attributes below:
    :attr:`_streams` holds each turn's batches (None: dropped, the breaker was open)."""

    if TYPE_CHECKING:
        breaker: CircuitBreaker
        server: str
        settings: Any
        session_chunks: bool
        _stub: Any
        _sessions: TurnSessions
        _background: set[asyncio.Task[Any]]
        _streams: OrderedDict[str, ChunkStream | SessionChunks | None]

        def _failed_open(self, hook: str, failure: HookCallFailed, *, mode: str = "open") -> None: ...
        def _trace_context(self) -> Mapping[str, str]: ...
        def _metadata(self, request_id: str) -> tuple[tuple[str, str], ...]: ...
        def _open_session(self, request_id: str) -> HookSession: ...
        def _info(self, conversation_id: str, request_id: str) -> Any: ...

    def _open_chunks(self, conversation_id: str, request_id: str) -> ChunkStream | SessionChunks | None:
        """The turn's chunk batches: on its ``HookSession`` (``hook_session_chunks``, the stream
        opened now if the turn has none), else on an ``OnChunks`` call; None while the breaker is
        open (the turn's events are dropped, counted)."""
        stream: ChunkStream | SessionChunks | None = None
        if not self.breaker.allow():
            metrics.ERRORS.labels(self.server, "on_chunk", "breaker_open").inc()
        else:
            metrics.CALLS.labels(self.server, "on_chunk").inc()
            batching = self.settings.chunks
            info = self._info(conversation_id, request_id)
            options: dict[str, Any] = {
                "server": self.server,
                "max_events": batching.max_events,
                "max_delay_ms": batching.max_delay_ms,
                "buffer_events": batching.buffer_events,
                "deadline_seconds": self.settings.deadline_seconds,
            }
            session = None
            if self.session_chunks:
                session = self._sessions.get(request_id, "on_chunk", self._open_session)
            if session is not None:
                stream = SessionChunks(
                    session,
                    info,
                    trace_context=self._trace_context,
                    on_result=self._chunk_batch_answered,
                    **options,
                )
            else:
                assert self._stub is not None, "configure_session was not run"
                stub = self._stub
                stream = ChunkStream(
                    lambda: stub.OnChunks(metadata=self._metadata(request_id)),
                    info,
                    on_result=self._chunks_ended,
                    **options,
                )
        self._streams[request_id] = stream
        while len(self._streams) > MAX_OPEN_CHUNK_CALLS:
            _, oldest = self._streams.popitem(last=False)
            if oldest is not None:
                self._close_in_background(oldest)
        return stream

    def _close_in_background(self, stream: ChunkStream | SessionChunks) -> None:
        task = asyncio.get_running_loop().create_task(stream.close())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _chunks_ended(self, error: BaseException | None) -> None:
        if error is None:
            self.breaker.succeeded()
            return
        self.breaker.failed()
        kind = error.code().name.lower() if isinstance(error, grpc.aio.AioRpcError) else "deadline_exceeded"
        if not isinstance(error, grpc.aio.AioRpcError | TimeoutError):
            kind = "internal"
        metrics.ERRORS.labels(self.server, "on_chunk", kind).inc()
        self._failed_open("on_chunk", HookCallFailed(kind, f"OnChunks failed: {error}"))

    def _chunk_batch_answered(self, error: BaseException | None) -> None:
        """A batch's answer on the turn's ``HookSession``, counted as a session call's."""
        if error is None:
            self.breaker.succeeded()
            return
        self.breaker.failed()
        kind, text = failure_kind(error)
        metrics.ERRORS.labels(self.server, "on_chunk", kind).inc()
        self._failed_open("on_chunk", HookCallFailed(kind, f"OnChunks (HookSession) failed: {text}"))
