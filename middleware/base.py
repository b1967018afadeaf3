"""The middleware base class: one async method per lifecycle hook.

Subclass :class:`Middleware` and override only the hooks you need; the chain
calls a hook only on middlewares that override it, so an unimplemented
``on_chunk`` costs nothing per chunk. Hook order and error rules are those of
THINK-SEMANTICS.md sections 3 and 4.
"""

from __future__ import annotations

from typing import Any

from middleware.context import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseResult,
    ChunkContext,
    StepConfig,
    StepContext,
    StepResult,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)

HOOKS = (
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
    the class name). ``options`` are the ones given in the config file.
    """

    name: str = ""

    def __init__(self, **options: Any) -> None:
        self.options = options
        if not self.name:
            self.name = type(self).__name__

    async def configure_session(self) -> None:
        """Once at process start. Raising aborts start-up with a clear message."""

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

    async def on_step_finish(self, ctx: StepResult) -> None:
        """After each step, once all its tool calls are done."""

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Per model stream chunk and tool result; awaited, so keep it fast."""

    async def on_chat_response(self, result: ChatResponseResult) -> None:
        """After the assistant message is stored and the turn lock released."""

    async def on_chat_error(self, error: BaseException, ctx: ChatErrorContext) -> BaseException | str:
        """Once per turn that ends in error; return the error (or message) the client sees."""
        return error

    async def classify_chat_error(
        self, error: BaseException | str, ctx: ChatErrorContext
    ) -> ChatErrorClassification | None:
        """Map a provider error to a provider-neutral classification, or None."""
        return None


def implements(middleware: Middleware, hook: str) -> bool:
    """True when ``middleware``'s class overrides ``hook`` (so the chain must call it)."""
    return getattr(type(middleware), hook) is not getattr(Middleware, hook)
