"""The history is shared from turn to turn, never copied whole (issue 17): the store hands out its
kept message objects and the provider adapters keep conversions by object, so nothing may change
a stored message in place. Hooks see read-only views (server/hooks/readonly.py): a middleware
that edits ``ctx.messages`` in place changes its own turn's request only (as before), never the
store or the next turn; one that changes the list fails. The store stays the truth: a second
writer on the database (another replica) appending is seen by the next turn, and the request converted
from the shared objects equals one converted afresh."""

from __future__ import annotations

import copy
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.engine_harness import CONV, EngineFactory, end_of, text_of

from turnwire.hooks import Middleware, StepConfig, StepContext, TurnConfig, TurnContext
from turnwire.providers import ModelRequest
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.cache_budget import CacheBudget
from turnwire_server.hooks.readonly import MessagesView
from turnwire_server.providers import anthropic_request, openai_chat_request
from turnwire_server.providers.convert import PrefixStates


def _user(message_id: str, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def _converted(messages: list[message_pb2.Message]) -> tuple[Any, Any]:
    """The Anthropic turns and Chat messages for ``messages`` as a request converts them."""
    anthropic = anthropic_request.convert_messages(messages, [])
    chat = openai_chat_request.convert_messages("", messages, [])
    return anthropic, chat


def _afresh(messages: list[message_pb2.Message]) -> tuple[Any, Any]:
    """The same, from copies, with caches that keep nothing."""
    fresh = [copy.deepcopy(m) for m in messages]
    saved = (
        anthropic_request._converted,
        anthropic_request._prefixes,
        openai_chat_request._converted,
        openai_chat_request._prefixes,
    )
    anthropic_request._converted = anthropic_request._convert_message
    anthropic_request._prefixes = PrefixStates("off", budget=CacheBudget(0))
    openai_chat_request._converted = openai_chat_request._convert_message
    openai_chat_request._prefixes = PrefixStates("off", budget=CacheBudget(0))
    try:
        return _converted(fresh)
    finally:
        (
            anthropic_request._converted,
            anthropic_request._prefixes,
            openai_chat_request._converted,
            openai_chat_request._prefixes,
        ) = saved


class EditsInPlace(Middleware):
    """On the first turn only, edits the messages it is shown in place (the old way)."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = 0

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        self.turns += 1
        if self.turns == 1:
            ctx.messages[0].parts[0].text.text = "edited by before_turn"
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        if self.turns == 1:
            ctx.messages[-1].parts.add().text.text = " (and by before_step)"
        return None


async def test_a_middleware_editing_messages_in_place_changes_neither_the_store_nor_the_next_turn(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(middlewares=[EditsInPlace()])
    converted: list[tuple[Any, Any]] = []

    async def convert(request: ModelRequest) -> None:
        # What an adapter builds from the very objects the engine sends, checked against copies.
        assert _converted(list(request.messages)) == _afresh(list(request.messages))
        converted.append(_converted(list(request.messages)))

    h.provider.before_stream = convert
    assert end_of(await h.run("first question")).status == event_pb2.TURN_STATUS_COMPLETED
    # Its own turn's request has the edits (as when hooks got copies of their own) ...
    [first] = h.provider.requests
    assert text_of(first.messages[0]) == "edited by before_turn (and by before_step)"
    # ... the store has none of them ...
    stored = await h.store.load_messages(CONV)
    assert [text_of(m) for m in stored] == ["first question", "hello"]
    assert end_of(await h.run("second question")).status == event_pb2.TURN_STATUS_COMPLETED
    # ... and the next turn sends the stored history.
    second = h.provider.requests[1]
    assert [text_of(m) for m in second.messages] == ["first question", "hello", "second question"]
    assert len(converted) == 2


class ChangesTheList(Middleware):
    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        ctx.messages.append(_user("x", "sneaked in"))  # type: ignore[attr-defined]
        return None


async def test_a_middleware_changing_the_list_in_place_fails_the_turn_clearly(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(middlewares=[ChangesTheList()])
    end = end_of(await h.run("question"))
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert "append" in end.error.message and "ChangesTheList" in end.error.message
    assert h.provider.calls == 0
    assert [text_of(m) for m in await h.store.load_messages(CONV)] == ["question"]


def test_the_view_copies_on_read_and_settles_only_changed_copies() -> None:
    messages = (_user("a", "one"), _user("b", "two"), _user("c", "three"))
    view = MessagesView(messages)
    assert len(view) == 3 and view.settled() is messages  # nothing read: nothing copied
    assert view[1] is not messages[1] and view[1] == messages[1] and view[1] is view[1]
    with pytest.raises(TypeError):
        view[0] = _user("z", "replaced")  # type: ignore[index]
    assert view.settled() is messages  # read, not changed
    view[-1].parts[0].text.text = "three, edited"
    settled = view.settled()
    assert settled[:2] == list(messages[:2]) and settled[0] is messages[0]
    assert settled[2].parts[0].text.text == "three, edited"
    assert messages[2].parts[0].text.text == "three"
    # What a hook gives back: its unchanged copies are the originals again; new ones stay.
    extra = _user("d", "new")
    restored = view.restore([view[0], *view[1:2], extra])
    assert restored[0] is messages[0] and restored[1] is messages[1] and restored[2] is extra


async def test_another_writers_append_is_seen_by_the_next_turn(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    h = await make_engine(db="shared.db")
    assert end_of(await h.run("first")).status == event_pb2.TURN_STATUS_COMPLETED
    # Another writer on the same database (a replica of a PostgreSQL deployment, an operator):
    # rows written beside this store, which holds the history read by the first turn.
    part = message_pb2.Part()
    part.text.text = "written elsewhere"
    with sqlite3.connect(tmp_path / "shared.db") as conn:
        conn.execute(
            "INSERT INTO messages (conversation_id, id, seq, role, create_time_nanos) VALUES"
            " (?, ?, (SELECT MAX(seq) + 1 FROM messages WHERE conversation_id = ?), ?, 0)",
            (CONV, "elsewhere", CONV, message_pb2.ROLE_USER),
        )
        conn.execute(
            "INSERT INTO parts (conversation_id, message_id, idx, data) VALUES (?, ?, 0, ?)",
            (CONV, "elsewhere", part.SerializeToString()),
        )
    assert end_of(await h.run("second")).status == event_pb2.TURN_STATUS_COMPLETED
    second = h.provider.requests[1]
    assert [text_of(m) for m in second.messages] == ["first", "hello", "written elsewhere", "second"]
