"""Message content in the shapes of the GenAI semantic conventions' opt-in content attributes.

Recorded only with ``tracing.capture_message_content`` on (it holds what users and tools said).
The shapes are the conventions' JSON schemas (semantic-conventions-genai,
``docs/gen-ai/gen-ai-input-messages.json``, ``gen-ai-output-messages.json``,
``gen-ai-system-instructions.json``): a message is ``{"role", "parts"}``; a part is
``{"type": "text", "content"}``, ``{"type": "reasoning", "content"}``,
``{"type": "tool_call", "id", "name", "arguments"}`` or
``{"type": "tool_call_response", "id", "response"}``. Turnwire keeps a tool call and its result in
one assistant message; here the results follow as a ``tool`` message, as the model is sent them.
Span attributes cannot hold nested values, so each attribute is the JSON text of its value (the
conventions allow that on spans).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnwire.values import dumps, loads, tool_call_output_json
from turnwire_client.v1 import message_pb2

_ROLES = {
    message_pb2.ROLE_USER: "user",
    message_pb2.ROLE_ASSISTANT: "assistant",
    message_pb2.ROLE_SYSTEM: "system",
}


def system_instructions(system: str) -> str:
    """``gen_ai.system_instructions``: the system prompt as one text part (JSON text)."""
    return dumps([{"type": "text", "content": system}])


def input_messages(messages: Sequence[message_pb2.Message]) -> str:
    """``gen_ai.input.messages``: ``messages`` in the order the model is sent them (JSON text)."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        parts: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for part in message.parts:
            kind = part.WhichOneof("kind")
            if kind == "text":
                parts.append({"type": "text", "content": part.text.text})
            elif kind == "reasoning" and part.reasoning.text:
                parts.append({"type": "reasoning", "content": part.reasoning.text})
            elif kind == "tool_call":
                call = part.tool_call
                parts.append(tool_call_part(call.tool_call_id, call.tool_name, _json(call.input_json)))
                output = tool_call_output_json(call)
                if output or call.error_text:
                    response = _json(output) if output else call.error_text
                    results.append(
                        {"type": "tool_call_response", "id": call.tool_call_id, "response": response}
                    )
        if parts:
            converted.append({"role": _ROLES.get(message.role, "user"), "parts": parts})
        if results:
            converted.append({"role": "tool", "parts": results})
    return dumps(converted)


def output_messages(text: str, calls: Sequence[message_pb2.ToolCallPart], finish_reason: str) -> str:
    """``gen_ai.output.messages``: one step's reply (its text and tool calls) as one message."""
    parts: list[dict[str, Any]] = []
    if text:
        parts.append({"type": "text", "content": text})
    parts.extend(tool_call_part(c.tool_call_id, c.tool_name, _json(c.input_json)) for c in calls)
    return dumps([{"role": "assistant", "parts": parts, "finish_reason": finish_reason}])


def tool_call_part(tool_call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A ``tool_call`` part."""
    return {"type": "tool_call", "id": tool_call_id, "name": name, "arguments": arguments}


def _json(text: str) -> Any:
    """``text`` parsed, or as it is when it is not JSON (a model's malformed arguments)."""
    if not text:
        return None
    try:
        return loads(text)
    except ValueError:
        return text
