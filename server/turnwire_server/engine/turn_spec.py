"""What a recovery needs to run a turn again, stored with the turn (``TurnRecord.spec``).

The input messages are in the conversation and the model in the turn row; the rest of the
request (hook ``body``, client tools, whether it continued, the caller's trace context, the
request's own turn budget) is kept here as JSON text,
so a turn a crash interrupted can be run again by a process that never saw its request
(docs/semantics.md §8).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from turnwire.subagents import SubagentCall
from turnwire.tools import ClientTool
from turnwire.values import dumps, loads
from turnwire_server.engine.budget_settings import BudgetLimit
from turnwire_server.engine.request import TurnRequest

_VERSION = 1


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """The stored part of a turn's request; ``body`` is JSON; ``client_tools`` the tools the
    client offered (a recovery offers them again); ``trace_context`` the caller's W3C trace
    context (a recovery's span links to it); ``principal`` the caller (a recovery runs under its
    budgets); ``subagent_path`` a sub-agent's turn's calls (a recovery runs it with its
    sub-agent's own chain and tools, docs/subagents.md); ``tool_starts`` whether the turn ran
    under a sidecar that marks tool calls ``started`` before they run (a call without the mark
    then never ran; an older turn's are taken as started: docs/semantics.md §8, "Tool
    effects"); ``budget`` the request's own turn budget (a recovery, or a takeover, holds the
    turn to it as the first attempt was: docs/cost.md, "Budgets"); ``call_keys`` how its tool
    calls' idempotency keys are made (2: of the conversation, the reply and the call id; 1, a
    turn an older sidecar stored: of the conversation and the call id,
    :func:`~turnwire_server.engine.ids.tool_idempotency_key`)."""

    body: Mapping[str, Any] = field(default_factory=dict)
    continuation: bool = False
    client_tools: tuple[ClientTool, ...] = ()
    trace_context: Mapping[str, str] = field(default_factory=dict)
    principal: str = ""
    subagent_path: tuple[SubagentCall, ...] = ()
    tool_starts: bool = False
    budget: BudgetLimit | None = None
    call_keys: int = 1


def spec_json(request: TurnRequest) -> str:
    """``request``'s :class:`TurnSpec` as JSON text."""
    spec: dict[str, Any] = {
        "version": _VERSION,
        "body": dict(request.body),
        "continuation": request.continuation,
        "client_tools": [
            {"name": tool.name, "description": tool.description, "input_schema": dict(tool.input_schema)}
            for tool in request.client_tools
            if isinstance(tool, ClientTool)
        ],
        "tool_starts": True,
        "call_keys": 1 if request.legacy_call_keys else 2,
    }
    if request.trace_context:
        spec["trace_context"] = dict(request.trace_context)
    if request.principal:
        spec["principal"] = request.principal
    if request.budget is not None and request.budget.limited:
        spec["budget"] = request.budget.model_dump(exclude_none=True)
    if request.subagent_path:
        spec["subagent_path"] = [
            [call.tool_call_id, call.subagent, call.conversation_id, call.request_id]
            for call in request.subagent_path
        ]
    return dumps(spec)


def parse_spec(text: str) -> TurnSpec:
    """The :class:`TurnSpec` in ``text``. Raises :class:`ValueError` when it is not one this code
    wrote (an unknown version, not JSON, a field of the wrong type)."""
    value = loads(text)
    if not isinstance(value, dict) or value.get("version") != _VERSION:
        raise ValueError("not a version-1 turn spec")
    body = value.get("body", {})
    if not isinstance(body, dict):
        raise ValueError("turn spec body is not an object")
    tools = []
    for entry in value.get("client_tools", []):
        if not isinstance(entry, dict) or not isinstance(entry.get("input_schema"), dict):
            raise ValueError("turn spec client tool is not an object with an input_schema")
        tools.append(ClientTool(str(entry["name"]), str(entry.get("description", "")), entry["input_schema"]))
    trace_context = value.get("trace_context", {})
    if not isinstance(trace_context, dict):
        raise ValueError("turn spec trace_context is not an object")
    path = value.get("subagent_path", [])
    if not isinstance(path, list) or not all(
        isinstance(call, list) and len(call) == 4 and all(isinstance(v, str) for v in call) for call in path
    ):
        raise ValueError(
            "turn spec subagent_path is not a list of [tool_call_id, subagent, conversation, request]"
        )
    budget = value.get("budget")
    if budget is not None:
        try:
            budget = BudgetLimit.model_validate(budget)
        except ValidationError as error:
            raise ValueError(f"turn spec budget is not a budget limit: {error}") from None
    return TurnSpec(
        budget=budget,
        subagent_path=tuple(SubagentCall(*call) for call in path),
        body=body,
        continuation=bool(value.get("continuation", False)),
        client_tools=tuple(tools),
        trace_context={str(key): str(text) for key, text in trace_context.items()},
        principal=str(value.get("principal", "")),
        tool_starts=value.get("tool_starts") is True,
        call_keys=2 if value.get("call_keys") == 2 else 1,
    )
