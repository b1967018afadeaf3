"""OpenAI Responses request building.

Follows https://platform.openai.com/docs/api-reference/responses/create. :func:`build_request`
returns the body for ``responses.create`` and warnings for settings the API cannot
take (see :mod:`turnwire_server.providers.openai_responses` for the input item rules).
Provider-valid history (docs/semantics.md §11): no blank text, a blank tool output
is ``(empty result)``, each ``call_id`` unique in the request; items of one role
are not merged, since the API needs no alternation.

What goes back of reasoning (docs/providers.md, "What goes back on the next request"):

- A reasoning item goes back only together with the item that followed it in its step
  (a message or a function call). OpenAI refuses a reasoning item with none after it
  ("Item 'rs_…' of type 'reasoning' was provided without its required following item",
  https://github.com/openai/openai-node/issues/1567); a step that failed after its
  reasoning item leaves one at the end of its step, stored so for the client, left out
  here, so histories stored before this rule are repaired too.
- It goes back with its ``encrypted_content`` (``store`` false), or by id (``store``
  true); one that has neither goes back as text only when ``replay_reasoning`` asks
  (:func:`~turnwire_server.providers.openai_common.replay_reasoning_for`: by default for
  DeepSeek's and Kimi K2's thinking models, in user turns that called a tool), in the
  field it came in (``summary`` or ``content``).
- ``provider_options.previous_response_id`` and ``conversation`` are refused: Turnwire
  sends the whole history from its own store, so the API would get those items twice.
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
from turnwire_server.providers.openai_common import (
    ReplayReasoning,
    ReplayReasoningSetting,
    is_reasoning_model,
    replay_reasoning_for,
    sampling,
)
from turnwire_server.providers.openai_responses_items import input_items, is_client_run
from turnwire_server.providers.tool_content import responses_output, tool_media

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


def _reasoning_item(
    part: message_pb2.ReasoningPart, store: bool, send_text: bool
) -> tuple[dict[str, Any] | None, bool]:
    """``(item, text_only)``: the input item for a reasoning part of this API (``openai`` provider
    metadata), or None when it cannot go back; ``text_only`` when it goes back as its text alone
    (no encrypted content, not stored at OpenAI), which only ``send_text`` allows."""
    meta = part.provider_metadata.fields.get("openai")
    if meta is None or meta.WhichOneof("kind") != "struct_value":
        return None, False  # another API's reasoning
    fields = meta.struct_value.fields
    item_id = fields["item_id"].string_value if "item_id" in fields else ""
    text_field = fields["text_field"].string_value if "text_field" in fields else "summary"
    item: dict[str, Any] = {"type": "reasoning"}
    if item_id:
        item["id"] = item_id
    if text_field == "content":
        item["summary"] = []
        if part.text:
            item["content"] = [{"type": "reasoning_text", "text": part.text}]
    else:
        item["summary"] = [{"type": "summary_text", "text": part.text}] if part.text else []
    if part.signature:
        item["encrypted_content"] = part.signature.decode("utf-8")
        return (item, False) if item_id else (None, False)
    if store and item_id:
        return item, False  # resolved by id at OpenAI
    if send_text and part.text:
        return item, True
    return None, False  # neither stored server-side nor carried: the API could not resolve it


def convert_input(
    messages: Sequence[message_pb2.Message],
    store: bool,
    warnings: list[str],
    replay: ReplayReasoning = None,
) -> list[dict[str, Any]]:
    """Responses ``input`` items for the transcript (see the module docstring); ``replay`` says which
    text-only reasoning goes back (:data:`~turnwire_server.providers.openai_common.ReplayReasoning`)."""
    items: list[dict[str, Any]] = []
    call_id = ReplayIds()  # each call and its output share an id no other call of the request has
    held: list[dict[str, Any]] = []  # text-only reasoning of this user turn, sent if it calls a tool
    dropped: set[int] = set()  # ids of held items whose user turn called no tool
    called = False  # this user turn (since the last user message) has called a tool
    unsent = False  # a provider-executed call was left out (store false): warned once
    for message in messages:
        role = message.role
        if role == message_pb2.ROLE_SYSTEM:
            text = text_of(message.parts)
            if text.strip():
                items.append({"role": "system", "content": text})
        elif role == message_pb2.ROLE_USER:
            if not called:
                dropped.update(map(id, held))
            held.clear()
            called = False
            items.append(_user_item(message, warnings))
        elif role == message_pb2.ROLE_ASSISTANT:
            for step in assistant_steps(message):
                outputs: list[dict[str, Any]] = []
                step_items: list[dict[str, Any]] = []
                for part in portable_parts(step, OPENAI_RESPONSES):  # carry_over.py: what Responses takes
                    kind = part.WhichOneof("kind")
                    if kind == "text" and not is_blank(part.text.text):
                        step_items.append({"role": "assistant", "content": part.text.text})
                    elif kind == "reasoning":
                        reasoning, text_only = _reasoning_item(part.reasoning, store, replay is not None)
                        if reasoning is not None:
                            step_items.append(reasoning)
                            if text_only and replay == "tool_turns":
                                held.append(reasoning)
                    elif kind == "tool_call" and (
                        part.tool_call.provider_executed or is_client_run(part.tool_call)
                    ):
                        # A built-in's own items (openai_responses_items.py).
                        call = part.tool_call
                        called = called or not call.provider_executed
                        item, built_in_output = input_items(call, call_id(call.tool_call_id), store)
                        if item is not None:
                            step_items.append(item)
                        elif not store and not unsent:
                            unsent = True
                            warnings.append(
                                "the results of OpenAI's built-in tools (web search, file search, code "
                                "interpreter …) are not sent back when store is false: the API resolves "
                                "only items it stored"
                            )
                        if built_in_output is not None:
                            outputs.append(built_in_output)
                    elif kind == "tool_call":
                        called = True
                        call = part.tool_call
                        unique = call_id(call.tool_call_id)
                        step_items.append(
                            {
                                "type": "function_call",
                                "call_id": unique,
                                "name": call.tool_name,
                                "arguments": tool_arguments(call),
                            }
                        )
                        media = tool_media(call)  # images, PDFs: input items, never base64 text
                        output = responses_output(media) if media is not None else tool_result(call)[0]
                        outputs.append({"type": "function_call_output", "call_id": unique, "output": output})
                # A reasoning item goes back only with the item that followed it in its step.
                while step_items and step_items[-1].get("type") == "reasoning":
                    step_items.pop()
                items.extend(step_items)
                items.extend(outputs)
    if not called:
        dropped.update(map(id, held))
    return [item for item in items if id(item) not in dropped] if dropped else items


_REFUSED_OPTIONS = {
    "previous_response_id": "the items of that response",
    "conversation": "the conversation's items",
}
"""Provider options that make the API prepend items Turnwire sends itself (docs/providers.md)."""


def build_request(
    request: ModelRequest,
    *,
    provider: str,
    store: bool,
    encrypted_reasoning: EncryptedReasoning,
    replay_reasoning: ReplayReasoningSetting = "auto",
) -> tuple[dict[str, Any], list[str]]:
    """``(body, warnings)``: the ``responses.create`` arguments; ``replay_reasoning`` says which
    text-only reasoning goes back (:func:`~turnwire_server.providers.openai_common.replay_reasoning_for`).
    Raises ProviderError (``invalid_request_error``, INVALID_ARGUMENT for the client) for a request
    the API would reject (max output tokens < 1, an unknown named tool) or that would send items
    twice (``previous_response_id``, ``conversation`` in the provider options)."""
    settings = request.settings
    warnings: list[str] = []
    options = provider_options(settings.provider_options or {}, provider, "openai-responses")
    for name, items in _REFUSED_OPTIONS.items():
        if options.get(name) is not None:
            raise errors.invalid_request(
                provider,
                f"provider_options {name} is not supported: Turnwire sends the conversation's whole "
                f"history from its own store on every request, so the API would get {items} twice; "
                "remove it (store: true on the provider entry keeps responses at OpenAI)",
                code="unsupported_provider_option",
            )
    store = bool(options.get("store", store))
    replay = replay_reasoning_for(replay_reasoning, request.model, options)
    body: dict[str, Any] = {
        "model": request.model,
        "input": convert_input(request.messages, store, warnings, replay),
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
