"""The stores' Prometheus metrics (prometheus-client's default registry).

``backend`` is ``sqlite`` or ``postgresql``; ``kind`` is ``group`` (a group commit: the writes
queued meanwhile in one transaction, as SQLite's writer and PostgreSQL's hot writes do) or
``single`` (a write in a transaction of its own).
"""

from __future__ import annotations

from prometheus_client import Histogram

COMMIT_DURATION = Histogram(
    "turnwire_store_commit_duration_seconds",
    "Seconds from a write transaction's start to its commit (waiting for a connection excluded; "
    "a group commit counts once, however many writes it carries).",
    ["backend", "kind"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
