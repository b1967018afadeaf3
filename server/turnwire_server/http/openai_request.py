"""The body of ``POST /v1/responses``, read into the Turnwire request it stands for.

docs/api/openai.md#what-maps. The body is OpenAI's ``ResponseCreateParams``; pydantic reads the
fields this door maps and lets every other field through unread (OpenAI adds fields often; a
client that sends one still gets its turn). A field in the wrong shape is
:class:`RequestProblem`: the door answers 400 with OpenAI's error body naming the ``param``.

Input items: a string, or a list of ``message`` items (role ``user``, ``assistant``,
``system`` or ``developer``; content a string or ``input_text`` / ``output_text`` parts) and
``function_call_output`` items (the result of a client tool call of the previous response) and
``mcp_approval_response`` items (the user's answer to an ``mcp_approval_request`` of the previous
response: a call of the sidecar's own tools waiting for approval, docs/api/openai.md#tool-approvals).
``function_call``, ``reasoning`` and ``item_reference`` items repeat what the conversation already
stores and are skipped. Other content (images, files, audio) is refused: this door carries text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.json_depth import MAX_JSON_DEPTH, json_depth
from turnwire_server.engine.ids import approval_turn

_ROLES: dict[str, message_pb2.Role.ValueType] = {
    "user": message_pb2.ROLE_USER,
    "assistant": message_pb2.ROLE_ASSISTANT,
    "system": message_pb2.ROLE_SYSTEM,
    "developer": message_pb2.ROLE_SYSTEM,
}

_SKIPPED_ITEMS = frozenset({"function_call", "reasoning", "item_reference"})

_ECHOED = (
    "instructions",
    "metadata",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "user",
)
"""Request fields the Response repeats as given."""

_FOR_HOOKS = (
    "metadata",
    "tool_choice",
    "parallel_tool_calls",
    "temperature",
    "top_p",
    "max_output_tokens",
    "user",
    "reasoning",
    "text",
    "truncation",
)
"""Request fields with no Turnwire request field: handed to hooks in ``body`` (docs/hooks.md)."""


class RequestProblem(Exception):
    """The body is not a request this door takes: ``param`` names the field, the message what to fix."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def check_nesting(data: Any) -> None:
    """Raise :class:`RequestProblem` for a body (parsed JSON) that nests objects and arrays
    deeper than :data:`~turnwire_server.api.json_depth.MAX_JSON_DEPTH`: its free-form fields
    (``metadata``, ``state``, tool schemas …) become ``google.protobuf.Struct`` values, which
    the sidecar takes only that deep (docs/security.md)."""
    if json_depth(data) > MAX_JSON_DEPTH:
        raise RequestProblem(
            f"the body nests JSON objects and arrays more than {MAX_JSON_DEPTH} levels deep; flatten "
            f"it (at most {MAX_JSON_DEPTH} levels)",
            None,
        )


class _Conversation(BaseModel):
    id: str


class ResponsesRequest(BaseModel):
    """The fields of OpenAI's ``ResponseCreateParams`` this door reads (others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    conversation: str | _Conversation | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    stream: bool | None = False
    background: bool | None = False
    metadata: dict[str, str] | None = None

    @property
    def conversation_id(self) -> str | None:
        """The named conversation's id (``conversation`` as a string or ``{"id": …}``)."""
        if isinstance(self.conversation, _Conversation):
            return self.conversation.id
        return self.conversation


@dataclass(frozen=True, slots=True)
class ApprovalAnswer:
    """One ``mcp_approval_response`` input item: ``approval_request_id`` (the ``id`` of the
    ``mcp_approval_request`` item it answers: the call's approval id), ``approve``, the optional
    ``reason`` (the model is told it for a denial), and ``where`` (its ``input[i]``)."""

    approval_request_id: str
    approve: bool
    reason: str
    where: str


class TurnInput(BaseModel):
    """What a Responses request asks Turnwire for: ``messages`` to store and run a turn on, or
    ``results`` of client tool calls and ``approvals`` of the sidecar's calls waiting for approval
    to continue with (never messages with either), and the request's ``client_tools``, ``body``
    (for hooks) and ``echo`` (for the Response object)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    messages: list[message_pb2.Message]
    results: list[chat_service_pb2.ToolResult]
    approvals: list[ApprovalAnswer] = []
    client_tools: list[chat_service_pb2.ClientTool]
    body: dict[str, Any]
    echo: dict[str, Any]
    params: dict[str, str] = {}
    """The request parameter each message and result came from, by the Turnwire field naming it
    in a refusal (``message``, ``messages[2]``, ``results[0]`` → ``input``, ``instructions``,
    ``input[1]``), so an error's ``param`` names what the caller sent."""


