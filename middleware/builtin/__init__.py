"""Built-in middlewares: ordinary :class:`middleware.Middleware` subclasses, configured like a user's.

List them in the config by dotted path with their options, e.g.::

    middleware:
      - path: middleware.builtin:HookLogger
      - path: middleware.builtin:ToolPolicy
        options: {deny: [delete_file]}
      - path: middleware.builtin:ToolResultCache
        options: {tools: [get_weather], ttl_seconds: 60}

One module per middleware: :mod:`~middleware.builtin.logging` (hook logger),
:mod:`~middleware.builtin.tool_policy` (allow / deny / read-only),
:mod:`~middleware.builtin.tool_cache` (tool-result cache) and
:mod:`~middleware.builtin.examples` (the five ``beforeTurn`` examples of Think's
lifecycle-hooks page). Each module's docstring gives its options and the rule it follows.
"""

from middleware.builtin.examples import (
    CheaperModelOnContinuation,
    HideReasoningOnContinuation,
    LimitActiveTools,
    SelectedFileInSystemPrompt,
    StructuredAnswer,
)
from middleware.builtin.logging import HookLogger
from middleware.builtin.tool_cache import ToolResultCache
from middleware.builtin.tool_policy import ToolPolicy

__all__ = [
    "CheaperModelOnContinuation",
    "HideReasoningOnContinuation",
    "HookLogger",
    "LimitActiveTools",
    "SelectedFileInSystemPrompt",
    "StructuredAnswer",
    "ToolPolicy",
    "ToolResultCache",
]
