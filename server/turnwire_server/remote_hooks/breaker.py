"""The circuit breaker of one remote hook server (docs/semantics.md §4, remote middleware).

Closed: calls go through, and ``failure_threshold`` failures in a row open it. Open: for
``open_seconds`` no call goes through (the caller applies its failure mode at once, without an
RPC). Then half-open: exactly one call goes through as a probe; its success closes the breaker,
its failure opens it for another ``open_seconds``. A few dozen lines of our own rather than a
dependency: the async breakers on PyPI either need Tornado (pybreaker) or are unmaintained
(aiobreaker), and the states must feed our own metrics and re-subscription.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """Consecutive-failure breaker; not thread-safe (one event loop uses it).

    ``on_change(old, new)`` is called on every state change (metrics, logs, re-subscribing);
    ``clock`` returns monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        failure_threshold: int,
        open_seconds: float,
        *,
        on_change: Callable[[BreakerState, BreakerState], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.open_seconds = open_seconds
        self.state: BreakerState = "closed"
        self.failures = 0
        self._opened_at = 0.0
        self._probing = False
        self._on_change = on_change
        self._clock = clock

    def allow(self) -> bool:
        """True when a call may go out now. While open, False until ``open_seconds`` passed;
        then True once (the probe) and False for other callers until the probe reports."""
        if self.state == "closed":
            return True
        if self.state == "open":
            if self._clock() - self._opened_at < self.open_seconds:
                return False
            self._set("half_open")
        if self._probing:
            return False
        self._probing = True
        return True

    def succeeded(self) -> None:
        """A call got a usable answer: reset the count; a probe's success closes the breaker."""
        self.failures = 0
        self._probing = False
        if self.state != "closed":
            self._set("closed")

    def released(self) -> None:
        """A call that went out ended without an outcome (the turn was cancelled): a probe's slot
        is free again, nothing is counted."""
        self._probing = False

    def failed(self) -> None:
        """A call failed (transport, deadline, status or unusable answer)."""
        self.failures += 1
        self._probing = False
        if self.state == "half_open" or (self.state == "closed" and self.failures >= self.failure_threshold):
            self._opened_at = self._clock()
            self._set("open")

    def _set(self, state: BreakerState) -> None:
        old, self.state = self.state, state
        if self._on_change is not None:
            self._on_change(old, state)