def parse_request(raw: bytes) -> ResponsesRequest:
    """``raw`` (the HTTP body) read as a :class:`ResponsesRequest`; raises :class:`RequestProblem`."""
    try:
        data = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as error:
        raise RequestProblem(f"the body is not JSON: {error}", None) from None
    if not isinstance(data, dict):
        raise RequestProblem("the body must be a JSON object (OpenAI's response create parameters)", None)
    check_nesting(data)
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        raise RequestProblem(f"{_path(first['loc'])}: {first['msg']}", _path(first["loc"])) from None


def _path(loc: tuple[Any, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif not str(part).startswith(("str", "list", "_Conversation", "function-")):
            path += f".{part}" if path else str(part)
    return path


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestProblem(f"{where}: must be a string or a list of input_text parts", where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
            raise RequestProblem(
                f"{where}[{index}]: only text parts (input_text, output_text) are taken by this door; "
                f"got {kind!r}",
                f"{where}[{index}].type",
            )
        texts.append(part["text"])
    return "".join(texts)


def _text_message(role: message_pb2.Role.ValueType, text: str) -> message_pb2.Message:
    return message_pb2.Message(role=role, parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))])


def _output_json(output: Any, where: str) -> str:
    """A function_call_output's ``output`` as the JSON text Turnwire stores: text that is JSON is
    kept as it is (a tool answering ``{"temp": 21}``), other text becomes a JSON string."""
    if isinstance(output, list):
        output = _text_of(output, where)
    if not isinstance(output, str):
        raise RequestProblem(f"{where}: must be a string", where)
    try:
        orjson.loads(output)
    except orjson.JSONDecodeError:
        return orjson.dumps(output).decode()
    return output


def _client_tool(tool: dict[str, Any], where: str) -> chat_service_pb2.ClientTool:
    if tool.get("type") != "function":
        raise RequestProblem(
            f"{where}.type: only function tools are taken by this door (the sidecar's own tools are "
            f"configured on the sidecar); got {tool.get('type')!r}",
            f"{where}.type",
        )
    name = tool.get("name")
    if not isinstance(name, str):
        raise RequestProblem(f"{where}.name: a function tool needs a name", f"{where}.name")
    offered = chat_service_pb2.ClientTool(name=name, description=str(tool.get("description") or ""))
    parameters = tool.get("parameters")
    if isinstance(parameters, dict):
        offered.input_schema.update(parameters)
    return offered


def _approval_answer(item: dict[str, Any], where: str) -> ApprovalAnswer:
    """An ``mcp_approval_response`` item (OpenAI's ``McpApprovalResponse`` input item) read."""
    request_id = item.get("approval_request_id")
    if not isinstance(request_id, str) or not request_id:
        raise RequestProblem(
            f"{where}.approval_request_id: the id of the mcp_approval_request item it answers",
            f"{where}.approval_request_id",
        )
    approve = item.get("approve")
    if not isinstance(approve, bool):
        raise RequestProblem(f"{where}.approve: true or false", f"{where}.approve")
    reason = item.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise RequestProblem(f"{where}.reason: a string", f"{where}.reason")
    return ApprovalAnswer(request_id, approve, reason or "", where)


_ITEM_ID = re.compile(r"(?:msg|rs|fc|mcp)_([A-Za-z0-9.:-]+)_[0-9]+")
"""An output item id this door made (``msg_<response id>_<index>``: openai_response_log.py);
response ids hold no ``_`` (docs/guarantees.md, "Ids never collide")."""


def _response_of(item_id: str) -> str | None:
    """The response that holds output item ``item_id``: an item this door made (:data:`_ITEM_ID`),
    or an ``mcp_approval_request``, whose id is an approval id that names the turn that asked it
    (:func:`~turnwire_server.engine.ids.approval_turn`); None for any other id."""
    if (matched := _ITEM_ID.fullmatch(item_id)) is not None:
        return matched.group(1)
    return approval_turn(item_id)


