"""The middleware chain's Prometheus metrics (prometheus-client's default registry).

``middleware`` is a middleware's name (its class name, or the name a remote entry was given:
set by the configuration, so bounded), ``hook`` a hook name. Remote hook servers have their own,
finer metrics (``remote_hooks/metrics.py``).
"""

from __future__ import annotations

from prometheus_client import Counter

HOOK_ERRORS = Counter(
    "turnwire_hook_errors",
    "Hook calls that raised, by middleware and hook: swallowed ones (observing hooks) and those "
    "that failed a tool call or a turn (before_turn, before_step, before_tool_call, configure_session).",
    ["middleware", "hook"],
)
