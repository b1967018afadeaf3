"""The middleware ``bench/ttft.py``'s sidecars load (``_ttft_middlewares:EveryHookNoop``, five
times for the 5-middleware rows): every hook implemented as a no-op, so the engine runs the whole
chain, ``on_chunk`` included, on every turn."""

from __future__ import annotations

from turnwire.hooks import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ChunkContext,
    Middleware,
    StepConfig,
    StepContext,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)


class EveryHookNoop(Middleware):
    """Implements every per-turn hook, each a no-op."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """No-op."""
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """No-op."""
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """No-op."""
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """No-op."""
        return None

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """No-op."""
        return None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """No-op."""
        return None

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        """No-op."""
        return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """No-op."""
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """No-op."""
        return None
