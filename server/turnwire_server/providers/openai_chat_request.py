"""OpenAI Chat Completions request building (also for OpenAI-compatible servers).

Follows https://platform.openai.com/docs/api-reference/chat/create. :func:`build_request`
returns the body for ``chat.completions.create`` and warnings for settings the API
cannot take (see :mod:`turnwire_server.providers.openai_chat` for the transcript rules).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from turnwire.providers import ModelRequest
from turnwire_client.v1 import message_pb2
from turnwire_server.providers import errors
from turnwire_server.providers.carry_over import OPENAI_CHAT, portable_parts
from turnwire_server.providers.convert import (
    EMPTY_USER_TEXT,
    PrefixStates,
    ReplayIds,
    assistant_steps,
    file_base64,
    file_text,
    file_url,
    is_blank,
    per_message_cache,
    provider_options,
    text_of,
    tool_arguments,
    tool_result,
)
from turnwire_server.providers.openai_common import (
    ReplayReasoning,
    ReplayReasoningSetting,
    replay_reasoning_for,
    sampling,
)
from turnwire_server.providers.tool_content import chat_content, tool_media

MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]

_AUDIO = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def _user_content(message: message_pb2.Message, warnings: list[str]) -> str | list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            if not is_blank(part.text.text):  # several compatible servers refuse blank text
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
                if is_blank(text):
                    warnings.append(f"an empty {media or 'text'} file was not sent")
                else:
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


_Item = tuple[dict[str, Any], tuple[str, ...], int, str | None]
"""A Chat message of a converted message: the wire dict, the original ids of its tool calls (an
assistant message), for a ``tool`` message the index of the call it answers among the
preceding assistant message's calls (:data:`_TOOL_MEDIA` for the user message carrying the
step's tool result media, -1 for other messages), and for an assistant message the
reasoning of its step (``""`` when none; None for other messages), sent as ``reasoning_content``
only when the request replays reasoning (:func:`convert_messages`)."""


_TOOL_MEDIA = -2
"""The ``_Item`` index of the user message that carries a step's tool result media: part of the
tool loop, not a new user turn (reasoning replay goes on)."""


def _reasoning_text(step: Sequence[message_pb2.Part]) -> str:
    """The readable reasoning of a step: its reasoning parts' text (redacted ones hold none),
    several joined by a blank line."""
    texts = [
        p.reasoning.text
        for p in step
        if p.WhichOneof("kind") == "reasoning" and p.reasoning.text and not p.reasoning.redacted
    ]
    return texts[0] if len(texts) == 1 else "\n\n".join(texts)


def _convert_message(message: message_pb2.Message) -> tuple[tuple[_Item, ...], tuple[str, ...]]:
    """``(items, warnings)`` for one message, shared between requests (never mutated)."""
    warnings: list[str] = []
    items: list[_Item] = []
    role = message.role
    if role == message_pb2.ROLE_SYSTEM:
        text = text_of(message.parts)
        if text.strip():
            items.append(({"role": "system", "content": text}, (), -1, None))
    elif role == message_pb2.ROLE_USER:
        items.append(({"role": "user", "content": _user_content(message, warnings)}, (), -1, None))
    elif role == message_pb2.ROLE_ASSISTANT:
        unsent = ""  # the reasoning of a step with nothing else (cut short) goes with the next one
        for whole_step in assistant_steps(message):
            step = portable_parts(whole_step, OPENAI_CHAT)  # carry_over.py: what Chat may take
            text = text_of(step)
            text = "" if is_blank(text) else text
            calls = [p.tool_call for p in step if p.WhichOneof("kind") == "tool_call"]
            reasoning = _reasoning_text(step)
            if unsent:
                reasoning = f"{unsent}\n\n{reasoning}" if reasoning else unsent
            if not text and not calls:
                unsent = reasoning
                continue
            unsent = ""
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
            items.append((assistant, tuple(call.tool_call_id for call in calls), -1, reasoning))
            attached: list[dict[str, Any]] = []  # the results' images, files, audio (tool_content.py)
            for index, call in enumerate(calls):
                media = tool_media(call)
                if media is not None:
                    content, parts = chat_content(media, call.tool_name)
                    attached.extend(parts)
                else:
                    content, _ = tool_result(call)
                tool = {"role": "tool", "tool_call_id": call.tool_call_id, "content": content}
                items.append((tool, (), index, None))
            if attached:  # tool messages take text only: the media follow them in a user message
                items.append(({"role": "user", "content": attached}, (), _TOOL_MEDIA, None))
    return tuple(items), tuple(warnings)


_converted = per_message_cache(_convert_message, "openai chat conversions")


@dataclass(frozen=True, slots=True)
class _Prefix:
    """:func:`convert_messages`' state after some messages (kept in :data:`_prefixes` with the
    system prompt and the reasoning replay; never mutated): the Chat messages so far (roles
    already merged), the warnings, the stored call ids seen, the call ids used, the last
    assistant message's renamed ids (None: none renamed) that its ``tool`` messages must follow,
    whether the current user turn (since the last user message) called a tool, and the reasoning
    of its assistant messages not yet attached (index in ``messages``, text)."""

    messages: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    call_ids: frozenset[str]
    used: frozenset[str]
    renamed: tuple[str, ...] | None
    turn_called_tools: bool = False
    unattached: tuple[tuple[int, str], ...] = ()


_prefixes: PrefixStates[_Prefix] = PrefixStates("openai chat prefix states")


def convert_messages(
    system: str,
    messages: Sequence[message_pb2.Message],
    warnings: list[str],
    call_ids: set[str] | None = None,
    *,
    replay_reasoning: ReplayReasoning = None,
) -> list[dict[str, Any]]:
    """Chat messages for the transcript (see the module docstring). Each message's conversion is
    kept between requests (:func:`per_message_cache`), and so is the state after each request's
    messages with its ``system`` (:class:`PrefixStates`): a request that starts with an earlier
    one's very messages goes on from there. Only the tool call ids (unique per request,
    :class:`ReplayIds`), the merging of roles (:func:`_append_alternating`) and the reasoning
    sent back (``replay_reasoning``, :data:`ReplayReasoning`) are done per request.
    ``call_ids`` gets the stored ids of the transcript's tool calls (``transcript_call_ids``,
    without a second pass)."""
    extra = (system, replay_reasoning)
    done, prefix = _prefixes.longest(messages, extra)
    if prefix is None:
        start = ({"role": "system", "content": system},) if system.strip() else ()
        prefix = _Prefix(start, (), frozenset(), frozenset(), None)
    merged = list(prefix.messages)
    warnings.extend(prefix.warnings)
    new_warnings: list[str] = []
    seen = set(prefix.call_ids)
    call_id = ReplayIds()
    call_id.used = set(prefix.used)
    renamed = list(prefix.renamed) if prefix.renamed is not None else None
    called_tools = prefix.turn_called_tools
    unattached = dict(prefix.unattached)
    for message in messages[done:] if done else messages:
        items, converted_warnings = _converted(message)
        new_warnings.extend(converted_warnings)
        for kept, originals, answers, reasoning in items:
            wire = kept  # shared with other requests: replaced, never changed
            if answers >= 0:  # a tool message
                if renamed is not None:
                    wire = {**wire, "tool_call_id": renamed[answers]}
            elif originals:
                seen.update(originals)
                ids = [call_id(original) for original in originals]  # one id per call, and its result's
                renamed = None
                if ids != list(originals):
                    renamed = ids
                    calls = [{**c, "id": n} for c, n in zip(wire["tool_calls"], ids, strict=True)]
                    wire = {**wire, "tool_calls": calls}
            _append_alternating(merged, wire)
            if replay_reasoning is None:
                continue
            if wire["role"] == "user" and answers != _TOOL_MEDIA:  # a new user turn
                called_tools = False
                unattached.clear()
            elif reasoning is not None:  # an assistant step
                index = len(merged) - 1
                unattached[index] = _joined(unattached.get(index, ""), reasoning)
                called_tools = called_tools or bool(originals) or replay_reasoning == "always"
                if called_tools:  # this turn's assistant messages so far, this one included
                    for at, text in unattached.items():
                        sent = merged[at]
                        merged[at] = {
                            **sent,
                            "reasoning_content": _joined(sent.get("reasoning_content", ""), text),
                        }
                    unattached.clear()
    warnings.extend(new_warnings)
    if call_ids is not None:
        call_ids.update(seen)
    if len(messages) > done:
        state = _Prefix(
            tuple(merged),
            (*prefix.warnings, *new_warnings),
            frozenset(seen),
            frozenset(call_id.used),
            tuple(renamed) if renamed is not None else None,
            called_tools,
            tuple(unattached.items()),
        )
        _prefixes.keep(messages, extra, state)
    return merged


def _joined(first: str, second: str) -> str:
    """Two reasoning texts of one Chat message (a reply continued, steps merged), a blank line apart."""
    return f"{first}\n\n{second}" if first and second else first or second


def _append_alternating(merged: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Append ``message`` to ``merged``, merged into the last one when they would make a run of
    same-role ``system``, ``user`` or ``assistant`` messages (docs/semantics.md §11): many
    OpenAI-compatible servers (chat templates of Mistral, Llama, Gemma …) refuse roles that do not
    alternate. User and system texts are joined with a blank line, assistant texts as they are (a
    continued reply goes on where it stopped, as Anthropic's adjacent text blocks do), content
    parts kept in order. An assistant message with ``tool_calls`` ends a run, since its ``tool``
    messages follow it: every call keeps exactly one result, right after it. A merge is a new
    dict in the last one's place (the merged ones are shared, never changed)."""
    previous = merged[-1] if merged else None
    role = message["role"]
    if previous is None or previous["role"] != role or role == "tool" or previous.get("tool_calls"):
        merged.append(message)
        return
    combined = dict(previous)
    separator = "" if role == "assistant" else "\n\n"
    combined["content"] = _join_content(previous.get("content"), message.get("content"), separator)
    if message.get("tool_calls"):
        combined["tool_calls"] = message["tool_calls"]
    if combined["content"] is None:
        del combined["content"]
    merged[-1] = combined


