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
import dataclasses
import itertools
import re
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import Any, Literal, Protocol

import orjson
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnwire.compaction import SUMMARY_REQUEST_ID, EstimateTokens
from turnwire.error_classes import never_retryable
from turnwire.providers import (
    CONTINUATION_PROMPT,
    ModelRequest,
    ProviderError,
    transcript_call_ids,
    unique_id,
)
from turnwire.scripted_limit import CUT_FINISH_REASON, TOOL_CALL_TOKENS, OutputLimit
from turnwire.scripted_parts import ScriptedFile, ScriptedSource, scripted_parts
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
    last_step_text,
)
from turnwire.values import dumps, parse_tool_input, tool_call_output
from turnwire_client.v1 import message_pb2

OFFLINE_NOTICE = "[offline scripted model, no LLM connected]"
_ESTIMATE = EstimateTokens()


class ScriptedToolCall(BaseModel):
    """A tool call a script step makes. ``raw_input`` (not JSON) overrides ``input``.
    ``provider_executed``: a call the model's provider runs itself (a server tool), with
    ``output`` as its result; the engine never runs it (``turnwire.types.ToolCall``). ``id``:
    the call's id as given; without one, ``call_<step>_<index>``, made unique against the
    request's transcript (``_2``, ``_3`` …) as a real API's ids are."""

    model_config = ConfigDict(extra="forbid")

    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    raw_input: str | None = None
    id: str | None = None
    provider_executed: bool = False
    output: Any = None


