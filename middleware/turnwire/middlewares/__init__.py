"""Built-in middlewares: ordinary :class:`middleware.Middleware` subclasses, configured like a user's.

List them in the config by dotted path with their options, e.g.::

    middleware:
      - path: turnwire.middlewares:HookLogger
      - path: turnwire.middlewares:ToolPolicy
        options: {deny: [delete_file]}
      - path: turnwire.middlewares:ToolResultCache
        options: {tools: [get_weather], ttl_seconds: 60}

``ErrorClassifier`` (:mod:`~turnwire.middlewares.error_classifier`, the default
``classify_chat_error``) is in every chain without being listed; list it (or a subclass) to
place, wrap or replace it.

One module per middleware: :mod:`~turnwire.middlewares.logging` (hook logger),
:mod:`~turnwire.middlewares.tool_policy` (allow / deny / read-only),
:mod:`~turnwire.middlewares.tool_cache` (tool-result cache),
:mod:`~turnwire.middlewares.compaction` (context compaction from the config file) and
:mod:`~turnwire.middlewares.examples` (the five ``beforeTurn`` examples of Think's
lifecycle-hooks page). Each module's docstring gives its options and the rule it follows.
"""

from turnwire.middlewares.compaction import ContextCompaction
from turnwire.middlewares.error_classifier import ErrorClassifier
from turnwire.middlewares.examples import (
    CheaperModelOnContinuation,
    HideReasoningOnContinuation,
    LimitActiveTools,
    SelectedFileInSystemPrompt,
    StructuredAnswer,
)
from turnwire.middlewares.logging import HookLogger
from turnwire.middlewares.tool_cache import ToolResultCache
from turnwire.middlewares.tool_policy import ToolPolicy

__all__ = [
    "CheaperModelOnContinuation",
    "ContextCompaction",
    "ErrorClassifier",
    "HideReasoningOnContinuation",
    "HookLogger",
    "LimitActiveTools",
    "SelectedFileInSystemPrompt",
    "StructuredAnswer",
    "ToolPolicy",
    "ToolResultCache",
]
