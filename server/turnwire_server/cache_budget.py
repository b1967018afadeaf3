"""One byte budget for every per-process cache that grows with conversations (issue 32, item 11).

The store's decoded messages (``store/core/message_cache.py``), the engine's open-call searches
(``engine/pending_calls.py``) and the provider adapters' per-message conversions, prefix states
and kept JSON bodies (``providers/convert.py``, ``providers/json_body.py``) each keep entries
here, in one least-recently-used order: past :attr:`CacheBudget.limit_bytes` (``memory.cache_bytes``,
docs/configuration.md) the entry used longest ago goes first, whichever cache it belongs to. So
the memory they hold together is bounded in bytes, not by separate counts of messages that can
be 150 bytes or 4 MiB each (docs/limits.md, "Memory").

Each cache says what an entry costs when it keeps it: the encoded length of what it holds (a
message's serialized bytes, a JSON body's bytes) plus a per-entry overhead constant, measured
once with ``bench/cache_entry_sizes.py`` (RSS of a process before and after keeping 20,000
entries of 150-byte and 4 KiB messages, divided by their number; the constants are the fixed
part of those figures). Entries share objects (the adapters' entries hold the store's message
objects, the JSON entries the conversions' wire dicts): each counts only what it made itself.
All entries of a conversation are used by its turn, so they age together and leave together.

Lookups are one dict probe and one ``move_to_end``, as each cache's own OrderedDict was; nothing
is done per streamed chunk. Not thread-safe: the event loop's (every cache here is used from it).
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Final

from prometheus_client import Gauge

DEFAULT_CACHE_BYTES: Final = 128 << 20
"""``memory.cache_bytes``' default: 128 MiB, so a process stays well within the shipped
Kubernetes limit of 512 MiB (``deploy/kubernetes/deployment.yaml``) beside its ~110 MiB at start
and what its running turns hold."""

ENTRY_OVERHEAD_BYTES: Final = 200
"""What the budget's own bookkeeping costs per entry, added to every entry's size: its key and
value tuples and its ordered-dict node (``sys.getsizeof`` of the tuples, 56 bytes each, and
CPython's OrderedDict node and dict slot)."""

_REPORT_STEP_BYTES: Final = 1 << 20  # the gauge moves by this much (less for small budgets), not per put

CACHE_BYTES = Gauge(
    "turnwire_cache_bytes",
    "Bytes the caches of conversations hold by their own count (memory.cache_bytes is the limit), "
    "updated in steps of 1 MiB (1/64 of a smaller limit).",
    multiprocess_mode="livesum",  # serve --workers N: the sum over the live workers
)
CACHE_LIMIT_BYTES = Gauge(
    "turnwire_cache_limit_bytes",
    "memory.cache_bytes: the bytes the caches of conversations may hold in this process.",
    multiprocess_mode="livesum",
)


class CacheRegion:
    """One cache's entries in a :class:`CacheBudget`: keys are the cache's own (any hashable),
    values what it keeps, sizes in bytes. ``counted_bytes`` is what its entries count now."""

    __slots__ = ("budget", "counted_bytes", "name")

    def __init__(self, budget: CacheBudget, name: str) -> None:
        self.budget = budget
        self.name = name
        self.counted_bytes = 0

    def get(self, key: Hashable) -> object | None:
        """The value kept under ``key``, now the most recently used; None when none is."""
        return self.budget.get((self, key))

    def put(self, key: Hashable, value: object, size_bytes: int) -> None:
        """Keep ``value`` under ``key`` (replacing what was there), counting ``size_bytes`` plus
        :data:`ENTRY_OVERHEAD_BYTES`; then
        evict least recently used entries of any region until the budget holds. A value larger
        than the whole budget is not kept."""
        self.budget.put((self, key), value, size_bytes)

    def discard(self, key: Hashable) -> None:
        """Drop what is kept under ``key``, if anything."""
        self.budget.discard((self, key))


class CacheBudget:
    """Entries of several caches (:class:`CacheRegion`) in one LRU order, bounded by the sum of
    their sizes: ``limit_bytes`` (bytes, ≥ 0; 0 keeps nothing). ``counted_bytes`` ≤
    ``limit_bytes`` after every call. ``exported``: the process's budget, whose figures are the
    ``turnwire_cache_bytes`` and ``turnwire_cache_limit_bytes`` gauges."""

    def __init__(self, limit_bytes: int = DEFAULT_CACHE_BYTES, *, exported: bool = False) -> None:
        self.limit_bytes = limit_bytes
        self.counted_bytes = 0
        self._entries: collections.OrderedDict[tuple[CacheRegion, Hashable], tuple[object, int]] = (
            collections.OrderedDict()
        )
        self._exported = exported
        self._reported = 0
        self._step = max(1, min(_REPORT_STEP_BYTES, limit_bytes // 64))
        if exported:
            CACHE_LIMIT_BYTES.set(limit_bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def region(self, name: str) -> CacheRegion:
        """A new cache's share of this budget (``name`` says which cache, for tests and logs)."""
        return CacheRegion(self, name)

    def resize(self, limit_bytes: int) -> None:
        """Set the limit (``memory.cache_bytes``, at start), evicting down to it."""
        if limit_bytes < 0:
            raise ValueError(f"memory.cache_bytes: must be at least 0, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._step = max(1, min(_REPORT_STEP_BYTES, limit_bytes // 64))
        if self._exported:
            CACHE_LIMIT_BYTES.set(limit_bytes)
        self._evict()

    def clear(self) -> None:
        """Drop every entry of every region."""
        while self._entries:
            self._pop_oldest()
        self._report()

    def get(self, key: tuple[CacheRegion, Hashable]) -> object | None:
        """:meth:`CacheRegion.get` with the region in the key."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: tuple[CacheRegion, Hashable], value: object, size_bytes: int) -> None:
        """:meth:`CacheRegion.put` with the region in the key."""
        self.discard(key)
        size_bytes += ENTRY_OVERHEAD_BYTES
        if size_bytes > self.limit_bytes:
            return
        self._entries[key] = (value, size_bytes)
        key[0].counted_bytes += size_bytes
        self.counted_bytes += size_bytes
        self._evict()

    def discard(self, key: tuple[CacheRegion, Hashable]) -> None:
        """:meth:`CacheRegion.discard` with the region in the key."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            key[0].counted_bytes -= entry[1]
            self.counted_bytes -= entry[1]

    def _evict(self) -> None:
        while self.counted_bytes > self.limit_bytes:
            self._pop_oldest()
        if abs(self.counted_bytes - self._reported) >= self._step:
            self._report()

    def _pop_oldest(self) -> None:
        (region, _), (_, size) = self._entries.popitem(last=False)
        region.counted_bytes -= size
        self.counted_bytes -= size

    def _report(self) -> None:
        self._reported = self.counted_bytes
        if self._exported:
            CACHE_BYTES.set(self.counted_bytes)


CACHES: Final = CacheBudget(exported=True)
"""This process's budget, shared by every cache of conversations; ``app.py`` sets its limit from
``memory.cache_bytes`` at start."""
