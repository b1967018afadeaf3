"""The engine's Prometheus counters (prometheus-client's default registry).

Labels are bounded sets (a trigger, a strategy name, a classification), never conversation or
request ids. Exposing them over HTTP is the server's business, not the engine's.
"""

from __future__ import annotations

from prometheus_client import Counter

COMPACTIONS = Counter(
    "turnwire_compactions",
    "Context compactions (docs/semantics.md §9) by trigger, strategy and whether they shortened the view.",
    ["reason", "strategy", "shortened"],
)

CHAT_ERROR_CLASSIFICATIONS = Counter(
    "turnwire_chat_error_classifications",
    "Failed turns by what classify_chat_error returned (none: no middleware classified it).",
    ["classification"],
)
