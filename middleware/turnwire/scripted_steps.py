"""The scripted model's steps: what one step of a script plays (text, reasoning, tool calls,
usage, an error), the scripts that choose a step for a request, and the errors a scripted model
raises as a real one would (Anthropic's error types and context-overflow wording). Played by
:class:`turnwire.testing.ScriptedProvider` (the module docstring there says how)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from turnwire.providers import ModelRequest, ProviderError
from turnwire.scripted_parts import ScriptedFile, ScriptedSource

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "Script",
    "ScriptStep",
    "ScriptedError",
    "ScriptedToolCall",
    "ScriptedUsage",
    "StaticScript",
    "UnexpectedModelCall",
    "anthropic_error_type",
    "check_repeat_last",
    "output_overflow_error",
    "overflow_error",
]


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
    apart); the step never finishes (unless the request's ``max_output_tokens`` cuts it, turnwire.testing's
    docstring), so it takes no ``tool_calls``. ``repeat`` (only on a
    script's last step): this step also plays for every later step of the turn, which a strict
    provider otherwise refuses (see turnwire.testing's docstring).

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


def _invalid_request(message: str) -> ProviderError:
    """Anthropic's HTTP 400 ``invalid_request_error`` saying ``message``, body and all."""
    return ProviderError(
        message,
        status=400,
        type="invalid_request_error",
        retryable=False,
        provider="scripted",
        body={"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )


def overflow_error(input_tokens: int, window: int) -> ProviderError:
    """The error a model with a ``window``-token context gives a request of ``input_tokens``:
    Anthropic's wording and body (HTTP 400 ``invalid_request_error``, "prompt is too long: N
    tokens > M maximum"), so classifiers see a real overflow."""
    message = f"prompt is too long: {input_tokens} tokens > {window} maximum"
    return _invalid_request(message)


def output_overflow_error(input_tokens: int, max_tokens: int, window: int) -> ProviderError:
    """The error a model with a ``window``-token context gives a request of ``input_tokens`` that
    asks for ``max_tokens`` of output, when the two together do not fit: Anthropic's wording
    ("input length and `max_tokens` exceed context limit: P + C > W", HTTP 400)."""
    message = (
        f"input length and `max_tokens` exceed context limit: {input_tokens} + {max_tokens} > {window}, "
        "decrease input length or `max_tokens` and try again"
    )
    return _invalid_request(message)
