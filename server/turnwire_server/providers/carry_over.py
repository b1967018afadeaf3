"""What of a stored history may go to which API: the rules, written once for every request builder.

A history may hold parts that only the API that made them can read back (docs/providers.md,
"What cannot carry over"):

- **Anthropic signed reasoning**: ``thinking`` (text + signature) and ``redacted_thinking``
  (encrypted data only) blocks, marked ``provider_metadata["anthropic"]``. The Messages API checks
  the signature; no other API can take them, and Anthropic takes no unsigned thinking (so plain
  reasoning text from elsewhere is not sent to it either).
- **OpenAI Responses reasoning items**: marked ``provider_metadata["openai"]["item_id"]``, with
  ``encrypted_content`` as the signature when not stored server-side. Only Responses resolves them.
- **Provider-executed tool calls**: a ``ToolCallPart`` with ``provider_executed`` (an Anthropic
  server tool, a Responses built-in), its API named by its ``provider_metadata`` key
  (``anthropic``, or ``openai`` for Responses), and replies stored before issue 31 that kept an
  Anthropic server tool's blocks as a ``DataPart`` of type
  :data:`turnwire.types.PROVIDER_EXECUTED` (read the same way). Only that API can pair them;
  elsewhere they are dropped (the text the model wrote from them stays).

Plain reasoning (no signature, no provider marks: e.g. ``reasoning_content`` of an
OpenAI-compatible server) belongs to no API: Chat Completions builders may send it where a model
wants it; Anthropic and Responses cannot take it. Text, files and tool calls carry over everywhere.

Used by ``anthropic_request``, ``openai_chat_request`` and ``openai_responses_request`` (and by a
cross-provider fallback, which must send a history to another API than the one that made it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from google.protobuf import json_format

from turnwire.types import PROVIDER_EXECUTED
from turnwire_client.v1 import message_pb2

Api = Literal["anthropic", "openai-chat", "openai-responses"]
"""The APIs a request builder speaks."""

ANTHROPIC: Api = "anthropic"
OPENAI_CHAT: Api = "openai-chat"
OPENAI_RESPONSES: Api = "openai-responses"

_UNKNOWN = "unknown"  # signed or redacted by an API Turnwire cannot name: replayable nowhere


def origin(part: message_pb2.Part) -> str | None:
    """The API whose own state ``part`` carries (``"anthropic"``, ``"openai-responses"``, or
    ``"unknown"`` for a signature no adapter marked), or None for a part any API may take."""
    kind = part.WhichOneof("kind")
    if kind == "reasoning":
        reasoning = part.reasoning
        fields = reasoning.provider_metadata.fields
        if "anthropic" in fields:
            return ANTHROPIC
        openai = fields.get("openai")
        if openai is not None and openai.WhichOneof("kind") == "struct_value":
            item_id = openai.struct_value.fields.get("item_id")
            if item_id is not None and item_id.string_value:
                return OPENAI_RESPONSES
        if reasoning.signature or reasoning.redacted:
            return _UNKNOWN
        return None
    if kind == "tool_call":
        call = part.tool_call
        if not call.provider_executed:
            return None
        fields = call.provider_metadata.fields
        if "anthropic" in fields:
            return ANTHROPIC
        return OPENAI_RESPONSES if "openai" in fields else _UNKNOWN
    if kind == "data" and part.data.type == PROVIDER_EXECUTED:
        data = part.data.data
        api = data.struct_value.fields.get("api") if data.WhichOneof("kind") == "struct_value" else None
        return api.string_value if api is not None and api.string_value else _UNKNOWN
    return None


def carries_over(part: message_pb2.Part, api: Api) -> bool:
    """True when ``part`` may be sent to ``api``: parts of no API's own (text, files, tool calls,
    application data) always; reasoning and provider-executed calls and blocks only to the API
    that made them, except that plain reasoning text goes only to Chat Completions (see the
    module)."""
    made_by = origin(part)
    if made_by is None:
        return api == OPENAI_CHAT or part.WhichOneof("kind") != "reasoning"
    return made_by == api


def portable_parts(parts: Sequence[message_pb2.Part], api: Api) -> Sequence[message_pb2.Part]:
    """``parts`` (one assistant step) without those that cannot go to ``api``; ``parts`` itself
    when all can (the common case costs one pass and no copy)."""
    for index, part in enumerate(parts):
        kind = part.WhichOneof("kind")
        if (
            kind in ("reasoning", "data") or (kind == "tool_call" and part.tool_call.provider_executed)
        ) and not carries_over(part, api):
            return [*parts[:index], *(p for p in parts[index + 1 :] if carries_over(p, api))]
    return parts


def provider_block(part: message_pb2.Part) -> dict[str, Any] | None:
    """The block of a provider-executed ``DataPart`` as the API gave it (a new dict), or None when
    ``part`` is not one or its block is not an object with a ``type``. Integral numbers come back
    as ints (the stored Struct keeps every number as a double)."""
    if part.WhichOneof("kind") != "data" or part.data.type != PROVIDER_EXECUTED:
        return None
    value = json_format.MessageToDict(part.data.data)
    block = value.get("block") if isinstance(value, Mapping) else None
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        return None
    result: dict[str, Any] = _ints(block)
    return result


def api_record(call: message_pb2.ToolCallPart, api_key: str) -> dict[str, Any]:
    """What ``call``'s ``provider_metadata`` keeps for the API keyed ``api_key`` (``"anthropic"``,
    ``"openai"``) as plain JSON values (integral numbers as ints), or ``{}``."""
    value = call.provider_metadata.fields.get(api_key)
    if value is None or value.WhichOneof("kind") != "struct_value":
        return {}
    record: dict[str, Any] = _ints(json_format.MessageToDict(value.struct_value))
    return record


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {key: _ints(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_ints(item) for item in value]
    return value
