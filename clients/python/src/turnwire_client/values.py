"""Plain Python views of Turnwire messages: text per step, tool calls with JSON values, usage.

The generated protobuf messages stay available everywhere (``TurnResult.message``, the event
stream); these views are what a script usually wants to print or compare:

- JSON values (tool inputs and outputs, metadata) as ``dict``/``list``/``str``/``bool``/``None``
  and numbers, read from the exact JSON text the server sends (``input_json``,
  ``output_json``), not from the deprecated ``Struct``/``Value`` views: an integral JSON number
  is an ``int`` of any size (``2**64`` stays exact), other numbers are ``float``.
- Text per model step (:attr:`ChatMessage.steps`, exact) and per message
  (:attr:`ChatMessage.text`: the steps' texts, trimmed, joined by :data:`STEP_SEPARATOR`).
- Enum values as the AI SDK's names (tool call states ``"output-available"``) or lower-case
  names without their prefix (roles ``"assistant"``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format, struct_pb2

from turnwire_client.v1 import message_pb2

__all__ = [
    "EXACT_INTEGER_LIMIT",
    "STEP_SEPARATOR",
    "ChatMessage",
    "Citation",
    "MessageFile",
    "Step",
    "ToolCall",
    "Usage",
    "json_value",
    "steps_of",
    "struct_number",
    "struct_value",
]

STEP_SEPARATOR = "\n\n"
"""What :attr:`ChatMessage.text` puts between the texts of two model steps (a blank line, so a
preamble before a tool call and the answer after it read as two paragraphs)."""


EXACT_INTEGER_LIMIT = 2**53
"""The largest integer magnitude a ``Struct``/``Value`` number (a double) holds exactly: the
server makes those views only for values within it (docs/semantics.md §11, exact values)."""


def struct_number(number: float) -> int | float:
    """A ``Struct``/``Value`` number as its sender most likely meant it: an ``int`` when it is whole
    and below :data:`EXACT_INTEGER_LIMIT` in magnitude, else the ``float`` (a whole double beyond it
    may stand for any of several integers, so it is not passed off as an exact one).

    The one rule for reading protobuf numbers back as JSON values, on both sides of the wire: this
    client, and the server and middleware (``turnwire.values.from_value``) use it.
    """
    return int(number) if number.is_integer() and abs(number) < EXACT_INTEGER_LIMIT else number


def json_value(text: str) -> Any:
    """Parse JSON text into plain Python values, numbers exact where Python can hold them.

    Integral numbers become ``int`` (arbitrary size), others ``float``. Raises
    :class:`ValueError` for text that is not JSON.
    """
    return json.loads(text)


def struct_value(value: struct_pb2.Struct | struct_pb2.Value) -> Any:
    """A ``Struct``/``Value`` as plain values, for fields the server sends only that way (message
    metadata, and tool values of a server without the JSON text fields). Struct numbers are
    doubles, read by :func:`struct_number`: a whole one below 2**53 becomes an ``int``."""
    return _whole_numbers_as_int(json_format.MessageToDict(value))


def _whole_numbers_as_int(data: Any) -> Any:
    if isinstance(data, float):
        return struct_number(data)
    if isinstance(data, dict):
        return {key: _whole_numbers_as_int(item) for key, item in data.items()}
    if isinstance(data, list):
        return [_whole_numbers_as_int(item) for item in data]
    return data


_STATES = {
    message_pb2.TOOL_CALL_STATE_UNSPECIFIED: "",
    message_pb2.TOOL_CALL_STATE_INPUT_STREAMING: "input-streaming",
    message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE: "input-available",
    message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED: "approval-requested",
    message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED: "approval-responded",
    message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE: "output-available",
    message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR: "output-error",
    message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED: "output-denied",
}


def _enum_name(enum: Any, number: int, prefix: str) -> str:
    """``number``'s name in ``enum``, lower case without ``prefix``; ``""`` for UNSPECIFIED, the
    number as text for a value newer than this client."""
    try:
        name: str = enum.Name(number)
    except ValueError:
        return str(number)
    name = name.removeprefix(prefix).lower()
    return "" if name == "unspecified" else name


@dataclass(frozen=True)
class Usage:
    """Token usage of a step or a turn, as plain ints (``turnwire.v1.Usage``).

    Attributes:
        input_tokens: Prompt tokens, cached ones included.
        output_tokens: Generated tokens, reasoning included.
        total_tokens: Input plus output, as the provider reports it.
        reasoning_tokens: Generated tokens spent on reasoning.
        cached_input_tokens: Prompt tokens read from the provider's cache.
        cache_write_input_tokens: Prompt tokens written to the provider's cache.
        cache_write_1h_input_tokens: Of those, the ones written to a cache kept an hour.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    cache_write_1h_input_tokens: int = 0

    @classmethod
    def from_proto(cls, usage: message_pb2.Usage) -> Usage:
        """The plain view of a ``turnwire.v1.Usage``."""
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            reasoning_tokens=usage.reasoning_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            cache_write_input_tokens=usage.cache_write_input_tokens,
            cache_write_1h_input_tokens=usage.cache_write_1h_input_tokens,
        )


