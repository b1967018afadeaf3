"""One byte budget for the caches of conversations (issue 32, item 11).

The budget evicts least recently used entries across every cache by bytes; the real caches (the
store's decoded messages, the adapters' conversions, prefix states and JSON bodies, the open-call
searches) count what they keep there; and a request built from cached entries is the request
built with nothing cached.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, ENTRY_OVERHEAD_BYTES, CacheBudget
from turnwire_server.engine import pending_calls
from turnwire_server.providers import anthropic_request, openai_chat_request, streaming
from turnwire_server.providers.convert import PrefixStates, per_message_cache
from turnwire_server.providers.json_body import JsonBodies
from turnwire_server.store.core.message_cache import MESSAGE_OVERHEAD_BYTES, DecodedMessages


def _rows(conversation: str, texts: list[str]) -> list[tuple[Any, ...]]:
    """What the history statement returns for a conversation of user messages ``texts``."""
    rows = []
    for index, text in enumerate(texts):
        part = message_pb2.Part()
        part.text.text = text
        rows.append(
            (
                100,
                0,
                index + 1,
                f"{conversation}-m{index}",
                index + 1,
                message_pb2.ROLE_USER,
                None,
                0,
                None,
                part.SerializeToString(),
                0,
            )
        )
    return rows


def test_the_budget_evicts_the_least_recently_used_entry_of_any_cache() -> None:
    budget = CacheBudget(3 * (100 + ENTRY_OVERHEAD_BYTES))
    store, adapter = budget.region("store"), budget.region("adapter")
    store.put("a", "A", 100)
    adapter.put("b", "B", 100)
    store.put("c", "C", 100)
    assert store.get("a") == "A"  # now the most recently used: b is the oldest
    adapter.put("d", "D", 100)
    assert adapter.get("b") is None
    assert (store.get("a"), store.get("c"), adapter.get("d")) == ("A", "C", "D")
    assert budget.counted_bytes == 3 * (100 + ENTRY_OVERHEAD_BYTES) == budget.limit_bytes
    assert store.counted_bytes == 2 * (100 + ENTRY_OVERHEAD_BYTES)
    assert adapter.counted_bytes == 100 + ENTRY_OVERHEAD_BYTES


def test_the_budget_counts_bytes_not_entries() -> None:
    budget = CacheBudget(10_000)
    region = budget.region("store")
    for key in range(20):
        region.put(key, key, 100)
    assert len(budget) == 20  # 20 small entries fit
    region.put("big", "big", 6_000)  # one large one pushes out the oldest small ones
    assert region.get("big") == "big"
    assert budget.counted_bytes <= 10_000
    assert region.get(0) is None and region.get(19) == 19
    region.put("huge", "huge", 20_000)  # larger than the whole budget: not kept, nothing evicted for it
    assert region.get("huge") is None and region.get("big") == "big"
    region.put(19, "replaced", 10)  # replacing an entry counts its new size only
    assert budget.counted_bytes == sum(
        size + ENTRY_OVERHEAD_BYTES for size in [6_000, 10] + [100] * (len(budget) - 2)
    )
    budget.resize(0)
    assert len(budget) == 0 and budget.counted_bytes == 0 == region.counted_bytes


def test_the_store_caches_conversations_by_their_bytes() -> None:
    """Today's cache held 200,000 messages whatever their size: here a conversation of 4 KiB
    messages weighs about three times one of 150-byte messages (with their objects' overhead),
    and the held total never passes the budget."""
    small, large = "s" * 150, "L" * 4096
    per_small = 150 + MESSAGE_OVERHEAD_BYTES
    budget = CacheBudget(100 * 10 * per_small)  # room for about 100 conversations of 10 small messages
    decoded = DecodedMessages("sqlite", region=budget.region("decoded"))

    def read(conversation: str, text: str) -> None:
        read = decoded.read(conversation)
        assert len(decoded.messages(read, _rows(conversation, [text] * 10))) == 10

    for number in range(80):
        read(f"small-{number}", small)
    assert all(decoded.read(f"small-{n}").base is not None for n in range(80))
    for number in range(40):
        read(f"large-{number}", large)
        assert budget.counted_bytes <= budget.limit_bytes
    held_small = sum(decoded.read(f"small-{n}").base is not None for n in range(80))
    held_large = sum(decoded.read(f"large-{n}").base is not None for n in range(40))
    assert held_small == 0  # older: out first
    assert 25 <= held_large < 40  # about 33 fit: 3 small conversations' room each
    assert budget.counted_bytes <= budget.limit_bytes


def test_every_cache_of_conversations_counts_in_the_one_process_budget() -> None:
    """The store's decoded messages, the open-call searches, both adapters' conversions and
    prefix states and the JSON bodies: a turn's entries all land in ``CACHES``; a smaller limit
    evicts across all of them."""
    before = {region.name for (region, _) in CACHES._entries}
    decoded = DecodedMessages("sqlite")
    history = tuple(decoded.messages(decoded.read("everyone"), _rows("everyone", ["hello", "there"])))
    pending_calls._SEARCHES.search("everyone", history)
    _, turns = anthropic_request.convert_messages(list(history), [])
    chat = openai_chat_request.convert_messages("system", list(history), [])
    streaming._BODIES.encode({"model": "m", "messages": turns})
    streaming._BODIES.encode({"model": "m", "messages": chat})
    names = {region.name for (region, _) in CACHES._entries} - before
    assert {
        "sqlite decoded messages",
        "open-call searches",
        "anthropic conversions",
        "anthropic prefix states",
        "openai chat conversions",
        "openai chat prefix states",
        "json items",
        "json lists",
    } <= names | before
    assert CACHES.counted_bytes <= CACHES.limit_bytes


@pytest.fixture
def tiny_budget() -> Iterator[CacheBudget]:
    """The adapters' caches on their own small budgets (restored afterwards)."""
    saved = (
        anthropic_request._converted,
        anthropic_request._prefixes,
        openai_chat_request._converted,
        openai_chat_request._prefixes,
    )
    budget = CacheBudget(6_000)
    anthropic_request._converted = per_message_cache(anthropic_request._convert_message, "a", budget)
    anthropic_request._prefixes = PrefixStates("a", budget=budget)
    openai_chat_request._converted = per_message_cache(openai_chat_request._convert_message, "o", budget)
    openai_chat_request._prefixes = PrefixStates("o", budget=budget)
    try:
        yield budget
    finally:
        (
            anthropic_request._converted,
            anthropic_request._prefixes,
            openai_chat_request._converted,
            openai_chat_request._prefixes,
        ) = saved


def _conversation(number: int, turns: int) -> list[message_pb2.Message]:
    messages = []
    for index in range(turns):
        for role, text in (
            (message_pb2.ROLE_USER, f"q{number}.{index} " + "x" * 300),
            (message_pb2.ROLE_ASSISTANT, f"a{number}.{index}"),
        ):
            message = message_pb2.Message(id=f"c{number}-{index}-{role}", role=role)
            if role == message_pb2.ROLE_ASSISTANT:
                message.parts.add().step_start.SetInParent()
            message.parts.add().text.text = text
            messages.append(message)
    return messages


def test_requests_are_the_same_whether_their_entries_were_kept_or_evicted(tiny_budget: CacheBudget) -> None:
    """Conversations interleaved turn by turn on a budget that holds only a few entries: every
    body (both adapters, JSON bytes included) equals the one built with nothing kept."""
    nothing = CacheBudget(0)
    uncached_bodies, bodies = JsonBodies(budget=nothing), JsonBodies(budget=tiny_budget)
    conversations = {number: _conversation(number, 6) for number in range(4)}
    evicted = False
    for turn in range(1, 7):
        for number, messages in conversations.items():
            history = messages[: 2 * turn]
            _, turns = anthropic_request.convert_messages(history, [])
            chat = openai_chat_request.convert_messages("be brief", history, [])
            kept = (bodies.encode({"messages": turns}), bodies.encode({"messages": chat}))
            evicted = evicted or tiny_budget.counted_bytes > tiny_budget.limit_bytes // 2
            assert tiny_budget.counted_bytes <= tiny_budget.limit_bytes
            saved_prefixes = (anthropic_request._prefixes, openai_chat_request._prefixes)
            saved_converted = (anthropic_request._converted, openai_chat_request._converted)
            anthropic_request._prefixes = PrefixStates("none", budget=nothing)
            openai_chat_request._prefixes = PrefixStates("none", budget=nothing)
            anthropic_request._converted = anthropic_request._convert_message
            openai_chat_request._converted = openai_chat_request._convert_message
            try:
                copies = [copy.deepcopy(m) for m in history]  # other objects: nothing can hit
                _, fresh_turns = anthropic_request.convert_messages(copies, [])
                fresh_chat = openai_chat_request.convert_messages("be brief", copies, [])
            finally:
                anthropic_request._prefixes, openai_chat_request._prefixes = saved_prefixes
                anthropic_request._converted, openai_chat_request._converted = saved_converted
            fresh = (
                uncached_bodies.encode({"messages": fresh_turns}),
                uncached_bodies.encode({"messages": fresh_chat}),
            )
            assert kept == fresh, (number, turn)
    assert evicted
