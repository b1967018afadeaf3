"""Gemini ``generateContent`` request building (the Gemini API and Vertex AI take the same).

Follows https://ai.google.dev/api/generate-content. :func:`build_request` returns the ``contents``
and the ``config`` for ``google-genai``'s ``models.generate_content_stream``:

- The system prompt and transcript ``ROLE_SYSTEM`` messages → ``system_instruction``.
- User messages → ``user`` contents: text; files inline (``inline_data``: the bytes and their media
  type) or by URL (``file_data``); ``text/*`` and JSON files as text.
- Consecutive turns of one role are joined into one (roles alternate).
- Each assistant step → a ``model`` content (its text; its tool calls as ``function_call`` parts
  with the thought signature Gemini gave them, ``provider_metadata["gemini"]``; of parallel calls
  only the first has one), then, when it
  called tools, a ``user`` content of one ``function_response`` per call (``response``:
  ``{"output": …}`` or ``{"error": …}``, as the API documents). A call Gemini did not make (another
  model's, earlier in the conversation) carries Google's documented placeholder signature, which
  Gemini 3 models accept for calls they did not sign. Reasoning text is not sent back (Gemini
  keeps its thinking in the signatures).
- Tools → ``function_declarations`` with their JSON Schema as is (``parameters_json_schema``);
  ``tool_choice`` → ``function_calling_config`` (``AUTO``, ``NONE``, ``ANY`` and one allowed name).
- Settings → ``max_output_tokens``, ``temperature``, ``top_p``, ``top_k``, ``presence_penalty``,
  ``frequency_penalty``, ``stop_sequences``, ``seed``; a structured output → ``response_mime_type``
  ``application/json`` with ``response_json_schema``.
- ``provider_options`` under the entry's name or ``gemini`` are further ``GenerateContentConfig``
  fields (``thinking_config``, ``safety_settings``, ``cached_content`` for an explicit context
  cache, ``labels`` …); a name the SDK does not know is refused (``invalid_request_error``).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from turnwire.providers import ModelRequest
from turnwire.values import tool_call_output_json
from turnwire_client.v1 import message_pb2
from turnwire_server.providers import errors
from turnwire_server.providers.convert import (
    EMPTY_USER_TEXT,
    assistant_steps,
    file_text,
    is_blank,
    provider_options,
    text_of,
    tool_input,
    tool_result,
)

API = "gemini"
"""The key of Gemini's entries in ``provider_metadata``."""

FOREIGN_SIGNATURE = b"skip_thought_signature_validator"
"""The thought signature Google documents for function calls a Gemini model did not make
(https://ai.google.dev/gemini-api/docs/thought-signatures)."""

_SETTINGS = (
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "seed",
)


@dataclass
class GeminiPlan:
    """One step's request: ``contents`` and ``config`` for the SDK, the transcript's tool call ids
    (a new call must not reuse one) and warnings for what the API cannot take."""

    contents: list[dict[str, Any]]
    config: dict[str, Any]
    output_schema: Mapping[str, Any] | None
    call_ids: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


def build_request(
    request: ModelRequest, *, provider: str, config_fields: frozenset[str], default_max_tokens: int | None
) -> GeminiPlan:
    """The request for one step. ``config_fields`` are the SDK's ``GenerateContentConfig`` field
    names (what ``provider_options`` may set). Raises ProviderError (``invalid_request_error``) for
    an option the SDK does not know."""
    system = [request.system] if request.system else []
    contents: list[dict[str, Any]] = []
    call_ids: set[str] = set()
    for message in request.messages:
        role = message.role
        if role == message_pb2.ROLE_SYSTEM:
            if text := text_of(message.parts):
                system.append(text)
        elif role == message_pb2.ROLE_ASSISTANT:
            for step in assistant_steps(message):
                for content in _assistant_step(step, call_ids):
                    _add(contents, content)
        else:
            _add(contents, {"role": "user", "parts": _user_parts(message)})
    config: dict[str, Any] = {}
    if system:
        config["system_instruction"] = "\n\n".join(system)
    settings = request.settings
    for name in _SETTINGS:
        value = getattr(settings, name)
        if value is not None:
            config[name] = value
    if "max_output_tokens" not in config and default_max_tokens is not None:
        config["max_output_tokens"] = default_max_tokens
    if settings.stop_sequences:
        config["stop_sequences"] = list(settings.stop_sequences)
    if request.tools and request.tool_choice != "none":
        declarations = [
            {
                "name": tool.name,
                "description": tool.description,
                "parameters_json_schema": dict(tool.input_schema),
            }
            for tool in request.tools
        ]
        config["tools"] = [{"function_declarations": declarations}]
        config["tool_config"] = {"function_calling_config": _calling_config(request.tool_choice)}
    if request.output_schema is not None:
        config["response_mime_type"] = "application/json"
        config["response_json_schema"] = dict(request.output_schema)
    options = provider_options(settings.provider_options or {}, provider, API)
    unknown = sorted(set(options) - config_fields)
    if unknown:
        raise errors.invalid_request(
            provider,
            f"provider_options {unknown} are not GenerateContentConfig fields "
            "(https://ai.google.dev/api/generate-content#generationconfig)",
        )
    config.update(options)
    return GeminiPlan(contents, config, request.output_schema, call_ids)


