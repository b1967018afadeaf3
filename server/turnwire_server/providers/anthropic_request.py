"""Anthropic Messages request building (API version 2026-10-21, ``anthropic`` SDK 2.x).

Follows https://platform.claude.com/docs/en/api/messages and the migration
guide to 2026-10-21. :func:`build_request` returns the keyword arguments for
``client.messages.create`` (plus ``extra_body`` for provider options the SDK
does not name) and the warnings for settings the API cannot take.

Transcript rules (each avoids a 400):

- System prompt and transcript ``ROLE_SYSTEM`` messages go in top-level ``system``.
- Every assistant step is one assistant turn (``thinking`` / ``redacted_thinking``
  blocks byte-for-byte with their signatures, ``text``, ``tool_use``), followed
  by one user turn whose ``tool_result`` blocks come first, one per ``tool_use``.
  Consecutive same-role turns are merged. A turn of one plain text block is sent as
  ``content: "<text>"``, the API's shorthand for that block (less for the SDK to copy and encode).
- No empty or whitespace-only text blocks (or empty text documents); a user
  message with nothing to send becomes :data:`EMPTY_USER_TEXT`; an assistant step
  with nothing is dropped; a blank tool result is ``(empty result)``
  (docs/semantics.md §11).
- Only what may go to Anthropic (:mod:`~turnwire_server.providers.carry_over`): its own
  signed reasoning, and its provider-executed calls (server tool calls and results, rebuilt
  from the kept blocks with their input and content by :func:`_server_blocks`; replies stored
  before issue 31 keep the blocks whole in a ``DataPart``) in place;
  a server call without its result only while its turn ends the request (:func:`_without_unpaired`).
- ``tools`` is defined whenever the history holds tool calls (:func:`_history_tools`);
  ``provider_options`` ``tools`` (server tools) join the request's own.
- Files: images (base64 or URL), PDFs and text documents in user turns only (the
  API rejects documents in assistant turns).
- ``temperature``, ``top_p``, ``top_k``, ``seed`` and the penalties do not exist in
  2026-10-21 (sending any is a 400): they are dropped with a warning.
- ``max_tokens`` is required: the setting, else the provider default; < 1 is refused.
- Structured output: a forced tool (``tool_choice`` = the output tool, its input
  streamed back as the text), or with ``structured_output="native"`` (or thinking
  on, which forbids forced tools) ``output_config.format``.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from turnwire.providers import ModelRequest
from turnwire.types import ToolDefinition
from turnwire.values import loads
from turnwire_client.v1 import message_pb2
from turnwire_server.providers import errors
from turnwire_server.providers.carry_over import ANTHROPIC, api_record, portable_parts, provider_block
from turnwire_server.providers.convert import (
    EMPTY_USER_TEXT,
    PrefixStates,
    assistant_steps,
    file_base64,
    file_text,
    is_blank,
    per_message_cache,
    provider_options,
    text_of,
    tool_input,
    tool_result,
)
from turnwire_server.providers.tool_content import anthropic_content, tool_media

OUTPUT_TOOL = "turnwire_structured_output"
"""The forced tool that carries structured output in ``tool`` mode."""

StructuredMode = Literal["tool", "native"]


@dataclass(slots=True)
class AnthropicPlan:
    """What one request sends, and what the decoder must know about it."""

    kwargs: dict[str, Any]
    extra_body: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    output_schema: Mapping[str, Any] | None = None
    output_tool: bool = False  # structured output arrives as the OUTPUT_TOOL's input
    output_wrapped: bool = False  # a non-object schema wrapped as {"value": …}
    call_ids: set[str] = field(default_factory=set)  # the transcript's tool call ids


_TOOL_ID_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


class _ToolUseIds:
    """``tool_use`` ids the Messages API accepts: only ``[a-zA-Z0-9_-]``, each once per request (it
    answers 400 otherwise). Ids from other providers may break both rules: the scripted model numbers
    calls ``call_<step>_<index>`` afresh every turn, and OpenAI-compatible servers send ids such as
    ``functions.get_weather:0``. Valid, unused ids pass unchanged; others get a deterministic stand-in,
    used for the call and its result alike (the stored transcript keeps the originals)."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, original: str) -> str:
        base = _TOOL_ID_INVALID.sub("_", original) or "toolu"
        candidate, count = base, 1
        while candidate in self.used:
            count += 1
            candidate = f"{base}_{count}"
        self.used.add(candidate)
        return candidate


def _text_block(text: str) -> dict[str, Any] | None:
    return {"type": "text", "text": text} if text and not text.isspace() else None


