"""Falling back to other models when a step's model refuses it (issue 37; docs/providers.md,
"Fallback across providers").

A step whose model fails before anything of the step was streamed, with an error the chain's
``classify_chat_error`` calls ``rate_limit`` or ``transient`` (a 429, 529 overloaded, 5xx, a
dropped connection: never an invalid request, an authentication failure or a context overflow),
runs again on the next model of the failed one's fallback list (``fallback.models``), across
APIs too: the request is provider-neutral, each adapter converts the history by the same rules
as for any history (docs/providers.md, "The history each API gets"). A failure after output
streamed falls back only with ``after_output: restart``: the step's output so far is dropped and
the step runs again from its start on the fallback, the client told by an ``AttemptStart``
(**Decision**: by default never, since the client saw part of an answer another model would not
continue; a step that began a tool call is never restarted: its call may be the client's to answer).

Each provider entry has a circuit breaker, per process: ``breaker_failures`` such failures in a
row open it for ``breaker_open_seconds``, during which steps go straight to the next model of
their list that is not open, without a call (a model with no closed alternative is called
anyway); the first success closes it. (A breaker is a counter and a deadline per entry; a
library's, built around wrapping calls, would not fit a failure decided after the call.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from turnwire.hooks import ChatErrorContext
from turnwire.providers import ProviderError
from turnwire_server.config_section import ConfigSection
from turnwire_server.engine import metrics
from turnwire_server.hooks.chain import TurnHooks

__all__ = ["FALLBACK_CLASSES", "FallbackSettings", "Fallbacks"]

log = logging.getLogger("turnwire.fallback")

FALLBACK_CLASSES = frozenset({"rate_limit", "transient"})
"""The ``classify_chat_error`` answers that send a step to a fallback model."""


class FallbackSettings(ConfigSection):
    """The ``fallback:`` section. ``models``: a model id (``provider:model``) → the model ids to
    try after it, in order. ``after_output``: whether a step that failed after some of it streamed
    falls back too (``restart``: its output so far dropped, the step run again). ``breaker_failures``
    fallback-worthy failures in a row open a provider entry's circuit breaker for
    ``breaker_open_seconds``."""

    models: dict[str, list[str]] = Field(
        default_factory=dict,
        description="model id -> the model ids tried in order when it fails before any output "
        "with a rate limit or a transient error",
    )
    after_output: Literal["never", "restart"] = Field(
        "never",
        description="a failure after some of the step streamed: never falls back, or restart runs the "
        "step again on the fallback from its start (the client is told by an AttemptStart)",
    )
    breaker_failures: int = Field(5, ge=1, description="failures in a row that open a provider's breaker")
    breaker_open_seconds: float = Field(30.0, gt=0, description="how long an open breaker skips its provider")

    @field_validator("models")
    @classmethod
    def _lists(cls, models: dict[str, list[str]]) -> dict[str, list[str]]:
        for model, fallbacks in models.items():
            for model_id in (model, *fallbacks):
                if ":" not in model_id.strip(":"):
                    raise ValueError(f"{model_id!r} is not a model id: write provider:model")
            if model in fallbacks:
                raise ValueError(f"{model} lists itself as its own fallback")
            if len(set(fallbacks)) < len(fallbacks):
                raise ValueError(f"{model} lists a fallback twice")
        return models


@dataclass(slots=True)
class _Breaker:
    failures: int = 0
    open_until: float = 0.0


class Fallbacks:
    """The fallback lists and the breakers of one process (held by the engine's settings, like
    its price book). ``clock`` gives monotonic seconds."""

    def __init__(
        self, settings: FallbackSettings | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings or FallbackSettings()
        self._clock = clock
        self._breakers: dict[str, _Breaker] = {}

    @property
    def restarts(self) -> bool:
        """Whether a step that failed after some of it streamed may fall back (``after_output``)."""
        return self.settings.after_output == "restart"

    def first(self, model_id: str) -> str:
        """The model a step of ``model_id`` starts on: ``model_id``, unless its provider's breaker
        is open and one of its fallbacks' is not (then the first such)."""
        if not self._open(model_id):
            return model_id
        return next((m for m in self.settings.models.get(model_id, ()) if not self._open(m)), model_id)

    async def after_failure(
        self, hooks: TurnHooks, context: ChatErrorContext, model_id: str, tried: list[str]
    ) -> str | None:
        """The model to run the step on after ``model_id`` (the last of ``tried``, the step's models
        so far, its configured one first) failed with ``context.error`` (the caller decides whether
        the step may fall back after what it streamed); None:
        the step fails. Counts the failure against ``model_id``'s breaker when it is one that falls
        back. Raises what ``classify_chat_error`` raises."""
        if not isinstance(context.error, ProviderError):
            return None
        untried = [m for m in self.settings.models.get(tried[0], ()) if m not in tried]
        if not untried:
            return None
        classification = await hooks.classify_chat_error(context)
        if classification not in FALLBACK_CLASSES:
            return None
        self._failed(model_id)
        chosen = next((m for m in untried if not self._open(m)), untried[0])
        metrics.FALLBACKS.labels(model_id.partition(":")[0], chosen.partition(":")[0], classification).inc()
        error = context.error
        # What the provider answered (never its message: that is the provider's text), so the log
        # says why a fallback ran: "(transient: HTTP 529 overloaded_error)".
        status = f"HTTP {error.status}" if error.status else ""
        answer = " ".join(part for part in (status, error.type) if part)
        log.warning(
            "turn %s: %s failed (%s%s): the step runs on %s",
            context.request_id,
            model_id,
            classification,
            f": {answer}" if answer else "",
            chosen,
        )
        return chosen

    def succeeded(self, model_id: str) -> None:
        """A step of ``model_id`` finished: its provider's breaker closes."""
        breaker = self._breakers.get(model_id.partition(":")[0])
        if breaker is not None:
            breaker.failures, breaker.open_until = 0, 0.0

    def _failed(self, model_id: str) -> None:
        entry = model_id.partition(":")[0]
        breaker = self._breakers.setdefault(entry, _Breaker())
        breaker.failures += 1
        if breaker.failures >= self.settings.breaker_failures:
            breaker.failures = 0
            breaker.open_until = self._clock() + self.settings.breaker_open_seconds
            metrics.BREAKER_OPENS.labels(entry).inc()
            log.warning(
                "provider %s: %d failures in a row; its steps go to their fallbacks for %g s",
                entry,
                self.settings.breaker_failures,
                self.settings.breaker_open_seconds,
            )

    def _open(self, model_id: str) -> bool:
        breaker = self._breakers.get(model_id.partition(":")[0])
        return breaker is not None and breaker.open_until > self._clock()
