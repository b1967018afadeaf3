"""Remote middleware: hook servers (``turnwire.v1.TurnHooksService``) in the middleware chain.

:class:`RemoteMiddleware` is one configured ``middleware: - remote: {...}`` entry
(docs/semantics.md §4; its settings in ``settings.py``); ``breaker``, ``chunks``, ``convert`` and
``metrics`` are its parts. The engine never imports this package: it sees an ordinary
``turnwire.hooks.Middleware``. The names below are imported on first use, so that reading the
configuration (which declares this package's entry with ``settings.py``) does not load gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnwire_server.remote_hooks.middleware import RemoteHookUnavailable, RemoteMiddleware

__all__ = ["RemoteHookUnavailable", "RemoteMiddleware"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from turnwire_server.remote_hooks import middleware

    return getattr(middleware, name)
