"""Hook contexts to ``turnwire.v1`` hook requests, and hook responses back (docs/semantics.md §3).

Requests are snapshots: ids, the turn's ``continuation``/``body``/``attempt`` (:class:`TurnInfo`),
system, model, tool names, step numbers, usage, and the message history only when the server
asked for it. Responses are checked as they are read: an unusable field (a ``max_steps`` below 1,
input that is not a JSON object, an unknown enum value …) raises :class:`InvalidResponse`, which
the caller treats as a failed call (its failure mode).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from turnwire.errors import DomainError
from turnwire.hooks import (
    ChatError,
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ConcurrentInput,
    StepConfig,
    StepContext,
    StepFinishContext,
    StopWhen,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
    TurnTimeout,
)
from turnwire.providers import ProviderError
from turnwire.types import BudgetState, ModelSettings
from turnwire.values import NotJsonError, dumps, from_struct, loads
from turnwire_client.v1 import chat_service_pb2, error_reason_pb2, event_pb2, hooks_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine.errors import TurnFailure
from turnwire_server.hooks.readonly import MessagesView


class InvalidResponse(DomainError, ValueError):
    """A hook server answered something that cannot be used; the message names the field."""

    error_reason = error_reason_pb2.ERROR_REASON_HOOK_FAILED


def turn_info(
    conversation_id: str,
    request_id: str,
    *,
    continuation: bool = False,
    body: Mapping[str, Any] | None = None,
    attempt: int = 1,
) -> hooks_pb2.TurnInfo:
    """The ``TurnInfo`` every request carries (``body`` as a Struct; JSON-safe by construction)."""
    info = hooks_pb2.TurnInfo(
        conversation_id=conversation_id, request_id=request_id, continuation=continuation, attempt=attempt
    )
    if body:
        info.body.update(body)
    return info


def turn_info_of(ctx: TurnContext) -> hooks_pb2.TurnInfo:
    """The turn as ``before_turn`` sees it."""
    return turn_info(
        ctx.conversation_id,
        ctx.request_id,
        continuation=ctx.continuation,
        body=ctx.body,
        attempt=ctx.attempt,
    )


# --- requests -----------------------------------------------------------------------------


def before_turn_request(
    ctx: TurnContext, info: hooks_pb2.TurnInfo, *, include_messages: bool
) -> hooks_pb2.BeforeTurnRequest:
    """``BeforeTurnRequest``: system, model and tool names as assembled (messages when asked),
    the entry path and, for a sub-agent's turn, its path of calls."""
    request = hooks_pb2.BeforeTurnRequest(
        turn=info, system=ctx.system, model=ctx.model, tool_names=list(ctx.tools)
    )
    if include_messages:
        request.messages.extend(MessagesView.read_only(ctx.messages))  # extend copies them
    if ctx.concurrent_input is not None:
        request.concurrent_input.CopyFrom(concurrent_input(ctx.concurrent_input))
    request.entry = ctx.entry
    for call in ctx.subagent_path:
        request.subagent_path.add(
            tool_call_id=call.tool_call_id,
            subagent=call.subagent,
            conversation_id=call.conversation_id,
            request_id=call.request_id,
        )
    return request


_STRATEGIES: dict[str, chat_service_pb2.ConcurrentInputStrategy.ValueType] = {
    "enqueue": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE,
    "reject": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT,
    "interrupt": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT,
    "rollback": chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK,
}


def concurrent_input(applied: ConcurrentInput) -> hooks_pb2.ConcurrentInput:
    """The ``ConcurrentInput`` message of a hook context's :class:`~turnwire.hooks.ConcurrentInput`."""
    return hooks_pb2.ConcurrentInput(strategy=_STRATEGIES[applied.strategy], request_id=applied.request_id)


def step_finish_reason(reason: str) -> event_pb2.FinishReason.ValueType:
    """The proto ``FinishReason`` of a ``turnwire.types.FinishReason`` value (``other`` when unknown)."""
    try:
        return event_pb2.FinishReason.Value("FINISH_REASON_" + reason.upper().replace("-", "_"))
    except ValueError:
        return event_pb2.FINISH_REASON_OTHER


