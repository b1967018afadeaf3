"""A turn's hook calls on one ``HookSession`` stream (docs/semantics.md §4, remote middleware).

A server whose ``GetHookSubscriptionsResponse`` sets ``hook_session`` gets each turn's hook
calls (all but ``OnChunks``, whose batches come too when it also sets ``hook_session_chunks``:
:mod:`.session_chunks`) as messages of one bidirectional call instead of a unary RPC each:
a message costs a fraction of an RPC (no call set-up, metadata or deadline per hook). The server
answers the requests in order, one each, so the hooks reach it in the order the chain runs them.

:class:`HookSession` is the stream of one turn: :meth:`HookSession.send` queues a request for
its writer task and returns the future of its answer, which a reader task resolves by ``id``. A
deadline per call is a timer on that future (:meth:`HookSession.expire_after`). Anything that
breaks the stream (an RPC error, an answer that does not decode, a deadline) fails every pending
call of it and marks it :attr:`HookSession.broken`: the caller then makes the turn's later calls
unary, so one stuck answer never holds the rest of the turn behind it.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import grpc

from turnwire_client.v1 import hooks_pb2
from turnwire_server.remote_hooks import metrics

METHOD = "/turnwire.v1.TurnHooksService/HookSession"

FIELDS = {
    "BeforeTurn": ("before_turn", 10),
    "BeforeStep": ("before_step", 11),
    "BeforeToolCall": ("before_tool_call", 12),
    "AfterToolCall": ("after_tool_call", 13),
    "OnStepFinish": ("on_step_finish", 14),
    "OnChatResponse": ("on_chat_response", 15),
    "ClassifyChatError": ("classify_chat_error", 16),
    "OnChatError": ("on_chat_error", 17),
    "OnChunks": ("on_chunks", 18),
}
"""RPC name → the ``hook`` oneof member of ``HookCall`` / ``HookAnswer`` and its field number
(protos/turnwire/v1/hooks.proto); ``OnChunks``: a batch, for a server that sets
``hook_session_chunks`` (:mod:`.session_chunks`)."""


class SessionBroken(Exception):
    """The stream cannot carry the call: it ended, failed, or a call's deadline passed.
    ``error`` is the cause (an ``AioRpcError``, ``TimeoutError`` or another exception);
    ``call_id`` the call whose deadline passed (None: the stream itself failed). ``stale``: the
    stream, kept from an earlier turn, failed before the server answered any call of this turn
    on it (a server that stopped or restarted meanwhile): its calls are made again as unary RPCs."""

    def __init__(self, error: BaseException, call_id: int | None = None, *, stale: bool = False) -> None:
        super().__init__(str(error))
        self.error = error
        self.call_id = call_id
        self.stale = stale


class CallFailed(Exception):
    """The server answered the call with an error status (``code``: a ``grpc.StatusCode``)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_TAGS = {rpc: _varint(number << 3 | 2) for rpc, (_, number) in FIELDS.items()}


def _encode_call(
    call_id: int, rpc: str, request: Any, trace_context: Mapping[str, str], request_id: str
) -> bytes:
    """``HookCall`` bytes without copying the hook's request into a message: the call's own
    fields, then the request's bytes as its oneof member (protobuf merges concatenated fields,
    so this is the same message)."""
    head: bytes = hooks_pb2.HookCall(
        id=call_id, trace_context=trace_context, parent_request_id=request_id
    ).SerializeToString()
    payload: bytes = request.SerializeToString()
    return head + _TAGS[rpc] + _varint(len(payload)) + payload


def _encode(calls: list[bytes]) -> bytes:
    """``HookSessionRequest`` bytes of encoded calls (its field 1, repeated)."""
    return b"".join(b"\x0a" + _varint(len(call)) + call for call in calls)


def posted_due(remaining: float, deadline_seconds: float) -> float:
    """Seconds until an observing (posted) call's unanswered state breaks the stream: what remains
    of its deadline plus one more, since its answer may come with the answer of the awaited call
    written after it, which has a deadline of its own (hooks.proto, HookSessionRequest)."""
    return remaining + deadline_seconds


HOLD_SECONDS = 0.05
"""An observing call waits at most this long for the turn's next call to be sent with it."""


