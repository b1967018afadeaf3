"""Types shared by hooks, tools and providers: usage, finish reasons, stream chunks, tool choice.

Chunk names follow the AI SDK's stream parts (``text-start``, ``text-delta``,
``tool-input-start``, ``finish-step`` …). A model stream is a sequence of
:data:`ModelChunk` values that ends with exactly one :class:`FinishStep`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from google.protobuf import struct_pb2

from turnwire_client.v1 import message_pb2


class FinishReason(StrEnum):
    """Why a step ended, normalized across providers (AI SDK finish reasons; docs/semantics.md §2).

    A ``StrEnum``: members compare equal to their AI SDK strings (``"tool-calls"`` …).
    """

    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool-calls"
    CONTENT_FILTER = "content-filter"
    ERROR = "error"
    OTHER = "other"


ToolChoice = Literal["auto", "none", "required"] | str
"""``auto``, ``none``, ``required``, or the name of the one tool the model must call."""


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    """A tool as the model sees it.

    ``input_schema`` is a JSON Schema object describing the tool's input
    (``{"type": "object", "properties": …}``).
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """Sampling and transport settings of one model call; ``None`` means the provider's default.

    Units: ``max_output_tokens`` in tokens, ``timeout_seconds`` per HTTP
    request. ``headers`` are extra HTTP headers; ``provider_options`` maps a
    provider name or type (``"anthropic"``, ``"openai"`` …) to extra request
    fields for that provider only. In a ``TurnConfig`` or ``StepConfig`` only
    the fields set change the call; ``headers`` and ``provider_options``
    merge shallowly over earlier ones.
    """

    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop_sequences: Sequence[str] | None = None
    seed: int | None = None
    max_retries: int | None = None
    timeout_seconds: float | None = None
    headers: Mapping[str, str] | None = None
    provider_options: Mapping[str, Any] | None = None


@dataclass(slots=True)
class Usage:
    """Token counts of one step (or a sum of steps); see ``turnwire_client.v1.Usage``."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    cache_write_1h_input_tokens: int = 0
    """Of ``cache_write_input_tokens``, those written to a cache kept an hour (Anthropic's
    ``ttl: 1h``), priced at their own, higher rate (docs/cost.md)."""

    def copy_to(self, target: message_pb2.Usage) -> None:
        """Write these counts into the proto ``target`` (in place)."""
        target.input_tokens = self.input_tokens
        target.output_tokens = self.output_tokens
        target.total_tokens = self.total_tokens
        target.reasoning_tokens = self.reasoning_tokens
        target.cached_input_tokens = self.cached_input_tokens
        target.cache_write_input_tokens = self.cache_write_input_tokens
        target.cache_write_1h_input_tokens = self.cache_write_1h_input_tokens

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to this one, in place."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.total_tokens += other.total_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.cache_write_input_tokens += other.cache_write_input_tokens
        self.cache_write_1h_input_tokens += other.cache_write_1h_input_tokens


@dataclass(frozen=True, slots=True)
class Cost:
    """What a step or a turn cost, priced from its :class:`Usage` (docs/cost.md); see
    ``turnwire_client.v1.Cost``. ``usd``: US dollars. ``price_source``: where the prices came
    from, ``genai-prices <version>`` (the price data that package version ships) or ``config``
    (a ``pricing.models`` entry); a turn's total joins its steps' sources with ``, ``. Where a
    cost is unknown the field holding it is None, never a zero cost."""

    usd: float
    price_source: str

    def copy_to(self, target: message_pb2.Cost) -> None:
        """Write this cost into the proto ``target`` (in place)."""
        target.usd = self.usd
        target.price_source = self.price_source


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One budget a turn runs under, in one ``unit`` (``tokens``: input plus output tokens;
    ``usd``: US dollars), as the store holds it (docs/cost.md, "Budgets in hooks"); a budget
    limited in both units is two entries. ``scope``: ``turn``, ``conversation``, ``tenant/day``,
    ``tenant/month``, ``principal/day`` or ``principal/month``; ``period``: the UTC day
    (``2026-12-02``) or month (``2026-12``) a period's budget counts, ``""`` for the others.
    ``spent``: what settled steps spent; ``reserved``: what running steps (this turn's among
    them) reserved; ``remaining``: ``limit - spent - reserved``, never below 0; ``resets_at``:
    when its period ends (UTC), None for a budget that never resets."""

    scope: str
    period: str
    unit: Literal["tokens", "usd"]
    limit: float
    spent: float
    reserved: float
    remaining: float
    resets_at: dt.datetime | None = None


