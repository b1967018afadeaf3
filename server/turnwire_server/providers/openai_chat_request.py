"""OpenAI Chat Completions request building (also for OpenAI-compatible servers).

Follows https://platform.openai.com/docs/api-reference/chat/create. :func:`build_request`
returns the body for ``chat.completions.create`` and warnings for settings the API
cannot take (see :mod:`turnwire_server.providers.openai_chat` for the transcript rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from turnwire.providers import ModelRequest
from turnwire_client.v1 import message_pb2
from turnwire_server.providers import errors
from turnwire_server.providers.convert import (
    EMPTY_USER_TEXT,
    assistant_steps,
    file_base64,
    file_text,
    file_url,
    provider_options,
    text_of,
    tool_arguments,
    tool_result,
)
from turnwire_server.providers.openai_common import sampling

MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]

_AUDIO = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def _user_content(message: message_pb2.Message, warnings: list[str]) -> str | list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            if part.text.text:
                parts.append({"type": "text", "text": part.text.text})
        elif kind == "file":
            file = part.file
            media = file.media_type
            if media.startswith("image/"):
                parts.append({"type": "image_url", "image_url": {"url": file_url(file)}})
            elif media == "application/pdf" and file.WhichOneof("content") == "data":
                pdf = {"file_data": file_url(file), "filename": file.filename or "document.pdf"}
                parts.append({"type": "file", "file": pdf})
            elif media in _AUDIO and file.WhichOneof("content") == "data":
                audio = {"data": file_base64(file), "format": _AUDIO[media]}
                parts.append({"type": "input_audio", "input_audio": audio})
            elif (text := file_text(file)) is not None:
                parts.append({"type": "text", "text": text})
            else:
                warnings.append(
                    f"a {media or 'untyped'} file was not sent: Chat Completions does not take it"
                )
    if not parts:
        return EMPTY_USER_TEXT
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def convert_messages(
    system: str, messages: Sequence[message_pb2.Message], warnings: list[str]
) -> list[dict[str, Any]]:
    """Chat messages for the transcript (see the module docstring)."""
    result: list[dict[str, Any]] = []
    if system.strip():
        result.append({"role": "system", "content": system})
    for message in messages:
        role = message.role
        if role == message_pb2.ROLE_SYSTEM:
            text = text_of(message.parts)
            if text.strip():
                result.append({"role": "system", "content": text})
        elif role == message_pb2.ROLE_USER:
            result.append({"role": "user", "content": _user_content(message, warnings)})
        elif role == message_pb2.ROLE_ASSISTANT:
            for step in assistant_steps(message):
                text = text_of(step)
                calls = [p.tool_call for p in step if p.WhichOneof("kind") == "tool_call"]
                if not text and not calls:
                    continue
                assistant: dict[str, Any] = {"role": "assistant"}
                if text:
                    assistant["content"] = text
                if calls:
                    assistant["tool_calls"] = [
                        {
                            "id": call.tool_call_id,
                            "type": "function",
                            "function": {"name": call.tool_name, "arguments": tool_arguments(call)},
                        }
                        for call in calls
                    ]
                result.append(assistant)
                for call in calls:
                    content, _ = tool_result(call)
                    result.append({"role": "tool", "tool_call_id": call.tool_call_id, "content": content})
    return result


def build_request(
    request: ModelRequest, *, provider: str, max_tokens_param: MaxTokensParam, include_usage: bool
) -> tuple[dict[str, Any], list[str]]:
    """``(body, warnings)``: the ``chat.completions.create`` arguments. Raises ProviderError for a request
    the API would reject (max tokens < 1, an unknown named tool)."""
    settings = request.settings
    warnings: list[str] = []
    body: dict[str, Any] = {
        "model": request.model,
        "messages": convert_messages(request.system, request.messages, warnings),
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if settings.max_output_tokens is not None:
        if settings.max_output_tokens < 1:
            raise errors.invalid_request(
                provider, f"max tokens must be at least 1, got {settings.max_output_tokens}"
            )
        body[max_tokens_param] = settings.max_output_tokens
    fields = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
    body.update(sampling(settings, request.model, fields, warnings))
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop_sequences:
        body["stop"] = list(settings.stop_sequences)
    if settings.top_k is not None:
        warnings.append("top_k is not part of Chat Completions and was not sent (set it in provider_options)")
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "parameters": dict(tool.input_schema) or {"type": "object", "properties": {}},
                    **({"description": tool.description} if tool.description else {}),
                },
            }
            for tool in request.tools
        ]
        choice = request.tool_choice
        if choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
        elif choice in {tool.name for tool in request.tools}:
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
        else:
            raise errors.invalid_request(
                provider, f"tool_choice names tool {choice!r}, which is not among the tools"
            )
    if request.output_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": dict(request.output_schema), "strict": False},
        }
    body.update(provider_options(settings.provider_options or {}, provider, "openai"))
    return body, warnings
