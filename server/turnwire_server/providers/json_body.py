"""Request bodies as JSON bytes, a conversation's messages encoded once each (issue 17).

A step's request carries the whole transcript. Encoded by the SDK, every turn pays a deep copy of
it (``anthropic``'s request preparation) and its JSON encoding: at 1,000 prior turns 43 % of the
sidecar's CPU per request (py-spy, bench/ttft.py). The adapters' wire messages are shared objects
that are never changed once a request was built from them (``convert.PrefixStates``,
``per_message_cache``): their JSON is kept by object here, so a turn encodes only its new messages
and joins the rest. The bytes are what the SDKs' own encoder gives (``openapi_dumps``: UTF-8,
``ensure_ascii=False``, compact separators, ``allow_nan=False``).
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    """``value`` as the SDKs send JSON. Raises ValueError for a non-finite float, TypeError for a
    value JSON has no form for."""
    return _ENCODER.encode(value).encode()


class JsonBodies:
    """Encodes request bodies, keeping the JSON of each item of their ``messages`` list by object.

    An item is kept with its encoding (so its ``id()`` is not reused while kept), least recently
    used first out once the kept encodings pass ``max_bytes``. Items must never change once a body
    was encoded with them: the adapters' wire messages are immutable by contract (kept turns are
    replaced, never changed; see the conversions' docstrings). Not thread-safe: the event loop's.
    """

    def __init__(self, *, max_bytes: int = 32 << 20) -> None:
        self.max_bytes = max_bytes
        self._kept: collections.OrderedDict[int, tuple[object, bytes]] = collections.OrderedDict()
        self._size = 0

    def encode(self, body: Mapping[str, Any], list_key: str = "messages") -> bytes:
        """``body`` as JSON bytes, its keys in order. Raises as :func:`dumps`."""
        items: Sequence[Any] = body[list_key]
        before: dict[str, Any] = {}
        after: dict[str, Any] = {}
        side = before
        for key, value in body.items():
            if key == list_key:
                side = after
            else:
                side[key] = value
        head = dumps(before)[:-1]  # b'{…' without its '}'
        tail = dumps(after)[1:]  # b'…}' without its '{'
        joined = b",".join([self._item(item) for item in items])
        return (
            (head + b"," if before else head)
            + dumps(list_key)
            + b":["
            + joined
            + (b"]," + tail if after else b"]}")
        )

    def _item(self, item: Any) -> bytes:
        key = id(item)
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept[1]
        encoded = dumps(item)  # kept[0] holds the item: a kept id is never another object's
        self._kept[key] = (item, encoded)
        self._size += len(encoded)
        while self._size > self.max_bytes:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._size -= len(dropped)
        return encoded