# --- stream chunks ---------------------------------------------------------
# Plain slotted classes: one is allocated per token, so they stay cheap.


@dataclass(slots=True)
class TextStart:
    """A text block starts. ``id`` names the block for its deltas and end."""

    id: str


@dataclass(slots=True)
class TextDelta:
    """More text of block ``id``."""

    id: str
    delta: str


@dataclass(slots=True)
class TextEnd:
    """Text block ``id`` ends."""

    id: str


@dataclass(slots=True)
class ReasoningStart:
    """A reasoning block starts."""

    id: str


@dataclass(slots=True)
class ReasoningDelta:
    """More reasoning text of block ``id``."""

    id: str
    delta: str


@dataclass(slots=True)
class ReasoningEnd:
    """Reasoning block ``id`` ends.

    ``signature`` is the provider's opaque signature (Anthropic) or encrypted
    content (OpenAI Responses), returned to it verbatim on the next request;
    ``redacted`` marks reasoning the provider returned only encrypted.
    """

    id: str
    signature: bytes = b""
    redacted: bool = False
    provider_metadata: Mapping[str, Any] | None = None


@dataclass(slots=True)
class ToolInputStart:
    """The model starts a call of tool ``tool_name``; ``provider_executed`` for a call the provider
    runs itself (see :class:`ToolCall`)."""

    tool_call_id: str
    tool_name: str
    provider_executed: bool = False


@dataclass(slots=True)
class ToolInputDelta:
    """More input text (a JSON fragment) of call ``tool_call_id``."""

    tool_call_id: str
    delta: str


@dataclass(slots=True)
class ToolCall:
    """A complete tool call.

    ``input`` is the parsed JSON object, or ``None`` when ``raw_input`` was not
    a JSON object; then ``error`` says what was wrong and the call is not run.

    ``provider_executed``: the provider runs the call itself (an Anthropic server tool, a
    Responses built-in such as ``web_search_call``; AI SDK ``providerExecuted``): the engine
    stores and streams it, never runs it and offers it to no ``before_tool_call``; its result
    comes as a :class:`ToolResult`. ``client_executed``: the API defines the tool as one the
    application runs (Responses ``shell_call``, ``local_shell_call``, ``apply_patch_call``,
    ``custom_tool_call``): held for the client as a client tool's call when the turn has no tool
    of that name. ``provider_metadata`` (JSON values, keyed by API) is what that API needs to
    have the call back (docs/providers.md, "What each API's parts become").
    """

    tool_call_id: str
    tool_name: str
    input: dict[str, Any] | None
    raw_input: str = ""
    error: str | None = None
    provider_executed: bool = False
    client_executed: bool = False
    provider_metadata: Mapping[str, Any] | None = None


@dataclass(slots=True)
class ToolResult:
    """The result of a provider-executed call (:attr:`ToolCall.provider_executed`), as the
    provider gave it: ``output`` (any JSON value) or, for a failed call, ``error`` (its text).

    It may come in a later step than its call (an Anthropic ``pause_turn`` continued);
    ``provider_metadata`` (keyed by API) is what that API needs to have the result back.
    """

    tool_call_id: str
    tool_name: str
    output: Any = None
    error: str | None = None
    provider_metadata: Mapping[str, Any] | None = None


SourceType = Literal["url", "document"]
"""What a :class:`Source` is: a web page (``url``) or a document (AI SDK ``sourceType``)."""

