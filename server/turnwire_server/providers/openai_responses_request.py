"""OpenAI Responses request building.

Follows https://platform.openai.com/docs/api-reference/responses/create. :func:`build_request`
returns the body for ``responses.create`` and warnings for settings the API cannot
take (see :mod:`turnwire_server.providers.openai_responses` for the input item rules).
Provider-valid history (docs/semantics.md §11): no blank text, a blank tool output
is ``(empty result)``, each ``call_id`` unique in the request; items of one role
are not merged, since the API needs no alternation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from turnwire.providers import ModelRequest
from turnwire_client.v1 import message_pb2
from turnwire_server.providers import errors
from turnwire_server.providers.carry_over import OPENAI_RESPONSES, portable_parts
from turnwire_server.providers.convert import (
    EMPTY_USER_TEXT,
    ReplayIds,
    assistant_steps,
    file_text,
    file_url,
    is_blank,
    provider_options,
    text_of,
    tool_arguments,
    tool_result,
)
from turnwire_server.providers.openai_common import is_reasoning_model, sampling

EncryptedReasoning = Literal["auto", "always", "never"]


def _user_item(message: message_pb2.Message, warnings: list[str]) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text" and not is_blank(part.text.text):
            content.append({"type": "input_text", "text": part.text.text})
        elif kind == "file":
            file = part.file
            by_url = file.WhichOneof("content") == "url"
            if file.media_type.startswith("image/"):
                content.append({"type": "input_image", "image_url": file_url(file), "detail": "auto"})
            elif file.media_type == "application/pdf":
                item = {"type": "input_file", "file_url" if by_url else "file_data": file_url(file)}
                if not by_url:
                    item["filename"] = file.filename or "document.pdf"
                content.append(item)
            elif (text := file_text(file)) is not None:
                if is_blank(text):
                    warnings.append(f"an empty {file.media_type or 'text'} file was not sent")
                else:
                    content.append({"type": "input_text", "text": text})
            else:
                warnings.append(
                    f"a {file.media_type or 'untyped'} file was not sent: Responses does not take it"
                )
    return {"role": "user", "content": content or [{"type": "input_text", "text": EMPTY_USER_TEXT}]}


def _reasoning_item(part: message_pb2.ReasoningPart, store: bool) -> dict[str, Any] | None:
    meta = part.provider_metadata.fields.get("openai")
    if meta is None or meta.WhichOneof("kind") != "struct_value":
        return None
    item_id = meta.struct_value.fields.get("item_id")
    if item_id is None or not item_id.string_value:
        return None
    summary = [{"type": "summary_text", "text": part.text}] if part.text else []
    item: dict[str, Any] = {"type": "reasoning", "id": item_id.string_value, "summary": summary}
    if part.signature:
        item["encrypted_content"] = part.signature.decode("utf-8")
    elif not store:
        return None  # neither stored server-side nor carried: the API could not resolve it
    return item


def convert_input(
    messages: Sequence[message_pb2.Message], store: bool, warnings: list[str]
) -> list[dict[str, Any]]:
    """Responses ``input`` items for the transcript (see the module docstring)."""
    items: list[dict[str, Any]] = []
    call_id = ReplayIds()  # each call and its output share an id no other call of the request has
    for message in messages:
        role = message.role
        if role == message_pb2.ROLE_SYSTEM:
            text = text_of(message.parts)
            if text.strip():
                items.append({"role": "system", "content": text})
        elif role == message_pb2.ROLE_USER:
            items.append(_user_item(message, warnings))
        elif role == message_pb2.ROLE_ASSISTANT:
            for step in assistant_steps(message):
                outputs: list[dict[str, Any]] = []
                for part in portable_parts(step, OPENAI_RESPONSES):  # carry_over.py: what Responses takes
                    kind = part.WhichOneof("kind")
                    if kind == "text" and not is_blank(part.text.text):
                        items.append({"role": "assistant", "content": part.text.text})
                    elif kind == "reasoning":
                        reasoning = _reasoning_item(part.reasoning, store)
                        if reasoning is not None:
                            items.append(reasoning)
                    elif kind == "tool_call":
                        call = part.tool_call
                        unique = call_id(call.tool_call_id)
                        items.append(
                            {
                                "type": "function_call",
                                "call_id": unique,
                                "name": call.tool_name,
                                "arguments": tool_arguments(call),
                            }
                        )
                        content, _ = tool_result(call)
                        outputs.append({"type": "function_call_output", "call_id": unique, "output": content})
                items.extend(outputs)
    return items


def build_request(
    request: ModelRequest, *, provider: str, store: bool, encrypted_reasoning: EncryptedReasoning
) -> tuple[dict[str, Any], list[str]]:
    """``(body, warnings)``: the ``responses.create`` arguments. Raises ProviderError for a request the API
    would reject (max output tokens < 1, an unknown named tool)."""
    settings = request.settings
    warnings: list[str] = []
    options = provider_options(settings.provider_options or {}, provider, "openai-responses")
    store = bool(options.get("store", store))
    body: dict[str, Any] = {
        "model": request.model,
        "input": convert_input(request.messages, store, warnings),
        "store": store,
    }
    if request.system.strip():
        body["instructions"] = request.system
    reasoning = is_reasoning_model(request.model) or "reasoning" in options
    if not store and (encrypted_reasoning == "always" or (encrypted_reasoning == "auto" and reasoning)):
        body["include"] = ["reasoning.encrypted_content"]
    if settings.max_output_tokens is not None:
        if settings.max_output_tokens < 1:
            raise errors.invalid_request(
                provider, f"max_output_tokens must be at least 1, got {settings.max_output_tokens}"
            )
        body["max_output_tokens"] = settings.max_output_tokens
    body.update(sampling(settings, request.model, ("temperature", "top_p"), warnings))
    for name in ("top_k", "seed", "presence_penalty", "frequency_penalty", "stop_sequences"):
        if getattr(settings, name):
            warnings.append(f"{name} is not part of the Responses API and was not sent")
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": tool.name,
                "parameters": dict(tool.input_schema) or {"type": "object", "properties": {}},
                "strict": False,
                **({"description": tool.description} if tool.description else {}),
            }
            for tool in request.tools
        ]
        choice = request.tool_choice
        if choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
        elif choice in {tool.name for tool in request.tools}:
            body["tool_choice"] = {"type": "function", "name": choice}
        else:
            raise errors.invalid_request(
                provider, f"tool_choice names tool {choice!r}, which is not among the tools"
            )
    if request.output_schema is not None:
        body["text"] = {
            "format": {
                "type": "json_schema",
                "name": "output",
                "schema": dict(request.output_schema),
                "strict": False,
            }
        }
    body.update(options)
    return body, warnings
