"""The typed inputs and outputs of every lifecycle hook.

Each hook takes exactly one context object (Temporal-interceptor style), so
fields can be added later without breaking anyone's middleware. Names are
Think's, snake_cased (THINK-SEMANTICS.md section 3).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from turnwire.v1 import message_pb2

if TYPE_CHECKING:
    from server.providers.base import ModelChunk, ToolChoice, Usage
    from server.providers.base import ToolCall as ModelToolCall
    from server.tools.base import Tool

ErrorStage = Literal["parse", "persist", "turn", "step", "stream", "recovery"]
"""Where a turn failed (ChatErrorContext.stage)."""

ChatErrorClassification = Literal["context_overflow", "rate_limit", "transient", "fatal", "unknown"]
"""What ``classify_chat_error`` may return."""

TurnOutcome = Literal["completed", "error", "aborted"]
"""ChatResponseResult.status."""


@dataclass(frozen=True, slots=True)
class StopWhen:
    """A declarative stop condition, checked after each step.

    ``tool_called``: stop once a step called this tool. ``step_count``: stop
    once this many steps ran. The ``max_steps`` bound always applies too.
    """

    tool_called: str | None = None
    step_count: int | None = None


@dataclass(frozen=True, slots=True)
class TurnTimeout:
    """Time limits of a turn's model calls, in seconds (AI SDK ``timeout``: total, step, chunk).

    ``total`` bounds the whole step loop (tools included); ``step`` each model
    call; ``chunk`` the gap between two chunks of a model stream. Expiry ends
    the turn in error (DEADLINE_EXCEEDED). A plain number in
    ``TurnConfig.timeout`` means ``total``.
    """

    total: float | None = None
    step: float | None = None
    chunk: float | None = None


RepairToolCall = Callable[["ModelToolCall", str], "ModelToolCall | Awaitable[ModelToolCall | None] | None"]
"""``repair_tool_call(call, error)``: return a fixed call (same id) or None to keep the error.

Called for a call whose input is not a JSON object, or that names an unknown or
inactive tool, never for one cut off by the output limit (in-process only;
AI SDK ``experimental_repairToolCall``).
"""


@dataclass(frozen=True, slots=True)
class TurnContext:
    """Input of ``before_turn``: the assembled turn, before the first step.

    ``tools`` maps name to tool (the merged set); ``model`` is
    ``provider:model``; ``body`` is the request's free-form JSON.
    """

    conversation_id: str
    request_id: str
    system: str
    messages: Sequence[message_pb2.Message]
    tools: Mapping[str, Tool]
    model: str
    continuation: bool
    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """Output of ``before_turn``: only the fields set (not ``None``) change the turn.

    Units: ``timeout`` in seconds, ``stream_stall_timeout_ms`` in
    milliseconds. ``tools`` and ``stop_when`` add to what earlier middlewares
    returned; ``headers`` and ``provider_options`` merge shallowly; every other
    field replaces (THINK-SEMANTICS.md section 4).
    """

    model: str | None = None
    system: str | None = None
    messages: Sequence[message_pb2.Message] | None = None
    tools: Mapping[str, Tool] | None = None
    active_tools: Sequence[str] | None = None
    tool_choice: ToolChoice | None = None
    max_steps: int | None = None
    stop_when: Sequence[StopWhen] | None = None
    send_reasoning: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop_sequences: Sequence[str] | None = None
    seed: int | None = None
    max_retries: int | None = None
    timeout: float | TurnTimeout | None = None
    stream_stall_timeout_ms: float | None = None
    headers: Mapping[str, str] | None = None
    provider_options: Mapping[str, Any] | None = None
    output: Mapping[str, Any] | None = None
    repair_tool_call: RepairToolCall | None = None


@dataclass(frozen=True, slots=True)
class StepResult:
    """One finished step (input of ``on_step_finish``), the AI SDK's step-finish record."""

    step_number: int
    text: str
    reasoning: Sequence[message_pb2.ReasoningPart]
    reasoning_text: str
    tool_calls: Sequence[message_pb2.ToolCallPart]
    tool_results: Sequence[message_pb2.ToolCallPart]
    finish_reason: str
    raw_finish_reason: str
    usage: Usage
    response_id: str = ""
    response_model: str = ""
    warnings: Sequence[str] = ()
    provider_metadata: Mapping[str, Any] | None = None
    conversation_id: str = ""
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class StepContext:
    """Input of ``before_step``: the step about to run.

    ``step_number`` is 0-based; ``steps`` are the results so far;
    ``messages`` is what will be sent to the model.
    """

    conversation_id: str
    request_id: str
    step_number: int
    steps: Sequence[StepResult]
    model: str
    system: str
    messages: Sequence[message_pb2.Message]