SourceLocationUnit = Literal["character", "page", "content_block"]
"""What a :class:`SourceLocation`'s range counts: characters (0-based), PDF pages (1-based) or
content blocks (0-based); ``turnwire_client.v1.SourceLocationUnit``."""


@dataclass(frozen=True, slots=True)
class SourceLocation:
    """Where a cited passage lies in a document: ``[start, end)`` in ``unit`` of the request's
    document ``document_index`` (Anthropic's ``char_location``, ``page_location``,
    ``content_block_location``, ``search_result_location``,
    https://platform.claude.com/docs/en/build-with-claude/citations). ``unit`` None: only the
    document is known."""

    document_index: int = 0
    unit: SourceLocationUnit | None = None
    start: int = 0
    end: int = 0


@dataclass(slots=True)
class Source:
    """A source the model cited (``turnwire_client.v1.SourcePart``).

    ``cited_text`` is the passage it quotes; ``location`` where that passage lies in a document;
    ``text_id`` the id of the text block (:class:`TextStart` ``id``) of this step that cites it,
    and ``text_span`` the cited ``(start_index, end_index)`` of that block's text in Unicode code
    points (None: the whole block), as Responses and OpenRouter annotations give them;
    ``provider_file_id`` a file the provider keeps; ``provider_metadata`` the citation's other
    fields under the API's name (``{"anthropic": {...}}``).
    """

    source_id: str
    url: str = ""
    title: str = ""
    media_type: str = ""
    filename: str = ""
    source_type: SourceType = "url"
    cited_text: str = ""
    location: SourceLocation | None = None
    text_id: str = ""
    text_span: tuple[int, int] | None = None
    provider_file_id: str = ""
    provider_metadata: Mapping[str, Any] | None = None

    def copy_to(self, target: message_pb2.SourcePart) -> None:
        """Write this source into the proto ``target`` (in place); ``provider_metadata`` bounded
        by :func:`bounded_metadata`."""
        target.source_id = self.source_id
        target.url = self.url
        target.title = self.title
        target.media_type = self.media_type
        target.filename = self.filename
        target.source_type = _SOURCE_TYPES[self.source_type]
        target.cited_text = self.cited_text
        if self.location is not None:
            location = target.location
            location.document_index = self.location.document_index
            location.unit = _LOCATION_UNITS[self.location.unit]
            location.start = self.location.start
            location.end = self.location.end
        target.text_id = self.text_id
        if self.text_span is not None:
            target.text_span.start_index, target.text_span.end_index = self.text_span
        target.provider_file_id = self.provider_file_id
        if self.provider_metadata:
            target.provider_metadata.CopyFrom(bounded_metadata(self.provider_metadata))


_SOURCE_TYPES = {"url": message_pb2.SOURCE_TYPE_URL, "document": message_pb2.SOURCE_TYPE_DOCUMENT}
_LOCATION_UNITS = {
    None: message_pb2.SOURCE_LOCATION_UNIT_UNSPECIFIED,
    "character": message_pb2.SOURCE_LOCATION_UNIT_CHARACTER,
    "page": message_pb2.SOURCE_LOCATION_UNIT_PAGE,
    "content_block": message_pb2.SOURCE_LOCATION_UNIT_CONTENT_BLOCK,
}

METADATA_STRING_CHARS = 4096
"""The longest string :func:`bounded_metadata` keeps whole (a citation's ``encrypted_index``, a
revised prompt): longer ones are cut, so provider metadata never crowds out a reply's content."""


def bounded_metadata(metadata: Mapping[str, Any]) -> struct_pb2.Struct:
    """``metadata`` (JSON values) as a Struct, each string cut to :data:`METADATA_STRING_CHARS`
    characters; values with no exact Struct form (non-finite or huge numbers) become their text."""
    target = struct_pb2.Struct()
    for key, value in metadata.items():
        _bounded(target.fields[str(key)], value)
    return target