@dataclass(frozen=True)
class ToolCall:
    """A tool call of an assistant message with its result, in plain values.

    Attributes:
        tool_call_id: The provider's id of the call (what ``submit_tool_results`` and
            ``submit_tool_approvals`` take).
        tool_name: The tool called.
        state: Where the call is, by the AI SDK's name: ``"input-available"`` (no result yet,
            e.g. a client tool to answer), ``"approval-requested"``, ``"output-available"``,
            ``"output-error"``, ``"output-denied"``, ...
        input: The input object as the model produced it (``dict``), or ``None`` when it was
            not a JSON object (then :attr:`raw_input` has the text).
        output: The result (any JSON value) when ``state`` is ``"output-available"``, else
            ``None``.
        error_text: Why the call failed (``"output-error"``), else ``""``.
        raw_input: The model's input text when it was not a JSON object, else ``""``.
        approval_id: The approval request's id, for a tool that needs approval, else ``""``.
        approved: The client's answer to the approval request (``None`` before one).
        client_executed: True for a client-side tool.
        provider_executed: True for a call the provider ran itself (an Anthropic server tool,
            a Responses built-in such as web search): nothing to answer; its result, once the
            provider gave it, is :attr:`output` (or :attr:`error_text`).
        preliminary: True while :attr:`output` is a preliminary result of a streaming tool.
        decision: ``"blocked"`` or ``"substituted"`` when a ``before_tool_call`` hook decided
            the result instead of the tool, else ``""``.
        part: The ``turnwire.v1.ToolCallPart`` this view was made from.
    """

    tool_call_id: str
    tool_name: str
    state: str
    input: dict[str, Any] | None
    output: Any
    error_text: str = ""
    raw_input: str = ""
    approval_id: str = ""
    approved: bool | None = None
    client_executed: bool = False
    provider_executed: bool = False
    preliminary: bool = False
    decision: str = ""
    part: message_pb2.ToolCallPart = field(
        default_factory=message_pb2.ToolCallPart, repr=False, compare=False
    )

    @classmethod
    def from_proto(cls, part: message_pb2.ToolCallPart) -> ToolCall:
        """The plain view of a ``ToolCallPart``: input and output from its exact JSON texts
        (``input_json``, ``output_json``), falling back to the ``Struct``/``Value`` views for a
        server that sent only those."""
        if part.input_json:
            call_input = json_value(part.input_json)
        elif part.HasField("input"):
            call_input = struct_value(part.input)
        else:
            call_input = None
        output: Any = None
        if part.output_json:
            output = json_value(part.output_json)
        elif part.HasField("output"):
            output = struct_value(part.output)
        approval = part.approval if part.HasField("approval") else None
        answered = part.state in (
            message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
            message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
        ) or (approval is not None and approval.approved)
        return cls(
            tool_call_id=part.tool_call_id,
            tool_name=part.tool_name,
            state=_STATES.get(part.state, str(part.state)),
            input=call_input,
            output=output,
            error_text=part.error_text,
            raw_input=part.raw_input,
            approval_id=approval.id if approval is not None else "",
            approved=approval.approved if approval is not None and answered else None,
            client_executed=part.client_executed,
            provider_executed=part.provider_executed,
            preliminary=part.preliminary,
            decision=_enum_name(message_pb2.ToolCallDecision, part.decision, "TOOL_CALL_DECISION_"),
            part=part,
        )


_LOCATION_UNITS = {
    message_pb2.SOURCE_LOCATION_UNIT_CHARACTER: "character",
    message_pb2.SOURCE_LOCATION_UNIT_PAGE: "page",
    message_pb2.SOURCE_LOCATION_UNIT_CONTENT_BLOCK: "content_block",
}


@dataclass(frozen=True)
class Citation:
    """A source the reply cites (``turnwire.v1.SourcePart`` in plain values).

    Attributes:
        url: The URL, for a web source.
        title: Its title (a document's title, a page's).
        cited_text: The passage of the source the answer relies on, when the provider gave it.
        text: The reply's text that cites it (its text part), ``""`` when tied to none.
        kind: ``"url"`` or ``"document"``.
        location: Where the passage is in a document: ``{"unit": "character" | "page" |
            "content_block", "document_index", "start", "end"}`` (end exclusive), or ``None``.
        provider_file_id: The provider's id of the file it is, when it is one.
        proto: The ``SourcePart`` this view was made from.
    """

    url: str
    title: str
    cited_text: str
    text: str
    kind: str
    location: dict[str, Any] | None
    provider_file_id: str
    proto: message_pb2.SourcePart = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, part: message_pb2.SourcePart, texts: dict[str, str]) -> Citation:
        """The plain view of ``part``; ``texts`` maps the message's text part ids to their text."""
        location = None
        if part.HasField("location"):
            where = part.location
            location = {
                "unit": _LOCATION_UNITS.get(where.unit),
                "document_index": where.document_index,
                "start": where.start,
                "end": where.end,
            }
        kind = "document" if part.source_type == message_pb2.SOURCE_TYPE_DOCUMENT or not part.url else "url"
        return cls(
            url=part.url,
            title=part.title or part.filename,
            cited_text=part.cited_text,
            text=texts.get(part.text_id, "") if part.text_id else "",
            kind=kind,
            location=location,
            provider_file_id=part.provider_file_id,
            proto=part,
        )


