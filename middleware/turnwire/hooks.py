"""The lifecycle-hook contract: the :class:`Middleware` base class and one context type per hook.

Subclass :class:`Middleware` and override only the hooks you need; each hook
takes exactly one context object (Temporal-interceptor style), so fields can
be added later without breaking anyone's middleware. Hook names are Think's,
snake_cased; order, merge and error rules are in ``docs/semantics.md``
("Hooks" and "Hook order and merging").

======================  ===========================  ===============================
hook                    context                      returns
======================  ===========================  ===============================
``configure_session``   :class:`SessionContext`      :class:`SessionConfig` or ``None``
``before_turn``         :class:`TurnContext`         :class:`TurnConfig` or ``None``
``before_step``         :class:`StepContext`         :class:`StepConfig` or ``None``
``before_tool_call``    :class:`ToolCallContext`     :class:`ToolCallDecision` or ``None``
``after_tool_call``     :class:`ToolCallResultContext`  ``None``
``on_step_finish``      :class:`StepFinishContext`   ``None``
``on_chunk``            :class:`ChunkContext`        ``None``
``on_chat_response``    :class:`ChatResponseContext` ``None``
``classify_chat_error`` :class:`ChatErrorContext`    a classification or ``None``
``on_chat_error``       :class:`ChatErrorContext`    the error (or message) to surface
======================  ===========================  ===============================
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from turnwire.compaction import CompactionConfig

# Re-exported: part of the hook contract (defined beside the classifier to keep imports acyclic).
from turnwire.error_classes import ChatErrorClassification as ChatErrorClassification  # noqa: PLC0414
from turnwire.errors import CanonicalCode, ErrorWithStatus
from turnwire.subagents import SubagentCall
from turnwire.tools import Tool
from turnwire.types import BudgetState, Cost, FinishReason, ModelChunk, ModelSettings, ToolChoice, Usage
from turnwire.types import ToolCall as ModelToolCall
from turnwire_client.v1 import message_pb2

ErrorStage = Literal["parse", "persist", "turn", "step", "stream", "recovery"]
"""Where a turn failed (ChatErrorContext.stage)."""


TurnOutcome = Literal["completed", "error", "aborted"]
"""ChatResponseContext.status."""


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
    """Time limits of a turn's model calls (AI SDK ``timeout``: total, step, chunk), in seconds.

    ``total_seconds`` bounds the whole step loop (tools included);
    ``step_seconds`` each model call; ``chunk_seconds`` the gap between two
    chunks of a model stream. Expiry ends the turn in error
    (DEADLINE_EXCEEDED, reason ``MODEL_TIMEOUT``).
    """

    total_seconds: float | None = None
    step_seconds: float | None = None
    chunk_seconds: float | None = None


RepairToolCall = Callable[["ModelToolCall", str], "ModelToolCall | Awaitable[ModelToolCall | None] | None"]
"""``repair_tool_call(call, error)``: return a fixed call (same id) or None to keep the error.