def _user_blocks(message: message_pb2.Message, warnings: list[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            block = _text_block(part.text.text)
            if block is not None:
                blocks.append(block)
        elif kind == "file":
            file_block = _file_block(part.file, warnings)
            if file_block is not None:
                blocks.append(file_block)
    return blocks


def _file_block(file: message_pb2.FilePart, warnings: list[str]) -> dict[str, Any] | None:
    media = file.media_type
    by_url = file.WhichOneof("content") == "url"
    if media.startswith("image/"):
        source = (
            {"type": "url", "url": file.url}
            if by_url
            else {"type": "base64", "media_type": media, "data": file_base64(file)}
        )
        return {"type": "image", "source": source}
    if media == "application/pdf":
        source = (
            {"type": "url", "url": file.url}
            if by_url
            else {"type": "base64", "media_type": media, "data": file_base64(file)}
        )
        block: dict[str, Any] = {"type": "document", "source": source}
        if file.filename:
            block["title"] = file.filename
        return block
    text = file_text(file)
    if text is not None and is_blank(text):
        warnings.append(f"an empty {media or 'text'} file was not sent: the Messages API rejects blank text")
        return None
    if text is not None:
        block = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text}}
        if file.filename:
            block["title"] = file.filename
        return block
    warnings.append(f"a {media or 'untyped'} file was not sent: the Messages API does not take it")
    return None


def _reasoning_block(part: message_pb2.ReasoningPart) -> dict[str, Any] | None:
    """A signed thinking block (carry_over.py keeps other APIs' reasoning out); None unsigned."""
    if not part.signature:
        return None
    signature = part.signature.decode("utf-8")
    if part.redacted:
        return {"type": "redacted_thinking", "data": signature}
    return {"type": "thinking", "thinking": part.text, "signature": signature}


_Segment = tuple[str, list[dict[str, Any]], tuple[tuple[int, str], ...], dict[str, Any]]


def _content(blocks: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A turn's ``content``: one plain text block (no keys but ``type`` and ``text``) as its string,
    which the Messages API takes as exactly that block ("content: string | array of content blocks");
    anything else as the blocks. One object per turn instead of three: the SDK deep-copies every
    request (``copy_tree``) and JSON encodes it, so a long history costs less per request."""
    if len(blocks) == 1:
        block = blocks[0]
        if block["type"] == "text" and len(block) == 2:
            text: str = block["text"]
            return text
    return blocks


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``content`` of a turn as a new list of blocks (to merge another turn into it)."""
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _segment(role: str, blocks: list[dict[str, Any]], calls: tuple[tuple[int, str], ...] = ()) -> _Segment:
    return (role, blocks, calls, {"role": role, "content": _content(blocks)})


@dataclass(frozen=True, slots=True)
class _Converted:
    """One message in the Messages API's terms, shared between requests (never mutated):
    ``system`` text (a system message), else ``(role, blocks, calls, turn)`` segments in order,
    where ``calls`` are ``(tool_use block index, original tool call id)`` of an assistant segment,
    whose results are the next segment's blocks, in the same order, and ``turn`` is the segment as
    a turn of its own, its ``content`` a string for one plain text block (:func:`_content`; a
    request takes it as is unless it merges or renames: fewer objects per request, which also
    spares the garbage collector); and the warnings."""

    system: str | None
    segments: tuple[_Segment, ...]
    warnings: tuple[str, ...]


def _convert_message(message: message_pb2.Message) -> _Converted:
    warnings: list[str] = []
    role = message.role
    if role == message_pb2.ROLE_SYSTEM:
        text = text_of(message.parts)
        return _Converted(text if text.strip() else None, (), ())
    if role == message_pb2.ROLE_USER:
        user = _user_blocks(message, warnings) or [{"type": "text", "text": EMPTY_USER_TEXT}]
        return _Converted(None, (_segment("user", user),), tuple(warnings))
    if role != message_pb2.ROLE_ASSISTANT:
        return _Converted(None, (), ())
    segments: list[_Segment] = []
    for step in assistant_steps(message):
        blocks: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        calls: list[tuple[int, str]] = []
        for part in portable_parts(step, ANTHROPIC):
            kind = part.WhichOneof("kind")
            if kind == "text":
                block = _text_block(part.text.text)
            elif kind == "reasoning":
                block = _reasoning_block(part.reasoning)
            elif kind == "data":
                block = provider_block(part)  # a server tool's call or result, stored before issue 31
            elif kind == "tool_call" and part.tool_call.provider_executed:
                blocks.extend(_server_blocks(part.tool_call))
                continue
            elif kind == "tool_call":
                call = part.tool_call
                calls.append((len(blocks), call.tool_call_id))
                block = {
                    "type": "tool_use",
                    "id": call.tool_call_id,
                    "name": call.tool_name,
                    "input": tool_input(call),
                }
                content, is_error = tool_result(call)
                result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call.tool_call_id}
                media = tool_media(call)  # images, documents: native blocks, never base64 text
                if media is not None:
                    result["content"] = anthropic_content(media)
                elif content:
                    result["content"] = content
                if is_error:
                    result["is_error"] = True
                results.append(result)
            else:
                block = None
            if block is not None:
                blocks.append(block)
        segments.append(_segment("assistant", blocks, tuple(calls)))
        segments.append(_segment("user", results))
    return _Converted(None, tuple(segments), ())