@dataclass(frozen=True, slots=True)
class StepConfig:
    """Output of ``before_step``; only the fields set change this step."""

    model: str | None = None
    tool_choice: ToolChoice | None = None
    active_tools: Sequence[str] | None = None
    system: str | None = None
    messages: Sequence[message_pb2.Message] | None = None
    provider_options: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """Input of ``before_tool_call``: a server-executed call about to run.

    ``input`` is the parsed JSON object (after any earlier middleware's
    ``allow(input=…)``); ``cancelled`` is set when the turn is cancelled.
    """

    conversation_id: str
    request_id: str
    tool_call_id: str
    tool_name: str
    input: Mapping[str, Any]
    step_number: int
    messages: Sequence[message_pb2.Message]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True, slots=True)
class ToolCallDecision:
    """Output of ``before_tool_call``. Build it with :meth:`allow`, :meth:`block` or :meth:`substitute`."""

    action: Literal["allow", "block", "substitute"]
    input: Mapping[str, Any] | None = None
    reason: str | None = None
    output: Any = None

    @classmethod
    def allow(cls, input: Mapping[str, Any] | None = None) -> ToolCallDecision:
        """Run the tool, with ``input`` instead of the model's when given (not re-validated)."""
        return cls(action="allow", input=input)

    @classmethod
    def block(cls, reason: str | None = None) -> ToolCallDecision:
        """Do not run it; the model sees ``reason`` or ``Tool "<name>" was blocked by beforeToolCall.``."""
        return cls(action="block", reason=reason)

    @classmethod
    def substitute(cls, output: Any) -> ToolCallDecision:
        """Do not run it; the model sees ``output`` as the result."""
        return cls(action="substitute", output=output)


ToolCallOutcome = Literal["executed", "blocked", "substituted", "failed"]
"""How a tool call's result came about (``ToolCallResultContext.outcome``)."""


@dataclass(frozen=True, slots=True)
class ToolCallResultContext:
    """Input of ``after_tool_call``: a call's outcome.

    ``input`` is the model's input; ``duration_ms`` the wall time of the
    execution in milliseconds; ``success`` is true for real results, blocks
    and substitutes, false when the tool or ``before_tool_call`` raised.
    ``outcome`` says which: ``executed`` (the tool ran and returned),
    ``blocked`` or ``substituted`` (a ``before_tool_call`` decision), ``failed``.
    """

    conversation_id: str
    request_id: str
    tool_call_id: str
    tool_name: str
    input: Mapping[str, Any]
    step_number: int
    duration_ms: float
    success: bool
    output: Any = None
    error: str | None = None
    outcome: ToolCallOutcome = "executed"


@dataclass(frozen=True, slots=True)
class ChunkContext:
    """Input of ``on_chunk``: one model stream chunk, or a tool result.

    ``chunk`` is a :data:`server.providers.base.ModelChunk`, or a
    ``ToolCallPart`` for tool results (``preliminary`` set on streaming
    ones).
    """

    conversation_id: str
    request_id: str
    step_number: int
    chunk: ModelChunk | message_pb2.ToolCallPart


@dataclass(frozen=True, slots=True)
class ChatResponseResult:
    """Input of ``on_chat_response``: the stored assistant message and how the turn ended."""

    conversation_id: str
    request_id: str
    message: message_pb2.Message
    continuation: bool
    status: TurnOutcome
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ChatErrorContext:
    """Input of ``on_chat_error`` and ``classify_chat_error``: where the turn failed."""

    conversation_id: str
    request_id: str
    stage: ErrorStage
    messages_persisted: bool
    classification: ChatErrorClassification | None = None
