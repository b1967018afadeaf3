"""Request messages of ``ChatService``, built from plain arguments; shared by the async client
(:mod:`turnwire_client.client`) and the synchronous one (:mod:`turnwire_client.sync`) so both
send exactly the same requests."""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict, TypeVar

from google.protobuf import struct_pb2

from turnwire_client.v1 import chat_service_pb2, message_pb2, webhook_pb2

DisconnectPolicy = Literal["cancel", "continue"]
"""What a turn does when its call ends early (``ChatRequest.disconnect_policy``)."""

ClientToolSpec = chat_service_pb2.ClientTool | Mapping[str, Any]
"""A client tool: the proto, or ``{"name": …, "description": …, "input_schema": {…}}``."""

MessagesSpec = str | Sequence[message_pb2.Message]
"""Messages to send: a plain text (one user message with one text part), or messages."""

TurnBudgetSpec = chat_service_pb2.TurnBudget | Mapping[str, float]
"""A turn's own lower budget (``ChatRequest.budget``, docs/cost.md "Budgets"): the proto, or
``{"max_tokens": …, "max_usd": …}`` (either key may be left out)."""

WebhookSpec = str | Mapping[str, str] | webhook_pb2.WebhookTarget
"""A webhook target (docs/webhooks.md): a configured endpoint's name, ``{"url": …}`` for a
per-request URL (when the server allows them), or the ``WebhookTarget`` itself."""


class TurnOptions(TypedDict, total=False):
    """Options every turn-running call takes as keyword arguments (all optional).

    Attributes:
        request_id: The turn's id (to cancel it with ``cancel_chat``, re-attach with
            ``resume_turn``, or retry it); the client chooses one (:func:`new_request_id`) when
            absent. Input messages without an id get one derived from it
            (:func:`input_message_id`), so a failed turn retried under the same request id with
            the same input stores that input once (docs/semantics.md §11, "Idempotent input").
        body: JSON-like data for the lifecycle hooks (sent as a ``Struct``).
        model: ``provider:model`` for this turn, e.g. ``"scripted:demo"``.
        timeout: Deadline of the whole call in seconds.
        disconnect: What the turn does when this call ends early: ``"cancel"`` (the default:
            abort it) or ``"continue"`` (it finishes without the caller; re-attach with
            ``resume_turn``).
        client_tools: Tools this client runs itself, offered to the model for this turn:
            ``ClientTool`` messages or mappings with ``name``, ``description`` and
            ``input_schema`` (a JSON Schema object). A call of one ends the turn with the call
            pending (state ``"input-available"``); answer it with ``submit_tool_results``.
        concurrent_input: What this input does when the conversation has a turn running or
            queued: ``"enqueue"`` (first in, first out), ``"reject"`` (``FAILED_PRECONDITION``,
            reason ``TURN_IN_PROGRESS``, nothing stored), ``"interrupt"`` (the running turn ends
            ABORTED and this runs next) or ``"rollback"`` (the running turn and its input are
            removed); None: the sidecar's ``limits.concurrent_input``. Not for
            ``continue_last_turn``, which brings no input.
        budget: Lowers this turn's budget below the configured ``budgets.turn``, never raises
            it (docs/cost.md, "Budgets"): ``{"max_tokens": int, "max_usd": float}`` (either
            may be left out) or a ``TurnBudget``. Not for ``submit_tool_results`` and
            ``submit_tool_approvals``, which continue a turn under the budget it had.
    """

    request_id: str | None
    body: Mapping[str, Any] | None
    model: str | None
    timeout: float | None
    disconnect: DisconnectPolicy
    client_tools: Sequence[ClientToolSpec]
    concurrent_input: ConcurrentInputStrategy | None
    budget: TurnBudgetSpec | None


ConcurrentInputStrategy = Literal["enqueue", "reject", "interrupt", "rollback"]
"""What new input does on a busy conversation (``ChatRequest.concurrent_input_strategy``)."""

_STRATEGIES: dict[str, chat_service_pb2.ConcurrentInputStrategy.ValueType] = {
    "enqueue": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE,
    "reject": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT,
    "interrupt": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT,
    "rollback": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK,
}


def strategy(value: ConcurrentInputStrategy | None) -> chat_service_pb2.ConcurrentInputStrategy.ValueType:
    """``concurrent_input`` as the enum value; raises :class:`ValueError` for an unknown one."""
    if value is None:
        return chat_service_pb2.CONCURRENT_INPUT_STRATEGY_UNSPECIFIED
    if value not in _STRATEGIES:
        raise ValueError(f"concurrent_input must be one of {sorted(_STRATEGIES)}, not {value!r}")
    return _STRATEGIES[value]


