"""``ErrorClassifier``: the default ``classify_chat_error`` (docs/semantics.md §3, §9).

It answers ``coarse_class(classify_error(ctx.error))`` (:mod:`turnwire.error_classes`) for the
errors it knows: every :class:`~turnwire.providers.ProviderError` (an error status, an error
inside a stream, a stream cut short, a dropped connection, a timeout), whatever provider and body
shape it came from, and the engine's model timeouts (``TimeoutError``: ``transient``). For any
other error (a hook's, a tool's, the store's) it returns ``None``, leaving it to other classifiers.
It reads the same normalized error as the adapters' "retryable" and the gRPC status, so the three
never disagree. No options.

The mapping (:data:`turnwire.error_classes.COARSE`):

- ``context_overflow`` → ``context_overflow``; ``rate_limit`` → ``rate_limit``;
- ``overloaded``, ``server_error``, ``transient`` → ``transient``;
- ``quota_or_billing``, ``max_output_tokens_invalid``, ``request_too_large``,
  ``invalid_request_transcript``, ``invalid_request``, ``authentication``, ``not_found``,
  ``invalid_response``, ``server_capacity`` → ``fatal`` (the same request fails again until
  someone changes something);
- ``unknown`` (a provider error of no known kind) → ``unknown``.

**In the chain by default.** The chain is ``[ErrorClassifier()] + the configured middlewares``
unless the configured list holds an ``ErrorClassifier`` (or a subclass) itself. Since
``classify_chat_error`` runs last to first and the first non-None answer wins (section 4), the
default, first in the list, is asked last: any classifier of yours wins for the errors it answers
and leaves the rest (``None``) to the default. To place it yourself (so that classifiers listed
after it win and those before it do not), list it::

    middleware:
      - path: my_hooks:OnlyAskedWhenTheDefaultDeclines
      - path: turnwire.middlewares:ErrorClassifier
      - path: my_hooks:AskedBeforeTheDefault

To wrap or replace it, subclass it and list the subclass (then no default is added)::

    class MyClassifier(ErrorClassifier):
        async def classify_chat_error(self, ctx):
            if isinstance(ctx.error, MyGatewayError):
                return "transient"
            return await super().classify_chat_error(ctx)  # or None: no default at all

**The fine class and the remedy** for other hooks (``on_chat_error``, a compaction hook): call
``classify_error(ctx.error)``, ``overflow_remedy(ctx.error)`` and ``overflow_tokens(ctx.error)``
from :mod:`turnwire.error_classes`: pure functions of the error's fields, a few regular-expression
searches, cheap enough to call from every hook that wants them.
"""

from __future__ import annotations

from turnwire.error_classes import classify_error, coarse_class
from turnwire.hooks import ChatErrorClassification, ChatErrorContext, Middleware
from turnwire.providers import ProviderError


class ErrorClassifier(Middleware):
    """The default classifier (see the module docstring); named ``error_classifier``."""

    name = "error_classifier"

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """The coarse class of ``ctx.error``; None for an error that is neither a ProviderError nor a
        timeout or connection error."""
        fine = classify_error(ctx.error)
        if fine == "unknown" and not isinstance(ctx.error, ProviderError):
            return None
        return coarse_class(fine)