def _bounded(target: struct_pb2.Value, value: Any) -> None:
    if value is None:
        target.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        target.bool_value = value
    elif isinstance(value, int | float) and abs(value) < 2**53 and not math.isnan(value):
        target.number_value = value
    elif isinstance(value, Mapping):
        fields = target.struct_value.fields
        target.struct_value.SetInParent()
        for key, item in value.items():
            _bounded(fields[str(key)], item)
    elif isinstance(value, list | tuple):
        target.list_value.SetInParent()
        for item in value:
            _bounded(target.list_value.values.add(), item)
    else:
        target.string_value = str(value)[:METADATA_STRING_CHARS]


@dataclass(slots=True)
class File:
    """A file the model produced (``turnwire_client.v1.FilePart``): its bytes in ``data``, or a
    ``url``, or the ``provider_file_id`` of a file the provider keeps (a code interpreter's output,
    a Files API file). ``provider_metadata`` holds what the API said about it under the API's name
    (``{"openai": {"item_id": "ig_…", "revised_prompt": …}}``). The engine keeps the bytes when
    they fit the reply (docs/providers.md, "Files"), else the reference alone."""

    media_type: str
    data: bytes = b""
    url: str = ""
    filename: str = ""
    provider_file_id: str = ""
    provider_metadata: Mapping[str, Any] | None = None

    def copy_to(self, target: message_pb2.FilePart, *, keep_data: bool = True) -> None:
        """Write this file into the proto ``target`` (in place): ``size_bytes`` always, the bytes
        only when ``keep_data`` (else the ``url`` or ``provider_file_id`` reference, or no content
        when there is none)."""
        target.media_type = self.media_type
        target.filename = self.filename
        if self.data:
            target.size_bytes = len(self.data)
        if self.data and keep_data:
            target.data = self.data
        elif self.url:
            target.url = self.url
        elif self.provider_file_id:
            target.provider_file_id = self.provider_file_id
        if self.provider_metadata:
            target.provider_metadata.CopyFrom(bounded_metadata(self.provider_metadata))


PROVIDER_EXECUTED = "provider-executed"
"""The ``DataPart.type`` under which replies stored before issue 31 kept an Anthropic server
tool's block (``{"api", "block"}``); still read, and sent back to the API that made it
(``turnwire_server.providers.carry_over``). New replies store a provider-executed
``ToolCallPart`` instead (:class:`ToolCall`, :class:`ToolResult`)."""


@dataclass(slots=True)
class UsageUpdate:
    """Usage the provider reported so far in this step (cumulative), before the step finished.

    The last one counts when the step is cut short (a cancel, a stall, an in-stream error),
    so every model call's usage is kept (docs/semantics.md §11); a :class:`FinishStep`'s
    usage replaces it. Anthropic reports input tokens at ``message_start``, for example.
    """

    usage: Usage


@dataclass(slots=True)
class FinishStep:
    """The step ended. Always the last chunk of a successful stream.

    ``warnings`` lists settings the provider could not honour (e.g. a sampling
    setting the model rejects), surfaced in ``StepResult.warnings``. ``paused`` says the
    provider stopped a long turn of its own before it was done (Anthropic's ``pause_turn``):
    the engine runs the next step at once, within ``max_steps``, with the reply so far as the
    model's input (docs/semantics.md §2, Steps).
    """

    finish_reason: FinishReason
    raw_finish_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    response_id: str = ""
    response_model: str = ""
    provider_metadata: Mapping[str, Any] | None = None
    warnings: Sequence[str] = ()
    paused: bool = False


ModelChunk = (
    TextStart
    | TextDelta
    | TextEnd
    | ReasoningStart
    | ReasoningDelta
    | ReasoningEnd
    | ToolInputStart
    | ToolInputDelta
    | ToolCall
    | ToolResult
    | Source
    | File
    | UsageUpdate
    | FinishStep
)
"""One normalized piece of a model's stream."""


def last_step_text(message: message_pb2.Message) -> str:
    """The text an assistant message's last step wrote: its text parts after its last step start,
    joined ("" when that step wrote none). A sub-agent's answer is this of its reply
    (docs/subagents.md)."""
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            texts = []
        elif kind == "text":
            texts.append(part.text.text)
    return "".join(texts)
