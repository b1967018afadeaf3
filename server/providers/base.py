"""The provider interface: stream one model step from a normalized request.

A provider adapter turns a :class:`ModelRequest` (provider-neutral transcript,
tool definitions, settings) into the provider's wire request, and the
provider's stream into :data:`ModelChunk` values. The engine consumes only
these types; it never imports a concrete provider.

Chunk names follow the AI SDK's stream parts (``text-start``, ``text-delta``,
``tool-input-start``, ``finish-step`` …). Every stream ends with exactly one
:class:`FinishStep` unless it raises :class:`ProviderError`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from turnwire.v1 import message_pb2

FinishReason = Literal["stop", "length", "tool-calls", "content-filter", "error", "other"]
"""Normalized finish reasons (THINK-SEMANTICS.md section 3, StepResult)."""

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


@dataclass(slots=True)
class ModelSettings:
    """Sampling and transport settings of one model call; ``None`` means the provider's default.

    Units: ``max_output_tokens`` in tokens, ``timeout`` in seconds.
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
    timeout: float | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    provider_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ModelRequest:
    """Everything one model step needs.

    ``model`` is the provider-local model name (the part after ``provider:``).
    ``messages`` is the provider-neutral transcript (proto ``Message``s, oldest
    first, already repaired so every tool call has its result); the adapter
    converts it to its wire format. ``step_number`` is the 0-based step within
    the turn (adapters may ignore it; the scripted model uses it).
    """

    model: str
    system: str
    messages: Sequence[message_pb2.Message]
    tools: Sequence[ToolDefinition] = ()
    tool_choice: ToolChoice = "auto"
    settings: ModelSettings = field(default_factory=ModelSettings)
    output_schema: Mapping[str, Any] | None = None
    step_number: int = 0


@dataclass(slots=True)
class Usage:
    """Token counts of one step (or a sum of steps); see ``turnwire.v1.Usage``."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0

    def copy_to(self, target: message_pb2.Usage) -> None:
        """Write these counts into the proto ``target`` (in place)."""
        target.input_tokens = self.input_tokens
        target.output_tokens = self.output_tokens
        target.total_tokens = self.total_tokens
        target.reasoning_tokens = self.reasoning_tokens
        target.cached_input_tokens = self.cached_input_tokens
        target.cache_write_input_tokens = self.cache_write_input_tokens

    def add(self, other: Usage) -> None:
        """Add ``other``'s counts to this one, in place."""
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.total_tokens += other.total_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cached_input_tokens += other.cached_input_tokens
        self.cache_write_input_tokens += other.cache_write_input_tokens


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
    """The model starts a call of tool ``tool_name``."""

    tool_call_id: str
    tool_name: str


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
    """

    tool_call_id: str
    tool_name: str
    input: dict[str, Any] | None
    raw_input: str = ""
    error: str | None = None


@dataclass(slots=True)
class Source:
    """A source the model cited."""

    source_id: str
    url: str = ""
    title: str = ""
    media_type: str = ""
    filename: str = ""


@dataclass(slots=True)
class File:
    """A file the model produced."""

    media_type: str
    data: bytes = b""
    url: str = ""
    filename: str = ""


@dataclass(slots=True)
class FinishStep:
    """The step ended. Always the last chunk of a successful stream.

    ``warnings`` lists settings the provider could not honour (e.g. a sampling
    setting the model rejects), surfaced in ``StepResult.warnings``.
    """

    finish_reason: FinishReason
    raw_finish_reason: str = ""
    usage: Usage = field(default_factory=Usage)
    response_id: str = ""
    response_model: str = ""
    provider_metadata: Mapping[str, Any] | None = None
    warnings: Sequence[str] = ()


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
    | Source
    | File
    | FinishStep
)
"""One normalized piece of a model's stream."""


class ProviderError(Exception):
    """A provider call failed, normalized across providers.

    ``status`` is the HTTP status (0 when none, e.g. an in-stream error or a
    dropped connection), ``type``/``code`` the provider's own error type and
    code, ``retryable`` whether the same request may succeed later,
    ``retry_after`` seconds to wait when the provider said so, ``body`` the raw
    error body for ``classify_chat_error``.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        type: str = "",
        code: str = "",
        retryable: bool = False,
        retry_after: float | None = None,
        body: Any = None,
        provider: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
        self.body = body
        self.provider = provider


@runtime_checkable
class Provider(Protocol):
    """A model provider: streams one model step.

    Implementations: ``server.providers.scripted.ScriptedProvider`` (offline);
    the official-SDK adapters follow. ``stream`` yields :data:`ModelChunk`s,
    ending with one :class:`FinishStep`, and raises :class:`ProviderError` on
    failure. Closing the iterator (``aclose``) must stop the underlying HTTP
    stream at once.
    """

    name: str

    def has_model(self, model: str) -> bool:
        """False when ``model`` is known not to exist (checked at admission); True when unsure."""
        ...

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream one step of model output for ``request``."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections."""
        ...
