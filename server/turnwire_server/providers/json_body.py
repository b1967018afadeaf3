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

import json
from collections.abc import Mapping, Sequence
from typing import Any

from turnwire_server.cache_budget import CACHES, CacheBudget
from turnwire_server.providers.kept import KeptByObject

JSON_OVERHEAD_BYTES = 220
"""RSS a kept encoding costs beyond its JSON's length and the budget's own entry: the bytes
object's header, the tuple holding it, malloc's rounding (``bench/cache_entry_sizes.py``: 1,670
bytes of RSS per 150-byte text message for both adapters' item and list encodings, 17,500 per 4
KiB one; these constants count 1,700 and 17,500); a joined list adds 8 bytes per item it holds."""

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(value: Any) -> bytes:
    """``value`` as the SDKs send JSON. Raises ValueError for a non-finite float, TypeError for a
    value JSON has no form for."""
    return _ENCODER.encode(value).encode()


class JsonBodies:
    """Encodes request bodies, keeping the JSON of their ``messages`` lists by object.

    Two kinds are kept in ``budget`` (regions ``json items`` and ``json lists``, least recently
    used first out with the other caches of conversations, issue 32 item 11), each counting its
    JSON's length plus :data:`JSON_OVERHEAD_BYTES` (the objects they hold are mostly the
    conversions' kept ones, shared, counted there): each item's
    encoding, and each list's joined items, by its first item, so the next request that starts
    with the same items (the turn before's, only appended to) joins only its new ones to them (the
    kept list is compared with its start in one C-level pass; an item equal in content counts as
    the same). Keeping the objects keeps their ``id()`` from being reused. Items must never change
    once a body was encoded with them: the adapters' wire messages are immutable by contract
    (kept turns are replaced, never changed; see the conversions' docstrings). Not thread-safe:
    the event loop's.
    """

    def __init__(self, *, budget: CacheBudget = CACHES) -> None:
        self._items: KeptByObject[object, bytes] = KeptByObject("json items", budget)
        self._lists: KeptByObject[list[Any], bytes] = KeptByObject("json lists", budget)

    def encode(self, body: Mapping[str, Any], list_key: str = "messages") -> bytes:
        """``body`` as JSON bytes, its keys in order. Raises as :func:`dumps`."""
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
        return (
            (head + b"," if before else head)
            + dumps(list_key)
            + b":["
            + self._joined(body[list_key])
            + (b"]," + tail if after else b"]}")
        )

    def _joined(self, items: Sequence[Any]) -> bytes:
        """The items' encodings joined with commas."""
        if not items:
            return b""
        items = list(items)
        first = id(items[0])
        kept = self._lists.get(first)
        done, joined = 0, b""
        if kept is not None:
            held, held_joined = kept
            if len(held) <= len(items) and items[: len(held)] == held:
                done, joined = len(held), held_joined
        new = [self._item(item) for item in items[done:]]
        if new:
            joined = b",".join([joined, *new]) if done else b",".join(new)
            size = len(joined) + 8 * len(items) + JSON_OVERHEAD_BYTES
            self._lists.put(items, joined, size, key=first)  # items[0] has id ``first``
        return joined

    def _item(self, item: Any) -> bytes:
        kept = self._items.get(id(item))
        if kept is not None:
            return kept[1]
        encoded = dumps(item)
        self._items.put(item, encoded, len(encoded) + JSON_OVERHEAD_BYTES)
        return encoded
