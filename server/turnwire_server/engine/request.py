"""What the engine is asked to run (:class:`TurnRequest`) and its defaults (:class:`EngineSettings`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from turnwire.compaction import CompactionConfig
from turnwire.hooks import ConcurrentInputStrategy
from turnwire.tools import Tool
from turnwire_client.v1 import message_pb2

TurnEntry = Literal[
    "chat", "save_messages", "continue", "tool_results", "tool_approvals", "submission", "recovery"
]
"""How a turn came in: the RPC that started it (``Chat``, ``SaveMessages``, ``ContinueLastTurn``,
``SubmitToolResults``, ``SubmitToolApprovals``), a stored submission, or a crash recovery."""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """An admitted request for one turn.

    ``messages`` are the new messages to append (validated, ids assigned);
    ``continuation`` is true for ContinueLastTurn; ``response_type`` is the
    RPC's response class (it wraps ``TurnEvent`` in field ``event``);
    ``skip_unless_assistant_last`` ends the turn SKIPPED when the stored
    history does not end with an assistant message (ContinueLastTurn).
    ``disconnect`` is what the caller going away does: ``cancel`` the turn, or let it
    ``continue`` detached (re-attach with ResumeTurn; docs/semantics.md §5).
    ``client_tools`` are the request's client-side tools (:class:`turnwire.tools.ClientTool`),
    added after the server's tools and overriding those of the same name (docs/semantics.md §2, §6).
    ``tool_denials`` are ``(tool_call_id, reason)`` of calls the client denied just before this
    continuation: its stream announces them with ``ToolOutputDenied`` (docs/semantics.md §6).
    ``entry`` is how the turn came in (:data:`TurnEntry`; a label of the turn metrics).
    ``trace_context`` is the W3C trace context (``traceparent``, ``tracestate``) of the call that
    asked for the turn: its span continues that trace (:mod:`turnwire_server.engine.tracing`).
    ``concurrent_input`` is what the request does when its conversation has a turn running or
    queued (docs/semantics.md §5; None: ``EngineSettings.concurrent_input``).
    """

    conversation_id: str
    request_id: str
    messages: Sequence[message_pb2.Message]
    body: Mapping[str, Any]
    model: str
    continuation: bool
    response_type: Callable[[], Any]
    skip_unless_assistant_last: bool = False
    disconnect: Literal["cancel", "continue"] = "cancel"
    client_tools: Sequence[Tool] = ()
    tool_denials: Sequence[tuple[str, str]] = ()
    entry: TurnEntry = "chat"
    trace_context: Mapping[str, str] = field(default_factory=dict)
    concurrent_input: ConcurrentInputStrategy | None = None


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Engine-wide defaults; every duration carries its unit in its name.

    ``stream_stall_timeout_seconds`` 0 turns the stall watchdog off.
    ``max_tool_output_bytes``: a tool result whose JSON text is larger becomes the call's
    error (the model is told the size), so every stored message stays readable by clients
    with gRPC's default 4 MiB message limit (docs/semantics.md §12, big outputs).
    ``stream_buffer_events``: events a stream may hold for a client that reads slower than
    the turn writes; past it the turn waits for the client, and a client that brings the
    backlog down by nothing for ``slow_reader_timeout_seconds`` has its turn stopped
    (partial reply stored, ``SLOW_CONSUMER``).
    ``hook_timeline`` puts each turn's hook timeline in ``TurnEnd.metadata``.
    ``event_retention_seconds``: how long a finished turn's events stay re-attachable.
    ``recovery_budget``: recoveries (crash, stall) one turn may get, counted in the store;
    ``stall_recovery`` recovers a stalled turn in its own stream;
    ``max_concurrent_recoveries`` bounds the crash recoveries that run their steps at once.
    ``replica_id`` names this process as the owner of the turns it runs; it renews their
    leases so they last ``lease_seconds`` past each renewal (a lapsed lease marks a turn whose
    process died, for another replica to recover).
    ``pending_expiry_seconds``: pending client tool calls, approvals and submissions older
    than this expire (0: never).
    ``compaction``: the session's context compaction (from ``configure_session``; None: off,
    docs/semantics.md §9).
    ``metric_models``: the model ids the configuration names, which label the metrics by name
    (any other is ``<provider>:other``, see ``engine/metrics.py``); None: every id by name.
    ``concurrent_input``: the strategy of a request that names none (``limits.concurrent_input``).
    """

    default_model: str = "scripted:demo"
    system_prompt: str = "You are a helpful assistant."
    max_steps: int = 10
    max_queued_turns_per_conversation: int = 32
    text_coalesce_ms: float = 0.0
    checkpoint_interval_ms: float = 250.0
    tool_timeout_seconds: float = 60.0
    max_tool_output_bytes: int = 1 << 20
    stream_stall_timeout_seconds: float = 0.0
    stream_buffer_events: int = 1024
    slow_reader_timeout_seconds: float = 30.0
    hook_timeline: bool = False
    event_retention_seconds: float = 3600.0
    recovery_budget: int = 2
    max_concurrent_recoveries: int = 16
    replica_id: str = field(default_factory=lambda: f"replica-{uuid.uuid4().hex[:12]}")
    lease_seconds: float = 30.0
    stall_recovery: bool = False
    pending_expiry_seconds: float = 86400.0
    compaction: CompactionConfig | None = None
    metric_models: frozenset[str] | None = None
    concurrent_input: ConcurrentInputStrategy = "enqueue"
