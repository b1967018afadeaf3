"""The engine's Prometheus metrics (prometheus-client's default registry).

Labels are bounded sets, never conversation or request ids: ``entry`` (:data:`TurnEntry`),
``status`` (a turn's end), ``model`` (:func:`model_label`: a model id from the configuration,
else ``<provider>:other``), ``type`` (a token kind), ``finish_reason`` (the provider-neutral
set), ``tool`` (a tool the server runs: its registered names), ``outcome``
(``turnwire.hooks.ToolCallOutcome``), ``provider`` (a configured provider name), ``reason``
(``turnwire.error_classes.ErrorClass``) and ``tenant`` (a configured tenant, "" for the default
one: ``turnwire_server.tenant_keys``). Each is observed once per event kind (a turn, a step,
a tool call, a first token), never per streamed chunk. Serving them over HTTP is the server's
business (docs/operate/metrics.md), not the engine's.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from turnwire.error_classes import classify_error
from turnwire.types import Cost, Usage
from turnwire_server.tenant_keys import tenant_of_key

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TURN_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

TURNS = Counter(
    "turnwire_turns",
    "Turns ended, by how they entered (chat, save_messages, continue, tool_results, tool_approvals, "
    "submission, recovery) and how they ended (completed, error, aborted, interrupted, skipped).",
    ["entry", "status"],
)

TURN_DURATION = Histogram(
    "turnwire_turn_duration_seconds",
    "Wall time of a turn in seconds, from its admission (queueing included) to its TurnEnd.",
    ["status"],
    buckets=_TURN_BUCKETS,
)

TIME_TO_FIRST_TOKEN = Histogram(
    "turnwire_time_to_first_token_seconds",
    "Seconds from a turn's admission to the first text or reasoning token of its model "
    "(queueing, storing the input, hooks and the model's own latency included); once per turn.",
    ["model"],
    buckets=_LATENCY_BUCKETS,
)

STEPS = Counter(
    "turnwire_steps",
    "Model steps (calls) that finished, by model and finish reason (stop, length, tool-calls, "
    "content-filter, error, other).",
    ["model", "finish_reason"],
)

TOKENS = Counter(
    "turnwire_tokens",
    "Tokens the providers reported, by model and type (input, output, reasoning, cached_input, "
    "cache_write_input); steps cut short and compaction summaries included.",
    ["model", "type"],
)

COST = Counter(
    "turnwire_cost_usd",
    "US dollars the model calls cost, priced from their usage (docs/cost.md), by tenant, provider "
    "and model; steps cut short and compaction summaries included, calls of unknown cost not.",
    ["tenant", "provider", "model"],
)

FALLBACKS = Counter(
    "turnwire_fallbacks",
    "Steps sent to a fallback model after their model failed before any output, by the provider "
    "entry that failed, the one fallen back to, and the failure's classification (rate_limit, "
    "transient).",
    ["from_provider", "to_provider", "classification"],
)
BREAKER_OPENS = Counter(
    "turnwire_provider_breaker_opens",
    "Times a provider entry's circuit breaker opened (fallback.breaker_failures failures in a row): "
    "its steps then go to their fallbacks for fallback.breaker_open_seconds.",
    ["provider"],
)
TOOL_CALLS = Counter(
    "turnwire_tool_calls",
    "Server-side tool calls, by tool and outcome (executed, blocked, substituted, failed).",
    ["tool", "outcome"],
)

TOOL_CALL_DURATION = Histogram(
    "turnwire_tool_call_duration_seconds",
    "Wall time of a server-side tool call in seconds (before_tool_call and the execution).",
    ["tool"],
    buckets=_TOOL_BUCKETS,
)

PROVIDER_ERRORS = Counter(
    "turnwire_provider_errors",
    "Model steps that failed with a provider error, by provider and error class "
    "(turnwire.error_classes: rate_limit, overloaded, context_overflow …).",
    ["provider", "reason"],
)

QUEUED_TURNS = Gauge(
    "turnwire_queued_turns",
    "Turns admitted by this process that wait for their conversation's earlier turns.",
    multiprocess_mode="livesum",  # serve --workers N: the sum over the live workers
)

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

BUDGET_EXHAUSTED = Counter(
    "turnwire_budget_exhausted",
    "Turns a budget stopped (ended with reason BUDGET_EXHAUSTED) or refused before they started, by "
    "tenant and budget (turn, conversation, tenant/day, tenant/month).",
    ["tenant", "budget"],
)

BUDGET_CLAMPED_STEPS = Counter(
    "turnwire_budget_clamped_steps",
    "Model steps sent with max_output_tokens lowered to what their budgets had room for, by tenant.",
    ["tenant"],
)

BUDGET_SPENT_TOKENS = Gauge(
    "turnwire_budget_spent_tokens",
    "Tokens a tenant's current period spent (settled steps), by tenant and budget (tenant/day, "
    "tenant/month), as of this process's last charge of it.",
    ["tenant", "budget"],
)

BUDGET_SPENT_USD = Gauge(
    "turnwire_budget_spent_usd",
    "US dollars a tenant's current period spent (settled steps), by tenant and budget (tenant/day, "
    "tenant/month), as of this process's last charge of it.",
    ["tenant", "budget"],
)

OTHER_MODEL = "other"
"""The model part of the ``model`` label of a model id the configuration does not name."""


def model_label(model_id: str, known: frozenset[str] | None) -> str:
    """The ``model`` label of ``model_id`` (``provider:model``): itself when ``known`` (the ids the
    configuration names) holds it or is None, else ``<provider>:other``, so a client choosing
    model names cannot grow the label set (the provider part is always a configured one)."""
    if known is None or model_id in known:
        return model_id
    return f"{model_id.partition(':')[0]}:{OTHER_MODEL}"


def count_tokens(model: str, usage: Usage) -> None:
    """Add ``usage``'s counts to :data:`TOKENS` under the ``model`` label (non-zero ones only)."""
    for kind, count in (
        ("input", usage.input_tokens),
        ("output", usage.output_tokens),
        ("reasoning", usage.reasoning_tokens),
        ("cached_input", usage.cached_input_tokens),
        ("cache_write_input", usage.cache_write_input_tokens),
    ):
        if count:
            TOKENS.labels(model, kind).inc(count)


def count_cost(key: str, provider: str, model: str, cost: Cost | None) -> None:
    """Add ``cost`` (None: unknown, not counted) to :data:`COST` under the tenant of the
    conversation key ``key`` and the ``provider`` and ``model`` labels."""
    if cost is not None:
        COST.labels(tenant_of_key(key), provider, model).inc(cost.usd)


def count_provider_error(provider: str, error: BaseException) -> None:
    """Count a step failed by ``error`` under its :func:`~turnwire.error_classes.classify_error` class."""
    PROVIDER_ERRORS.labels(provider, classify_error(error)).inc()
