"""What the engine is asked to run (:class:`TurnRequest`); its defaults are
:class:`~turnwire_server.engine.settings.EngineSettings`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from turnwire.hooks import ConcurrentInputStrategy
from turnwire.subagents import SubagentCall
from turnwire.tools import Tool
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.budget_settings import BudgetLimit

TurnEntry = Literal[
    "chat",
    "save_messages",
    "continue",
    "tool_results",
    "tool_approvals",
    "submission",
    "recovery",
    "subagent",
]
"""How a turn came in: the RPC that started it (``Chat``, ``SaveMessages``, ``ContinueLastTurn``,
``SubmitToolResults``, ``SubmitToolApprovals``), a stored submission, a crash recovery, or a
sub-agent's call (docs/subagents.md)."""


@dataclass(frozen=True, slots=True)
class ToolDenial:
    """A tool call the client denied just before a continuation: its id, its tool's name, the
    reason the model is given, and the call's stored input (JSON text) and approval id, which the
    continuation announces it with (docs/semantics.md §6)."""

    tool_call_id: str
    tool_name: str
    reason: str
    input_json: str = ""
    approval_id: str = ""


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """An admitted request for one turn.

    ``messages`` are the new messages to append (validated, ids assigned);
    ``continuation`` is true for ContinueLastTurn; ``response_type`` is the
    RPC's response class (it wraps ``TurnEvent`` in field ``event``);
    ``skip_unless`` ends the turn SKIPPED (``NothingToContinue``) when the stored history, read
    under the turn lock, is empty (``"history"``: SaveMessages with no messages) or does not end
    with an assistant message (``"assistant_last"``: ContinueLastTurn); docs/semantics.md §1.
    ``disconnect`` is what the caller going away does: ``cancel`` the turn, or let it
    ``continue`` detached (re-attach with ResumeTurn; docs/semantics.md §5).
    ``client_tools`` are the request's client-side tools (:class:`turnwire.tools.ClientTool`),
    added after the server's tools and overriding those of the same name (docs/semantics.md §2, §6).
    ``tool_denials`` are the calls (:class:`ToolDenial`) the client denied just before this
    continuation: its stream announces them with ``ToolOutputDenied`` (docs/semantics.md §6).
    ``entry`` is how the turn came in (:data:`TurnEntry`; a label of the turn metrics).
    ``trace_context`` is the W3C trace context (``traceparent``, ``tracestate``) of the call that
    asked for the turn: its span continues that trace (:mod:`turnwire_server.engine.tracing`).
    ``concurrent_input`` is what the request does when its conversation has a turn running or
    queued (docs/semantics.md §5; None: ``limits.concurrent_input``).
    ``budget`` is the request's own turn budget, which lowers ``budgets.turn`` and never raises
    it (docs/cost.md, "Budgets"; None: the configured one). ``principal`` is the caller who asked
    for the turn ("" when authentication is off, or unknown): the turn runs under its budgets.
    ``subagent_path`` is set on a sub-agent's turn (entry ``subagent``): the sub-agent calls from
    the top-level turn down to this one, outermost first (docs/subagents.md); its length is the
    turn's depth. ``legacy_call_keys``: the turn's tool calls keep the idempotency keys of the
    sidecar that stored it (a recovery of a turn whose ``TurnSpec.call_keys`` is 1).
    """

    conversation_id: str
    request_id: str
    messages: Sequence[message_pb2.Message]
    body: Mapping[str, Any]
    model: str
    continuation: bool
    response_type: Callable[[], Any]
    skip_unless: Literal["", "history", "assistant_last"] = ""
    disconnect: Literal["cancel", "continue"] = "cancel"
    client_tools: Sequence[Tool] = ()
    tool_denials: Sequence[ToolDenial] = ()
    entry: TurnEntry = "chat"
    trace_context: Mapping[str, str] = field(default_factory=dict)
    concurrent_input: ConcurrentInputStrategy | None = None
    budget: BudgetLimit | None = None
    principal: str = ""
    subagent_path: tuple[SubagentCall, ...] = ()
    legacy_call_keys: bool = False