def _server_blocks(call: message_pb2.ToolCallPart) -> list[dict[str, Any]]:
    """A server tool's call (``server_tool_use``, ``mcp_tool_use``) and result blocks as the API
    gave them: the kept blocks (``provider_metadata["anthropic"]``) with the call's input and the
    result's content put back; a failed result's block was kept whole. A result without its call
    block, or a call without a result, goes as it is (:func:`_without_unpaired` drops an unpaired
    call where the API would refuse it)."""
    record = api_record(call, "anthropic")
    blocks: list[dict[str, Any]] = []
    start = record.get("call")
    if isinstance(start, dict) and isinstance(start.get("type"), str):
        blocks.append({**start, "input": tool_input(call)})
    result = record.get("result")
    if isinstance(result, dict) and isinstance(result.get("type"), str):
        if "content" in result:
            blocks.append(result)
        elif call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE and call.output_json:
            blocks.append({**result, "content": loads(call.output_json)})
    return blocks


_converted = per_message_cache(_convert_message, "anthropic conversions")


@dataclass(frozen=True, slots=True)
class _Prefix:
    """:func:`convert_messages`' state after some messages (kept in :data:`_prefixes`; never
    mutated): the system texts, the turns (tool results already first), the warnings, the stored
    call ids seen, the tool_use ids used, the last assistant segment's renamed ids (None:
    none renamed) that the next segment's results must follow, and the called tools' names."""

    system: tuple[str, ...]
    turns: tuple[dict[str, Any], ...]
    warnings: tuple[str, ...]
    call_ids: frozenset[str]
    used: frozenset[str]
    renamed: tuple[str, ...] | None
    tool_names: frozenset[str] = frozenset()


_prefixes: PrefixStates[_Prefix] = PrefixStates("anthropic prefix states")