def step_info(step: StepFinishContext) -> hooks_pb2.StepInfo:
    """A finished step's summary: number, finish reason, usage, cost (unset: unknown), called tool
    names in order, the model that ran it."""
    info = hooks_pb2.StepInfo(
        step_number=step.step_number,
        model=step.model,
        finish_reason=step_finish_reason(step.finish_reason),
        tool_names=[call.tool_name for call in step.tool_calls],
    )
    step.usage.copy_to(info.usage)
    if step.cost is not None:
        step.cost.copy_to(info.cost)
    return info


_BUDGET_UNITS = {"tokens": hooks_pb2.BUDGET_UNIT_TOKENS, "usd": hooks_pb2.BUDGET_UNIT_USD}


def budget_states(states: Sequence[BudgetState]) -> list[hooks_pb2.BudgetState]:
    """The ``BudgetState`` messages of a hook context's budget states (docs/cost.md, "Budgets
    in hooks")."""
    messages = []
    for state in states:
        message = hooks_pb2.BudgetState(
            scope=state.scope,
            period=state.period,
            unit=_BUDGET_UNITS[state.unit],
            limit=state.limit,
            spent=state.spent,
            reserved=state.reserved,
            remaining=state.remaining,
        )
        if state.resets_at is not None:
            message.resets_at.FromDatetime(state.resets_at)
        messages.append(message)
    return messages


def before_step_request(
    ctx: StepContext, info: hooks_pb2.TurnInfo, *, include_messages: bool
) -> hooks_pb2.BeforeStepRequest:
    """``BeforeStepRequest``: the step number, the steps so far, model, system, the budgets
    (messages when asked)."""
    request = hooks_pb2.BeforeStepRequest(
        turn=info,
        step_number=ctx.step_number,
        steps=[step_info(step) for step in ctx.steps],
        model=ctx.model,
        system=ctx.system,
        budgets=budget_states(ctx.budgets),
    )
    if include_messages:
        request.messages.extend(MessagesView.read_only(ctx.messages))  # extend copies them
    return request


def _json(value: Any) -> str:
    try:
        return dumps(value)
    except NotJsonError:
        return dumps(repr(value))


def before_tool_call_request(
    ctx: ToolCallContext, info: hooks_pb2.TurnInfo
) -> hooks_pb2.BeforeToolCallRequest:
    """``BeforeToolCallRequest``: the call with its input as JSON text (after earlier changes)."""
    return hooks_pb2.BeforeToolCallRequest(turn=info, call=_call_info(ctx))


def _call_info(ctx: ToolCallContext | ToolCallResultContext) -> hooks_pb2.ToolCallInfo:
    return hooks_pb2.ToolCallInfo(
        tool_call_id=ctx.tool_call_id,
        tool_name=ctx.tool_name,
        input_json=_json(ctx.input),
        step_number=ctx.step_number,
        idempotency_key=ctx.idempotency_key,
        rerun=ctx.rerun,
    )


_OUTCOMES = {
    "executed": hooks_pb2.TOOL_CALL_OUTCOME_EXECUTED,
    "blocked": hooks_pb2.TOOL_CALL_OUTCOME_BLOCKED,
    "substituted": hooks_pb2.TOOL_CALL_OUTCOME_SUBSTITUTED,
    "failed": hooks_pb2.TOOL_CALL_OUTCOME_FAILED,
    "interrupted": hooks_pb2.TOOL_CALL_OUTCOME_INTERRUPTED,
}


def after_tool_call_request(
    ctx: ToolCallResultContext, info: hooks_pb2.TurnInfo
) -> hooks_pb2.AfterToolCallRequest:
    """``AfterToolCallRequest``: the model's input, duration, success, output or error, outcome."""
    duration = duration_pb2.Duration()
    duration.FromMilliseconds(round(ctx.duration_ms))
    return hooks_pb2.AfterToolCallRequest(
        turn=info,
        call=_call_info(ctx),
        duration=duration,
        success=ctx.success,
        output_json=_json(ctx.output) if ctx.success else "",
        error=ctx.error or "",
        outcome=_OUTCOMES.get(ctx.outcome, hooks_pb2.TOOL_CALL_OUTCOME_UNSPECIFIED),
    )


