"""The body of ``POST /v1/ag-ui``, AG-UI's ``RunAgentInput``, read into the Turnwire request it
stands for (docs/api/ag-ui.md#what-maps; https://docs.ag-ui.com/sdk/js/core/types#runagentinput).

- ``threadId`` is the Turnwire conversation, ``runId`` the turn's request id (both Turnwire ids:
  ``[A-Za-z0-9._:-]{1,128}``, not starting ``tw-``; the servicer checks them).
- ``messages``: AG-UI clients send the whole thread each run; the sidecar stores the thread, so
  only its tail is read. Tool messages at the end answer the client tool calls the previous run
  left pending (``SubmitToolResults``; a tool message whose id starts ``tw-`` is a result the
  sidecar sent itself and is skipped). Otherwise the last message must be a ``user`` message:
  it is the turn's input (``Chat``, its ``id`` the message id, so a retry does not store it twice).
  Earlier messages are not read: a thread the sidecar does not hold starts with that last
  message (seed one with ``SaveMessages`` over gRPC or Connect). A user message's content is a
  string or ``text`` parts; other parts (images, audio, documents) are refused: this door
  carries text.
- ``tools`` are client tools (``ClientTool``: name, description, ``parameters`` as the input
  schema). ``forwardedProps.model`` (a string, ``provider:model``) picks the model; ``context``,
  ``state`` and ``forwardedProps`` go to the turn's hooks in ``body`` (docs/hooks.md) under
  those names. ``resume`` (answers to interrupts) is refused: this door raises no interrupts.

A body in the wrong shape is :class:`~turnwire_server.http.openai_request.RequestProblem`, the
door answers 400 naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.openai_request import RequestProblem, check_nesting


class RunAgentInput(BaseModel):
    """The fields of AG-UI's ``RunAgentInput`` this door reads (others are ignored)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    thread_id: str = Field(alias="threadId", min_length=1)
    run_id: str = Field(alias="runId", min_length=1)
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)
    context: list[dict[str, Any]] = Field(default_factory=list)
    state: Any = None
    forwarded_props: Any = Field(default=None, alias="forwardedProps")
    resume: list[dict[str, Any]] | None = None


@dataclass
class RunInput:
    """What a run asks Turnwire for: ``message`` (a user message to run a turn on) or ``results``
    (of pending client tool calls), never both; ``client_tools``, ``model`` ("" = the default)
    and ``body`` (for hooks)."""

    message: message_pb2.Message | None
    results: list[chat_service_pb2.ToolResult]
    client_tools: list[chat_service_pb2.ClientTool]
    model: str
    body: dict[str, Any] = field(default_factory=dict)


def parse_run_input(raw: bytes) -> RunAgentInput:
    """``raw`` (the HTTP body) read as a :class:`RunAgentInput`; raises ``RequestProblem``."""
    try:
        data = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError as error:
        raise RequestProblem(f"the body is not JSON: {error}", None) from None
    if not isinstance(data, dict):
        raise RequestProblem("the body must be a JSON object (AG-UI's RunAgentInput)", None)
    check_nesting(data)
    try:
        return RunAgentInput.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestProblem(f"{where}: {first['msg']} (AG-UI's RunAgentInput)", where) from None


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestProblem(f"{where}: must be a string or a list of text parts", where)
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise RequestProblem(
                f"{where}[{index}]: only text parts are taken by this door; got {kind!r}", f"{where}[{index}]"
            )
        texts.append(part["text"])
    return "".join(texts)


def _client_tool(tool: dict[str, Any], where: str) -> chat_service_pb2.ClientTool:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise RequestProblem(f"{where}.name: a tool needs a name", f"{where}.name")
    offered = chat_service_pb2.ClientTool(name=name, description=str(tool.get("description") or ""))
    parameters = tool.get("parameters")
    if isinstance(parameters, dict):
        offered.input_schema.update(parameters)
    return offered


def _results(messages: list[dict[str, Any]]) -> list[chat_service_pb2.ToolResult]:
    """The results of the tool messages at the end of ``messages`` the client wrote (not ``tw-``)."""
    tail: list[tuple[int, dict[str, Any]]] = []
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].get("role") != "tool":
            break
        tail.insert(0, (index, messages[index]))
    results = []
    for index, message in tail:
        where = f"messages.{index}"
        if str(message.get("id", "")).startswith("tw-"):
            continue
        call_id = message.get("toolCallId")
        if not isinstance(call_id, str) or not call_id:
            raise RequestProblem(
                f"{where}.toolCallId: the id of the tool call it answers", f"{where}.toolCallId"
            )
        content = _text_of(message.get("content", ""), f"{where}.content")
        error = message.get("error")
        if isinstance(error, str) and error:
            results.append(chat_service_pb2.ToolResult(tool_call_id=call_id, error=True, error_text=error))
            continue
        try:
            orjson.loads(content)
        except orjson.JSONDecodeError:
            content = orjson.dumps(content).decode()  # text that is not JSON is a JSON string
        results.append(chat_service_pb2.ToolResult(tool_call_id=call_id, output_json=content))
    return results


def run_input(request: RunAgentInput) -> RunInput:
    """The Turnwire input of ``request`` (see the module docstring); raises ``RequestProblem``."""
    if request.resume:
        raise RequestProblem("resume: this door raises no interrupts, so there are none to answer", "resume")
    props = request.forwarded_props
    model = props.get("model", "") if isinstance(props, dict) else ""
    if not isinstance(model, str):
        raise RequestProblem(
            "forwardedProps.model: a model id as a string (provider:model)", "forwardedProps.model"
        )
    body: dict[str, Any] = {"context": request.context}
    if request.state is not None:
        body["state"] = request.state
    if props is not None:
        body["forwardedProps"] = props
    tools = [_client_tool(tool, f"tools.{i}") for i, tool in enumerate(request.tools)]
    messages = request.messages
    if messages and messages[-1].get("role") == "tool":
        results = _results(messages)
        if not results:
            raise RequestProblem(
                "messages: the tool messages at the end are results the sidecar sent itself; add the "
                "user's next message, or the result of a pending client tool call",
                "messages",
            )
        return RunInput(None, results, tools, model, body)
    if not messages or messages[-1].get("role") != "user":
        got = messages[-1].get("role") if messages else "no message"
        raise RequestProblem(
            "messages: the last message must be the user's new message (or tool messages answering "
            f"pending client tool calls); got {got!r}",
            "messages",
        )
    last = messages[-1]
    where = f"messages.{len(messages) - 1}"
    message = message_pb2.Message(
        role=message_pb2.ROLE_USER,
        parts=[
            message_pb2.Part(
                text=message_pb2.TextPart(text=_text_of(last.get("content"), f"{where}.content"))
            )
        ],
    )
    if isinstance(last.get("id"), str):
        message.id = last["id"]
    return RunInput(message, [], tools, model, body)


__all__ = ["RunAgentInput", "RunInput", "parse_run_input", "run_input"]
