"""The body of ``POST /v1/ai-sdk/chat``, read into the Turnwire request it stands for.

docs/api/ai-sdk.md#what-maps. The body is what the AI SDK's ``DefaultChatTransport`` sends:
``{id, messages: UIMessage[], trigger, messageId, ...body}`` (``HttpChatTransport.sendMessages``
in the ``ai`` package), the transport's ``body`` option spread into it. This door reads ``model``,
``tools`` (the client tools, ``{name: {description, inputSchema}}``) and ``disconnectPolicy``
(``"cancel"`` or ``"continue"``) from it; every other extra field goes to hooks in the turn's
``body``.

Only the last message is read; the conversation's stored history is what the model sees:

- a **user** message is the turn's input (``Chat``), stored under the UIMessage's own id (an id
  already stored with the same content is not stored twice, docs/semantics.md §11). So
  ``regenerate-message`` (``chat.regenerate()``, which resends the last user message) runs a new
  turn on it when its last turn did not complete, and is refused (``ALREADY_ANSWERED``) after a
  completed reply: a stored conversation cannot branch;
- an **assistant** message answers that message's tool calls in its last step: parts in
  ``output-available`` / ``output-error`` of a client tool become ``SubmitToolResults``, parts in
  ``approval-responded`` (``addToolApprovalResponse``) become ``SubmitToolApprovals``.

A body in the wrong shape is the OpenAI door's
:class:`~turnwire_server.http.openai_request.RequestProblem` (``param`` the field); the door
answers 400 with its message, which names the field and what to fix.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.openai_request import RequestProblem, check_nesting

_READ = frozenset({"id", "messages", "trigger", "messageId", "model", "tools", "disconnectPolicy"})
"""Body fields this door reads; the others go to hooks in ``body``."""

_POLICIES = {
    "cancel": chat_service_pb2.DISCONNECT_POLICY_CANCEL,
    "continue": chat_service_pb2.DISCONNECT_POLICY_CONTINUE,
}


class _Tool(BaseModel):
    description: str = ""
    inputSchema: dict[str, Any] | None = None


class ChatBody(BaseModel):
    """The fields of the transport's body this door reads (others are kept for hooks)."""

    model_config = ConfigDict(extra="allow")

    id: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    trigger: Literal["submit-message", "regenerate-message"] = "submit-message"
    messageId: str | None = None
    model: str = ""
    tools: dict[str, _Tool] = Field(default_factory=dict)
    disconnectPolicy: Literal["cancel", "continue"] = "cancel"


@dataclass
class ChatTurn:
    """What a request asks Turnwire for: the user ``message`` to run a turn on, or the ``results``
    and ``approvals`` answering the tool calls of the assistant message ``continues`` (its id;
    ``known_calls``: its tool call ids). ``common`` holds the fields every RPC's request shares
    (conversation, model, client tools, body, disconnect policy)."""

    common: dict[str, Any]
    message: message_pb2.Message | None = None
    results: list[chat_service_pb2.ToolResult] = field(default_factory=list)
    approvals: list[chat_service_pb2.ToolApproval] = field(default_factory=list)
    continues: str | None = None
    known_calls: list[str] = field(default_factory=list)


def parse_body(raw: bytes) -> ChatBody:
    """``raw`` (the HTTP body) read as a :class:`ChatBody`; raises :class:`RequestProblem`."""
    try:
        data = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as error:
        raise RequestProblem(f"the body is not JSON: {error}", None) from None
    if not isinstance(data, dict):
        raise RequestProblem("the body must be a JSON object: {id, messages, trigger, messageId}", None)
    check_nesting(data)
    try:
        return ChatBody.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestProblem(f"{where}: {first['msg']}", where) from None


def turn_input(body: ChatBody) -> ChatTurn:
    """The Turnwire input of ``body`` (see the module docstring); raises :class:`RequestProblem`."""
    extra = {name: value for name, value in body.model_dump().items() if name not in _READ}
    common: dict[str, Any] = {
        "conversation_id": body.id,
        "model": body.model,
        "client_tools": [_client_tool(name, tool) for name, tool in body.tools.items()],
        "body": extra,
        "disconnect_policy": _POLICIES[body.disconnectPolicy],
    }
    index = len(body.messages) - 1
    last = body.messages[index]
    role = last.get("role")
    parts = last.get("parts")
    if not isinstance(parts, list):
        raise RequestProblem(
            f"messages[{index}].parts: a list of UIMessage parts", f"messages[{index}].parts"
        )
    if role == "user":
        return ChatTurn(common, message=_user_message(last, parts, index))
    if body.trigger == "regenerate-message":
        raise RequestProblem(
            f"messages[{index}]: regenerate-message sends the user message to answer again as the last "
            "message (a stored conversation cannot branch from an assistant message)",
            "trigger",
        )
    if role == "assistant":
        return _answers(common, last, parts, index, set(body.tools))
    raise RequestProblem(
        f"messages[{index}].role: the last message must be a user or assistant message; got {role!r}",
        f"messages[{index}].role",
    )