_POLICIES: dict[str, chat_service_pb2.DisconnectPolicy.ValueType] = {
    "cancel": chat_service_pb2.DISCONNECT_POLICY_CANCEL,
    "continue": chat_service_pb2.DISCONNECT_POLICY_CONTINUE,
}

TurnRequest = (
    chat_service_pb2.ChatRequest
    | chat_service_pb2.SaveMessagesRequest
    | chat_service_pb2.ContinueLastTurnRequest
    | chat_service_pb2.SubmitToolResultsRequest
    | chat_service_pb2.SubmitToolApprovalsRequest
)


_Request = TypeVar("_Request", bound=TurnRequest)


def new_request_id() -> str:
    """A request id for a turn-running call given none: ``r-`` and 32 hex digits (a UUID4), in the
    client's namespace (the server's own ids start with ``tw-``)."""
    return f"r-{uuid.uuid4().hex}"


_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
"""An id the server takes (docs/semantics.md §11)."""


def input_message_id(request_id: str, index: int) -> str:
    """The id of input message ``index`` (from 0) of the turn ``request_id`` when the caller gave
    that message none: ``<request_id>.m<index>``, or ``m<index>-`` and the SHA-256 digest (hex) of
    the request id when that is no valid id (over 128 characters; a request id the server will
    refuse on its own).

    Deterministic, so re-sending the same call under the same request id re-sends the same ids:
    the server then stores the input once and runs the retry (docs/semantics.md §11). The
    TypeScript and Go clients derive the same ids."""
    derived = f"{request_id}.m{index}"
    if _ID.fullmatch(derived):
        return derived
    return f"m{index}-{hashlib.sha256(request_id.encode()).hexdigest()}"


def with_turn_options(request: _Request, options: TurnOptions) -> _Request:
    """Set ``options`` (but ``timeout``, a call option) on a turn-running request; returns it.

    The request id is ``options["request_id"]`` or a new one (:func:`new_request_id`); input
    messages without an id get :func:`input_message_id`. Raises :class:`TypeError` for an
    unknown option and :class:`ValueError` for an unknown ``disconnect`` value, naming the ones
    there are.
    """
    unknown = set(options) - set(TurnOptions.__annotations__)
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)}; the options are {sorted(TurnOptions.__annotations__)}"
        )
    request.request_id = options.get("request_id") or new_request_id()
    inputs = (
        [request.message]
        if isinstance(request, chat_service_pb2.ChatRequest)
        else request.messages
        if isinstance(request, chat_service_pb2.SaveMessagesRequest)
        else []
    )
    for index, message in enumerate(inputs):
        if not message.id:
            message.id = input_message_id(request.request_id, index)
    request.model = options.get("model") or ""
    disconnect = options.get("disconnect", "cancel")
    if disconnect not in _POLICIES:
        raise ValueError(f"disconnect must be one of {sorted(_POLICIES)}, not {disconnect!r}")
    request.disconnect_policy = _POLICIES[disconnect]
    request.client_tools.extend(_client_tools(options.get("client_tools", ())))
    concurrent_input = options.get("concurrent_input")
    if concurrent_input is not None:
        if isinstance(request, chat_service_pb2.ContinueLastTurnRequest):
            raise TypeError("continue_last_turn brings no new input: it takes no concurrent_input")
        request.concurrent_input_strategy = strategy(concurrent_input)
    budget = options.get("budget")
    if budget is not None:
        if not isinstance(
            request,
            chat_service_pb2.ChatRequest
            | chat_service_pb2.SaveMessagesRequest
            | chat_service_pb2.ContinueLastTurnRequest,
        ):
            raise TypeError(
                "tool results and approvals continue a turn under its budget: they take no budget"
            )
        request.budget.CopyFrom(turn_budget(budget))
    body = options.get("body")
    if body is not None:
        request.body.CopyFrom(struct(body))
    return request


def turn_budget(spec: TurnBudgetSpec) -> chat_service_pb2.TurnBudget:
    """``spec`` as a ``TurnBudget``. Raises :class:`ValueError` for a key other than
    ``max_tokens`` and ``max_usd`` (the server checks the values: ``INVALID_ARGUMENT`` below 1
    token or 0 dollars)."""
    if isinstance(spec, chat_service_pb2.TurnBudget):
        return spec
    unknown = set(spec) - {"max_tokens", "max_usd"}
    if unknown:
        raise ValueError(f"budget takes max_tokens and max_usd, not {sorted(unknown)}")
    budget = chat_service_pb2.TurnBudget()
    if spec.get("max_tokens") is not None:
        budget.max_tokens = int(spec["max_tokens"])
    if spec.get("max_usd") is not None:
        budget.max_usd = float(spec["max_usd"])
    return budget