def referenced_response(request: ResponsesRequest) -> tuple[str, int] | None:
    """For a request naming neither a conversation nor a previous response whose ``input`` refers
    to this door's output items (``item_reference``, as the AI SDK's OpenAI provider sends the
    earlier steps and replies of its history, and the ``mcp_approval_request`` an
    ``mcp_approval_response`` answers): the response of the last such item and the index of the
    input after it. The items up to there are that response's conversation, stored; what
    follows is the new input, so the request continues that response as ``previous_response_id``
    would. None for any other request."""
    if request.conversation_id or request.previous_response_id or isinstance(request.input, str):
        return None
    found: tuple[str, int] | None = None
    for index, item in enumerate(request.input):
        reference = item.get("id") if item.get("type") == "item_reference" else None
        if isinstance(reference, str) and (response := _response_of(reference)) is not None:
            found = (response, index + 1)
    return found


def turn_input(request: ResponsesRequest, start: int = 0) -> TurnInput:
    """The Turnwire input of ``request`` (see the module docstring), from input item ``start`` on
    (:func:`referenced_response`); raises :class:`RequestProblem`."""
    messages: list[message_pb2.Message] = []
    results: list[chat_service_pb2.ToolResult] = []
    approvals: list[ApprovalAnswer] = []
    sources: list[str] = []  # the request parameter of each message
    result_sources: list[str] = []
    if request.instructions:
        messages.append(_text_message(message_pb2.ROLE_SYSTEM, request.instructions))
        sources.append("instructions")
    if isinstance(request.input, str):
        if request.input or not messages:
            messages.append(_text_message(message_pb2.ROLE_USER, request.input))
            sources.append("input")
    else:
        for index, item in enumerate(request.input[start:], start):
            where = f"input[{index}]"
            kind = item.get("type", "message")
            if kind == "message":
                role = _ROLES.get(item.get("role", ""))
                if role is None:
                    raise RequestProblem(
                        f"{where}.role: one of user, assistant, system, developer; got {item.get('role')!r}",
                        f"{where}.role",
                    )
                messages.append(_text_message(role, _text_of(item.get("content", ""), f"{where}.content")))
                sources.append(where)
            elif kind == "function_call_output":
                call_id = item.get("call_id")
                if not isinstance(call_id, str) or not call_id:
                    raise RequestProblem(
                        f"{where}.call_id: the call_id of the function_call", f"{where}.call_id"
                    )
                results.append(
                    chat_service_pb2.ToolResult(
                        tool_call_id=call_id, output_json=_output_json(item.get("output"), f"{where}.output")
                    )
                )
                result_sources.append(where)
            elif kind == "mcp_approval_response":
                approvals.append(_approval_answer(item, where))
            elif kind not in _SKIPPED_ITEMS:
                raise RequestProblem(
                    f"{where}.type: this door takes message, function_call_output and "
                    f"mcp_approval_response items; got {kind!r}",
                    f"{where}.type",
                )
    answers = "function_call_output" if results else "mcp_approval_response"
    if (results or approvals) and any(m.role != message_pb2.ROLE_SYSTEM for m in messages):
        raise RequestProblem(
            f"input: send {answers} items without new messages (they continue the previous "
            "response); send the next message in the request after",
            "input",
        )
    if (results or approvals) and messages:
        raise RequestProblem(f"instructions: not taken with {answers} items", "instructions")
    fields = request.model_dump(exclude_none=True)
    return TurnInput(
        messages=messages,
        results=results,
        approvals=approvals,
        client_tools=[_client_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools)],
        body={name: fields[name] for name in _FOR_HOOKS if name in fields},
        echo={name: fields[name] for name in _ECHOED if name in fields} | {"tools": request.tools},
        params=item_params(sources, result_sources)
        | {f"approvals[{i}]": answer.where for i, answer in enumerate(approvals)},
    )


def item_params(sources: Sequence[str], result_sources: Sequence[str] = ()) -> dict[str, str]:
    """The door's parameter names of a request's messages and tool results by the Turnwire field
    that names them in a refusal: ``message`` (a ``Chat``'s one message), ``messages[i]``
    (``SaveMessages``), ``results[i]`` (``SubmitToolResults``); ``sources[i]`` is the parameter
    of message ``i`` (``instructions``, ``input[2]`` …), ``result_sources[i]`` of result ``i``."""
    params = {f"messages[{i}]": source for i, source in enumerate(sources)}
    params |= {f"results[{i}]": source for i, source in enumerate(result_sources)}
    if len(sources) == 1:
        params["message"] = sources[0]
    return params


__all__ = [
    "ApprovalAnswer",
    "RequestProblem",
    "ResponsesRequest",
    "TurnInput",
    "item_params",
    "parse_request",
    "referenced_response",
    "turn_input",
]