def convert_messages(
    messages: Sequence[message_pb2.Message],
    warnings: list[str],
    call_ids: set[str] | None = None,
    tool_names: set[str] | None = None,
) -> tuple[list[str], list[dict[str, Any]]]:
    """``(system texts, turns)`` for the Messages API (see the module docstring for the rules); a
    turn's ``content`` is a string for one plain text block, else a list of blocks.
    Each message's conversion is kept between requests (:func:`per_message_cache`), and so is the
    state after each request's messages (:class:`PrefixStates`): a request that starts with an
    earlier one's very messages (the history of the turn before, only appended to) goes on from
    there, so only the new messages cost anything but copying the kept turns list. ``call_ids``
    gets the stored ids of the transcript's tool calls (``transcript_call_ids``, without a
    second pass over the messages), ``tool_names`` the names of the tools they called. A server
    tool call left without its result (a paused turn, ``pause_turn``) is sent only while its
    assistant turn ends the request: a later turn would make it unpaired (a 400), so it is dropped
    then (:func:`_without_unpaired`)."""
    done, prefix = _prefixes.longest(messages, None)
    if prefix is None:
        prefix = _Prefix((), (), (), frozenset(), frozenset(), None)
    system = list(prefix.system)
    turns = list(prefix.turns)
    warnings.extend(prefix.warnings)
    new_warnings: list[str] = []
    seen = set(prefix.call_ids)
    names = set(prefix.tool_names)
    tool_use_id = _ToolUseIds()
    tool_use_id.used = set(prefix.used)
    renamed = list(prefix.renamed) if prefix.renamed is not None else None
    owned = False  # turns[-1] was made by this request (else it is a kept, shared one)
    sorted_from = max(len(turns) - 1, 0)  # the kept turns are sorted; the last may grow
    for message in messages[done:] if done else messages:
        converted = _converted(message)
        new_warnings.extend(converted.warnings)
        if converted.system is not None:
            system.append(converted.system)
        for role, kept, calls, kept_turn in converted.segments:
            blocks = kept  # shared with other requests: replaced, never changed
            if calls:
                seen.update(original for _, original in calls)
                names.update(kept[index]["name"] for index, _ in calls)
                ids = [tool_use_id(original) for _, original in calls]
                if any(new != original for new, (_, original) in zip(ids, calls, strict=True)):
                    blocks = list(kept)
                    for new, (index, _) in zip(ids, calls, strict=True):
                        blocks[index] = {**kept[index], "id": new}
                    renamed = ids
            elif renamed is not None:  # the results of the calls just renamed
                blocks = [{**result, "tool_use_id": new} for result, new in zip(kept, renamed, strict=True)]
                renamed = None
            if not blocks:
                continue
            if turns and turns[-1]["role"] == "assistant" and role != "assistant":
                paired = _without_unpaired(turns[-1]["content"])
                if paired is not None:  # the paused server call a later turn follows
                    if paired:
                        turns[-1] = {"role": "assistant", "content": paired}
                        owned = True
                    else:
                        turns.pop()
                        owned = False
            if turns and turns[-1]["role"] == role:
                if not owned:  # a kept turn, its content maybe a string: a list of this request's own
                    turns[-1] = {"role": role, "content": _blocks(turns[-1]["content"])}
                    owned = True
                turns[-1]["content"].extend(blocks)
            elif blocks is kept:
                turns.append(kept_turn)
                owned = False
            else:  # renamed tool_use or tool_result blocks: never a lone text block, always a list
                turns.append({"role": role, "content": blocks})
                owned = True
    for i in range(sorted_from, len(turns)):  # tool_result blocks first in every user turn
        content = turns[i]["content"]
        if (
            turns[i]["role"] == "user"
            and not isinstance(content, str)
            and len(content) > 1
            and content[0]["type"] != "tool_result"
        ):
            turns[i] = {
                "role": "user",
                "content": sorted(content, key=lambda block: block["type"] != "tool_result"),
            }
    warnings.extend(new_warnings)
    if call_ids is not None:
        call_ids.update(seen)
    if tool_names is not None:
        tool_names.update(names)
    if len(messages) > done:
        state = _Prefix(
            tuple(system),
            tuple(turns),
            (*prefix.warnings, *new_warnings),
            frozenset(seen),
            frozenset(tool_use_id.used),
            tuple(renamed) if renamed is not None else None,
            frozenset(names),
        )
        _prefixes.keep(messages, None, state)
    return system, turns


_SERVER_USES = ("server_tool_use", "mcp_tool_use")


