"""In-process per-conversation turn locks for single-process store backends."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager


class _Place:
    """A place in a key's line: a holder, a waiter, or a reservation nobody waits on yet.
    ``token`` names it (a request or submission id, "" when unnamed); ``first`` marks a place
    put at the head of the line."""

    __slots__ = ("first", "key", "token", "turn")

    def __init__(self, key: str, token: str, first: bool = False) -> None:
        self.key = key
        self.token = token
        self.first = first
        self.turn = asyncio.Event()  # set once this place is first in line


class LocalTurnLocks:
    """One first-in-first-out lock per key (conversation id), created on demand.

    Waiters acquire in arrival order. A place in line can also be reserved ahead of time under a
    token (a submission's id, at acceptance): the later :meth:`hold` with that token takes the
    reserved place, so it goes before everyone who came after the reservation. A key's line is
    dropped as soon as nobody holds, waits for or reserved it, so the table holds only
    conversations with a turn running or queued. Bound to the running event loop; protects
    nothing across processes.
    """

    def __init__(self) -> None:
        self._lines: dict[str, deque[_Place]] = {}
        self._reserved: dict[str, _Place] = {}

    def __len__(self) -> int:
        """The number of keys currently held, waited for or reserved."""
        return len(self._lines)

    def places(self, key: str) -> int:
        """How many hold, wait for or reserved ``key``'s lock (0: none)."""
        line = self._lines.get(key)
        return 0 if line is None else len(line)

    def head(self, key: str) -> str | None:
        """The token of the place holding ``key``'s lock, or first in line (None: nobody)."""
        line = self._lines.get(key)
        return None if not line else line[0].token

    def hold(self, key: str, token: str = "", *, first: bool = False) -> AbstractAsyncContextManager[None]:
        """Async context manager holding ``key``'s lock for the ``async with`` body.

        Waits (FIFO) while another task holds it or an earlier place is reserved; with the
        ``token`` of a reservation of ``key``, from that reserved place. ``first`` waits right
        behind the holder and the places taken ``first`` before it, ahead of all others (a
        reserved place then moves there). Cancelling a waiting task leaves the line cleanly.
        Not reentrant: a task holding ``key`` that enters ``hold(key)`` again deadlocks.
        """
        return self._hold(key, token, first)

    def reserve(self, key: str, token: str, *, first: bool = False) -> None:
        """Reserve the next place in ``key``'s line (``first``: as :meth:`hold`'s) for the
        :meth:`hold` that names ``token`` (until then the lock waits at that place); when
        ``token`` holds one already, ``first`` moves it up, else nothing changes."""
        place = self._reserved.get(token)
        if place is None:
            self._reserved[token] = self._join(key, token, first=first)
        elif first:
            self._reserved[token] = self._move_up(place)

    def drop(self, token: str) -> None:
        """Give up the place reserved under ``token`` if no :meth:`hold` took it (a no-op else)."""
        place = self._reserved.pop(token, None)
        if place is not None:
            self._leave(place)

    def drop_all(self, key: str) -> None:
        """Give up every place reserved in ``key``'s line that no :meth:`hold` took."""
        for token in [token for token, place in self._reserved.items() if place.key == key]:
            self.drop(token)

    @asynccontextmanager
    async def _hold(self, key: str, token: str, first: bool) -> AsyncIterator[None]:
        place = self._reserved.get(token) if token else None
        if place is not None and place.key == key:
            del self._reserved[token]
            if first:
                place = self._move_up(place)
        else:
            place = self._join(key, token, first=first)
        try:
            await place.turn.wait()
            yield
        finally:
            self._leave(place)

    def _join(self, key: str, token: str, *, first: bool = False) -> _Place:
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = deque()
        place = _Place(key, token, first)
        if first and line:
            # Behind the holder and the earlier first places: those go first among themselves.
            at = 1
            while at < len(line) and line[at].first:
                at += 1
            line.insert(at, place)
        else:
            line.append(place)
        if len(line) == 1:
            place.turn.set()
        return place

    def _move_up(self, place: _Place) -> _Place:
        """``place`` put first (behind the holder and the first places); unchanged when it is
        first already or holds the lock."""
        if place.first or place.turn.is_set():
            return place
        self._leave(place)
        return self._join(place.key, place.token, first=True)

    def _leave(self, place: _Place) -> None:
        line = self._lines[place.key]
        first = line[0] is place
        line.remove(place)
        if not line:
            del self._lines[place.key]
        elif first:
            line[0].turn.set()