@dataclass(frozen=True)
class MessageFile:
    """A file of a message (``turnwire.v1.FilePart`` in plain values): ``data`` (its bytes), ``url``
    or ``provider_file_id`` (a file the provider keeps) says where it is; none of them when the
    sidecar kept only its ``size_bytes`` (a generated file too large for the reply)."""

    media_type: str
    filename: str
    data: bytes
    url: str
    provider_file_id: str
    size_bytes: int
    proto: message_pb2.FilePart = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, part: message_pb2.FilePart) -> MessageFile:
        """The plain view of ``part``."""
        return cls(
            media_type=part.media_type,
            filename=part.filename,
            data=part.data,
            url=part.url,
            provider_file_id=part.provider_file_id,
            size_bytes=part.size_bytes or len(part.data),
            proto=part,
        )


@dataclass(frozen=True)
class Step:
    """One model step of an assistant message (the parts between two ``step_start`` markers).

    Attributes:
        text: The step's text parts joined as streamed (no separator).
        reasoning: The step's readable reasoning parts joined the same way.
        tool_calls: The tool calls the step made, in order.
        sources: The sources the step cited, in order, each with the text that cites it.
        files: The files the step produced (a generated image …), in order.
    """

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    sources: list[Citation] = field(default_factory=list)
    files: list[MessageFile] = field(default_factory=list)


@dataclass(frozen=True)
class ChatMessage:
    """A transcript message in plain values.

    Attributes:
        id: The message id.
        role: ``"user"``, ``"assistant"`` or ``"system"``.
        steps: For an assistant message, its model steps in order; a user or system message
            is one step (its text parts).
        metadata: The application's metadata as plain values (``{}`` when none).
        create_time: When the sidecar first stored the message (UTC), or ``None``.
        proto: The ``turnwire.v1.Message`` this view was made from.
    """

    id: str
    role: str
    steps: list[Step]
    metadata: dict[str, Any] = field(default_factory=dict)
    create_time: datetime | None = None
    proto: message_pb2.Message = field(default_factory=message_pb2.Message, repr=False, compare=False)

    @property
    def text(self) -> str:
        """The text for reading: each step's text without surrounding whitespace, the non-empty
        ones joined by :data:`STEP_SEPARATOR` (a blank line); ``""`` when there is none. Each
        step's exact text is in :attr:`steps`."""
        return STEP_SEPARATOR.join(text for step in self.steps if (text := step.text.strip()))

    @property
    def tool_calls(self) -> list[ToolCall]:
        """Every step's tool calls, in order."""
        return [call for step in self.steps for call in step.tool_calls]

    @classmethod
    def from_proto(cls, message: message_pb2.Message) -> ChatMessage:
        """The plain view of a ``turnwire.v1.Message``."""
        return cls(
            id=message.id,
            role=_enum_name(message_pb2.Role, message.role, "ROLE_"),
            steps=steps_of(message),
            metadata=struct_value(message.metadata) if message.HasField("metadata") else {},
            create_time=message.create_time.ToDatetime(tzinfo=UTC)
            if message.HasField("create_time")
            else None,
            proto=message,
        )


def steps_of(message: message_pb2.Message) -> list[Step]:
    """A message's parts grouped into steps at each ``step_start`` part (a message without one is
    one step); steps without parts are left out."""
    groups: list[list[message_pb2.Part]] = [[]]
    for part in message.parts:
        if part.WhichOneof("kind") == "step_start":
            groups.append([])
        else:
            groups[-1].append(part)
    texts = {p.text.id: p.text.text for p in message.parts if p.WhichOneof("kind") == "text" and p.text.id}
    return [
        Step(
            text="".join(p.text.text for p in parts if p.WhichOneof("kind") == "text"),
            reasoning="".join(p.reasoning.text for p in parts if p.WhichOneof("kind") == "reasoning"),
            tool_calls=[
                ToolCall.from_proto(p.tool_call) for p in parts if p.WhichOneof("kind") == "tool_call"
            ],
            sources=[Citation.from_proto(p.source, texts) for p in parts if p.WhichOneof("kind") == "source"],
            files=[MessageFile.from_proto(p.file) for p in parts if p.WhichOneof("kind") == "file"],
        )
        for parts in groups
        if parts  # a step cut short before any part, or the empty head before the first marker
    ]