def step_finish_request(ctx: StepFinishContext, info: hooks_pb2.TurnInfo) -> hooks_pb2.OnStepFinishRequest:
    """``OnStepFinishRequest``: the step's summary, text, reasoning, tool calls with results,
    sources and files, the budgets, and whether the turn's steps end with it."""
    return hooks_pb2.OnStepFinishRequest(
        turn=info,
        step=step_info(ctx),
        text=ctx.text,
        reasoning_text=ctx.reasoning_text,
        tool_calls=list(ctx.tool_calls),
        raw_finish_reason=ctx.raw_finish_reason,
        response_id=ctx.response_id,
        response_model=ctx.response_model,
        sources=list(ctx.sources),
        files=list(ctx.files),
        budgets=budget_states(ctx.budgets),
        last_step=ctx.last_step,
    )


_TURN_OUTCOMES = {
    "completed": hooks_pb2.TURN_OUTCOME_COMPLETED,
    "error": hooks_pb2.TURN_OUTCOME_ERROR,
    "aborted": hooks_pb2.TURN_OUTCOME_ABORTED,
}


def chat_response_request(
    ctx: ChatResponseContext, info: hooks_pb2.TurnInfo
) -> hooks_pb2.OnChatResponseRequest:
    """``OnChatResponseRequest``: the stored message, the outcome, the error's status when it
    failed, the turn's cost (unset: unknown), the budgets."""
    request = hooks_pb2.OnChatResponseRequest(
        turn=info, message=ctx.message, outcome=_TURN_OUTCOMES[ctx.status], budgets=budget_states(ctx.budgets)
    )
    if ctx.concurrent_input is not None:
        request.concurrent_input.CopyFrom(concurrent_input(ctx.concurrent_input))
    if ctx.cost is not None:
        ctx.cost.copy_to(request.cost)
    error = ctx.error
    if error is not None:
        # The turn's error as the client saw it in TurnEnd (a TurnFailure names its stage).
        if isinstance(error, TurnFailure):
            request.error.CopyFrom(status_of(error.error, error.stage))
        else:
            request.error.CopyFrom(status_of(error, "turn"))
    return request


_CLASSIFICATIONS: dict[str, hooks_pb2.ChatErrorClassification.ValueType] = {
    "context_overflow": hooks_pb2.CHAT_ERROR_CLASSIFICATION_CONTEXT_OVERFLOW,
    "rate_limit": hooks_pb2.CHAT_ERROR_CLASSIFICATION_RATE_LIMIT,
    "transient": hooks_pb2.CHAT_ERROR_CLASSIFICATION_TRANSIENT,
    "fatal": hooks_pb2.CHAT_ERROR_CLASSIFICATION_FATAL,
    "unknown": hooks_pb2.CHAT_ERROR_CLASSIFICATION_UNKNOWN,
}
_CLASSIFICATION_NAMES = {value: name for name, value in _CLASSIFICATIONS.items()}


def chat_error_info(ctx: ChatErrorContext, info: hooks_pb2.TurnInfo) -> hooks_pb2.ChatErrorInfo:
    """``ChatErrorInfo``: the status the client would see, stage, classification, provider error."""
    failure = hooks_pb2.ChatErrorInfo(
        turn=info,
        error=status_of(ctx.error, ctx.stage),
        stage=ctx.stage,
        messages_persisted=ctx.messages_persisted,
        classification=_CLASSIFICATIONS.get(
            ctx.classification or "", hooks_pb2.CHAT_ERROR_CLASSIFICATION_UNSPECIFIED
        ),
        middleware=ctx.middleware,
        hook=ctx.hook,
    )
    error = ctx.error
    if isinstance(error, ProviderError):
        body = error.body
        failure.provider_error.CopyFrom(
            hooks_pb2.ProviderErrorInfo(
                provider=error.provider,
                http_status=error.status,
                type=error.type,
                code=error.code,
                body=body if isinstance(body, str) else ("" if body is None else _json(body)),
                in_stream=error.in_stream,
                retryable=error.retryable,
            )
        )
    return failure


