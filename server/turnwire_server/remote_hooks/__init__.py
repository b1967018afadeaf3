"""Remote middleware: hook servers (``turnwire.v1.TurnHooksService``) in the middleware chain.

:class:`RemoteMiddleware` is one configured ``middleware: - remote: {...}`` entry
(docs/semantics.md §4); ``breaker``, ``chunks``, ``convert`` and ``metrics`` are its parts. The
engine never imports this package: it sees an ordinary ``turnwire.hooks.Middleware``.
"""

from turnwire_server.remote_hooks.middleware import RemoteHookUnavailable, RemoteMiddleware

__all__ = ["RemoteHookUnavailable", "RemoteMiddleware"]
