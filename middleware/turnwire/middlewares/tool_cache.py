"""``ToolResultCache``: answer a repeated tool call with the earlier result instead of running it.

Options (config ``options:``):

``tools`` (none)
    The tool names to cache; omitted: every server-executed tool.
``max_entries`` (``256``)
    At most this many results are kept; the least recently used goes first.
``ttl_seconds`` (``300``)
    A result is reused for this many seconds after it was stored; ``null``: no expiry.

Rule (Think's ``beforeToolCall`` cache example and docs/semantics.md §3):
a call whose tool and input (canonical JSON: sorted keys, no spaces) match a
stored result ends with ``substitute(output)``: the tool does not run, the model
sees the stored output, ``after_tool_call`` gets ``success=True``, and a
streaming tool sends one preliminary result then the final one. Results are
stored from ``after_tool_call``, only for calls this cache saw in
``before_tool_call`` and let through, and only when they succeeded: errors,
blocks and substitutes are never stored. The cache is per process and shared
by every conversation; keep it to tools whose result depends only on the input.

Where to list it: last. ``before_tool_call`` runs first to last and the first
block or substitute ends the chain (section 4): a middleware listed *before* the
cache that blocks a call keeps the call away from the cache, while one listed
*after* it could block or rewrite a call the cache already let through, and
``after_tool_call`` cannot yet tell that result from a real one (when the
engine reports ``ToolCallResultContext.outcome``, the cache stores only
``"executed"`` results wherever it is listed).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from turnwire.hooks import Middleware, ToolCallContext, ToolCallDecision, ToolCallResultContext

_MAX_PENDING = 4096
"""Calls let through and not yet finished that are tracked at most (oldest dropped first)."""

_Key = tuple[str, bytes]


def canonical_input(input: Mapping[str, Any]) -> bytes:
    """The cache key's input part: JSON with sorted keys. Raises :class:`TypeError` for non-JSON."""
    return orjson.dumps(input, option=orjson.OPT_SORT_KEYS)


class ToolResultCache(Middleware):
    """An LRU, TTL-bounded cache of successful tool results (see the module docstring).

    ``hits`` and ``misses`` count lookups of cached tools. ``clock`` (seconds,
    monotonic) is for tests. Raises :class:`ValueError` at construction for a
    ``max_entries`` below 1 or a ``ttl_seconds`` that is not positive.
    """

    def __init__(
        self,
        *,
        tools: Sequence[str] | None = None,
        max_entries: int = 256,
        ttl_seconds: float | None = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """See the module docstring for the options."""
        super().__init__(tools=tools, max_entries=max_entries, ttl_seconds=ttl_seconds)
        if isinstance(tools, str):
            raise ValueError(f"tools: must be a list of tool names, got {tools!r}")
        if max_entries < 1:
            raise ValueError(f"max_entries: must be at least 1, got {max_entries}")
        if ttl_seconds is not None and ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds: must be positive (or null for no expiry), got {ttl_seconds}")
        self.tools = None if tools is None else frozenset(tools)
        self.max_entries = max_entries
        self.ttl_seconds = ttl_seconds
        self.clock = clock
        self.hits = 0
        self.misses = 0
        # key -> (expiry on ``clock`` or None, the output as JSON bytes: every hit decodes a fresh copy)
        self._entries: OrderedDict[_Key, tuple[float | None, bytes]] = OrderedDict()
        # (request_id, tool_call_id) -> key, for calls let through and not finished yet
        self._pending: OrderedDict[tuple[str, str], _Key] = OrderedDict()

    def __len__(self) -> int:
        """Stored results, expired ones included until they are looked up."""
        return len(self._entries)

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """``substitute`` with the stored output on a fresh hit; otherwise remember the call, ``None``."""
        if self.tools is not None and ctx.tool_name not in self.tools:
            return None
        try:
            key = (ctx.tool_name, canonical_input(ctx.input))
        except TypeError:
            return None
        entry = self._entries.get(key)
        if entry is not None:
            expires, payload = entry
            if expires is None or self.clock() < expires:
                self._entries.move_to_end(key)
                self.hits += 1
                return ToolCallDecision.substitute(orjson.loads(payload))
            del self._entries[key]
        self.misses += 1
        self._pending[(ctx.request_id, ctx.tool_call_id)] = key
        if len(self._pending) > _MAX_PENDING:
            self._pending.popitem(last=False)
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """Store the output of a call this cache let through, when it ran and succeeded."""
        key = self._pending.pop((ctx.request_id, ctx.tool_call_id), None)
        if key is None or not ctx.success:
            return
        # Forward-compatible: once the engine reports how the result came about, trust it.
        outcome = ctx.outcome
        if outcome is not None and outcome != "executed":
            return
        try:
            payload = orjson.dumps(ctx.output)
        except TypeError:
            return
        expires = None if self.ttl_seconds is None else self.clock() + self.ttl_seconds
        self._entries[key] = (expires, payload)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