def _client_tool(name: str, tool: _Tool) -> chat_service_pb2.ClientTool:
    offered = chat_service_pb2.ClientTool(name=name, description=tool.description)
    if tool.inputSchema is not None:
        offered.input_schema.update(tool.inputSchema)
    return offered


def _user_message(message: dict[str, Any], parts: list[Any], index: int) -> message_pb2.Message:
    converted = message_pb2.Message(id=str(message.get("id") or ""), role=message_pb2.ROLE_USER)
    for number, part in enumerate(parts):
        where = f"messages[{index}].parts[{number}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text":
            converted.parts.add(text=message_pb2.TextPart(text=str(part.get("text", ""))))
        elif kind == "file":
            converted.parts.add(file=_file(part, where))
        else:
            raise RequestProblem(
                f"{where}.type: a user message takes text and file parts; got {kind!r}", f"{where}.type"
            )
    metadata = message.get("metadata")
    if isinstance(metadata, dict):
        converted.metadata.update(metadata)
    return converted


def _file(part: dict[str, Any], where: str) -> message_pb2.FilePart:
    url = part.get("url")
    if not isinstance(url, str) or not url:
        raise RequestProblem(
            f"{where}.url: a file part needs its url (an https: or data: URL)", f"{where}.url"
        )
    file = message_pb2.FilePart(
        media_type=str(part.get("mediaType", "")), filename=str(part.get("filename") or "")
    )
    head, comma, payload = url.partition(",")
    if url.startswith("data:") and comma and head.endswith(";base64"):
        try:
            file.data = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise RequestProblem(f"{where}.url: the data: URL is not valid base64", f"{where}.url") from None
    else:
        file.url = url
    return file


def _tool_name(part: dict[str, Any]) -> str | None:
    kind = str(part.get("type", ""))
    if kind == "dynamic-tool":
        return str(part.get("toolName", ""))
    return kind.removeprefix("tool-") if kind.startswith("tool-") else None


def _answers(
    common: dict[str, Any], message: dict[str, Any], parts: list[Any], index: int, client_tools: set[str]
) -> ChatTurn:
    """The answers in the last step of assistant ``message`` (see the module docstring)."""
    step = max(
        (i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "step-start"), default=-1
    )
    answer = ChatTurn(common, continues=str(message.get("id") or ""))
    for number, part in enumerate(parts):
        name = _tool_name(part) if isinstance(part, dict) else None
        if name is None:
            continue
        call_id = str(part.get("toolCallId", ""))
        answer.known_calls.append(call_id)
        if number < step or part.get("providerExecuted"):
            continue
        state = part.get("state")
        where = f"messages[{index}].parts[{number}]"
        if state == "approval-responded":
            approval = part.get("approval") or {}
            answer.approvals.append(
                chat_service_pb2.ToolApproval(
                    tool_call_id=call_id,
                    approved=bool(approval.get("approved")),
                    reason=str(approval.get("reason") or ""),
                )
            )
        elif name in client_tools and state == "output-available" and not part.get("preliminary"):
            output = orjson.dumps(part.get("output")).decode()
            answer.results.append(chat_service_pb2.ToolResult(tool_call_id=call_id, output_json=output))
        elif name in client_tools and state == "output-error":
            text = str(part.get("errorText") or "")
            answer.results.append(
                chat_service_pb2.ToolResult(tool_call_id=call_id, error=True, error_text=text)
            )
        elif name in client_tools and state in ("input-streaming", "input-available"):
            raise RequestProblem(
                f"{where}: client tool call {call_id!r} has no output yet: add it with addToolOutput", where
            )
    if not answer.results and not answer.approvals:
        raise RequestProblem(
            f"messages[{index}]: the last message is an assistant message with no new tool output or "
            "approval answer in its last step; send a user message (or list the client tool in body.tools)",
            f"messages[{index}]",
        )
    return answer


__all__ = ["ChatBody", "ChatTurn", "parse_body", "turn_input"]