# --- responses ----------------------------------------------------------------------------


def _seconds(duration: duration_pb2.Duration, field: str, *, allow_zero: bool = False) -> float:
    seconds = duration.seconds + duration.nanos / 1e9
    if seconds < 0 or (seconds == 0 and not allow_zero):
        raise InvalidResponse(f"{field} must be positive, not {seconds:g} s")
    return seconds


def _model_settings(settings: hooks_pb2.ModelSettings) -> ModelSettings:
    return ModelSettings(
        max_output_tokens=settings.max_output_tokens if settings.HasField("max_output_tokens") else None,
        temperature=settings.temperature if settings.HasField("temperature") else None,
        top_p=settings.top_p if settings.HasField("top_p") else None,
        top_k=settings.top_k if settings.HasField("top_k") else None,
        presence_penalty=settings.presence_penalty if settings.HasField("presence_penalty") else None,
        frequency_penalty=settings.frequency_penalty if settings.HasField("frequency_penalty") else None,
        stop_sequences=list(settings.stop_sequences.values) if settings.HasField("stop_sequences") else None,
        seed=settings.seed if settings.HasField("seed") else None,
        max_retries=settings.max_retries if settings.HasField("max_retries") else None,
        headers=dict(settings.headers) or None,
        provider_options=from_struct(settings.provider_options)
        if settings.HasField("provider_options")
        else None,
    )


def _tool_choice(value: str) -> str:
    if not value:
        raise InvalidResponse("tool_choice must be auto, none, required or a tool's name, not empty")
    return value


def _model(value: str) -> str:
    if ":" not in value:
        raise InvalidResponse(f"model must be provider:model, not {value!r}")
    return value


def _stop_conditions(conditions: Iterable[hooks_pb2.StopCondition]) -> list[StopWhen]:
    stops = []
    for condition in conditions:
        kind = condition.WhichOneof("condition")
        if kind == "tool_called":
            stops.append(StopWhen(tool_called=condition.tool_called))
        elif kind == "step_count" and condition.step_count >= 1:
            stops.append(StopWhen(step_count=condition.step_count))
        else:
            raise InvalidResponse("stop_when: each condition sets tool_called or a step_count of at least 1")
    return stops


def turn_config(response: hooks_pb2.BeforeTurnResponse) -> TurnConfig | None:
    """The ``TurnConfig`` of a ``BeforeTurnResponse`` (None when it sets nothing).

    Raises :class:`InvalidResponse`.
    """
    if response.ByteSize() == 0:
        return None
    if response.HasField("max_steps") and response.max_steps < 1:
        raise InvalidResponse(f"max_steps must be at least 1, not {response.max_steps}")
    timeout = None
    if response.HasField("timeout"):
        limits = response.timeout
        timeout = TurnTimeout(
            total_seconds=_seconds(limits.total, "timeout.total") if limits.HasField("total") else None,
            step_seconds=_seconds(limits.step, "timeout.step") if limits.HasField("step") else None,
            chunk_seconds=_seconds(limits.chunk, "timeout.chunk") if limits.HasField("chunk") else None,
        )
    return TurnConfig(
        model=_model(response.model) if response.HasField("model") else None,
        system=response.system if response.HasField("system") else None,
        messages=list(response.messages.messages) if response.HasField("messages") else None,
        active_tools=list(response.active_tools.values) if response.HasField("active_tools") else None,
        tool_choice=_tool_choice(response.tool_choice) if response.HasField("tool_choice") else None,
        max_steps=response.max_steps if response.HasField("max_steps") else None,
        stop_when=_stop_conditions(response.stop_when) or None,
        send_reasoning=response.send_reasoning if response.HasField("send_reasoning") else None,
        model_settings=_model_settings(response.model_settings)
        if response.HasField("model_settings")
        else None,
        timeout=timeout,
        stream_stall_timeout_seconds=_seconds(
            response.stream_stall_timeout, "stream_stall_timeout", allow_zero=True
        )
        if response.HasField("stream_stall_timeout")
        else None,
        output=from_struct(response.output) if response.HasField("output") else None,
    )