def _add(contents: list[dict[str, Any]], content: dict[str, Any]) -> None:
    """Append ``content``, joined to the last one when it has the same role: turns alternate (a
    tool step's results and the next user message are one ``user`` turn)."""
    if contents and contents[-1]["role"] == content["role"]:
        contents[-1] = {"role": content["role"], "parts": [*contents[-1]["parts"], *content["parts"]]}
    else:
        contents.append(content)


def _calling_config(choice: str) -> dict[str, Any]:
    if choice == "auto":
        return {"mode": "AUTO"}
    if choice == "required":
        return {"mode": "ANY"}
    return {"mode": "ANY", "allowed_function_names": [choice]}


def _user_parts(message: message_pb2.Message) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            if not is_blank(part.text.text):  # the API refuses an empty text part
                parts.append({"text": part.text.text})
        elif kind == "file":
            parts.append(_file(part.file))
    return parts or [{"text": EMPTY_USER_TEXT}]


def _file(file: message_pb2.FilePart) -> dict[str, Any]:
    text = file_text(file)
    if text is not None:
        return {"text": text}
    media = file.media_type or "application/octet-stream"
    if file.WhichOneof("content") == "url":
        return {"file_data": {"file_uri": file.url, "mime_type": media}}
    return {"inline_data": {"data": file.data, "mime_type": media}}


def _assistant_step(step: Sequence[message_pb2.Part], call_ids: set[str]) -> list[dict[str, Any]]:
    """A ``model`` content for the step, then the ``user`` content of its calls' results."""
    parts: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part in step:
        kind = part.WhichOneof("kind")
        if kind == "text" and not is_blank(part.text.text):
            parts.append({"text": part.text.text})
        elif kind == "tool_call" and not part.tool_call.provider_executed:
            call = part.tool_call
            call_ids.add(call.tool_call_id)
            record = _record(call)
            function_call: dict[str, Any] = {"name": call.tool_name, "args": tool_input(call)}
            if record.get("id"):
                function_call["id"] = call.tool_call_id
            signature = record.get("thought_signature")
            if isinstance(signature, str):
                parts.append(
                    {"function_call": function_call, "thought_signature": base64.b64decode(signature)}
                )
            elif record:  # Gemini's, without a signature (a parallel call after the first): as it came
                parts.append({"function_call": function_call})
            else:
                parts.append({"function_call": function_call, "thought_signature": FOREIGN_SIGNATURE})
            response: dict[str, Any] = {"name": call.tool_name, "response": _response(call)}
            if record.get("id"):
                response["id"] = call.tool_call_id
            results.append({"function_response": response})
    out = [{"role": "model", "parts": parts}] if parts else []
    if results:
        out.append({"role": "user", "parts": results})
    return out


def _record(call: message_pb2.ToolCallPart) -> dict[str, Any]:
    """What Gemini gave with the call (``provider_metadata["gemini"]``): its signature (base64 text),
    and ``id`` true when the call's id is Gemini's own."""
    value = call.provider_metadata.fields.get(API)
    if value is None or value.WhichOneof("kind") != "struct_value":
        return {}
    fields = value.struct_value.fields
    return {name: fields[name].string_value or fields[name].bool_value for name in fields}


def _response(call: message_pb2.ToolCallPart) -> dict[str, Any]:
    if call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        return {"output": orjson.loads(tool_call_output_json(call) or "null")}
    text, _ = tool_result(call)
    return {"error": text}
