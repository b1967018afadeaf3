"""Responses output items that are tool calls but not ``function_call``: the built-in tools.

Follows https://platform.openai.com/docs/guides/tools and the output item types of
https://platform.openai.com/docs/api-reference/responses/object (``openai`` SDK
``types/responses``). Two kinds (docs/providers.md, "What each API's parts become"):

- **Provider-executed** (OpenAI runs them; AI SDK ``providerExecuted``): ``web_search_call``,
  ``file_search_call``, ``code_interpreter_call``, ``image_generation_call``, ``mcp_call`` (remote
  MCP) and ``computer_call``. Each becomes a ToolCall marked ``provider_executed`` (its input: the
  item's input fields) and a ToolResult (the item's other fields; an ``mcp_call`` its ``output``
  or ``error``). The image an ``image_generation_call`` returns (``result``, base64) is not part of
  the call's result: it is a file part of its own.
- **Client-run** (the application runs them and answers): ``shell_call``, ``local_shell_call``,
  ``apply_patch_call`` and ``custom_tool_call``. Each becomes a ToolCall marked
  ``client_executed``, which the engine holds for the client when the turn has no tool of that
  name (its name: ``shell``, ``local_shell``, ``apply_patch``, or the custom tool's own); its
  input is the item's ``action``, ``operation`` or ``input`` under that key.

Both keep ``{"openai": {"type", "item_id"}}`` as provider metadata: what the request builder
(:func:`input_items`) needs to send them back as the API's own items.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnwire.types import ModelChunk, ToolCall, ToolInputStart, ToolResult
from turnwire.values import dumps, loads, parse_tool_input
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.convert import tool_input, tool_result

_EXECUTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "web_search_call": ("web_search", ("action",)),
    "file_search_call": ("file_search", ("queries",)),
    "code_interpreter_call": ("code_interpreter", ("code", "container_id")),
    "image_generation_call": ("image_generation", ()),
    "mcp_call": ("", ("arguments",)),
    "computer_call": ("computer_use", ("action", "pending_safety_checks")),
}
"""Provider-executed item type → (tool name, "" for the item's own ``name``; its input fields)."""

_CLIENT_RUN: dict[str, tuple[str, str]] = {
    "shell_call": ("shell", "action"),
    "local_shell_call": ("local_shell", "action"),
    "apply_patch_call": ("apply_patch", "operation"),
    "custom_tool_call": ("", "input"),
}
"""Client-run item type → (tool name, "" for the item's own ``name``; the field that is its input)."""

_NOT_OUTPUT = frozenset({"id", "type", "call_id", "name", "server_label", "result", "output", "error"})
"""Item fields that are not a provider-executed call's result (``result``: a generated image)."""


def is_built_in(item_type: Any) -> bool:
    """True for a built-in tool's item type (either kind)."""
    return item_type in _EXECUTED or item_type in _CLIENT_RUN


def _name(item: Mapping[str, Any], default: str) -> str:
    return default or str(item.get("name") or "")


def _call_id(item: Mapping[str, Any]) -> str:
    return str(item.get("call_id") or item.get("id") or "")


def started(item: Mapping[str, Any], call_id: str) -> ToolInputStart:
    """The ToolInputStart of a built-in item (``response.output_item.added``) under ``call_id``."""
    item_type = item.get("type")
    if item_type in _EXECUTED:
        return ToolInputStart(call_id, _name(item, _EXECUTED[item_type][0]), provider_executed=True)
    return ToolInputStart(call_id, _name(item, _CLIENT_RUN[str(item_type)][0]))


def original_id(item: Mapping[str, Any]) -> str:
    """The id the API gave a built-in item's call (``call_id``, else the item ``id``)."""
    return _call_id(item)


def finished(item: Mapping[str, Any], call_id: str) -> list[ModelChunk]:
    """The ToolCall (and, for a provider-executed item, its ToolResult) of a complete built-in item
    (``response.output_item.done``, or an item of a whole response) under ``call_id``."""
    item_type = str(item.get("type"))
    record = {"openai": {"type": item_type, "item_id": str(item.get("id") or "")}}
    if item_type in _CLIENT_RUN:
        name, field = _CLIENT_RUN[item_type]
        given = {field: item.get(field)}
        return [
            ToolCall(
                call_id,
                _name(item, name),
                given,
                raw_input=dumps(given),
                client_executed=True,
                provider_metadata=record,
            )
        ]
    name, fields = _EXECUTED[item_type]
    name = _name(item, name)
    if item_type == "mcp_call":
        record["openai"]["server_label"] = str(item.get("server_label") or "")
        arguments = item.get("arguments")
        parsed, _ = parse_tool_input(arguments if isinstance(arguments, str) else "")
        value: dict[str, Any] = parsed or {}
        output: Any = item.get("output")
        error = item.get("error")
        error_text: str | None = None if error is None else error if isinstance(error, str) else dumps(error)
    else:
        value = {key: item[key] for key in fields if item.get(key) is not None}
        output = {key: v for key, v in item.items() if key not in _NOT_OUTPUT and key not in fields}
        error = item.get("error")
        if isinstance(error, Mapping):
            error_text = str(error.get("message") or error.get("code") or "failed")
        else:
            error_text = "failed" if error or item.get("status") == "failed" else None
    call = ToolCall(
        call_id, name, value, raw_input=dumps(value), provider_executed=True, provider_metadata=record
    )
    return [call, ToolResult(call_id, name, output=output, error=error_text)]


def _record(call: message_pb2.ToolCallPart) -> tuple[str, str]:
    """``(item type, item id)`` a stored call keeps under ``provider_metadata["openai"]``."""
    value = call.provider_metadata.fields.get("openai")
    if value is None or value.WhichOneof("kind") != "struct_value":
        return "", ""
    fields = value.struct_value.fields
    item_type = fields["type"].string_value if "type" in fields else ""
    item_id = fields["item_id"].string_value if "item_id" in fields else ""
    return item_type, item_id


def is_client_run(call: message_pb2.ToolCallPart) -> bool:
    """True for a stored call of a client-run built-in (its item type kept)."""
    return _record(call)[0] in _CLIENT_RUN


def input_items(
    call: message_pb2.ToolCallPart, call_id: str, store: bool
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """``(call item, output item)`` to send back for a stored built-in call, under ``call_id``.

    A provider-executed call goes back by reference (``item_reference``, its result with it) when
    ``store`` is true, and not at all otherwise (``(None, None)``: the API resolves only items it
    stored; the text the model wrote from them stays). A client-run call goes back as its own
    item type and its answer as the matching ``*_output`` item: a ``shell_call_output`` takes the
    answer's JSON when it is a list (the API's ``output`` chunks), else the answer's text as
    ``stdout`` (or the error as ``stderr``, exit code 1)."""
    item_type, item_id = _record(call)
    if call.provider_executed:
        return ({"type": "item_reference", "id": item_id}, None) if store and item_id else (None, None)
    value = tool_input(call)
    content, is_error = tool_result(call)
    if item_type == "custom_tool_call":
        text = value.get("input")
        return (
            {"type": item_type, "call_id": call_id, "name": call.tool_name, "input": str(text or "")},
            {"type": "custom_tool_call_output", "call_id": call_id, "output": content},
        )
    if item_type == "apply_patch_call":
        status = "failed" if is_error else "completed"
        return (
            {
                "type": item_type,
                "call_id": call_id,
                "operation": value.get("operation"),
                "status": "completed",
            },
            {"type": "apply_patch_call_output", "call_id": call_id, "status": status, "output": content},
        )
    if item_type == "local_shell_call":
        item = {"type": item_type, "id": item_id, "call_id": call_id, "action": value.get("action")}
        return {**item, "status": "completed"}, {
            "type": "local_shell_call_output",
            "id": call_id,
            "output": content,
        }
    # shell_call
    answer = loads(call.output_json) if call.output_json else None
    if not isinstance(answer, list):
        stream = "stderr" if is_error else "stdout"
        answer = [
            {
                "stdout": "",
                "stderr": "",
                stream: content,
                "outcome": {"type": "exit", "exit_code": int(is_error)},
            }
        ]
    return (
        {"type": item_type, "call_id": call_id, "action": value.get("action"), "status": "completed"},
        {"type": "shell_call_output", "call_id": call_id, "output": answer},
    )