class HookSession:
    """A ``HookSession`` call on ``channel`` with ``metadata`` (the parent request id of its first
    turn, the trace context at its opening), carrying one turn at a time (:attr:`request_id`;
    later turns too when the server reuses streams: :class:`TurnSessions`). Not thread-safe: one
    event loop uses it.

    Writes go out from one writer task, in the order of the calls' ids: a caller does not wait
    for its write's completion, only for the answer (which implies it), so the send's completion
    and the server's work overlap instead of adding up."""

    def __init__(
        self, channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...], request_id: str
    ) -> None:
        method = channel.stream_stream(
            METHOD,
            request_serializer=_encode,
            response_deserializer=hooks_pb2.HookSessionResponse.FromString,
        )
        self._call: Any = method(metadata=metadata)
        self.request_id = request_id
        """The turn whose calls the stream carries now (each call names it: ``parent_request_id``)."""
        self._loop = asyncio.get_running_loop()
        self.opened = self._loop.time()
        self.reused = False  # carries a turn after the one it was opened for
        self.answered = 0  # answers to this turn's calls
        self.in_step = True  # False once an answer named another hook than its call's
        self._next_id = 0
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        # Encoded calls not handed to the writer yet, as the requests they go in: an awaited call
        # ends its request (_write). _open: the last request takes more calls.
        self._requests: deque[list[bytes]] = deque()
        self._open = False
        self._flush_timer: asyncio.TimerHandle | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the writer and the half-close, kept alive
        self.broken: SessionBroken | None = None
        self._reader = self._loop.create_task(self._read())

    def post(
        self, rpc: str, request: Any, trace_context: Mapping[str, str], *, now: bool = False
    ) -> tuple[int, asyncio.Future[Any]]:
        """Queue an observing call (no one waits for its answer): written with the turn's next
        call, or :data:`HOLD_SECONDS` from now (``now``: at once, with the calls held). Returns
        what :meth:`send` returns; raises :class:`SessionBroken` likewise."""
        call_id, future = self._add(rpc, request, trace_context, awaited=False)
        if now:
            self.flush()
        elif self._flush_timer is None:
            self._flush_timer = self._loop.call_later(HOLD_SECONDS, self.flush)
        return call_id, future

    def send(
        self, rpc: str, request: Any, trace_context: Mapping[str, str]
    ) -> tuple[int, asyncio.Future[Any]]:
        """Queue ``request`` as the session's next ``rpc`` call and have it written now (with the
        calls held before it): its id, and the future of the answer (the unary response
        message), which fails with :class:`CallFailed` (an error answer), :class:`SessionBroken`
        (the stream broke, its write included) or ``ValueError`` (an answer of another hook).
        Raises :class:`SessionBroken` when the stream is already broken."""
        call_id, future = self._add(rpc, request, trace_context, awaited=True)
        self.flush()
        return call_id, future

    def _add(
        self, rpc: str, request: Any, trace_context: Mapping[str, str], *, awaited: bool
    ) -> tuple[int, asyncio.Future[Any]]:
        if self.broken is not None:
            raise self.broken
        self._next_id += 1
        call_id = self._next_id
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[call_id] = (rpc, future)
        if not self._open:
            self._requests.append([])
            self._open = True
        self._requests[-1].append(_encode_call(call_id, rpc, request, trace_context, self.request_id))
        self._open = not awaited
        return call_id, future

    def hold(self) -> None:
        """Keep the buffered calls until :meth:`flush` (no :data:`HOLD_SECONDS` timer writes them
        meanwhile): the turn's end writes them once its own end is out (:meth:`TurnSessions.close_later`)."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None

    def flush(self) -> None:
        """Hand the buffered calls to the writer task (started when none runs)."""
        self.hold()
        if self._requests and self.broken is None and (self._writer is None or self._writer.done()):
            self._writer = self._spawn(self._write())

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task = self._loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write(self) -> None:
        # One write at a time (grpc's rule), a request each: the calls buffered meanwhile up to
        # and including the first awaited one, so the calls go out in the order of their ids and a
        # request holds at most one awaited call, its last: a server that answers a request's
        # calls together (hooks.proto, HookSessionRequest) never holds an awaited answer behind
        # another call. The task ends once nothing is buffered (a later call starts another).
        while self._requests and self.broken is None:
            calls = self._requests.popleft()
            if not self._requests:
                self._open = False  # the request taken was the last: a later call starts one
            try:
                await self._call.write(calls)
            except asyncio.CancelledError:
                self.break_(RuntimeError("the stream's writer was cancelled"))
                raise
            except Exception as error:  # an RPC error, or the call already ended or cancelled
                self.break_(self.broken.error if self.broken else error)

    def expire_after(self, call_id: int, future: asyncio.Future[Any], seconds: float) -> asyncio.TimerHandle:
        """After ``seconds`` (what remains of the call's deadline) an unanswered call ``call_id``
        breaks the session (a deadline, as the unary RPC's): its pending calls fail with a
        ``TimeoutError`` cause naming ``call_id``; the later ones were not handled yet (the
        server answers in order)."""

        def expire() -> None:
            if not future.done():
                self.break_(TimeoutError("no answer within its deadline"), call_id)

        return self._loop.call_later(seconds, expire)

    def break_(self, error: BaseException, call_id: int | None = None) -> None:
        """Fail every pending call with :class:`SessionBroken` (``error``, ``call_id``: the call
        whose deadline passed) and cancel the call."""
        if self.broken is None:
            stale = call_id is None and self.reused and self.answered == 0
            self.broken = SessionBroken(error, call_id, stale=stale)
        self.hold()
        self._requests.clear()
        self._open = False
        for _, future in list(self._pending.values()):
            if not future.done():
                future.set_exception(self.broken)
        self._pending.clear()
        self._call.cancel()
        if not self._reader.done() and self._reader is not asyncio.current_task():
            self._reader.cancel()

    async def finish_turn(self, wait_seconds: float) -> bool:
        """Send the calls held and wait (at most ``wait_seconds``) for the turn's answers still
        due: True when the stream can carry another turn (every answer in, not broken). A cancel
        during the wait breaks the stream (its answers would be nobody's)."""
        self.flush()
        if self.broken is not None:
            return False
        if self._pending:
            # Observing calls not answered yet (no OnChatResponse waited for them): the turn ends
            # once the server has taken them, as on the unary path; each call's own deadline
            # breaks the stream sooner when the server does not answer.
            pending = [future for _, future in self._pending.values()]
            try:
                await asyncio.wait(pending, timeout=max(wait_seconds, 0.0))
            except asyncio.CancelledError:
                self.break_(RuntimeError("the turn was cancelled while its stream closed"))
                raise
        return self.broken is None and not self._pending and self.in_step

    async def close(self, seconds: float, *, wait_seconds: float | None = None) -> None:
        """:meth:`finish_turn` (waiting at most ``wait_seconds``, default ``seconds``), then
        :meth:`end`."""
        await self.finish_turn(seconds if wait_seconds is None else wait_seconds)
        self.end(seconds)

    def end(self, seconds: float) -> None:
        """Half-close the stream in the background (the turn does not wait for it), the reader
        taking the server's end of the stream (given up after ``seconds``)."""
        if self.broken is None:
            self._spawn(self._half_close(seconds))

    async def _half_close(self, seconds: float) -> None:
        if self._writer is not None:
            await asyncio.wait([self._writer])  # the last calls are written before the close
        if self.broken is not None:
            return
        try:
            await self._call.done_writing()
        except Exception as error:  # an RPC error, or the call already ended or cancelled
            self.break_(error)
            return
        if not self._reader.done():
            handle = self._loop.call_later(
                seconds, lambda: self.break_(TimeoutError("the stream did not end in time"))
            )
            self._reader.add_done_callback(lambda _: handle.cancel())

    def _answer(self, response: Any) -> None:
        entry = self._pending.pop(response.id, None)
        if entry is None or entry[1].done():
            return  # a call already failed or cancelled
        rpc, future = entry
        self.answered += 1
        if response.HasField("error"):
            code = _CODES.get(response.error.code, grpc.StatusCode.UNKNOWN)
            future.set_exception(CallFailed(code, response.error.message))
            return
        field, _ = FIELDS[rpc]
        answered = response.WhichOneof("hook")
        if answered != field:
            self.in_step = False  # the server is out of step with the stream: never reused
            future.set_exception(ValueError(f"the answer to {rpc} is {answered or 'empty'}"))
            return
        future.set_result(getattr(response, field))

    async def _read(self) -> None:
        try:
            while True:
                response = await self._call.read()
                if response is grpc.aio.EOF:
                    code = await self._call.code()
                    details = await self._call.details()
                    if self._pending:
                        self.break_(CallFailed(code, details or "the stream ended before its answers"))
                    elif self.broken is None:  # nothing due: only never to carry another turn
                        self.broken = SessionBroken(CallFailed(code, details or "the stream ended"))
                    return
                if response is None:
                    # grpc.aio logs a message that does not decode and hands back None.
                    self.break_(ValueError("an answer is not a decodable HookSessionResponse"))
                    return
                for answer in response.answers:
                    self._answer(answer)
        except asyncio.CancelledError:
            return
        except grpc.aio.AioRpcError as error:
            self.break_(error)
        except Exception as error:  # any read failure breaks the stream alike
            self.break_(error)


MAX_OPEN_SESSIONS = 1024
"""``HookSession`` streams open at once per server; past it the oldest is closed (a turn that
failed with no ``on_chat_error`` subscribed, or was cancelled, or whose ``on_chat_response`` never
came after an ``on_chat_error`` that left the stream to it, leaves its stream to this bound)."""

OPENING_HOOKS = frozenset(
    ("before_turn", "before_step", "before_tool_call", "after_tool_call", "on_step_finish", "on_chunk")
)
"""Hooks that open a turn's stream (``on_chunk``: its batches, when they go on the stream); the
others (``on_chat_response``, the error hooks) use the turn's stream when one is open, else a
unary RPC (one call is not worth a stream), unless the server observes them: a posted end hook
opens one (kept for later turns), so the turn's end does not wait for it (:meth:`TurnSessions.get`)."""


MAX_IDLE_SESSIONS = 16
"""Streams kept open between turns per server that reuses them (``reuse_hook_session``); past
it the longest idle is half-closed. The most a burst of concurrent turns leaves open."""

MAX_IDLE_SECONDS = 30.0
"""A kept stream no turn took for this long is half-closed (a quiet sidecar holds none open)."""

MAX_STREAM_SECONDS = 60.0
"""A stream opened this long ago is not kept after its turn: a later turn opens a new one, which
a balancing proxy or a restarted server's new connection may route elsewhere."""


class TurnSessions:
    """The ``HookSession`` of each running turn of one server, by request id (None: the turn's
    stream broke, its later calls are unary). ``deadline_seconds`` bounds a closing stream's
    wait for the server's end; ``background`` keeps the tasks of evicted streams' closing;
    ``server`` labels the count of turns on opened and on kept streams
    (``turnwire_remote_hook_session_turns_total``).

    :attr:`reuse` (the server's ``reuse_hook_session``): a turn's stream whose answers are all in
    when the turn ends is kept for the next turn (at most :data:`MAX_IDLE_SESSIONS`), which then
    opens none: each call names its turn (``HookCall.parent_request_id``), and a stream carries
    one turn at a time, so the server sees each turn's calls in order, never interleaved."""

    def __init__(self, deadline_seconds: float, background: set[asyncio.Task[Any]], server: str) -> None:
        self._deadline = deadline_seconds
        self._opened = metrics.SESSION_TURNS.labels(server, "opened")
        self._kept = metrics.SESSION_TURNS.labels(server, "kept")
        self._background = background
        self._by_turn: OrderedDict[str, HookSession | None] = OrderedDict()
        # Kept streams, the most recently kept last, each with the timer that ends it when idle.
        self._idle: OrderedDict[HookSession, asyncio.TimerHandle] = OrderedDict()
        self._finishing: set[asyncio.Task[None]] = set()  # ended turns' streams taking their answers
        self._stopped = False
        self.reuse = False

    def get(
        self, request_id: str, hook: str, open_session: Callable[[str], HookSession], *, posted: bool = False
    ) -> HookSession | None:
        """The turn's open stream (opened now with ``open_session`` for an opening ``hook``, or
        for a ``posted`` call: posted on a stream, it is not waited for, as on a unary RPC it
        would be), or None: the call is a unary RPC."""
        if request_id in self._by_turn:
            session = self._by_turn[request_id]
            if session is not None and session.broken is not None:
                self._by_turn[request_id] = session = None
            return session
        if hook not in OPENING_HOOKS and not posted:
            return None
        session = self._take_idle(request_id)
        if session is None:
            session = open_session(request_id)
            self._opened.inc()
        else:
            self._kept.inc()
        self._by_turn[request_id] = session
        while len(self._by_turn) > MAX_OPEN_SESSIONS:
            _, oldest = self._by_turn.popitem(last=False)
            if oldest is not None:
                task = asyncio.get_running_loop().create_task(oldest.close(self._deadline))
                self._background.add(task)
                task.add_done_callback(self._background.discard)
        return session

    def _take_idle(self, request_id: str) -> HookSession | None:
        """A kept stream for ``request_id``'s turn (the most recently kept: its connection's state
        is the warmest), skipping those the server ended meanwhile; None (and every kept stream
        ended) when the server no longer offers reuse."""
        if not self.reuse:
            self._end_idle()
            return None
        while self._idle:
            session, timer = self._idle.popitem()
            timer.cancel()
            if session.broken is None:
                session.request_id = request_id
                session.reused = True
                session.answered = 0
                return session
        return None

    def _keep(self, session: HookSession) -> None:
        """Keep ``session`` for a later turn (or end it: reuse off, too old, the sidecar
        stopping), within :data:`MAX_IDLE_SESSIONS` and :data:`MAX_IDLE_SECONDS`."""
        loop = asyncio.get_running_loop()
        if not self.reuse or self._stopped or loop.time() - session.opened > MAX_STREAM_SECONDS:
            session.end(self._deadline)
            return
        for dead in [s for s in self._idle if s.broken is not None]:
            self._idle.pop(dead).cancel()
        self._idle[session] = loop.call_later(MAX_IDLE_SECONDS, self._expire, session)
        while len(self._idle) > MAX_IDLE_SESSIONS:
            oldest, timer = self._idle.popitem(last=False)
            timer.cancel()
            oldest.end(self._deadline)

    def _expire(self, session: HookSession) -> None:
        if self._idle.pop(session, None) is not None:
            session.end(self._deadline)

    def _end_idle(self) -> None:
        while self._idle:
            session, timer = self._idle.popitem()
            timer.cancel()
            session.end(self._deadline)

    def unary(self, request_id: str) -> None:
        """The turn's stream broke: its later calls are unary RPCs."""
        if self._by_turn.get(request_id) is not None:
            self._by_turn[request_id] = None

    async def close(self, request_id: str, *, wait_seconds: float | None = None) -> None:
        """End the turn's stream (after its last call), if it has one, waiting at most
        ``wait_seconds`` (default the deadline) for the answers still due."""
        session = self._by_turn.pop(request_id, None) if self._by_turn else None
        if session is not None:
            await self._finish(session, self._deadline if wait_seconds is None else wait_seconds)

    def close_later(self, request_id: str, *, deadline: float, after: asyncio.Future[Any] | None) -> None:
        """:meth:`close` without the turn waiting (its end hooks are observed: hooks.proto
        ``observed_hooks``), in the background: once ``after`` is done (the turn's task: its own
        ``TurnEnd`` stored and handed to the client's stream first, since on one event loop a
        write the turn does not wait for would otherwise go before the one it does), at most
        :data:`HOLD_SECONDS` from now, the calls held are written (no earlier timer of theirs
        writes them); the answers still due are waited for until ``deadline``
        (``time.monotonic()``), then the stream is kept or ended."""
        session = self._by_turn.pop(request_id, None) if self._by_turn else None
        if session is not None:
            session.hold()
            task = asyncio.get_running_loop().create_task(self._finish_after(session, deadline, after))
            self._finishing.add(task)
            task.add_done_callback(self._finishing.discard)

    async def _finish_after(
        self, session: HookSession, deadline: float, after: asyncio.Future[Any] | None
    ) -> None:
        if after is not None and not after.done():
            await asyncio.wait([after], timeout=HOLD_SECONDS)
        await self._finish(session, deadline - time.monotonic())

    async def finish_ended(self) -> None:
        """Wait for the streams of turns already ended (:meth:`close_later`) to take their
        answers, each within its deadline, so stopping does not cut off a call the server is
        handling (an awaited one would have held its turn, which the drain waits for)."""
        if self._finishing:
            await asyncio.wait(list(self._finishing))

    async def _finish(self, session: HookSession, wait_seconds: float) -> None:
        if await session.finish_turn(wait_seconds):
            self._keep(session)
        else:
            session.end(self._deadline)

    def break_all(self) -> None:
        """The sidecar stops: cancel every stream, the kept ones too (and keep none after)."""
        self._stopped = True
        for timer in self._idle.values():
            timer.cancel()
        for session in [*self._by_turn.values(), *self._idle]:
            if session is not None:
                session.break_(RuntimeError("the sidecar stops"))
        self._by_turn.clear()
        self._idle.clear()


def failure_kind(error: BaseException) -> tuple[str, str]:
    """A failed session call's metric kind (as the unary RPC's: a status code name in lower
    case, ``deadline_exceeded``, ``invalid_response`` or ``internal``) and what to log."""
    if isinstance(error, SessionBroken):
        error = error.error
    if isinstance(error, CallFailed):
        return error.code.name.lower(), str(error)
    if isinstance(error, grpc.aio.AioRpcError):
        return error.code().name.lower(), f"{error.code().name}: {error.details()}"
    if isinstance(error, TimeoutError):
        return "deadline_exceeded", str(error)
    if isinstance(error, ValueError):
        return "invalid_response", f"an answer that cannot be used: {error}"
    return "internal", f"{type(error).__name__}: {error}"
