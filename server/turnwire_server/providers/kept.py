"""Values kept per object, least recently used first out past a size bound (issue 17).

The adapters' caches key a value by the very object it was made from (``id()``), holding the
object so its id is not reused while kept: a read-only message or wire dict stands for its content
and finding it costs no serialization (``convert.per_message_cache``, ``json_body.JsonBodies``).
"""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")


class KeptByObject(Generic[_K, _V]):
    """``{id(obj): (obj, value, size)}`` with the sizes summed, least recently used dropped first
    once they pass ``max_size`` (a unit the caller picks: bytes). Not thread-safe: the event loop's."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._kept: collections.OrderedDict[int, tuple[_K, _V, int]] = collections.OrderedDict()
        self.size = 0

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, key: int) -> tuple[_K, _V] | None:
        """``(obj, value)`` kept under ``key`` (an ``id()``), now the most recently used; None."""
        entry = self._kept.get(key)
        if entry is None:
            return None
        self._kept.move_to_end(key)
        return entry[0], entry[1]

    def put(self, obj: _K, value: _V, size: int, key: int | None = None) -> None:
        """Keep ``value`` for ``obj`` under ``key`` (default ``id(obj)``; the caller's key must be
        the id of an object ``obj`` holds), replacing what was kept there."""
        key = id(obj) if key is None else key
        previous = self._kept.pop(key, None)
        if previous is not None:
            self.size -= previous[2]
        self._kept[key] = (obj, value, size)
        self.size += size
        while self.size > self.max_size:
            _, (_, _, dropped) = self._kept.popitem(last=False)
            self.size -= dropped