def webhook_target(spec: WebhookSpec) -> webhook_pb2.WebhookTarget:
    """``spec`` as a ``WebhookTarget``: a string names an endpoint; a mapping gives ``endpoint``
    or ``url``."""
    if isinstance(spec, webhook_pb2.WebhookTarget):
        return spec
    if isinstance(spec, str):
        return webhook_pb2.WebhookTarget(endpoint=spec)
    return webhook_pb2.WebhookTarget(endpoint=spec.get("endpoint", ""), url=spec.get("url", ""))


def user_messages(messages: MessagesSpec) -> list[message_pb2.Message]:
    """``messages`` as a list; a plain text becomes one user message with one text part."""
    if isinstance(messages, str):
        return [user_message(messages)]
    return list(messages)


def user_message(text: str) -> message_pb2.Message:
    """A user message with one text part."""
    return message_pb2.Message(
        role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))]
    )


def tool_results(
    results: Mapping[str, Any], errors: Mapping[str, str] | None
) -> list[chat_service_pb2.ToolResult]:
    """``{tool_call_id: output}`` (outputs as JSON text) and ``{tool_call_id: error_text}`` as
    ``ToolResult`` entries. Raises :class:`ValueError` for an output with no JSON form (NaN,
    Infinity) and :class:`TypeError` for a value JSON cannot encode."""
    entries = [
        chat_service_pb2.ToolResult(tool_call_id=call_id, output_json=json_text(output))
        for call_id, output in results.items()
    ]
    entries += [
        chat_service_pb2.ToolResult(tool_call_id=call_id, error=True, error_text=text)
        for call_id, text in (errors or {}).items()
    ]
    return entries


def tool_approvals(
    approvals: Mapping[str, bool], reasons: Mapping[str, str] | None
) -> list[chat_service_pb2.ToolApproval]:
    """``{tool_call_id: approved}`` with optional ``{tool_call_id: reason}`` as ``ToolApproval``
    entries."""
    return [
        chat_service_pb2.ToolApproval(
            tool_call_id=call_id, approved=approved, reason=(reasons or {}).get(call_id, "")
        )
        for call_id, approved in approvals.items()
    ]


def submit_messages_request(
    conversation_id: str,
    messages: MessagesSpec,
    *,
    submission_id: str | None,
    idempotency_key: str | None,
    metadata: Mapping[str, Any] | None,
    body: Mapping[str, Any] | None,
    model: str | None,
    client_tools: Sequence[ClientToolSpec],
    concurrent_input: ConcurrentInputStrategy | None = None,
    webhook: WebhookSpec | None = None,
    budget: TurnBudgetSpec | None = None,
) -> chat_service_pb2.SubmitMessagesRequest:
    """The ``SubmitMessagesRequest`` of ``submit_messages`` (see there for the arguments)."""
    request = chat_service_pb2.SubmitMessagesRequest(
        conversation_id=conversation_id,
        concurrent_input_strategy=strategy(concurrent_input),
        messages=user_messages(messages),
        submission_id=submission_id or "",
        idempotency_key=idempotency_key or "",
        model=model or "",
        client_tools=_client_tools(client_tools),
    )
    if metadata is not None:
        request.metadata.CopyFrom(struct(metadata))
    if body is not None:
        request.body.CopyFrom(struct(body))
    if webhook is not None:
        request.webhook.CopyFrom(webhook_target(webhook))
    if budget is not None:
        request.budget.CopyFrom(turn_budget(budget))
    return request


def _client_tools(tools: Sequence[ClientToolSpec]) -> list[chat_service_pb2.ClientTool]:
    converted = []
    for tool in tools:
        if isinstance(tool, chat_service_pb2.ClientTool):
            converted.append(tool)
            continue
        proto = chat_service_pb2.ClientTool(name=tool["name"], description=tool.get("description", ""))
        if tool.get("input_schema") is not None:
            proto.input_schema.CopyFrom(struct(tool["input_schema"]))
        converted.append(proto)
    return converted


def json_text(value: Any) -> str:
    """``value`` as compact JSON text; NaN and Infinity are refused (they have no JSON form)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    """A mapping as a ``google.protobuf.Struct`` (numbers become doubles)."""
    converted = struct_pb2.Struct()
    converted.update(dict(data))
    return converted
