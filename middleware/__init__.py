"""Turnwire's lifecycle-hook contract and the chain that runs it.

Write a middleware by subclassing :class:`Middleware` and overriding the
hooks you need; list it in the config by dotted path. See THINK-SEMANTICS.md
sections 3 and 4 for the order and the rules.
"""

from middleware.base import HOOKS, Middleware
from middleware.chain import HookError, HookTimeline, MiddlewareChain
from middleware.context import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseResult,
    ChunkContext,
    ErrorStage,
    StepConfig,
    StepContext,
    StepResult,
    StopWhen,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
    TurnTimeout,
)

__all__ = [
    "HOOKS",
    "ChatErrorClassification",
    "ChatErrorContext",
    "ChatResponseResult",
    "ChunkContext",
    "ErrorStage",
    "HookError",
    "HookTimeline",
    "Middleware",
    "MiddlewareChain",
    "StepConfig",
    "StepContext",
    "StepResult",
    "StopWhen",
    "ToolCallContext",
    "ToolCallDecision",
    "ToolCallResultContext",
    "TurnConfig",
    "TurnContext",
    "TurnTimeout",
]
