"""The offline scripted model: deterministic output driven by a script.

It is the embedded default (no API keys needed) and the test double for
everything above the provider interface. A script is a list of steps; step
``n`` of a turn (0-based) plays ``steps[n]``. A step streams reasoning, then
text, then tool calls, then finishes with the given finish reason and usage, or
raises the given error; ``delay_ms`` sleeps before every chunk.

When a turn runs longer than its script, the last step plays again, unless the
provider is *strict* (``ScriptedProvider(..., strict=True)``, ``strict: true``
in the YAML entry; the test harnesses use it): then a call past the script's
end is a call the script did not expect. It fails with a non-retryable
:class:`UnexpectedModelCall` naming the script, the step number and the
script's length, and is kept in :attr:`ScriptedProvider.unexpected_calls` so a
test fails even when the turn's error was swallowed. A script that means to
repeat says so: ``repeat: true`` on its last step.

A step with ``until_cancelled: true`` streams its text again and again, one
delta every ``delay_ms``, and never finishes: the turn runs until it is
cancelled (or a deadline or a stall timeout ends it, or its output limit, below).
Tests that cancel a turn mid-reply use it instead of a long text they hope
outlasts the cancel.

A request with ``settings.max_output_tokens`` set (a budget's clamp, a hook's or
the client's setting) is held to it as a real model is: the step's output stops
at that many tokens (words, and 8 a tool call: :mod:`turnwire.scripted_limit`),
nothing after the cut is streamed (no later text, sources, files or tool calls),
the step finishes ``length`` (raw ``length``), and its usage reports no more
output tokens than the limit (a scripted ``usage.output_tokens`` is capped too).
Without a limit a step plays as scripted.

The built-in ``demo`` script is rule-based instead: it calls a demo tool when
the user asks for something one answers (the time, the weather, arithmetic),
then answers with the tool's result. Every text it writes says it is an
offline model. Asked to continue its last reply (the engine's continuation
prompt), it writes the rest of that reply, or says it was complete: it never
takes the prompt for the user's question.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence

import orjson
from google.protobuf import json_format

from turnwire.compaction import EstimateTokens
from turnwire.error_classes import never_retryable
from turnwire.providers import (
    ModelRequest,
    ProviderError,
    transcript_call_ids,
    unique_id,
)
from turnwire.scripted_builtins import BUILTIN_SCRIPTS, OFFLINE_NOTICE, DemoScript, SummaryScript
from turnwire.scripted_limit import CUT_FINISH_REASON, TOOL_CALL_TOKENS, OutputLimit
from turnwire.scripted_parts import scripted_parts
from turnwire.scripted_steps import (
    ANTHROPIC_ERROR_TYPES,
    Script,
    ScriptedError,
    ScriptedToolCall,
    ScriptedUsage,
    ScriptStep,
    StaticScript,
    UnexpectedModelCall,
    anthropic_error_type,
    check_repeat_last,
    output_overflow_error,
    overflow_error,
)
from turnwire.types import (
    FinishReason,
    FinishStep,
    ModelChunk,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
    ToolResult,
    Usage,
    UsageUpdate,
)
from turnwire.values import dumps, parse_tool_input

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "BUILTIN_SCRIPTS",
    "OFFLINE_NOTICE",
    "DemoScript",
    "Script",
    "ScriptStep",
    "ScriptedError",
    "ScriptedProvider",
    "ScriptedToolCall",
    "ScriptedUsage",
    "StaticScript",
    "SummaryScript",
    "UnexpectedModelCall",
    "anthropic_error_type",
    "check_repeat_last",
    "output_overflow_error",
    "overflow_error",
]

_ESTIMATE = EstimateTokens()


def _first_and_rest(pieces: Iterator[str]) -> Iterator[str] | None:
    """``pieces`` again, or None when there are none (a block cut before its first word is never
    opened)."""
    first = next(pieces, None)
    return None if first is None else itertools.chain((first,), pieces)


def _split(text: str, chunk_size: int) -> list[str]:
    if not text:
        return []
    if chunk_size > 0:
        return [text[i : i + chunk_size] for i in range(0, len(text), chunk_size)]
    return re.findall(r"\S+\s*|\s+", text)


class ScriptedProvider:
    """The offline provider. Model ``scripted:<name>`` plays script ``<name>``.

    ``scripts`` maps names to step lists (from config); ``demo`` and ``summarizer``
    (:class:`SummaryScript`) are built in unless overridden. ``record_path``: every request is
    appended to that file as one JSON line (``model``, ``step_number``, ``system``, ``tools``
    by name, ``messages`` in protobuf's JSON form), so a test can see what the model was
    told. ``context_window`` (tokens): a request whose input (estimated as
    :class:`turnwire.compaction.EstimateTokens` does) is larger fails with
    :func:`overflow_error` before any output, and one whose input plus ``max_output_tokens`` (when
    set) is larger, with :func:`output_overflow_error`. A step is cut at ``max_output_tokens``
    when the request sets it (the module docstring). ``strict``: a call past a script's last step
    (unless that step has ``repeat``) raises :class:`UnexpectedModelCall` and is appended to
    :attr:`unexpected_calls`, which a test harness checks at teardown. Raises
    :class:`ProviderError` (status 404) for an unknown script name, and whatever error a step
    scripts.
    """

    name = "scripted"

    def __init__(
        self,
        scripts: Mapping[str, Sequence[ScriptStep]] | None = None,
        *,
        record_path: str | None = None,
        context_window: int | None = None,
        strict: bool = False,
    ) -> None:
        self.record_path = record_path
        self.context_window = context_window
        self.strict = strict
        self.unexpected_calls: list[UnexpectedModelCall] = []
        """Every call a strict script did not expect, in order (also raised to the engine)."""
        builtins: tuple[Script, ...] = (DemoScript(), SummaryScript())
        self.scripts: dict[str, Script] = dict(zip(BUILTIN_SCRIPTS, builtins, strict=True))
        for script_name, steps in (scripts or {}).items():
            self.scripts[script_name] = StaticScript(steps, name=script_name, strict=strict)

    def has_model(self, model: str) -> bool:
        """True when ``model`` names a script."""
        return model in self.scripts

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream the scripted step for ``request``."""
        script = self.scripts.get(request.model)
        if script is None:
            raise ProviderError(
                f"scripted model {request.model!r} has no script; known: {sorted(self.scripts)}",
                status=404,
                type="not_found_error",
                provider=self.name,
            )
        if self.record_path is not None:
            self._record(request)
        try:
            step = script.step(request)
        except UnexpectedModelCall as unexpected:
            self.unexpected_calls.append(unexpected)
            raise
        if request.attempt > 1 and step.retry is not None:
            step = step.retry
        delay = step.delay_ms / 1000.0
        sent = 0
        # Without a delay or a scripted error there is nothing to pace: skip the call per chunk.
        paced = bool(delay) or step.error is not None
        prefix = f"s{request.step_number}"

        async def pace() -> None:
            nonlocal sent
            if step.error is not None and sent >= step.error.after_chunks:
                error = ProviderError(
                    step.error.message,
                    status=step.error.status,
                    type=step.error.type,
                    code=step.error.code,
                    retryable=step.error.retryable,
                    retry_after_seconds=step.error.retry_after_seconds,
                    provider=self.name,
                    body={"type": "error", "error": {"type": step.error.type, "message": step.error.message}},
                    in_stream=step.error.after_chunks > 0,
                )
                # The adapters' rule: an overflow or a fatal error is never retryable.
                error.retryable = error.retryable and not never_retryable(error)
                raise error
            sent += 1
            if delay:
                await asyncio.sleep(delay)

        input_tokens = step.usage.input_tokens
        if input_tokens is None:
            # What a model reads (texts, tool inputs and outputs), not the protobuf encoding, with
            # the system prompt and the tool definitions, which providers count as input too.
            input_tokens = _ESTIMATE.messages(request.messages) + _ESTIMATE.framing(request)
        if self.context_window is not None:
            if input_tokens > self.context_window:
                raise overflow_error(input_tokens, self.context_window)
            reserved = request.settings.max_output_tokens
            if reserved is not None and input_tokens + reserved > self.context_window:
                raise output_overflow_error(input_tokens, reserved, self.context_window)
        if step.error is not None and step.error.after_chunks == 0:
            # Refused before its stream, as a 429 or 529 is: the provider reports no usage for it.
            await pace()
        # As providers do at stream start: the input is counted before any output.
        yield UsageUpdate(Usage(input_tokens=input_tokens, total_tokens=input_tokens))
        limit = OutputLimit(request.settings.max_output_tokens)
        reasoning = _first_and_rest(limit.words(_split(step.reasoning, step.chunk_size)))
        if reasoning is not None:
            if paced:
                await pace()
            yield ReasoningStart(f"{prefix}-r")
            for piece in reasoning:
                if paced:
                    await pace()
                yield ReasoningDelta(f"{prefix}-r", piece)
            yield ReasoningEnd(f"{prefix}-r", signature=step.reasoning_signature.encode())
        text = _first_and_rest(limit.words(_split(step.text, step.chunk_size), repeat=step.until_cancelled))
        if text is not None:
            if paced:
                await pace()
            yield TextStart(f"{prefix}-t")
            for piece in text:
                if paced:
                    await pace()
                yield TextDelta(f"{prefix}-t", piece)
            yield TextEnd(f"{prefix}-t")
        if not limit.cut:
            text_id = f"{prefix}-t" if text is not None else ""
            for chunk in scripted_parts(step.sources, step.files, prefix, text_id):
                yield chunk
        taken = transcript_call_ids(request.messages) if step.tool_calls else set()
        for index, call in enumerate(step.tool_calls):
            if not limit.tool_call():
                break  # cut off: a model stopped at its limit emits no later call
            call_id = call.id or unique_id(f"call_{request.step_number}_{index}", taken)
            raw = call.raw_input if call.raw_input is not None else dumps(call.input)
            if paced:
                await pace()
            executed = call.provider_executed
            yield ToolInputStart(call_id, call.name, provider_executed=executed)
            yield ToolInputDelta(call_id, raw)
            parsed, error = parse_tool_input(raw)
            yield ToolCall(call_id, call.name, parsed, raw_input=raw, error=error, provider_executed=executed)
            if executed:
                yield ToolResult(call_id, call.name, output=call.output)
        if paced:
            await pace()
        output_tokens = step.usage.output_tokens
        if output_tokens is None:
            # A cut step counts what it streamed; the others keep their estimate (never above that).
            output_tokens = (
                limit.used
                if limit.cut
                else len((step.text + step.reasoning).split()) + TOOL_CALL_TOKENS * len(step.tool_calls)
            )
        output_tokens = limit.cap(output_tokens)
        reasoning_tokens = step.usage.reasoning_tokens
        if limit.max_output_tokens is not None:
            reasoning_tokens = min(reasoning_tokens, output_tokens)  # a part of the output
        if limit.cut:
            finish, raw_finish = FinishReason.LENGTH, CUT_FINISH_REASON
        else:
            finish = (
                FinishReason(step.finish_reason)
                if step.finish_reason
                else (
                    FinishReason.TOOL_CALLS
                    if any(not call.provider_executed for call in step.tool_calls)
                    else FinishReason.STOP
                )
            )
            raw_finish = step.raw_finish_reason or finish
        yield FinishStep(
            finish_reason=finish,
            raw_finish_reason=raw_finish,
            usage=Usage(
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                total_tokens=input_tokens + output_tokens,
                reasoning_tokens=reasoning_tokens,
                cached_input_tokens=step.usage.cached_input_tokens,
                cache_write_input_tokens=step.usage.cache_write_input_tokens,
                cache_write_1h_input_tokens=step.usage.cache_write_1h_input_tokens,
            ),
            response_id=f"scripted-{request.step_number}",
            response_model=f"scripted:{request.model}",
        )

    def _record(self, request: ModelRequest) -> None:
        assert self.record_path is not None
        line = orjson.dumps(
            {
                "model": request.model,
                "step_number": request.step_number,
                "system": request.system,
                "tools": [tool.name for tool in request.tools],
                "messages": [json_format.MessageToDict(message) for message in request.messages],
            }
        )
        with open(self.record_path, "ab") as out:
            out.write(line + b"\n")

    async def aclose(self) -> None:
        """Nothing to release."""
