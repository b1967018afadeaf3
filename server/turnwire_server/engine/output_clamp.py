"""A smaller output reservation after an overflow only that can fix (docs/semantics.md §9).

A provider refuses a request whose prompt plus requested output (``max_tokens``) is larger than the
model's context window: "input length and `max_tokens` exceed context limit: 64 + 8192 > 8192"
(Anthropic), "… 10527 tokens from the input messages and 105096 tokens for the completion" (vLLM).
When the reservation is at least half the request (remedy ``reduce_max_tokens``,
:func:`turnwire.error_classes.overflow_remedy`), compacting the history cannot help, but the same
step sent again with ``max_output_tokens`` lowered to window - prompt fits. The step loop does that
once per step, before anything of the step was streamed; the step's ``warnings`` say so.
"""

from __future__ import annotations

import dataclasses
import logging

from turnwire.error_classes import fitting_output_tokens, overflow_remedy, overflow_tokens
from turnwire.hooks import ChatErrorContext
from turnwire.providers import ModelRequest
from turnwire_server.engine.request import TurnRequest
from turnwire_server.hooks.chain import TurnHooks

log = logging.getLogger("turnwire.turn")


@dataclasses.dataclass(frozen=True, slots=True)
class ClampedStep:
    """The request to send again (``request``) and the warning that says why (``warning``)."""

    request: ModelRequest
    warning: str


def clamp_output(request: ModelRequest, error: BaseException) -> ClampedStep | None:
    """``request`` with ``settings.max_output_tokens`` lowered to what fits, when ``error`` is an
    overflow whose remedy is ``reduce_max_tokens`` and whose message states the prompt and the
    window (:func:`turnwire.error_classes.fitting_output_tokens`); None when it is not, or when
    the reservation sent (``max_output_tokens``, else the one the error states) is already no
    larger, so sending again cannot help. Pure: the caller decides whether to retry."""
    if overflow_remedy(error) != "reduce_max_tokens":
        return None
    fits = fitting_output_tokens(error)
    if fits is None:
        return None
    sent = request.settings.max_output_tokens
    if sent is None:
        sent = overflow_tokens(error).output  # the adapter's default, as the provider counted it
    if sent is not None and fits >= sent:
        return None
    settings = dataclasses.replace(request.settings, max_output_tokens=fits)
    was = f"{sent:,}" if sent is not None else "the provider default"
    warning = (
        f"max_output_tokens lowered from {was} to {fits:,} after a context overflow: the prompt "
        "and the requested output did not fit the model's context window"
    )
    return ClampedStep(dataclasses.replace(request, settings=settings), warning)


async def clamped_step(
    hooks: TurnHooks, turn: TurnRequest, request: ModelRequest, error: BaseException
) -> ClampedStep | None:
    """:func:`clamp_output` of ``request`` after ``error``, when the chain's ``classify_chat_error``
    also calls ``error`` a ``context_overflow`` (a user's classifier may decide otherwise); logs the
    warning. None: the step fails as it would have."""
    clamped = clamp_output(request, error)  # pure and cheap: nearly every error stops here
    if clamped is None:
        return None
    context = ChatErrorContext(
        turn.conversation_id, turn.request_id, error, "stream", messages_persisted=True
    )
    if await hooks.classify_chat_error(context) != "context_overflow":
        return None
    log.warning("turn %s: %s; sending the step again", turn.request_id, clamped.warning)
    return clamped
