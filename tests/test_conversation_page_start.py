"""``GetConversation`` with ``start_message_id`` (server/turnwire_server/api/chat_service.py,
docs/api/rpcs.md): a page from a named message whose cost is that page, not the conversation. In
process, on a stand-in store of 2,000 messages. Before, a page read walked every message's time to
place turns without a reply even when there were none (about 3 ms at 2,000 messages), and there was
no way to start a page at a message: a reader of one reply read every page.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api import chat_service
from turnwire_server.store.records import ConversationRecord, ConversationView


class _Store:
    """The read ``GetConversation`` makes, of one conversation ``c`` of ``messages``, with no
    partial reply, no turn without a reply and no cost."""

    def __init__(self, messages: list[message_pb2.Message]) -> None:
        self.messages = tuple(messages)

    async def conversation_view(self, conversation_id: str, unreplied_limit: int) -> ConversationView:
        when = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)
        record = ConversationRecord(conversation_id, when, when, len(self.messages))
        return ConversationView(record, self.messages, {}, [], None)


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> chat_service.ChatService:
    def no_walk(*args: Any) -> list[int]:
        raise AssertionError("turn_places walked the messages with no turn to place")

    monkeypatch.setattr(chat_service, "turn_places", no_walk)
    messages = [message_pb2.Message(id=f"m{i}", role=message_pb2.ROLE_USER) for i in range(2_000)]
    return chat_service.ChatService(
        None,  # type: ignore[arg-type]
        _Store(messages),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        default_model="scripted:echo",
        max_message_bytes=1 << 20,
    )


async def _ids(service: chat_service.ChatService, **fields: Any) -> tuple[list[str], str]:
    request = chat_service_pb2.GetConversationRequest(conversation_id="c", **fields)
    page = await service.GetConversation(request, None)
    return [m.id for m in page.conversation.messages], page.next_page_token


async def test_a_page_from_a_named_message_holds_it_and_what_follows(
    service: chat_service.ChatService,
) -> None:
    ids, token = await _ids(service, start_message_id="m1990", page_size=4)
    assert ids == ["m1990", "m1991", "m1992", "m1993"]
    assert await _ids(service, page_token=token, page_size=8) == ([f"m{i}" for i in range(1994, 2000)], "")
    assert await _ids(service, start_message_id="m-none", page_size=4) == ([], "")
