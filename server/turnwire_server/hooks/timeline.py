"""A turn's hook timeline: which hook of which middleware ran, when, and for how long.

Kept only when ``events.hook_timeline`` is on; sent in ``TurnEnd.metadata["hook_timeline"]``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class HookTiming:
    """One hook call in a turn's timeline: offsets and durations in milliseconds."""

    middleware: str
    hook: str
    start_ms: float
    duration_ms: float
    failed: bool = False
    calls: int = 1


@dataclass(slots=True)
class HookTimeline:
    """Which hook of which middleware ran, in order, and how long it took.

    ``on_chunk`` calls are folded into one entry per middleware (``calls`` and
    summed ``duration_ms``) so the timeline stays small on long streams.
    """

    origin: float = field(default_factory=time.perf_counter)
    entries: list[HookTiming] = field(default_factory=list)
    _chunk_entries: dict[str, HookTiming] = field(default_factory=dict)

    def add(self, middleware: str, hook: str, started: float, ended: float, failed: bool) -> None:
        """Record one call; ``started``/``ended`` are ``time.perf_counter()`` values."""
        duration = (ended - started) * 1000.0
        if hook == "on_chunk":
            entry = self._chunk_entries.get(middleware)
            if entry is not None:
                entry.calls += 1
                entry.duration_ms += duration
                entry.failed = entry.failed or failed
                return
            entry = HookTiming(middleware, hook, (started - self.origin) * 1000.0, duration, failed)
            self._chunk_entries[middleware] = entry
            self.entries.append(entry)
            return
        self.entries.append(HookTiming(middleware, hook, (started - self.origin) * 1000.0, duration, failed))

    def as_dicts(self) -> list[dict[str, Any]]:
        """The timeline as JSON-ready dicts, in call order."""
        return [dataclasses.asdict(entry) for entry in self.entries]
