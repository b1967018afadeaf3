"""Turnwire's extension API: what you import to write middlewares (lifecycle hooks), tools and tests.

Flat public modules, one concern each:

- :mod:`turnwire.hooks`: the :class:`~turnwire.hooks.Middleware` base class and
  one context, config or decision type per hook.
- :mod:`turnwire.tools`: the ``@tool`` decorator, the :class:`~turnwire.tools.Tool`
  interface, :class:`~turnwire.tools.ToolExecution` and :class:`~turnwire.tools.ToolError`.
- :mod:`turnwire.types`: usage, finish reasons, model stream chunks, tool choice,
  model settings.
- :mod:`turnwire.providers`: the model-provider interface.
- :mod:`turnwire.subagents`: sub-agents in the hook contract (:class:`~turnwire.subagents.SubagentCall`)
  and :func:`~turnwire.subagents.call_subagent`, a sub-agent run from a hook or a tool.
- :mod:`turnwire.errors`: :class:`~turnwire.errors.DomainError`, the base of every error a client
  may see (its ``ErrorReason``, status, retryability, message and details).
- :mod:`turnwire.testing`: the scripted model (the offline default and test double).
- :mod:`turnwire.middlewares`: the built-in middlewares (logger, tool policy,
  tool-result cache, the seed's examples).

The client is the separate package ``turnwire_client``; the sidecar runtime
(``turnwire_server``) is not an API. See ``docs/architecture.md``.
"""