def _without_unpaired(content: str | list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """An assistant turn's blocks without server tool calls that no result block follows (a new
    list), or None when every call has its result. The Messages API answers a server call without
    its result with 400 ("… tool use with id … was found without a corresponding … result block")
    unless the call ends the request's last turn (how a paused turn continues:
    https://platform.claude.com/docs/en/build-with-claude/handling-stop-reasons#pause-turn)."""
    if isinstance(content, str) or not any(block["type"] in _SERVER_USES for block in content):
        return None
    answered = {block.get("tool_use_id") for block in content if block["type"].endswith("_tool_result")}
    kept = [b for b in content if b["type"] not in _SERVER_USES or b.get("id") in answered]
    return kept if len(kept) < len(content) else None


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    schema = dict(tool.input_schema) or {"type": "object", "properties": {}}
    schema.setdefault("type", "object")
    result: dict[str, Any] = {"name": tool.name, "input_schema": schema}
    if tool.description:
        result["description"] = tool.description
    return result


HISTORY_TOOL_DESCRIPTION = "Called earlier in this conversation; not available now."


def _history_tools(names: set[str]) -> list[dict[str, Any]]:
    """Stand-in definitions for the tools a history called, for a request that has none.

    The Messages API refuses a request whose messages hold ``tool_use`` or ``tool_result`` blocks
    and that defines no tools (400 "Requests which include `tool_use` or `tool_result` blocks must
    define tools"); it checks that ``tools`` is there, not that each past call matches a
    definition. A turn may have none: a continuation after ``SubmitToolResults`` that did not send
    the client tools again, or a turn whose ``active_tools`` is empty. Sending the history as text
    would change what the model sees of its own calls, and the real specs are not ours to keep
    (client tools live with the client, docs/semantics.md §6): so each called name gets a minimal
    definition (any object input), sent with ``tool_choice: none``, so the model reads its history
    as it was and cannot call a tool this turn does not have."""
    return [
        {"name": name, "description": HISTORY_TOOL_DESCRIPTION, "input_schema": {"type": "object"}}
        for name in sorted(names)
    ]


def _tool_choice(choice: str, tool_names: set[str], provider: str) -> dict[str, Any]:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "none":
        return {"type": "none"}
    if choice == "required":
        return {"type": "any"}
    if choice not in tool_names:
        raise errors.invalid_request(
            provider, f"tool_choice names tool {choice!r}, which is not among the request's tools"
        )
    return {"type": "tool", "name": choice}


@functools.cache
def _sdk_params() -> frozenset[str]:
    """Parameter names of ``AsyncMessages.create`` (the rest of provider options go in ``extra_body``)."""
    from anthropic.resources.messages import AsyncMessages

    return frozenset(inspect.signature(AsyncMessages.create).parameters) - {"self"}


_DROPPED = ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty", "seed")


def build_request(
    request: ModelRequest,
    *,
    provider: str,
    default_max_tokens: int,
    structured_output: StructuredMode,
) -> AnthropicPlan:
    """The ``messages.create`` arguments for ``request``. Raises ProviderError for a request the API
    would reject (max tokens < 1, a forced tool with thinking on, an unknown named tool)."""
    settings = request.settings
    warnings: list[str] = []
    options = provider_options(settings.provider_options or {}, provider, "anthropic")
    mode: StructuredMode = options.pop("structured_output", structured_output)
    max_tokens = settings.max_output_tokens if settings.max_output_tokens is not None else default_max_tokens
    if max_tokens < 1:
        raise errors.invalid_request(provider, f"max_tokens must be at least 1, got {max_tokens}")
    call_ids: set[str] = set()
    called: set[str] = set()
    system, turns = convert_messages(request.messages, warnings, call_ids, called)
    if request.system.strip():
        system.insert(0, request.system)
    kwargs: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens, "messages": turns}
    if system:
        kwargs["system"] = "\n\n".join(system)
    for name in _DROPPED:
        if getattr(settings, name) is not None:
            warnings.append(f"{name} is not part of the Messages API (2026-10-21) and was not sent")
    if settings.stop_sequences:
        stops = [s for s in settings.stop_sequences if s and not s.isspace()]
        if len(stops) < len(settings.stop_sequences):
            warnings.append("whitespace-only stop sequences were not sent")
        if stops:
            kwargs["stop_sequences"] = stops
    tools = [_tool(t) for t in request.tools]
    # Server tools (web search …) are given as provider_options "tools": they join the request's.
    extra_tools = options.pop("tools", None)
    if isinstance(extra_tools, Sequence) and not isinstance(extra_tools, str):
        tools.extend(dict(t) for t in extra_tools if isinstance(t, Mapping))
    names = {t.name for t in request.tools} | {str(t.get("name")) for t in tools if "type" in t}
    choice = request.tool_choice
    thinking = options.get("thinking")
    thinking_on = isinstance(thinking, Mapping) and thinking.get("type") not in (None, "disabled")
    plan = AnthropicPlan(
        kwargs=kwargs,
        extra_body={},
        warnings=warnings,
        output_schema=request.output_schema,
        call_ids=call_ids,
    )
    tool_choice: dict[str, Any] | None = _tool_choice(choice, names, provider) if tools else None
    schema = request.output_schema
    if schema is not None and (mode == "native" or thinking_on):
        kwargs["output_config"] = {"format": {"type": "json_schema", "schema": dict(schema)}}
    elif schema is not None:
        plan.output_tool = True
        input_schema = dict(schema)
        if input_schema.get("type") != "object":
            plan.output_wrapped = True
            input_schema = {"type": "object", "properties": {"value": input_schema}, "required": ["value"]}
        output = {
            "name": OUTPUT_TOOL,
            "description": "Give the final answer as JSON matching this tool's input schema.",
            "input_schema": input_schema,
        }
        if not tools or choice == "none":
            tools, tool_choice = [output], {"type": "tool", "name": OUTPUT_TOOL}
        else:
            tools.append(output)
            if choice == "auto":
                tool_choice = {"type": "any"}
    if not tools and called:
        tools, tool_choice = _history_tools(called), {"type": "none"}
    if tools:
        kwargs["tools"] = tools
        if tool_choice is not None:
            if thinking_on and tool_choice["type"] in ("any", "tool"):
                raise errors.invalid_request(
                    provider,
                    "thinking cannot be on when tool_choice forces a tool (required or a named tool)",
                )
            kwargs["tool_choice"] = tool_choice
    if thinking_on and isinstance(thinking, Mapping):
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= max_tokens:
            raise errors.invalid_request(
                provider, f"thinking.budget_tokens ({budget}) must be below max_tokens ({max_tokens})"
            )
    known = _sdk_params()
    for key, value in options.items():
        if key in known and key not in ("model", "messages", "stream"):
            kwargs[key] = value
        else:
            plan.extra_body[key] = value
    return plan
