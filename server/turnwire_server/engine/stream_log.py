"""Keeps one turn's event stream re-attachable (ResumeTurn, WatchSubmission).

docs/semantics.md §8 (resumable streams). Every event a turn emits goes to its
RPC's channel as before and, here, to live subscribers and to the store: in
batches at checkpoint cadence (one write in flight at a time), and the rest with
the TurnEnd, before the TurnEnd is sent: in the transaction that records the
turn's end (:meth:`StreamLog.tail`, ``Store.finish_turn``), or, when hooks that
run after it shape the TurnEnd, in a write of their own (:meth:`StreamLog.store_end`).
So a turn recorded ended, or whose TurnEnd anyone received, has its whole stream
stored, however short it was and whenever the process dies. Events stay in
memory until their batch has committed, so a subscriber that attaches reads
everything older from the store, the uncommitted rest from here, then the live
events: each exactly once, in order.

Only streams that started (their first event is a TurnStart or an AttemptStart)
are stored: a turn refused before its input was stored has nothing to resume,
and storing its lone TurnEnd under a request id that belongs to an earlier turn
would replace that turn's stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from turnwire_server.engine.channel import EventChannel
from turnwire_server.store.errors import LeaseLost
from turnwire_server.store.records import TurnLease
from turnwire_server.store.streams import StreamStore

log = logging.getLogger("turnwire.stream_log")

MAX_UNSTORED_EVENTS = 1 << 16
"""Events kept in memory while the store fails; past it the stream stops being stored (logged)
and a resume gets what was stored. Also the sequence gap a crash recovery leaves
(see :data:`RECOVERY_SEQUENCE_GAP`)."""

RECOVERY_SEQUENCE_GAP = MAX_UNSTORED_EVENTS
"""After a crash, a recovered attempt numbers its events from the last stored one plus this: above
any number the lost attempt could have sent (at most this many were unstored), so a client that
saw lost events still receives the AttemptStart (docs/semantics.md §12)."""


def event_bytes(response: Any) -> int:
    """The serialized size of a stream response's ``event`` (bytes): what event batches count
    (``EventChannel.batches``, docs/semantics.md §10)."""
    size: int = response.event.ByteSize()
    return size


@dataclass(frozen=True, slots=True)
class StreamTail:
    """What a turn's final write stores of its stream (:meth:`StreamLog.tail`): ``events``
    (``(sequence_number, serialized TurnEvent)``, ascending), the first ``count`` of them from
    the log's unstored ones, then ``end``'s (the TurnEnd response, when given: the stream ends)."""

    events: list[tuple[int, bytes]]
    end: Any | None
    count: int

    @property
    def ended(self) -> bool:
        """The batch holds the TurnEnd."""
        return self.end is not None


@dataclass(slots=True)
class Subscription:
    """A live reader of a running turn's stream.

    ``first_unstored`` is the sequence number from which events were not yet stored when it
    attached (everything below is in the store); ``backlog`` the events emitted but not yet
    stored then; ``channel`` gets every later event. ``overflowed`` is set when the reader fell
    ``limit`` events behind: its channel is closed, and it should attach again.
    """

    first_unstored: int
    backlog: list[Any]
    channel: EventChannel[Any]
    limit: int
    overflowed: bool = False
    _log: StreamLog | None = field(default=None, repr=False)

    def put(self, response: Any) -> None:
        """Hand on one event; past ``limit`` unread ones, drop the reader (it re-attaches)."""
        if self.channel.backlogged:
            log.debug("a resume reader fell %d events behind; it re-attaches", self.limit)
            self.overflowed = True
            self.close()
            return
        self.channel.put(response)

    def close(self) -> None:
        """Stop receiving events."""
        self.channel.close()
        if self._log is not None:
            self._log.unsubscribe(self)
            self._log = None


class StreamLog:
    """The stored, re-attachable copy of one turn's events.

    ``interval`` (seconds) is the batch cadence; ``subscriber_limit`` the events a live reader
    may fall behind before it is dropped (it re-attaches and reads from the store). The
    event objects are the RPC's response messages, whose field ``event`` is the ``TurnEvent``;
    they are serialized when their batch is written, once the turn has filled them.

    Its writes are fenced (docs/semantics.md §5, "Fencing") once the turn calls :meth:`fence`:
    a batch the store refuses because another replica took the turn over (``LeaseLost``)
    stops the recording (nothing more is stored from here) and is reported to the turn.
    """

    def __init__(
        self,
        store: StreamStore,
        conversation_id: str,
        request_id: str,
        *,
        interval: float,
        subscriber_limit: int,
    ) -> None:
        self._store = store
        self.conversation_id = conversation_id
        self.request_id = request_id
        self._interval = interval
        self._limit = subscriber_limit
        self._unstored: list[Any] = []
        self._subscribers: list[Subscription] = []
        self._started: bool | None = None  # None until the first event says
        self._recording = True
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: asyncio.Task[None] | None = None
        self._ended = False
        self._final = False  # the final write was prepared: no more timer batches
        self._stored_end: Any = None  # the TurnEnd response once stored before it was sent
        self.last_sequence_number = 0
        self._sealed_through = 0  # events up to this number may be stored or sent: never amended
        self._lease: Callable[[], TurnLease | None] = lambda: None
        self._lost: Callable[[LeaseLost], None] | None = None

    def fence(self, lease: Callable[[], TurnLease | None], lost: Callable[[LeaseLost], None]) -> None:
        """Carry ``lease()`` (the turn's fencing token, read at each write) in every write, and
        call ``lost`` when the store refuses one because another replica took the turn over."""
        self._lease = lease
        self._lost = lost

    def abandon(self) -> None:
        """Store nothing more of this stream (live readers still get its events): another
        replica took the turn over, and its stored stream is that replica's now."""
        self._recording = False
        self._unstored.clear()

    def _lease_lost(self, error: LeaseLost) -> None:
        self.abandon()
        if self._lost is not None:
            self._lost(error)

    def record(self, response: Any) -> None:
        """Called by the turn's :class:`~turnwire_server.engine.events.EventWriter` for every
        event, before the turn fills it in (it is read later, never here)."""
        self.last_sequence_number = response.event.sequence_number
        if self._subscribers:
            for subscriber in tuple(self._subscribers):  # a put may drop the subscriber
                subscriber.put(response)
        if not self._recording or response is self._stored_end:
            return
        self._unstored.append(response)
        if len(self._unstored) > MAX_UNSTORED_EVENTS:
            log.error(
                "turn %s: %d events could not be stored; the rest of its stream is not kept for resume",
                self.request_id,
                len(self._unstored),
            )
            self._recording = False
            self._unstored.clear()
            return
        if self._timer is None and self._in_flight is None and not self._final:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._flush_soon)

    def amendable(self, response: Any) -> bool:
        """Whether the last recorded event, ``response``, may still be changed in place (a text
        delta merged into it): no store batch has serialized it, and every live reader still
        holds it unread (a reader that attached or left since it was recorded may have sent it)."""
        if response.event.sequence_number <= self._sealed_through:
            return False
        return all(subscriber.channel.last_unread() is response for subscriber in self._subscribers)

    def subscribe(self) -> Subscription:
        """Attach a live reader (see :class:`Subscription`); synchronous, so nothing is emitted
        between the snapshot of the backlog and the first live event."""
        self._sealed_through = self.last_sequence_number  # the backlog may be sent as it is now
        backlog = list(self._unstored)
        first = backlog[0].event.sequence_number if backlog else self.last_sequence_number + 1
        subscription = Subscription(first, backlog, EventChannel(self._limit), self._limit, _log=self)
        if self._ended:
            subscription.channel.close()
            subscription._log = None
        else:
            self._subscribers.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        """Detach a reader (a no-op when it is not attached)."""
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)
            self._sealed_through = self.last_sequence_number

    def end_live(self) -> None:
        """The stream ended (its TurnEnd is recorded): end every live reader's iteration."""
        self._ended = True
        for subscriber in tuple(self._subscribers):
            subscriber.channel.close()
        self._subscribers.clear()

    def _flush_soon(self) -> None:
        self._timer = None
        if self._in_flight is None and self._unstored:
            self._in_flight = asyncio.create_task(self._flush(ended=False), name=f"events {self.request_id}")

    async def _flush(self, *, ended: bool) -> None:
        try:
            batch = list(self._unstored)
            if self._started is None and batch:
                first = batch[0].event
                self._started = first.HasField("turn_start") or first.HasField("attempt_start")
            if not self._started:
                self._unstored.clear()  # never started: nothing to resume (see the module docstring)
                return
            if not batch and not ended:
                return
            events = [(r.event.sequence_number, r.event.SerializeToString()) for r in batch]
            if events:
                self._sealed_through = max(self._sealed_through, events[-1][0])
            try:
                await self._store.append_events(
                    self.conversation_id, self.request_id, events, ended=ended, lease=self._lease()
                )
            except LeaseLost as error:
                self._lease_lost(error)
                return
            except Exception as error:  # kept in memory; the next batch retries (bounded above)
                log.warning("turn %s: storing %d events failed: %s", self.request_id, len(events), error)
                return
            del self._unstored[: len(batch)]
        finally:
            self._in_flight = None
            if not ended and self._unstored and self._timer is None and not self._ended and not self._final:
                self._timer = asyncio.get_running_loop().call_later(self._interval, self._flush_soon)

    async def tail(self, end: Any | None = None) -> StreamTail | None:
        """What the turn's final write stores of the stream (``Store.finish_turn``): every event
        not stored yet, then ``end``, its TurnEnd (a response ``EventWriter.prepare`` made and
        filled, not sent yet), serialized now. None when there is nothing to store: no such
        event, a stream that never started (see the module docstring), or one no longer
        recorded (past :data:`MAX_UNSTORED_EVENTS`). It stops the batch timer and waits for the
        batch in flight; no timer batch follows (the final write, or :meth:`finish`, stores the
        rest). Once the write committed, pass the tail to :meth:`stored`."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._final = True
        while self._in_flight is not None:
            await asyncio.shield(self._in_flight)
        if not self._recording:
            return None
        batch = list(self._unstored)
        if self._started is None:
            first = batch[0] if batch else end
            if first is None:
                return None
            self._started = first.event.HasField("turn_start") or first.event.HasField("attempt_start")
        if not self._started:
            return None
        events = [(r.event.sequence_number, r.event.SerializeToString()) for r in batch]
        if events:
            self._sealed_through = max(self._sealed_through, events[-1][0])
        if end is not None:
            events.append((end.event.sequence_number, end.event.SerializeToString()))
        return StreamTail(events, end, len(batch)) if events else None

    def stored(self, tail: StreamTail) -> None:
        """``tail`` (from :meth:`tail`) has committed: its events leave memory, and its TurnEnd,
        when it has one, is not stored again when it is sent."""
        del self._unstored[: tail.count]
        if tail.end is not None:
            self._stored_end = tail.end

    async def store_end(self, end: Any) -> None:
        """Store what is left of the stream with its TurnEnd ``end`` (a prepared response, not
        sent yet), before it is sent: for a TurnEnd hooks shaped after the turn's final write
        (``on_chat_error``, the hook timeline). Never raises: when the write fails it is logged,
        and :meth:`finish` tries again once the TurnEnd was sent."""
        tail = await self.tail(end)
        if tail is None:
            return
        try:
            await self._store.append_events(
                self.conversation_id, self.request_id, tail.events, ended=True, lease=self._lease()
            )
        except LeaseLost as error:
            self._lease_lost(error)
            return
        except Exception as error:
            log.warning("turn %s: storing its TurnEnd failed: %s", self.request_id, error)
            return
        self.stored(tail)

    async def finish(self, *, ended: bool = True) -> None:
        """Store everything left, its TurnEnd included, and mark the stream ended, unless that
        was stored already (:meth:`stored`). With ``ended`` False (a turn left running for the
        next start to recover) the TurnEnd is not stored and the stream stays open. Never
        raises."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._in_flight is not None:
            await asyncio.shield(self._in_flight)
        if not ended and self._unstored and self._unstored[-1].event.HasField("turn_end"):
            self._unstored.pop()
        ending = self._started and ended and self._stored_end is None
        if self._recording and (self._unstored or ending):
            await self._flush(ended=ended)
        # The turn's last write is done: the fence's callbacks lead back to the turn, and kept,
        # its objects would wait for the cycle collector (docs/architecture.md, "A turn's objects").
        lease = self._lease()
        self._lease, self._lost = (lambda: lease), None
