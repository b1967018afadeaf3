"""Prometheus metrics of remote hook servers (prometheus-client's default registry); the whole
list is in docs/operate/metrics.md.

Labels are bounded: ``server`` is the address as configured, ``hook`` a hook name, ``kind`` an
error kind (a gRPC status code name in lower case, ``invalid_response`` or ``breaker_open``).
Serving them is the server's business, as for the engine's (engine/metrics.py).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CALLS = Counter(
    "turnwire_remote_hook_calls",
    "RPCs sent to remote hook servers (an OnChunks call counts once, its batches in CHUNK_BATCHES).",
    ["server", "hook"],
)

ERRORS = Counter(
    "turnwire_remote_hook_errors",
    "Remote hook calls that failed, by kind; breaker_open counts calls skipped while the breaker was open.",
    ["server", "hook", "kind"],
)

CALL_DURATION = Histogram(
    "turnwire_remote_hook_call_duration_seconds",
    "Wall time of remote hook calls in seconds, from when the turn asked for each (its wait behind "
    "earlier calls included), failed ones included.",
    ["server", "hook"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)

BREAKER_STATE = Gauge(
    "turnwire_remote_hook_breaker_state",
    "A remote hook server's circuit breaker: 0 closed, 1 half-open, 2 open.",
    ["server"],
    multiprocess_mode="livemax",  # serve --workers N: the most open breaker among the live workers
)

CHUNK_BATCHES = Counter(
    "turnwire_remote_hook_chunk_batches",
    "OnChunks request messages (batches) sent.",
    ["server"],
)

CHUNK_EVENTS = Counter(
    "turnwire_remote_hook_chunk_events",
    "Chunk events for OnChunks by result: sent, or dropped (buffer full, breaker open, call failed).",
    ["server", "result"],
)

SESSION_TURNS = Counter(
    "turnwire_remote_hook_session_turns",
    "Turns whose hook calls went on a HookSession, by its stream: opened for the turn, or kept from "
    "an earlier turn (reuse_hook_session).",
    ["server", "stream"],
)

BREAKER_VALUES = {"closed": 0, "half_open": 1, "open": 2}