def step_config(response: hooks_pb2.BeforeStepResponse) -> StepConfig | None:
    """The ``StepConfig`` of a ``BeforeStepResponse`` (None when it sets nothing).

    Raises :class:`InvalidResponse`.
    """
    if response.ByteSize() == 0:
        return None
    return StepConfig(
        model=_model(response.model) if response.HasField("model") else None,
        tool_choice=_tool_choice(response.tool_choice) if response.HasField("tool_choice") else None,
        active_tools=list(response.active_tools.values) if response.HasField("active_tools") else None,
        system=response.system if response.HasField("system") else None,
        messages=list(response.messages.messages) if response.HasField("messages") else None,
        model_settings=_model_settings(response.model_settings)
        if response.HasField("model_settings")
        else None,
        max_step_tokens=_step_tokens(response.max_step_tokens)
        if response.HasField("max_step_tokens")
        else None,
        max_step_usd=_step_usd(response.max_step_usd) if response.HasField("max_step_usd") else None,
    )


def _step_tokens(value: int) -> int:
    if value < 0:
        raise InvalidResponse(f"max_step_tokens must be 0 or more, not {value}")
    return value


def _step_usd(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise InvalidResponse(f"max_step_usd must be a finite amount of 0 or more, not {value}")
    return value


def _parse(text: str, field: str) -> Any:
    try:
        return loads(text)
    except ValueError as error:
        raise InvalidResponse(f"{field} is not JSON ({error}): {text[:200]!r}") from None


def tool_call_decision(response: hooks_pb2.BeforeToolCallResponse) -> ToolCallDecision | None:
    """The decision of a ``BeforeToolCallResponse`` (None: no decision, the call runs as it is).

    Raises :class:`InvalidResponse` (input that is not a JSON object, output that is not JSON).
    """
    kind = response.WhichOneof("decision")
    if kind is None:
        return None
    if kind == "allow":
        return ToolCallDecision.allow()
    if kind == "allow_with_input":
        value = _parse(response.allow_with_input.input_json, "allow_with_input.input_json")
        if not isinstance(value, dict):
            raise InvalidResponse("allow_with_input.input_json must be a JSON object")
        return ToolCallDecision.allow(input=value)
    if kind == "block":
        return ToolCallDecision.block(response.block.reason or None)
    return ToolCallDecision.substitute(_parse(response.substitute.output_json, "substitute.output_json"))


def classification(response: hooks_pb2.ClassifyChatErrorResponse) -> ChatErrorClassification | None:
    """The classification of a ``ClassifyChatErrorResponse`` (None: unspecified).

    Raises :class:`InvalidResponse` for a value the enum does not define.
    """
    value = response.classification
    if value == hooks_pb2.CHAT_ERROR_CLASSIFICATION_UNSPECIFIED:
        return None
    name = _CLASSIFICATION_NAMES.get(value)
    if name is None:
        raise InvalidResponse(f"classification {value} is not a ChatErrorClassification value")
    return name  # type: ignore[return-value]


def _chat_error(status: status_pb2.Status) -> ChatError:
    if status.code == code_pb2.OK or status.code not in code_pb2.Code.values():
        raise InvalidResponse(f"error.code {status.code} is not a google.rpc.Code of an error")
    reason, metadata, retry_after = "INTERNAL", dict[str, str](), None
    for packed in status.details:
        if packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            packed.Unpack(info)
            reason, metadata = info.reason or reason, dict(info.metadata)
        elif packed.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            packed.Unpack(retry)
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
    return ChatError(
        status.message,
        code=code_pb2.Code.Name(status.code),
        reason=reason,
        retry_after_seconds=retry_after,
        metadata=metadata,
    )


def surfaced_error(response: hooks_pb2.OnChatErrorResponse, current: BaseException) -> BaseException | str:
    """What an ``OnChatErrorResponse`` makes the client see: a :class:`ChatError` for ``error``
    (its code, message, ErrorInfo reason and metadata, RetryInfo), the ``message`` alone, or
    ``current`` unchanged when it sets neither. Raises :class:`InvalidResponse`."""
    if response.HasField("error"):
        return _chat_error(response.error)
    if response.HasField("message"):
        return response.message
    return current