ANTHROPIC_ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""The ``error.type`` Anthropic's API sends with each HTTP status
(https://docs.claude.com/en/api/errors); another 4xx is ``invalid_request_error``, another
status ``api_error``."""


def anthropic_error_type(status: int) -> str:
    """The ``error.type`` Anthropic's API sends with HTTP ``status`` (:data:`ANTHROPIC_ERROR_TYPES`)."""
    if status in ANTHROPIC_ERROR_TYPES:
        return ANTHROPIC_ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


class ScriptedError(BaseModel):
    """An error a script step raises, as a provider would (see ProviderError): as Anthropic's
    API sends it, ``{"type": "error", "error": {"type", "message"}}`` with HTTP ``status``.
    ``type`` unset: the type Anthropic sends with that status (:func:`anthropic_error_type`:
    ``overloaded_error`` for 529, ``rate_limit_error`` for 429 …)."""

    model_config = ConfigDict(extra="forbid")

    message: str
    status: int = 500
    type: str = Field("", description="the error's type; empty: Anthropic's for the status")
    code: str = ""
    retryable: bool = False
    retry_after_seconds: float | None = None
    after_chunks: int = Field(
        0,
        ge=0,
        description="chunks to stream before failing (more than 0: the error is in_stream, after the "
        "step reported its input usage; 0: the request is refused, with no usage)",
    )

    @model_validator(mode="after")
    def _type_of_status(self) -> ScriptedError:
        self.type = self.type or anthropic_error_type(self.status)
        return self


class ScriptedUsage(BaseModel):
    """Token counts a script step reports; missing ones are estimated: the input as
    :class:`~turnwire.compaction.EstimateTokens` counts the request (messages, system prompt, tool
    definitions), the output from the text (docs/providers.md, "scripted")."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_input_tokens: int = 0
    cache_write_1h_input_tokens: int = 0


class ScriptStep(BaseModel):
    """One model step of a script.

    ``chunk_size`` splits text into deltas of that many characters (0: one
    delta per word); ``delay_ms`` is slept before every chunk; ``retry`` replaces the step
    when the turn is recovered (``ModelRequest.attempt`` > 1).

    ``until_cancelled``: after the text's deltas, stream them again, without end (each after
    ``delay_ms``, which must be above 0; a text ending in a space keeps the last and first words
    apart); the step never finishes (unless the request's ``max_output_tokens`` cuts it, the module
    docstring), so it takes no ``tool_calls``. ``repeat`` (only on a
    script's last step): this step also plays for every later step of the turn, which a strict
    provider otherwise refuses (see the module docstring).

    Raises:
        pydantic.ValidationError: ``until_cancelled`` without a text, without a delay or with
            tool calls.
    """

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    reasoning: str = ""
    reasoning_signature: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    finish_reason: Literal["stop", "length", "tool-calls", "content-filter", "error", "other"] | None = None
    raw_finish_reason: str | None = None
    usage: ScriptedUsage = Field(default_factory=ScriptedUsage)
    error: ScriptedError | None = None
    chunk_size: int = Field(0, ge=0)
    delay_ms: float = Field(0.0, ge=0)
    retry: ScriptStep | None = Field(
        None, description="played instead on attempt 2 and later (a recovery after a stall or a crash)"
    )
    until_cancelled: bool = Field(
        False, description="stream the text again and again, never finishing: the turn runs until cancelled"
    )
    repeat: bool = Field(
        False, description="on the last step: it plays again for every later step (strict allows it)"
    )
    sources: list[ScriptedSource] = Field(default_factory=list, description="cited after the text")
    files: list[ScriptedFile] = Field(default_factory=list, description="produced after the sources")

    @model_validator(mode="after")
    def _check_until_cancelled(self) -> ScriptStep:
        if self.until_cancelled and (not self.text or self.delay_ms <= 0 or self.tool_calls):
            raise ValueError(
                "until_cancelled streams the text without end: it needs a text and a delay_ms "
                "above 0, and takes no tool_calls (they would never be reached)"
            )
        return self


class Script(Protocol):
    """Chooses the step to play for a request."""

    def step(self, request: ModelRequest) -> ScriptStep:
        """The step to stream for ``request``."""
        ...


class UnexpectedModelCall(ProviderError):
    """A strict scripted model was called for a step its script does not have (a turn ran
    longer than the test expected). Never retryable; ``script``, ``step_number`` (0-based) and
    ``script_steps`` (the script's length) say which call."""

    def __init__(self, script: str, step_number: int, script_steps: int) -> None:
        super().__init__(
            f"scripted model {script!r} got an unexpected call: step {step_number} (0-based) of a "
            f"turn, but the script has {script_steps} step(s) and is strict; give it more steps, "
            "or set `repeat: true` on its last step if the turn is meant to run longer",
            # A request error, so every classifier calls it fatal: retrying cannot help.
            status=400,
            type="invalid_request_error",
            code="unexpected_model_call",
            retryable=False,
            provider="scripted",
        )
        self.script = script
        self.step_number = step_number
        self.script_steps = script_steps


def check_repeat_last(steps: Sequence[ScriptStep]) -> None:
    """Raises :class:`ValueError` when a step other than the last has ``repeat`` set."""
    for index, step in enumerate(steps[:-1]):
        if step.repeat:
            raise ValueError(
                f"step {index} has repeat: true, but only a script's last step repeats "
                f"(it has {len(steps)} steps)"
            )


class StaticScript:
    """Plays ``steps[request.step_number]``; past the end, the last step again, unless
    ``strict`` (and the last step has no ``repeat``): then :class:`UnexpectedModelCall`.

    Raises:
        ValueError: no steps, or ``repeat`` on a step other than the last.
    """

    def __init__(self, steps: Sequence[ScriptStep], *, name: str = "script", strict: bool = False) -> None:
        if not steps:
            raise ValueError("a script needs at least one step")
        check_repeat_last(steps)
        self.steps = tuple(steps)
        self.name = name
        self.strict = strict

    def step(self, request: ModelRequest) -> ScriptStep:
        """Step ``request.step_number``, or the last one.

        Raises:
            UnexpectedModelCall: strict, past the last step, which does not ``repeat``.
        """
        last = self.steps[-1]
        if request.step_number >= len(self.steps) and self.strict and not last.repeat:
            raise UnexpectedModelCall(self.name, request.step_number, len(self.steps))
        return self.steps[min(request.step_number, len(self.steps) - 1)]


_ARITHMETIC = re.compile(r"[-\d(][\d\s.+\-*/()%×x]*[\d)]")
_OPERATOR = re.compile(r"\d\s*[-+*/%×x]\s*[-\d(]")
_WEATHER = re.compile(r"weather\s+(?:in|for|at)\s+([A-Za-zÀ-ÿ .'-]+?)(?:[?.!,]|$)", re.IGNORECASE)
_TIME = re.compile(r"\b(time|clock|date|today)\b", re.IGNORECASE)
_ZONE = re.compile(r"\b(?:in|for)\s+([A-Za-z]+/[A-Za-z_]+|UTC)\b")


def _text(message: message_pb2.Message) -> str:
    return " ".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def _is_continuation_prompt(message: message_pb2.Message) -> bool:
    return message.role == message_pb2.ROLE_USER and _text(message) == CONTINUATION_PROMPT


def _last_user_text(messages: Sequence[message_pb2.Message]) -> str:
    for message in reversed(messages):
        if message.role == message_pb2.ROLE_USER:
            return _text(message)
    return ""


def _trailing_tool_results(
    messages: Sequence[message_pb2.Message],
) -> list[message_pb2.ToolCallPart]:
    """Tool calls with results in the current turn's assistant message (after its last step start)."""
    if not messages or messages[-1].role != message_pb2.ROLE_ASSISTANT:
        return []
    results: list[message_pb2.ToolCallPart] = []
    for part in messages[-1].parts:
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            results = []
        elif kind == "tool_call" and part.tool_call.state in (
            message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
            message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
            message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
        ):
            results.append(part.tool_call)
    return results


class DemoScript:
    """The embedded default's rules: call a demo tool when one answers the question, then answer."""

    def step(self, request: ModelRequest) -> ScriptStep:
        """Decide the step from the transcript (deterministic); a compaction's summary request
        gets the :class:`SummaryScript`'s summary (so ``scripted:demo`` can summarize)."""
        if request.messages and request.messages[-1].id == SUMMARY_REQUEST_ID:
            return SummaryScript().step(request)
        if len(request.messages) >= 2 and _is_continuation_prompt(request.messages[-1]):
            return self._continue(request)
        tools = {t.name for t in request.tools}
        # Results end the history in a later step, or in a continuation after client results.
        results = _trailing_tool_results(request.messages)
        if results:
            return ScriptStep(text=self._answer(results))
        text = _last_user_text(request.messages)
        call = self._tool_call(text, tools)
        if call is not None and request.tool_choice != "none":
            return ScriptStep(text=f"{OFFLINE_NOTICE} Let me use the {call.name} tool.", tool_calls=[call])
        return ScriptStep(
            text=(
                f"{OFFLINE_NOTICE} You said: {text!r}. I can call the demo tools: "
                "ask me the time, the weather in a city, or to calculate 12 * 7."
            )
        )

    def _continue(self, request: ModelRequest) -> ScriptStep:
        """The step after the continuation prompt: the rest of the reply the prompt follows (the
        step this script gives for the history without the prompt, less the text already
        written: a reply cut off by a cancel or a crash is completed), else a note that the reply
        was complete (``turnwire continue`` after a finished answer)."""
        before = dataclasses.replace(request, messages=request.messages[:-1])
        written = last_step_text(before.messages[-1])
        whole = self.step(before)
        rest = whole.text[len(written) :] if whole.text.startswith(written) else ""
        if rest or (whole.tool_calls and whole.text.startswith(written)):
            return whole.model_copy(update={"text": rest})
        return ScriptStep(
            text=f"{OFFLINE_NOTICE} My previous reply was complete; there is nothing to continue. "
            "Ask me the time, the weather in a city, or to calculate 12 * 7."
        )

    @staticmethod
    def _tool_call(text: str, tools: set[str]) -> ScriptedToolCall | None:
        if (match := _WEATHER.search(text)) and "get_weather" in tools:
            return ScriptedToolCall(name="get_weather", input={"city": match.group(1).strip()})
        arithmetic = [m for m in _ARITHMETIC.findall(text) if _OPERATOR.search(m)]
        if arithmetic and "calculator" in tools:
            expression = max(arithmetic, key=len).strip().replace("x", "*").replace("×", "*")
            return ScriptedToolCall(name="calculator", input={"expression": expression})
        if _TIME.search(text) and "get_current_time" in tools:
            zone = _ZONE.search(text)
            return ScriptedToolCall(
                name="get_current_time", input={"timezone": zone.group(1) if zone else "UTC"}
            )
        return None

    @staticmethod
    def _answer(results: Sequence[message_pb2.ToolCallPart]) -> str:
        lines = []
        for result in results:
            if result.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
                lines.append(f"The {result.tool_name} tool failed: {result.error_text}")
                continue
            if result.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
                lines.append(
                    f"The {result.tool_name} call was denied: {result.error_text or 'no reason given'}"
                )
                continue
            value = tool_call_output(result)
            lines.append(_describe_result(result.tool_name, value))
        return f"{OFFLINE_NOTICE} " + " ".join(lines)


def _describe_result(tool_name: str, value: Any) -> str:
    """A sentence about a demo tool's result (generic JSON for other tools)."""
    if isinstance(value, dict):
        if tool_name == "get_weather" and {"city", "condition", "temperature_c"} <= value.keys():
            return (
                f"In {value['city']} it is {value['condition']} and "
                f"{value['temperature_c']} °C (the tool's offline demo data)."
            )
        if tool_name == "calculator" and {"expression", "result"} <= value.keys():
            return f"{value['expression']} = {value['result']}."
        if tool_name == "get_current_time" and {"iso", "timezone"} <= value.keys():
            return f"It is {value['iso']} ({value.get('weekday', '')}) in {value['timezone']}."
    return f"The {tool_name} tool returned {orjson.dumps(value).decode()}."


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


class SummaryScript:
    """The built-in ``summarizer``: an extractive summary of the conversation it is sent (the
    first sentence of each message, the tools called), deterministic and offline, for
    ``SummarizeOlder(model="scripted:summarizer")``."""

    def step(self, request: ModelRequest) -> ScriptStep:
        """One text step summarizing every message but the last (the summary request)."""
        lines = []
        for message in request.messages[:-1]:
            role = "user" if message.role == message_pb2.ROLE_USER else "assistant"
            for part in message.parts:
                kind = part.WhichOneof("kind")
                if kind == "text" and part.text.text.strip():
                    first = re.split(r"(?<=[.!?])\s", part.text.text.strip(), maxsplit=1)[0]
                    lines.append(f"{role}: {first[:120]}")
                elif kind == "tool_call":
                    lines.append(f"{role} called {part.tool_call.tool_name}")
        return ScriptStep(text=f"{OFFLINE_NOTICE} " + "; ".join(lines or ["nothing yet"]))


def overflow_error(input_tokens: int, window: int) -> ProviderError:
    """The error a model with a ``window``-token context gives a request of ``input_tokens``:
    Anthropic's wording and body (HTTP 400 ``invalid_request_error``, "prompt is too long: N
    tokens > M maximum"), so classifiers see a real overflow."""
    message = f"prompt is too long: {input_tokens} tokens > {window} maximum"
    return ProviderError(
        message,
        status=400,
        type="invalid_request_error",
        retryable=False,
        provider="scripted",
        body={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )


def output_overflow_error(input_tokens: int, max_tokens: int, window: int) -> ProviderError:
    """The error a model with a ``window``-token context gives a request of ``input_tokens`` that
    asks for ``max_tokens`` of output, when the two together do not fit: Anthropic's wording
    ("input length and `max_tokens` exceed context limit: P + C > W", HTTP 400)."""
    message = (
        f"input length and `max_tokens` exceed context limit: {input_tokens} + {max_tokens} > {window}, "
        "decrease input length or `max_tokens` and try again"
    )
    return ProviderError(
        message,
        status=400,
        type="invalid_request_error",
        retryable=False,
        provider="scripted",
        body={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )


BUILTIN_SCRIPTS = ("demo", "summarizer")
"""The scripts every :class:`ScriptedProvider` has unless the configuration overrides them."""


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