Called for a call whose input is not a JSON object, or that names an unknown or
inactive tool, never for one cut off by the output limit (in-process only;
AI SDK ``experimental_repairToolCall``).
"""


ConcurrentInputStrategy = Literal["enqueue", "reject", "interrupt", "rollback"]
"""What new input does when its conversation has a turn running or queued (docs/semantics.md §5,
new input while a turn runs; the request's ``concurrent_input_strategy``)."""


@dataclass(frozen=True, slots=True)
class ConcurrentInput:
    """Which concurrent-input strategy applied between two turns of a conversation.

    In ``before_turn`` (``TurnContext.concurrent_input``): the strategy the new turn's request
    used and ``request_id`` the turn it stopped (``""``: it stopped none: ``enqueue``, or the
    conversation was idle). In ``on_chat_response`` (``ChatResponseContext.concurrent_input``)
    of a turn stopped by new input: ``interrupt`` (its partial reply is stored) or ``rollback``
    (everything it stored was removed), and ``request_id`` the request that stopped it.
    """

    strategy: ConcurrentInputStrategy
    request_id: str = ""


@dataclass(frozen=True, slots=True)
class TurnContext:
    """Input of ``before_turn``: the assembled turn, before the first step.

    ``tools`` maps name to tool (the merged set); ``model`` is
    ``provider:model``; ``body`` is the request's free-form JSON; ``attempt`` counts the runs
    of the turn from 1 (a re-run after a stall, a crash or an overflow is 2 and later).
    ``concurrent_input``: the strategy the request used on a busy conversation and the turn it
    stopped (:class:`ConcurrentInput`; None for a recovery or a submission).
    ``entry`` is the entry path the turn came in by (docs/semantics.md §1: ``chat``,
    ``save_messages``, ``continue``, ``tool_results``, ``tool_approvals``, ``submission``,
    ``recovery``, or ``subagent`` for a sub-agent's turn); ``subagent_path`` is, for a
    sub-agent's turn, the calls from the top-level turn down to it (:class:`SubagentCall`,
    outermost first; docs/subagents.md), empty otherwise.

    ``messages`` (the stored history, as the model is sent it) is read-only, as in every
    context (docs/semantics.md §3, "Messages are read-only"): an immutable sequence whose items
    are copies made on first read; to change what the model is sent, return new messages in
    :attr:`TurnConfig.messages` (a message changed in place counts as returned, for this turn
    only, never for the store or a later turn).
    """

    conversation_id: str
    request_id: str
    system: str
    messages: Sequence[message_pb2.Message]
    tools: Mapping[str, Tool]
    model: str
    continuation: bool
    body: Mapping[str, Any]
    attempt: int = 1
    concurrent_input: ConcurrentInput | None = None
    entry: str = ""
    subagent_path: Sequence[SubagentCall] = ()


@dataclass(frozen=True, slots=True)
class TurnConfig:
    """Output of ``before_turn``: only the fields set (not ``None``) change the turn.

    ``model_settings`` carries sampling and transport settings (temperature,
    max output tokens, headers, provider options …; see
    :class:`turnwire.types.ModelSettings`); ``timeout`` the turn's time
    limits; ``stream_stall_timeout_seconds`` the stall watchdog (0 turns it
    off). Merge rules across middlewares (docs/semantics.md §4): ``tools``
    and ``stop_when`` add to what earlier middlewares returned;
    ``model_settings`` and ``timeout`` merge field by field (``headers`` and
    ``provider_options`` inside it shallowly); every other field replaces.
    ``messages`` replaces the messages the model is sent (messages of ``ctx.messages`` and new
    ones: copy one with ``CopyFrom`` to change it); the engine keeps them and its caches take a
    message object for its content, so never change them once returned.
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
    model_settings: ModelSettings | None = None
    timeout: TurnTimeout | None = None
    stream_stall_timeout_seconds: float | None = None
    output: Mapping[str, Any] | None = None
    repair_tool_call: RepairToolCall | None = None


@dataclass(frozen=True, slots=True)
class StepFinishContext:
    """Input of ``on_step_finish``: one finished step, the AI SDK's step-finish record.

    Also the element type of ``StepContext.steps`` (the steps so far). ``sources`` and ``files``
    are the step's cited sources (with their cited text, location and the text block they support)
    and produced files, as stored (docs/providers.md, "What each API's parts become"). ``cost``
    is what the step cost in US dollars, from ``usage``; None when unknown (docs/cost.md).
    ``budgets`` are the turn's budgets after this step's reservation, as the store holds them
    (the step is settled at its actual use by the turn's next charge); empty when no budget is
    configured (docs/cost.md, "Budgets in hooks"). ``model`` is the model that ran the step, as
    the configured id ``provider:model``: a fallback when the step fell back or its model's circuit
    breaker was open (docs/providers.md, "Fallback across providers"); ``response_model`` is the
    provider's own name for it. ``last_step`` is True when the turn's steps end with this one (no
    tool result to answer, a call waiting for the client, a ``stop_when`` condition or
    ``max_steps``: docs/semantics.md §2), so nothing more streams from the model in this attempt
    and the turn's final write follows (unless the attempt is then recovered, §5: a later
    attempt's steps are told again; the kept steps keep the flag they had).
    """

    step_number: int
    text: str
    reasoning: Sequence[message_pb2.ReasoningPart]
    reasoning_text: str
    tool_calls: Sequence[message_pb2.ToolCallPart]
    tool_results: Sequence[message_pb2.ToolCallPart]
    finish_reason: FinishReason
    raw_finish_reason: str
    usage: Usage
    response_id: str = ""
    response_model: str = ""
    warnings: Sequence[str] = ()
    provider_metadata: Mapping[str, Any] | None = None
    conversation_id: str = ""
    request_id: str = ""
    sources: Sequence[message_pb2.SourcePart] = ()
    files: Sequence[message_pb2.FilePart] = ()
    cost: Cost | None = None
    budgets: Sequence[BudgetState] = ()
    model: str = ""
    last_step: bool = False


@dataclass(frozen=True, slots=True)
class StepContext:
    """Input of ``before_step``: the step about to run.

    ``step_number`` is 0-based; ``steps`` are the results so far;
    ``messages`` is what will be sent to the model: read-only, as in :class:`TurnContext`
    (return :attr:`StepConfig.messages` to change it for this step). ``budgets`` are the turn's
    budgets before this step's reservation, as the turn's last charge left them in the store
    (step 0 of an attempt: read for the hook); empty when no budget is configured
    (docs/cost.md, "Budgets in hooks").
    """

    conversation_id: str
    request_id: str
    step_number: int
    steps: Sequence[StepFinishContext]
    model: str
    system: str
    messages: Sequence[message_pb2.Message]
    budgets: Sequence[BudgetState] = ()


@dataclass(frozen=True, slots=True)
class StepConfig:
    """Output of ``before_step``; only the fields set change this step.

    ``model_settings`` merges field by field over the turn's (``headers`` and
    ``provider_options`` shallowly); the other fields replace. ``messages`` as in
    :class:`TurnConfig` (never change them once returned).

    ``max_step_tokens`` and ``max_step_usd`` lower this step's budget: its reservation (the
    prompt's estimate plus its output) must fit within them, so ``max_output_tokens`` is clamped
    to what fits, and a step without room for ``budgets.min_output_tokens`` of output ends the
    turn ERROR with reason ``BUDGET_EXHAUSTED`` (scope ``step``). They only ever lower: the
    turn's budgets still apply, the lower of the two wins (docs/cost.md, "Budgets in hooks").
    A dollar limit needs the model's price (a step of an unpriced model is refused under it).
    """

    model: str | None = None
    tool_choice: ToolChoice | None = None
    active_tools: Sequence[str] | None = None
    system: str | None = None
    messages: Sequence[message_pb2.Message] | None = None
    model_settings: ModelSettings | None = None
    max_step_tokens: int | None = None
    max_step_usd: float | None = None


@dataclass(frozen=True, slots=True)
class ToolCallContext:
    """Input of ``before_tool_call``: a server-executed call about to run.

    ``input`` is the parsed JSON object (after any earlier middleware's
    ``allow(input=…)``); ``cancelled`` is set when the turn is cancelled; ``messages`` the
    step's request, read-only (copies on read; changes to them are dropped).
    ``idempotency_key`` is the call's key, the one its tool gets (docs/tools.md, "Idempotency
    keys"); ``rerun`` is True when the call runs again after a crash interrupted it while it ran
    (its tool is idempotent; docs/semantics.md §8, "Tool effects").
    """

    conversation_id: str
    request_id: str
    tool_call_id: str
    tool_name: str
    input: Mapping[str, Any]
    step_number: int
    messages: Sequence[message_pb2.Message]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    idempotency_key: str = ""
    rerun: bool = False


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


ToolCallOutcome = Literal["executed", "blocked", "substituted", "failed", "interrupted"]
"""How a tool call's result came about (``ToolCallResultContext.outcome``)."""


@dataclass(frozen=True, slots=True)
class ToolCallResultContext:
    """Input of ``after_tool_call``: a call's outcome.

    ``input`` is the model's input; ``duration_ms`` the wall time of the
    execution in milliseconds; ``success`` is true for real results, blocks
    and substitutes, false when the tool or ``before_tool_call`` raised.
    ``outcome`` says which: ``executed`` (the tool ran and returned),
    ``blocked`` or ``substituted`` (a ``before_tool_call`` decision), ``failed``, or
    ``interrupted``: the call was running when its process died and was not run again (its tool
    is not idempotent), so its effect may or may not have happened; ``success`` is False, ``error``
    the interrupted text the model reads, ``duration_ms`` 0, and no ``before_tool_call`` preceded
    it in this process. ``rerun`` is True for a call run again after such a crash (its tool is
    idempotent; docs/semantics.md §8, "Tool effects"); ``idempotency_key`` is the call's key.
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
    rerun: bool = False
    idempotency_key: str = ""


@dataclass(frozen=True, slots=True)
class ChunkContext:
    """Input of ``on_chunk``: one model stream chunk, or a tool result.

    ``chunk`` is a :data:`turnwire.types.ModelChunk`, or a
    ``ToolCallPart`` for tool results (``preliminary`` set on streaming
    ones).
    """

    conversation_id: str
    request_id: str
    step_number: int
    chunk: ModelChunk | message_pb2.ToolCallPart


@dataclass(frozen=True, slots=True)
class ChatResponseContext:
    """Input of ``on_chat_response``: the stored assistant message and how the turn ended.

    ``error`` is the turn's error when ``status`` is ``error``. ``concurrent_input`` is set when
    new input stopped the turn (status ``aborted``): ``interrupt`` (``message`` is the stored
    partial reply) or ``rollback`` (``message`` was removed with the turn's input), naming the
    request that stopped it (:class:`ConcurrentInput`). ``cost`` is what the turn cost so far
    (as ``TurnEnd.cost``); None when unknown (docs/cost.md). ``budgets`` are the turn's
    budgets once its last step was settled, as the store holds them; empty when no budget is
    configured or the settlement failed (docs/cost.md, "Budgets in hooks").
    """

    conversation_id: str
    request_id: str
    message: message_pb2.Message
    continuation: bool
    status: TurnOutcome
    error: BaseException | None = None
    concurrent_input: ConcurrentInput | None = None
    cost: Cost | None = None
    budgets: Sequence[BudgetState] = ()


@dataclass(frozen=True, slots=True)
class ChatErrorContext:
    """Input of ``classify_chat_error`` and ``on_chat_error``: the error and where the turn failed.

    ``error`` is the original exception (a hook's own exception when a hook
    raised it, not a wrapper), or what the previous middleware in the chain
    returned (``on_chat_error`` may return another one, or a message);
    ``middleware`` and ``hook`` name the hook that raised it (empty when no
    hook did; docs/semantics.md §11); ``stage`` is where it happened;
    ``messages_persisted`` whether the input was stored; ``classification``
    what ``classify_chat_error`` decided (``None`` when nobody classified it);
    ``response_follows`` (``on_chat_error`` only) whether ``on_chat_response`` runs after it for
    this turn (its partial reply was stored: docs/semantics.md §2 finish).
    """

    conversation_id: str
    request_id: str
    error: BaseException
    stage: ErrorStage
    messages_persisted: bool
    classification: ChatErrorClassification | None = None
    middleware: str = ""
    hook: str = ""
    response_follows: bool = False


class ChatError(ErrorWithStatus):
    """An error with the status the client should see: return it from ``on_chat_error``.

    ``code`` is a ``google.rpc.Code`` name (``"UNAVAILABLE"``, ``"PERMISSION_DENIED"`` …; a name
    that is none is ``UNKNOWN``); ``reason`` an ``ErrorReason`` name for the ``ErrorInfo``
    detail (sent as given, even when the enum lacks it); ``retry_after_seconds`` adds a
    ``RetryInfo`` detail; ``metadata`` goes into ``ErrorInfo.metadata``. The client sees
    ``message`` in ``TurnEnd.error`` (docs/semantics.md §10).
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "INTERNAL",
        reason: str = "INTERNAL",
        retry_after_seconds: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(
            message,
            status_code=CanonicalCode.__members__.get(code, CanonicalCode.UNKNOWN),
            reason=reason,
            retry_after_seconds=retry_after_seconds,
            metadata=metadata,
        )
        self.code = code


@dataclass(frozen=True, slots=True)
class SessionContext:
    """Input of ``configure_session``: the sidecar's configuration, once at process start.

    ``tools`` maps name to every configured server tool; ``default_model`` is
    ``provider:model``; ``system`` the configured default system prompt.
    """

    default_model: str
    system: str
    tools: Mapping[str, Tool]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """Output of ``configure_session``: the process-wide session setup (docs/semantics.md §3, §9).

    ``compaction`` turns on context compaction (:class:`turnwire.compaction.CompactionConfig`:
    the reactive overflow recovery, the proactive guard, ``compact_after``). Middlewares run
    first to last; a later middleware's non-None field replaces an earlier one's.
    """

    compaction: CompactionConfig | None = None


HOOK_NAMES = (
    "configure_session",
    "before_turn",
    "before_step",
    "before_tool_call",
    "after_tool_call",
    "on_step_finish",
    "on_chunk",
    "on_chat_response",
    "on_chat_error",
    "classify_chat_error",
)
"""Every hook name, in lifecycle order."""


class Middleware:
    """Base class of a lifecycle middleware; every hook is a no-op by default.

    ``name`` identifies the middleware in logs and hook timelines (defaults to
    the class name). ``options`` are the ones given in the config file. The
    chain calls a hook only on middlewares whose :meth:`implemented_hooks`
    include it, so an unimplemented ``on_chunk`` costs nothing per chunk.
    """

    name: str = ""

    def __init__(self, **options: Any) -> None:
        self.options = options
        if not self.name:
            self.name = type(self).__name__

    def implemented_hooks(self) -> frozenset[str]:
        """The hooks the chain must call on this middleware: by default, those its class overrides.

        Override to leave out an overridden hook depending on options (for
        example a logger whose chunk counting is off leaves out ``on_chunk``).
        The chain reads it when built and again after ``configure_session``, so a
        middleware may decide there (a remote hook server's subscriptions).
        """
        return frozenset(
            hook for hook in HOOK_NAMES if getattr(type(self), hook) is not getattr(Middleware, hook)
        )

    async def configure_session(self, ctx: SessionContext) -> SessionConfig | None:
        """Once at process start; return a SessionConfig to set up the session (compaction).
        Raising aborts start-up with a clear message."""
        return None

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Once per attempt before the first step; return a TurnConfig to change the turn."""
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """Before every step (step 0 included); return a StepConfig to change this step."""
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """Before each server-executed tool call: allow, allow with new input, block or substitute."""
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """After each call's outcome is known (real, blocked, substituted or failed)."""

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """After each step, once all its tool calls are done."""

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Per model stream chunk and tool result; awaited, so keep it fast."""

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """After the assistant message is stored and the turn lock released."""

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """Once per turn that ends in error; return the error (or message) the client sees."""
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """Map ``ctx.error`` to a provider-neutral classification, or None to leave it to others."""
        return None