def _join_content(
    first: str | list[dict[str, Any]] | None, second: str | list[dict[str, Any]] | None, separator: str
) -> str | list[dict[str, Any]] | None:
    if first is None or first == EMPTY_USER_TEXT:
        return second if second is not None else first
    if second is None or second == EMPTY_USER_TEXT:
        return first
    if isinstance(first, str) and isinstance(second, str):
        return f"{first}{separator}{second}"
    parts = [{"type": "text", "text": first}] if isinstance(first, str) else list(first)
    parts.extend([{"type": "text", "text": second}] if isinstance(second, str) else second)
    return parts


def build_request(
    request: ModelRequest,
    *,
    provider: str,
    max_tokens_param: MaxTokensParam,
    include_usage: bool,
    call_ids: set[str] | None = None,
    replay_reasoning: ReplayReasoningSetting = "auto",
) -> tuple[dict[str, Any], list[str]]:
    """``(body, warnings)``: the ``chat.completions.create`` arguments; ``call_ids`` gets the
    transcript's tool call ids; ``replay_reasoning`` says which assistant messages carry their
    reasoning back (:func:`replay_reasoning_for`). Raises ProviderError for a request the API
    would reject (max tokens < 1, an unknown named tool)."""
    settings = request.settings
    warnings: list[str] = []
    options = provider_options(settings.provider_options or {}, provider, "openai")
    replay = replay_reasoning_for(replay_reasoning, request.model, options)
    body: dict[str, Any] = {
        "model": request.model,
        "messages": convert_messages(
            request.system, request.messages, warnings, call_ids, replay_reasoning=replay
        ),
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
        stops = [stop for stop in settings.stop_sequences if stop]
        if len(stops) < len(settings.stop_sequences):
            warnings.append("empty stop sequences were not sent")
        if stops:
            body["stop"] = stops
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
    body.update(options)
    return body, warnings
