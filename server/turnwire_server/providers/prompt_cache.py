"""Prompt caching the sidecar asks for (issue 37; docs/providers.md, "Prompt caching").

**Anthropic** caches a request's prefix up to each ``cache_control`` breakpoint (tools, then
system, then messages), at most four per request; a later request reading the same prefix pays
the cache-read price (a tenth of the input price) instead of the input price
(https://docs.claude.com/en/docs/build-with-claude/prompt-caching). :func:`place_breakpoints`
puts them where a turn's requests share the most: the end of the conversation so far (the next
step and the next turn start with it), the system prompt, and the tools (what stays when the
history is compacted), in that order of priority, after any the request's provider options
placed already. A prefix shorter than the model's minimum (1,024 tokens and up) is simply not
cached: the API ignores the marker.

**OpenAI** routes requests with the same ``prompt_cache_key`` to the same cache
(https://platform.openai.com/docs/guides/prompt-caching): the adapters send the request's
``cache_key``, one per conversation and opaque (a hash: the conversation's id and tenant never
reach the provider; ``turnwire_server.engine.ids.conversation_cache_key``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Final, Literal, TypeAlias

__all__ = ["CacheTtl", "cache_writes", "place_breakpoints"]

CacheTtl: TypeAlias = Literal["5m", "1h"]
"""How long Anthropic keeps a cached prefix after its last use; ``1h`` writes cost twice the
input price instead of 1.25 times."""

MAX_BREAKPOINTS: Final = 4
"""Anthropic's limit of ``cache_control`` markers in one request."""

_NOT_CACHEABLE: Final = frozenset({"thinking", "redacted_thinking"})
"""Blocks that cannot carry ``cache_control`` (they are cached with the turn around them)."""


def place_breakpoints(kwargs: MutableMapping[str, Any], ttl: CacheTtl) -> int:
    """Add ``cache_control`` breakpoints to the ``messages.create`` arguments ``kwargs`` (module
    docstring: where), up to :data:`MAX_BREAKPOINTS` in all; returns how many it added. Replaces
    what it marks (the last message, its content list and block; the system prompt; the last
    tool), never changes a dict it did not make: converted messages are shared between requests."""
    marker: dict[str, Any] = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
    free = MAX_BREAKPOINTS - _placed(kwargs)
    added = 0
    # A top-level cache_control (provider options) marks the last block itself: not twice.
    if free > added and not kwargs.get("cache_control") and _mark_last_message(kwargs, marker):
        added += 1
    system = kwargs.get("system")
    if free > added and isinstance(system, str) and system:
        kwargs["system"] = [{"type": "text", "text": system, "cache_control": marker}]
        added += 1
    tools = kwargs.get("tools")
    if free > added and tools and "cache_control" not in tools[-1]:
        kwargs["tools"] = [*tools[:-1], {**tools[-1], "cache_control": marker}]
        added += 1
    return added


def cache_writes(ttl: CacheTtl | None, options: Mapping[str, Any]) -> CacheTtl | None:
    """The longest lifetime a request may write the cache at (a write costs more than uncached
    input, an hour's most: docs/cost.md, "Budgets"): ``1h`` when a marker the request's own
    provider ``options`` place asks for an hour, or the breakpoints the sidecar places do
    (``ttl``: theirs, None: it places none); else ``5m`` when either places one; else None."""
    markers = list(_markers(options))
    if ttl == "1h" or any(marker.get("ttl") == "1h" for marker in markers):
        return "1h"
    return "5m" if ttl is not None or markers else None


def _markers(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every ``cache_control`` marker in provider options ``value`` (at the top, on tools, on
    system blocks: anywhere)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "cache_control" and isinstance(item, Mapping):
                yield item
            else:
                yield from _markers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _markers(item)


def _mark_last_message(kwargs: MutableMapping[str, Any], marker: dict[str, Any]) -> bool:
    messages = kwargs.get("messages")
    if not messages:
        return False
    last = messages[-1]
    content = last["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    for index in range(len(blocks) - 1, -1, -1):
        block = blocks[index]
        if block.get("type") in _NOT_CACHEABLE or (block.get("type") == "text" and not block.get("text")):
            continue
        if "cache_control" in block:
            return False  # the request's own marker is there already
        blocks[index] = {**block, "cache_control": marker}
        kwargs["messages"] = [*messages[:-1], {**last, "content": blocks}]
        return True
    return False


def _placed(kwargs: Mapping[str, Any]) -> int:
    """The breakpoints the request has already (provider options: a top-level ``cache_control``,
    marked tools or system blocks)."""
    count = 1 if kwargs.get("cache_control") else 0
    for key in ("tools", "system"):
        value = kwargs.get(key)
        if isinstance(value, list):
            count += sum(1 for item in value if isinstance(item, Mapping) and "cache_control" in item)
    return count
