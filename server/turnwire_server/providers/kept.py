"""Values kept per object in the process's cache budget (issues 17 and 32 item 11).

The adapters' caches key a value by the very object it was made from (``id()``), holding the
object so its id is not reused while kept: a read-only message or wire dict stands for its content
and finding it costs no serialization (``convert.per_message_cache``, ``json_body.JsonBodies``).
Entries count bytes against one budget with every other cache of conversations
(``turnwire_server.cache_budget``), least recently used out first.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from turnwire_server.cache_budget import CACHES, CacheBudget

_K = TypeVar("_K")
_V = TypeVar("_V")


class KeptByObject(Generic[_K, _V]):
    """``{id(obj): (obj, value)}`` in a region of ``budget`` named ``name``, each entry counting
    the size its caller gives (bytes). Not thread-safe: the event loop's."""

    def __init__(self, name: str, budget: CacheBudget = CACHES) -> None:
        self.region = budget.region(name)

    def get(self, key: int) -> tuple[_K, _V] | None:
        """``(obj, value)`` kept under ``key`` (an ``id()``), now the most recently used; None."""
        return self.region.get(key)  # type: ignore[return-value]

    def put(self, obj: _K, value: _V, size_bytes: int, key: int | None = None) -> None:
        """Keep ``value`` for ``obj`` under ``key`` (default ``id(obj)``; the caller's key must be
        the id of an object ``obj`` holds), replacing what was kept there, counting ``size_bytes``."""
        self.region.put(id(obj) if key is None else key, (obj, value), size_bytes)
