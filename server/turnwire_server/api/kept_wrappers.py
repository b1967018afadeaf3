"""The handler wrappers an interceptor keeps, one per method (issue 33: a call's cost before its
handler runs).

A ``grpc.aio`` server hands an interceptor the same handler object for each call of a method
(unless an interceptor after it wraps per call, as the access interceptor does for a caller), and
the wrappers of :mod:`.rpc_observer` and :mod:`.admission` hold nothing of a call's, so each is
built once, not on every call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["KeptWrappers"]


class KeptWrappers:
    """Per method (its full name), the last handler wrapped and its wrapper: at most one entry a
    method the server implements."""

    __slots__ = ("_kept",)

    def __init__(self) -> None:
        self._kept: dict[str, tuple[Any, Any]] = {}

    def wrapper(self, method: str, handler: Any, wrap: Callable[[Any], Any]) -> Any:
        """``handler``'s wrapper: the kept one when ``handler`` is the one it was built for, else
        ``wrap(handler)``, kept in its place."""
        kept = self._kept.get(method)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = wrap(handler)
        self._kept[method] = (handler, wrapped)
        return wrapped
