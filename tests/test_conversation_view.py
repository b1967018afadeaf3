"""``GetConversation`` reads a conversation on one snapshot (``Store.conversation_view``;
docs/semantics.md §5), on SQLite and PostgreSQL alike.

The sample (CI, stop 69): the AI SDK door's reconnect (``GET /v1/ai-sdk/chat/{id}/stream``)
answered 204, no running turn, while a turn ran: GetConversation read the messages, then the
partial replies, then the turns without reply, each on its own snapshot, and the turn's first
checkpoint (its reply's first write) landed between the messages and the turns without reply.
The reply was not among the messages read, so the turn was no partial reply of the page; it had a
reply by the next read, so it was no turn without reply either. Here checkpoints race the reads
of many running turns, and every page must list each turn exactly once.
"""

from __future__ import annotations

import asyncio

from support.store_turns import started_turn

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api import chat_service
from turnwire_server.store import Store

TURNS = 40
"""Running turns whose first checkpoint races the reads (each a conversation of its own)."""


def _service(store: Store) -> chat_service.ChatService:
    return chat_service.ChatService(
        None,  # type: ignore[arg-type]  # GetConversation needs no engine
        store,
        None,  # type: ignore[arg-type]
        default_model="scripted:echo",
        max_message_bytes=1 << 20,
    )


def _listed(page: chat_service_pb2.GetConversationResponse, request_id: str) -> list[str]:
    """Where ``request_id``'s turn is listed on ``page``: ``"partial reply"`` and/or ``"turn
    without reply"``, once per listing."""
    conversation = page.conversation
    return [
        *("partial reply" for reply in conversation.partial_replies if reply.request_id == request_id),
        *("turn without reply" for turn in conversation.turns_without_reply if turn.request_id == request_id),
    ]


async def test_a_reply_checkpointed_while_the_conversation_is_read_is_listed_once(store: Store) -> None:
    """Each turn's conversation is read once before its checkpoint (a turn without reply), then
    again and again while the checkpoint is written, until a read after it (a partial reply);
    the turns race at once. Every page must list the turn exactly once."""
    service = _service(store)
    turns = [await started_turn(store, f"view-{n}", 0) for n in range(TURNS)]
    during: list[tuple[str, list[str]]] = []

    async def listed(n: int) -> list[str]:
        request = chat_service_pb2.GetConversationRequest(conversation_id=turns[n].conversation_id)
        return _listed(await service.GetConversation(request, None), turns[n].request_id)

    async def race(n: int) -> None:
        turn = turns[n]
        assert await listed(n) == ["turn without reply"], "before its reply is stored"
        reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
        reply.parts.add().text.text = "w0 "
        writing = asyncio.ensure_future(store.save_message(turn.conversation_id, reply))
        while True:
            written = writing.done()
            seen = await listed(n)
            during.append((turn.request_id, seen))
            if written:  # this read began after the reply was stored
                assert seen == ["partial reply"], "after its reply is stored"
                return

    await asyncio.gather(*(race(n) for n in range(TURNS)))
    wrong = [(request_id, seen) for request_id, seen in during if len(seen) != 1]
    assert not wrong, (
        f"{len(wrong)} of {len(during)} pages listed a running turn other than once: {wrong[:5]}"
    )


async def test_the_view_of_a_conversation_is_its_record_and_messages(store: Store) -> None:
    turn = await started_turn(store, "whole", 0)
    view = await store.conversation_view("whole", 10)
    assert view is not None
    assert view.record.conversation_id == "whole" and view.record.message_count == 1
    assert [m.id for m in view.messages] == ["whole-u0"]
    # Keyed by the reply's id whether or not it is stored yet: the API lists those on its page.
    assert {m: t.request_id for m, t in view.partial_replies.items()} == {"whole-a0": turn.request_id}
    assert [t.request_id for t in view.turns_without_reply] == [turn.request_id]
    assert view.cost is None  # no turn has ended
