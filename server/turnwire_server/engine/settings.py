"""The engine's settings: the ``limits:``, ``events:``, ``checkpoint:`` and ``durability:``
sections of the configuration, declared here and handed to the engine as validated
(:class:`EngineSettings`); :mod:`turnwire_server.config` assembles them with the other
components' sections into the YAML/environment format (docs/configuration.md).

``limits:`` also bounds the API layer (message sizes, concurrent calls, the drain and grace
windows, the progress keepalive), which reads it from the same validated section.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ConfigDict, Field

from turnwire.compaction import CompactionConfig
from turnwire_server.config_section import ConfigSection
from turnwire_server.engine.budget_admission import FirstStepEstimates
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.fallback import Fallbacks


class _EngineSection(ConfigSection):
    # Frozen: the engine and the API share one validated instance; nobody changes it after start.
    model_config = ConfigDict(frozen=True)


class LimitsSettings(_EngineSection):
    """Bounds. Sizes in bytes, times in seconds."""

    max_steps: int = Field(10, ge=1, le=1000)
    max_subagent_depth: int = Field(
        3, ge=1, le=16, description="sub-agent calls nested at most (docs/subagents.md)"
    )
    max_message_bytes: int = Field(1 << 20, ge=1024)
    max_receive_message_bytes: int = Field(16 << 20, ge=4096)
    max_concurrent_rpcs: int = Field(
        10_000,
        ge=1,
        description=(
            "ChatService streams open at once (the turn calls, ResumeTurn, WatchSubmission); past it a "
            "call gets RESOURCE_EXHAUSTED (reason OVERLOADED, with RetryInfo). Health checks, reflection "
            "and the unary ChatService calls do not count. With authentication on, one tenant holds at "
            "most its tenant_shares: of it"
        ),
    )
    max_queued_turns_per_conversation: int = Field(32, ge=1)
    concurrent_input: Literal["enqueue", "reject", "interrupt", "rollback"] = Field(
        "enqueue",
        description=(
            "what new input does on a conversation with a turn running or queued when its request "
            "names no concurrent_input_strategy: enqueue (wait, FIFO), reject (FAILED_PRECONDITION), "
            "interrupt (stop the running turn, run next) or rollback (stop it and remove what it stored)"
        ),
    )
    drain_seconds: float = Field(
        5.0,
        ge=0,
        description=(
            "SIGTERM: health turns NOT_SERVING at once while calls are still taken for this long, so "
            "readiness probes and load balancers move traffic away first; then the stop "
            "(shutdown_grace_seconds). 0: stop taking calls at once. A second SIGTERM/SIGINT ends it early"
        ),
    )
    shutdown_grace_seconds: float = Field(10.0, ge=0)
    tool_timeout_seconds: float = Field(60.0, gt=0)
    max_tool_output_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=3 << 20,
        description="a tool result with more JSON than this becomes an error the model is told about",
    )
    stream_stall_timeout_seconds: float = Field(
        0.0, ge=0, description="stall watchdog: no event for this long ends a turn INTERRUPTED (0: off)"
    )
    stream_buffer_events: int = Field(
        1024, ge=16, description="events one stream holds for a slow client before its turn waits"
    )
    slow_reader_timeout_seconds: float = Field(
        30.0, gt=0, description="a client that reads nothing of a full buffer this long has its turn stopped"
    )
    progress_interval_seconds: float = Field(
        15.0,
        ge=0,
        description=(
            "a turn stream (Chat, SaveMessages, ContinueLastTurn, SubmitToolResults/Approvals, ResumeTurn, "
            "WatchSubmission) silent this long sends a Progress keepalive, and again after each further "
            "interval, so proxies and clients with idle timeouts keep it open (0: off)"
        ),
    )


class EventsSettings(_EngineSection):
    """The event stream. ``text_coalesce_ms`` merges consecutive text and reasoning deltas of
    one block arriving within that many milliseconds into one event (0: off);
    ``hook_timeline`` adds which hook of which middleware ran, when and for how long, to
    ``TurnEnd.metadata["hook_timeline"]``."""

    text_coalesce_ms: float = Field(0.0, ge=0, le=1000)
    hook_timeline: bool = Field(False, description="put each turn's hook timeline in TurnEnd.metadata")


class DurabilitySettings(_EngineSection):
    """Resume, recovery, expiry and retention (docs/semantics.md §5, §7, §8, §12). Times in seconds;
    0 turns a retention or expiry off."""

    event_retention_seconds: float = Field(
        3600.0, ge=0, description="how long a finished turn's events stay re-attachable with ResumeTurn"
    )
    recover_on_start: bool = Field(
        True, description="finish turns a crash interrupted when the sidecar starts (within recovery_budget)"
    )
    recovery_budget: int = Field(
        2, ge=0, le=100, description="recoveries one turn may get (crash and stall), counted in the store"
    )
    max_concurrent_recoveries: int = Field(
        16, ge=1, le=10_000, description="crash recoveries that call the model at once after a start"
    )
    lease_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="a running turn's lease; renewed every third of it; a lapsed one is recovered elsewhere",
    )
    store_outage_seconds: float = Field(
        60.0,
        ge=0,
        le=3600,
        description="how long a turn's final write is retried while the store is unavailable (0: once)",
    )
    stall_recovery: bool = Field(
        False, description="after the stall watchdog interrupts a turn, recover it in the same stream"
    )
    pending_expiry_seconds: float = Field(
        86400.0, ge=0, description="pending client tool calls, approvals and submissions expire after this"
    )
    conversation_retention_seconds: float = Field(
        0.0, ge=0, description="conversations not updated for this long are deleted (0: kept forever)"
    )
    sweep_interval_seconds: float = Field(60.0, gt=0, description="how often expiry and retention run")
    max_pending_submissions_per_conversation: int = Field(
        1000, ge=1, description="past it SubmitMessages answers RESOURCE_EXHAUSTED"
    )
    max_running_submissions: int = Field(
        64,
        ge=1,
        le=100_000,
        description="submission turns one replica runs at once; more wait for a replica with a free slot",
    )


class StoreCheckpointSettings(_EngineSection):
    """How often a streaming reply is checkpointed, in milliseconds (besides step ends)."""

    interval_ms: float = Field(250.0, ge=10)


def new_replica_id() -> str:
    """A new process's replica id, ``replica-<12 hex digits>`` (random: a restarted process is
    another replica, so it never takes its predecessor's turns for its own running ones)."""
    return f"replica-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """What the engine runs with: the validated sections it reads, taken whole, plus what
    start-up decides. Every duration in a section carries its unit in its name.

    ``default_model`` and ``system_prompt``: the configuration's top-level fields.
    ``limits``, ``events``, ``checkpoint``, ``durability``: those sections (see each class).
    ``compaction``: the session's context compaction (from ``configure_session``; None: off,
    docs/semantics.md §9).
    ``metric_models``: the model ids the configuration names, which label the metrics by name
    (any other is ``<provider>:other``, see ``engine/metrics.py``); None: every id by name.
    ``replica_id`` names this process as the owner of the turns it runs; it renews their
    leases so they last ``durability.lease_seconds`` past each renewal (a lapsed lease marks a
    turn whose process died, for another replica to recover).
    ``redact`` masks the secrets in text that enters from outside (a provider's error, a tool's
    error text) before the turn reports, stores, traces or logs it; the application gives the
    process's redactor (``turnwire_server.redaction``, docs/security.md "Secrets"); the default
    keeps text as it is.
    ``prices`` prices each step's usage (the ``pricing:`` section, docs/cost.md).
    ``fallbacks``: the models a step falls back to and the providers' breakers (the ``fallback:``
    section, :mod:`~turnwire_server.engine.fallback`).
    ``budgets``: the ``budgets:`` section (docs/cost.md, "Budgets"); ``first_steps``: what this
    process learned of its conversations' prompts, which sizes a new turn's first reservation
    (:mod:`~turnwire_server.engine.budget_admission`).
    """

    default_model: str = "scripted:demo"
    system_prompt: str = "You are a helpful assistant."
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    events: EventsSettings = field(default_factory=EventsSettings)
    checkpoint: StoreCheckpointSettings = field(default_factory=StoreCheckpointSettings)
    durability: DurabilitySettings = field(default_factory=DurabilitySettings)
    compaction: CompactionConfig | None = None
    metric_models: frozenset[str] | None = None
    replica_id: str = field(default_factory=new_replica_id)
    redact: Callable[[str], str] = str
    prices: PriceBook = field(default_factory=PriceBook)
    fallbacks: Fallbacks = field(default_factory=Fallbacks)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    first_steps: FirstStepEstimates = field(default_factory=FirstStepEstimates)
