"""Every store backend (SQLite and PostgreSQL, through the ``store`` fixture): round trips, ordering,
transactions, migrations, page tokens, the turn lock. Backend-specific tests live in
``test_store_sqlite.py`` and ``test_store_postgres.py``."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import re
from typing import Any

import pytest
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.page_tokens import CRAFTED_TOKENS, ISSUE_9_TOKENS, TOKENS_OF_ANY_KIND, v3
from support.stores import StoreBackend
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import (
    InvalidPageToken,
    MessageIdConflict,
    Store,
    StoreCorrupted,
    StoreError,
    TurnNotFound,
    TurnRecord,
)
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.page_tokens import decode_page_token, encode_page_token
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.records import CompactionRecord, ConversationView

T0 = dt.datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=dt.UTC)


def _turn(
    request_id: str = "req-1",
    conversation_id: str = "conv-1",
    *,
    state: Any = "running",
    assistant_message_id: str = "asst-1",
) -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=assistant_message_id,
        continuation=False,
        model="openai/gpt-test",
        state=state,
        start_time=T0,
    )


def _text(
    message_id: str, text: str, role: message_pb2.Role.ValueType = message_pb2.ROLE_USER
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)
    message.parts.add().text.text = text
    return message


def _struct(**fields: Any) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(fields)
    return value


def _full_message() -> message_pb2.Message:
    """An assistant message using every Part kind and every field of each."""
    m = message_pb2.Message(id="asst-1", role=message_pb2.ROLE_ASSISTANT)
    m.create_time.seconds = 1_741_064_767
    m.create_time.nanos = 123_456_789  # sub-microsecond precision must survive
    m.metadata.update({"tenant": "acme", "n": 3, "nested": {"list": [1, "two", None, True]}})
    m.parts.add().step_start.SetInParent()
    reasoning = m.parts.add().reasoning
    reasoning.text = "Let me think."
    reasoning.signature = b"\x00\xffsig\x80"
    reasoning.redacted = True
    reasoning.provider_metadata.update({"anthropic": {"cache": "ephemeral"}})
    m.parts.add().text.text = "Héllo ✓ wörld"
    m.parts.add().text.text = ""  # empty text is still a part
    for state in message_pb2.ToolCallState.values():
        call = m.parts.add().tool_call
        call.tool_call_id = f"call-{state}"
        call.tool_name = "search"
        call.input.update({"q": "weather", "limit": 5, "opts": {"exact": False}})
        call.state = state
        call.output.struct_value.update({"hits": [{"title": "t", "score": 0.5}]})
        call.error_text = "boom" if state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR else ""
        call.preliminary = state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        call.raw_input = '{"q": "weather", broken'
    scalar_output = m.parts.add().tool_call
    scalar_output.tool_call_id = "call-scalar"
    scalar_output.output.string_value = "plain string result"
    inline = m.parts.add().file
    inline.media_type = "image/png"
    inline.filename = "pixel.png"
    inline.data = bytes(range(256))
    by_url = m.parts.add().file
    by_url.media_type = "application/pdf"
    by_url.url = "https://example.com/doc.pdf"
    source = m.parts.add().source
    source.source_id = "src-1"
    source.url = "https://example.com"
    source.title = "Example"
    source.media_type = "text/html"
    source.filename = "index.html"
    data = m.parts.add().data
    data.type = "weather"
    data.id = "w1"
    data.data.list_value.values.add().number_value = 21.5
    return m


# ----------------------------------------------------------------------------- round trips


async def test_every_part_kind_round_trips_losslessly(store: Store, store_backend: StoreBackend) -> None:
    user = _text("user-1", "hi")
    user.metadata.SetInParent()  # present but empty must stay present
    full = _full_message()
    await store.start_turn(_turn(), [user])
    await store.finish_turn(_turn(state="completed"), full)

    loaded = await store.load_messages("conv-1")

    assert [m.id for m in loaded] == ["user-1", "asst-1"]
    assert loaded[1] == full
    assert loaded[1].SerializeToString(deterministic=True) == full.SerializeToString(deterministic=True)
    assert loaded[1].create_time.nanos == 123_456_789
    assert loaded[1].parts[1].reasoning.signature == b"\x00\xffsig\x80"
    assert loaded[1].parts[-2].source.filename == "index.html"
    assert loaded[0] == user
    assert loaded[0].HasField("metadata")
    assert not loaded[0].HasField("create_time")
    kinds = store_backend.sql(
        "SELECT kind FROM parts WHERE message_id = 'asst-1' ORDER BY idx",
    )
    assert {k for (k,) in kinds} == {
        "step_start",
        "reasoning",
        "text",
        "tool_call",
        "file",
        "source",
        "data",
    }


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(0, 0), (-1, 999_999_999), (-62_135_596_800, 0), (253_402_300_799, 999_999_999), (5, 1)],
)
async def test_create_time_round_trips_exactly(store: Store, seconds: int, nanos: int) -> None:
    message = _text("m", "x")
    message.create_time.seconds = seconds
    message.create_time.nanos = nanos
    await store.save_message("c", message)
    [loaded] = await store.load_messages("c")
    assert loaded.HasField("create_time")
    assert (loaded.create_time.seconds, loaded.create_time.nanos) == (seconds, nanos)


async def test_unknown_role_number_round_trips(store: Store) -> None:
    message = _text("m", "x")
    message.role = 42  # type: ignore[assignment]  # proto3 enums are open
    await store.save_message("c", message)
    [loaded] = await store.load_messages("c")
    assert loaded.role == 42


async def test_invalid_arguments_raise_value_error(store: Store) -> None:
    with pytest.raises(ValueError, match="empty"):
        await store.save_message("c", _text("", "x"))
    bad = _text("m", "x")
    bad.create_time.nanos = -1
    with pytest.raises(ValueError, match="Timestamp"):
        await store.save_message("c", bad)
    naive = TurnRecord(
        request_id="r",
        conversation_id="c",
        assistant_message_id="a",
        continuation=False,
        model="m",
        state="running",
        start_time=dt.datetime(2025, 1, 1),  # naive on purpose
    )
    with pytest.raises(ValueError, match="timezone-aware"):
        await store.start_turn(naive, [])
    with pytest.raises(ValueError, match="state"):
        await store.start_turn(_turn(state="bogus"), [])
    assert await store.get_conversation("c") is None


async def test_data_survives_close_and_reopen(store_backend: StoreBackend) -> None:
    first = store_backend.new_store()
    await first.open()
    await first.start_turn(_turn(), [_text("user-1", "hi")])
    await first.finish_turn(_turn(state="completed"), _full_message())
    before = await first.get_conversation("conv-1")
    await first.close()

    second = store_backend.new_store()
    await second.open()
    try:
        assert await second.get_conversation("conv-1") == before
        loaded = await second.load_messages("conv-1")
        assert list(loaded) == [_text("user-1", "hi"), _full_message()]
        assert await second.running_turns() == []
    finally:
        await second.close()


# ----------------------------------------------------------------------------- writes


async def test_start_turn_is_committed_when_it_returns(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn(), [_text("user-1", "hi")])
    # A separate connection sees it: the transaction has committed.
    assert store_backend.sql("SELECT id, seq FROM messages") == [("user-1", 1)]
    assert store_backend.sql("SELECT request_id, state FROM turns") == [("req-1", "running")]
    conversation = await store.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.message_count == 1
    assert conversation.create_time.tzinfo is dt.UTC
    assert conversation.create_time <= conversation.update_time


async def test_messages_keep_append_order(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "1"), _text("u2", "2")])
    await store.save_message("conv-1", _text("a1", "3", message_pb2.ROLE_ASSISTANT))
    await store.finish_turn(_turn("r1", state="completed"), None)
    await store.start_turn(_turn("r2"), [_text("u3", "4")])
    await store.finish_turn(_turn("r2", state="completed"), _text("a2", "5", message_pb2.ROLE_ASSISTANT))

    loaded = await store.load_messages("conv-1")
    assert [m.id for m in loaded] == ["u1", "u2", "a1", "u3", "a2"]
    assert [m.parts[0].text.text for m in loaded] == ["1", "2", "3", "4", "5"]
    conversation = await store.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.message_count == 5
    assert await store.load_messages("nope") == ()


async def test_start_turn_conflict_stores_nothing(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "first")])
    before = await store.get_conversation("conv-1")

    with pytest.raises(MessageIdConflict) as info:
        await store.start_turn(_turn("r2"), [_text("u2", "new"), _text("u1", "dup")])
    assert (info.value.conversation_id, info.value.message_id) == ("conv-1", "u1")
    assert isinstance(info.value, StoreError)

    with pytest.raises(MessageIdConflict):  # repeated within the call
        await store.start_turn(_turn("r3", "conv-2"), [_text("x", "a"), _text("x", "b")])

    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]
    assert (await store.load_messages("conv-1"))[0].parts[0].text.text == "first"
    assert await store.get_conversation("conv-1") == before
    assert await store.get_conversation("conv-2") is None
    assert [t.request_id for t in await store.running_turns()] == ["r1"]
    assert store_backend.sql("SELECT COUNT(*) FROM parts") == [(1,)]


async def test_duplicate_request_id_is_a_store_error(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "1")])
    with pytest.raises(StoreError, match="already exists"):
        await store.start_turn(_turn("r1"), [_text("u2", "2")])
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]


async def test_save_message_replace_keeps_position(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn(), [_text("u1", "question")])
    reply = message_pb2.Message(id="a1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().step_start.SetInParent()
    reply.parts.add().text.text = "Hel"
    reply.parts.add().text.text = "tail to drop later"
    await store.save_message("conv-1", reply)
    await store.save_message("conv-1", _text("u2", "later message"))

    replaced = message_pb2.Message(id="a1", role=message_pb2.ROLE_ASSISTANT)
    replaced.parts.add().step_start.SetInParent()
    replaced.parts.add().text.text = "Hello, world"
    replaced.metadata.update({"final": True})
    await store.save_message("conv-1", replaced)

    loaded = await store.load_messages("conv-1")
    assert [m.id for m in loaded] == ["u1", "a1", "u2"]
    assert loaded[1] == replaced
    assert store_backend.sql("SELECT COUNT(*) FROM parts WHERE message_id = 'a1'") == [(2,)]
    conversation = await store.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.message_count == 3


async def test_save_message_bumps_update_time(store: Store) -> None:
    await store.start_turn(_turn(), [_text("u1", "q")])
    first = await store.get_conversation("conv-1")
    await store.save_message("conv-1", _text("a1", "r", message_pb2.ROLE_ASSISTANT))
    second = await store.get_conversation("conv-1")
    assert first is not None and second is not None
    assert second.update_time > first.update_time
    assert second.create_time == first.create_time


async def test_zero_part_messages_are_never_stored(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn(), [_text("u1", "q")])
    empty = message_pb2.Message(id="asst-1", role=message_pb2.ROLE_ASSISTANT)

    await store.save_message("conv-1", empty)  # a checkpoint before the first part: no-op
    with pytest.raises(ValueError, match="no parts"):
        await store.start_turn(_turn("r2"), [empty])
    await store.finish_turn(_turn(state="aborted"), empty)

    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]
    assert store_backend.sql("SELECT state FROM turns WHERE request_id = 'req-1'") == [("aborted",)]


async def test_finish_turn_records_end_state(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn(), [_text("u1", "q")])
    end = T0 + dt.timedelta(seconds=3, microseconds=7)
    finished = TurnRecord(
        request_id="req-1",
        conversation_id="conv-1",
        assistant_message_id="asst-1",
        continuation=False,
        model="openai/gpt-test",
        state="error",
        start_time=T0,
        end_time=end,
        error=b"\x08\x0e\x12\x04down",
        recovery_count=2,
    )
    await store.finish_turn(finished, _text("asst-1", "partial", message_pb2.ROLE_ASSISTANT))
    assert await store.running_turns() == []
    assert store_backend.sql(
        "SELECT state, end_time, error, recovery_count FROM turns WHERE request_id = ?",
        ("req-1",),
    ) == [
        (
            "error",
            (end - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1),
            b"\x08\x0e\x12\x04down",
            2,
        )
    ]
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1", "asst-1"]


async def _view(store: Store, conversation_id: str, unreplied_limit: int = 100) -> ConversationView:
    view = await store.conversation_view(conversation_id, unreplied_limit)
    assert view is not None, conversation_id
    return view


async def test_partial_replies_are_those_whose_latest_turn_did_not_complete(store: Store) -> None:
    reply = message_pb2.ROLE_ASSISTANT

    async def turn(request_id: str, message_id: str, state: Any, seconds: int) -> None:
        record = dataclasses.replace(
            _turn(request_id, assistant_message_id=message_id),
            start_time=T0 + dt.timedelta(seconds=seconds),
        )
        await store.start_turn(record, [_text(f"u-{request_id}", "q")] if seconds % 2 == 0 else [])
        if state != "running":
            ended = dataclasses.replace(
                record, state=state, end_time=record.start_time + dt.timedelta(seconds=1)
            )
            await store.finish_turn(ended, _text(message_id, "a", reply))

    assert await store.conversation_view("conv-1", 100) is None
    await turn("r-done", "a-done", "completed", 0)
    await turn("r-cut", "a-cut", "aborted", 2)
    await turn("r-failed", "a-failed", "error", 4)
    await turn("r-resumed", "a-cut-then-done", "aborted", 6)
    await turn("r-continued", "a-cut-then-done", "completed", 7)  # a continuation completed it
    await turn("r-live", "a-live", "running", 8)
    partial = (await _view(store, "conv-1")).partial_replies
    assert {message_id: (turn.request_id, turn.state) for message_id, turn in partial.items()} == {
        "a-cut": ("r-cut", "aborted"),
        "a-failed": ("r-failed", "error"),
        "a-live": ("r-live", "running"),
    }
    assert await store.conversation_view("no-such-conversation", 100) is None


async def test_turns_without_reply_are_unfinished_turns_whose_reply_does_not_exist(store: Store) -> None:
    """docs/semantics.md §5: a turn cancelled before any reply was stored, one still waiting for
    its first output and one rolled back are listed (oldest first, the ``limit`` most recent);
    a turn with a stored reply (partial or complete) and a skipped turn are not."""
    reply = message_pb2.ROLE_ASSISTANT

    async def turn(
        request_id: str, state: Any, seconds: int, *, stored: bool, error: bytes | None = None
    ) -> None:
        record = dataclasses.replace(
            _turn(request_id, assistant_message_id=f"a-{request_id}"),
            start_time=T0 + dt.timedelta(seconds=seconds),
        )
        await store.start_turn(record, [_text(f"u-{request_id}", "q")])
        if state != "running":
            ended = dataclasses.replace(record, state=state, end_time=record.start_time, error=error)
            await store.finish_turn(ended, _text(f"a-{request_id}", "a", reply) if stored else None)

    assert await store.conversation_view("conv-1", 100) is None
    await turn("r-done", "completed", 0, stored=True)
    await turn("r-cut", "aborted", 1, stored=True)  # a partial reply: in partial_replies instead
    await turn("r-early", "aborted", 2, stored=False)
    await turn("r-failed", "error", 3, stored=False, error=b"\x08\x0e\x12\x04down")
    await turn("r-skipped", "skipped", 4, stored=False)
    await turn("r-rolled", "running", 5, stored=False)
    rolled = dataclasses.replace(
        _turn("r-rolled", assistant_message_id="a-r-rolled"),
        state="aborted",
        start_time=T0 + dt.timedelta(seconds=5),
        end_time=T0 + dt.timedelta(seconds=5),
        error=b"\x08\x0a",
    )
    await store.roll_back_turn(rolled, ["u-r-rolled"])
    await turn("r-waiting", "running", 6, stored=False)

    turns = (await _view(store, "conv-1")).turns_without_reply
    assert [(t.request_id, t.state, t.start_time, t.error) for t in turns] == [
        ("r-early", "aborted", T0 + dt.timedelta(seconds=2), None),
        ("r-failed", "error", T0 + dt.timedelta(seconds=3), b"\x08\x0e\x12\x04down"),
        ("r-rolled", "aborted", T0 + dt.timedelta(seconds=5), b"\x08\x0a"),
        ("r-waiting", "running", T0 + dt.timedelta(seconds=6), None),
    ]
    latest = (await _view(store, "conv-1", 2)).turns_without_reply
    assert [t.request_id for t in latest] == ["r-rolled", "r-waiting"]
    with pytest.raises(ValueError, match="limit"):
        await store.conversation_view("conv-1", 0)


async def test_finish_unknown_turn_raises_and_stores_nothing(store: Store) -> None:
    await store.start_turn(_turn(), [_text("u1", "q")])
    with pytest.raises(StoreError, match="no turn"):
        await store.finish_turn(_turn("missing", state="completed"), _text("a9", "x"))
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]


async def test_running_turns_after_a_crash(store_backend: StoreBackend) -> None:
    crashed = store_backend.new_store()
    await crashed.open()
    await crashed.start_turn(_turn("r1", "c1"), [_text("u1", "q1")])
    await crashed.start_turn(_turn("r2", "c2"), [_text("u2", "q2")])
    await crashed.save_message("c2", _text("asst-1", "half a rep", message_pb2.ROLE_ASSISTANT))
    await crashed.finish_turn(_turn("r1", "c1", state="completed"), _text("a1", "done"))
    # "Crash": no finish_turn for r2; the process goes away (its file lock with it).
    await crashed.close()
    recovered = store_backend.new_store()
    await recovered.open()
    try:
        running = await recovered.running_turns()
        assert running == [_turn("r2", "c2")]
        assert running[0].start_time == T0
        assert running[0].start_time.tzinfo is dt.UTC
        checkpoint = (await recovered.load_messages("c2"))[-1]
        assert checkpoint.parts[0].text.text == "half a rep"
    finally:
        await recovered.close()


async def test_failed_write_does_not_affect_others_in_the_same_batch(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_text("u1", "q")])
    results = await asyncio.gather(
        store.save_message("conv-1", _text("a1", "before")),
        store.start_turn(_turn("r2"), [_text("u1", "conflict")]),
        store.save_message("conv-1", _text("a2", "after")),
        return_exceptions=True,
    )
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], MessageIdConflict)
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1", "a1", "a2"]
    assert [t.request_id for t in await store.running_turns()] == ["r1"]


# ----------------------------------------------------------------------------- group commit


async def test_a_failing_write_in_a_group_commit_undoes_only_itself(store: Store) -> None:
    """Checkpoints and turn ends share commits (PostgreSQL: one pipelined transaction, applied
    again write by write when one fails)."""
    await store.start_turn(_turn("r1"), [_text("u1", "q")])
    unknown = _turn("nope", state="completed")
    results = await asyncio.gather(
        store.save_message("conv-1", _text("a1", "before")),
        store.finish_turn(unknown, _text("a9", "never")),
        store.append_events("conv-1", "r1", [(1, b"e1"), (2, b"e2")], ended=False),
        store.save_message("conv-1", _text("a2", "after")),
        return_exceptions=True,
    )
    assert [type(r) for r in results] == [type(None), TurnNotFound, type(None), type(None)]
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1", "a1", "a2"]
    assert await store.load_events("r1", 0) == [b"e1", b"e2"]


# ----------------------------------------------------------------------------- reads


async def test_list_conversations_pages_by_update_time(store: Store) -> None:
    for i in range(7):
        await store.start_turn(_turn(f"r{i}", f"conv-{i}"), [_text("u", str(i))])
    await store.save_message("conv-2", _text("a", "bump"))  # conv-2 is now the newest

    seen: list[str] = []
    token = ""
    tokens: list[str] = []
    for expected in (3, 3, 1):
        page, next_token = await store.list_conversations(3, token)
        assert len(page) == expected
        # The same token yields the same page and the same next token.
        assert await store.list_conversations(3, token) == (page, next_token)
        seen += [c.conversation_id for c in page]
        token = next_token
        tokens.append(token)
    assert tokens[-1] == ""
    assert all(tokens[:-1])
    assert seen == ["conv-2", "conv-6", "conv-5", "conv-4", "conv-3", "conv-1", "conv-0"]

    everything, last = await store.list_conversations(100, "")
    assert last == ""
    assert [c.conversation_id for c in everything] == seen
    assert [c.update_time for c in everything] == sorted((c.update_time for c in everything), reverse=True)


async def test_list_conversations_filters_by_id_prefix(store: Store) -> None:
    # The API's tenant scope (api/tenancy.py): keys "<tenant>/<id>". Prefix characters that LIKE
    # would treat as wildcards ("_", "%") and ids that only share a shorter prefix must not match.
    ids = ["a_1/x", "a_1/y", "aX1/z", "a_10/w", "plain", "%/v"]
    for index, conversation_id in enumerate(ids):
        await store.start_turn(_turn(f"r{index}", conversation_id), [_text("u", "x")])
    page, token = await store.list_conversations(1, "", id_prefix="a_1/")
    assert [c.conversation_id for c in page] == ["a_1/y"] and token
    rest, last = await store.list_conversations(1, token, id_prefix="a_1/")
    assert [c.conversation_id for c in rest] == ["a_1/x"] and last == ""
    for other in ("aX1/", ""):  # another tenant's listing, or the whole store's, refuses the token
        with pytest.raises(InvalidPageToken):
            await store.list_conversations(1, token, id_prefix=other)
    assert [c.conversation_id for c in (await store.list_conversations(10, "", id_prefix="%/"))[0]] == ["%/v"]
    assert len((await store.list_conversations(10, ""))[0]) == len(ids)


async def test_list_conversations_empty_and_exact_fit(store: Store) -> None:
    assert await store.list_conversations(10, "") == ([], "")
    for i in range(3):
        await store.start_turn(_turn(f"r{i}", f"c{i}"), [_text("u", "x")])
    page, token = await store.list_conversations(3, "")
    assert len(page) == 3
    assert token == ""
    with pytest.raises(ValueError):
        await store.list_conversations(0, "")


@pytest.mark.parametrize(
    "token",
    [
        "garbage!",
        "bm90IGpzb24",  # "not json"
        "W10",  # []
        "eyJ2IjoxLCJ1IjoiMSIsImlkIjoiYyJ9",  # {"v":1,"u":"1","id":"c"}
        "eyJ2IjoyLCJ1IjoxLCJpZCI6ImMifQ",  # {"v":2,"u":1,"id":"c"}
        "_-_-",
        "a",
        *CRAFTED_TOKENS.values(),
    ],
    ids=lambda token: next((name for name, t in CRAFTED_TOKENS.items() if t == token), token),
)
async def test_invalid_page_token(store: Store, token: str) -> None:
    await store.start_turn(_turn(), [_text("u", "x")])  # something to list after
    with pytest.raises(InvalidPageToken):
        await store.list_conversations(3, token)


@pytest.mark.parametrize("name", ISSUE_9_TOKENS)
async def test_issue_9_crafted_page_tokens_are_invalid_page_tokens(store: Store, name: str) -> None:
    # Once OverflowError, RecursionError and a StoreError (UNAVAILABLE, "retry"): now all
    # InvalidPageToken, which is not only a StoreError but exactly the error for a bad token.
    await store.start_turn(_turn(), [_text("u", "x")])
    with pytest.raises(InvalidPageToken) as raised:
        await store.list_conversations(3, ISSUE_9_TOKENS[name])
    assert type(raised.value) is InvalidPageToken
    assert await store.list_conversations(3, "") == ([await store.get_conversation("conv-1")], "")


@given(
    update_us=st.integers(min_value=-62_135_596_800_000_000, max_value=253_402_300_799_999_999),
    conversation_id=st.text(min_size=1).filter(lambda t: not any("\ud800" <= c <= "\udfff" for c in t)),
)
def test_page_tokens_round_trip_and_are_url_safe(update_us: int, conversation_id: str) -> None:
    token = encode_page_token(update_us, conversation_id)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert decode_page_token(token) == (update_us, conversation_id)
    # In a tenant's listing the token holds the id without the tenant's prefix, and only that
    # listing takes it.
    scoped = encode_page_token(update_us, f"tenant-a/{conversation_id}", "tenant-a/")
    assert decode_page_token(scoped, "tenant-a/") == (update_us, f"tenant-a/{conversation_id}")
    assert scoped != token and b"tenant-a" not in base64.urlsafe_b64decode(scoped + "==")
    for other in ("", "tenant-b/"):
        with pytest.raises(InvalidPageToken):
            decode_page_token(scoped, other)


async def test_a_well_formed_forged_token_only_moves_where_the_listing_starts(store: Store) -> None:
    for i in range(4):
        await store.start_turn(_turn(f"r{i}", f"conv-{i}"), [_text("u", str(i))])
    everything, _ = await store.list_conversations(10, "")
    third = everything[2]
    forged = v3(to_us(third.update_time, "update_time"), third.conversation_id.encode())
    assert await store.list_conversations(10, forged) == (everything[3:], "")


def _stored_rows(backend: StoreBackend) -> dict[str, list[Any]]:
    tables = ("conversations", "messages", "parts", "turns", "schema_migrations")
    return {table: backend.sql(f"SELECT * FROM {table} ORDER BY 1, 2") for table in tables}


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(token=TOKENS_OF_ANY_KIND)
async def test_any_page_token_lists_or_is_refused_and_changes_nothing(
    store: Store, token: str, store_backend: StoreBackend
) -> None:
    if await store.get_conversation("conv-0") is None:  # the store is shared by every example
        for i in range(3):
            await store.start_turn(_turn(f"r{i}", f"conv-{i}"), [_text("u", str(i))])
    before = _stored_rows(store_backend)
    stored = {c.conversation_id for c in (await store.list_conversations(10, ""))[0]}
    try:
        records, next_token = await store.list_conversations(2, token)
    except InvalidPageToken:
        pass
    else:  # a well-formed token, forged or not: some stored conversations, and a token or ""
        assert {r.conversation_id for r in records} <= stored
        if next_token:  # and the store takes the token it issued
            await store.list_conversations(2, next_token)
    assert _stored_rows(store_backend) == before


# ----------------------------------------------------------------------------- migrations


async def test_migrations_run_once_and_are_recorded(store_backend: StoreBackend) -> None:
    for _ in range(3):
        s = store_backend.new_store()
        await s.open()
        await s.close()
    rows = store_backend.sql("SELECT version, name, applied_at FROM schema_migrations ORDER BY version")
    assert [(v, n) for v, n, _ in rows] == [
        (1, "0001_init"),
        (2, "0002_durable_turns"),
        (3, "0003_turn_leases"),
        (4, "0004_compactions"),
        (5, "0005_queue_order"),
        (6, "0006_history_versions"),
        (7, "0007_lease_epochs"),
        (8, "0008_turn_costs"),
        (9, "0009_budgets"),
        (10, "0010_turn_timelines"),
        (11, "0011_conversation_forks"),
        (12, "0012_schedules"),
        (13, "0013_webhooks"),
        (14, "0014_writer_versions"),
        (15, "0015_lean_reservations"),
        (16, "0016_budget_periods"),
    ]
    assert isinstance(rows[0][2], int)
    assert {
        "conversations",
        "messages",
        "parts",
        "turns",
        "schema_migrations",
        "turn_streams",
        "turn_events",
        "submissions",
        "compactions",
        "schedules",
    } <= store_backend.tables()


async def test_a_newer_schema_that_only_expands_is_served_by_the_previous_build(
    store_backend: StoreBackend,
) -> None:
    """Rolling upgrades (expand-then-contract): a migration marked readable by this build's
    schema lets this build run on the newer database; one that is not marked does not."""
    s = store_backend.new_store()
    await s.open()
    await s.close()
    (known,) = store_backend.sql("SELECT MAX(version) FROM schema_migrations")[0]
    store_backend.sql(
        "INSERT INTO schema_migrations (version, name, applied_at, readable_by) VALUES (?, ?, 0, ?)",
        (known + 1, f"{known + 1:04d}_expand", known),
    )
    older = store_backend.new_store()
    await older.open()  # the newer, expand-only schema is served
    await older.close()
    store_backend.sql(
        "INSERT INTO schema_migrations (version, name, applied_at, readable_by) VALUES (?, ?, 0, NULL)",
        (known + 2, f"{known + 2:04d}_contract"),
    )
    with pytest.raises(StoreError, match=rf"migration\(s\) \[{known + 2}\] change what this build reads"):
        await store_backend.new_store().open()


async def test_newer_schema_is_refused(store_backend: StoreBackend) -> None:
    s = store_backend.new_store()
    await s.open()
    await s.close()
    store_backend.sql(
        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, '0999_future', 0)"
    )
    with pytest.raises(StoreError, match="newer"):
        await store_backend.new_store().open()


async def test_concurrent_saves_land_in_call_order(store: Store) -> None:
    await store.start_turn(_turn(), [_text("u0", "q")])
    await asyncio.gather(*(store.save_message("conv-1", _text(f"m{i}", str(i))) for i in range(50)))
    # Same id saved repeatedly: the last call wins.
    await asyncio.gather(*(store.save_message("conv-1", _text("m0", f"v{i}")) for i in range(30)))
    loaded = await store.load_messages("conv-1")
    assert [m.id for m in loaded] == ["u0"] + [f"m{i}" for i in range(50)]
    assert loaded[1].parts[0].text.text == "v29"
    conversation = await store.get_conversation("conv-1")
    assert conversation is not None
    assert conversation.message_count == 51


# ----------------------------------------------------------------------------- turn lock


async def test_turn_lock_is_fifo_and_forgets_idle_conversations(
    store: Store, store_backend: StoreBackend
) -> None:
    """One holder at a time, first in, first out; nothing is left once every holder is gone
    (SQLite: the in-process lock's entry; PostgreSQL: the queue's tickets)."""
    order: list[str] = []
    a_holds = asyncio.Event()
    release_a = asyncio.Event()

    async def turn(name: str, hold: asyncio.Event | None = None) -> None:
        async with store.turn_lock("conv-1", request_id=name, owner="me"):
            order.append(f"{name}+")
            if name == "a":
                a_holds.set()
            if hold is not None:
                await hold.wait()
            await asyncio.sleep(0)
            order.append(f"{name}-")

    def users() -> int:
        """Tasks holding or waiting for conv-1's lock."""
        if store_backend.name == "postgres":
            return int(
                store_backend.sql("SELECT COUNT(*) FROM turn_queue WHERE conversation_id = 'conv-1'")[0][0]
            )
        return int(store._locks.places("conv-1"))  # type: ignore[attr-defined]

    a = asyncio.create_task(turn("a", release_a))
    await a_holds.wait()
    b = asyncio.create_task(turn("b"))
    # b queues before c is created. (With a broken lock, b gets in: then the order shows it.)
    await wait_until(lambda: users() == 2 or "b+" in order, what="b waits for the lock")
    c = asyncio.create_task(turn("c"))
    await wait_until(lambda: users() == 3 or "c+" in order, what="c waits for the lock")
    assert order == ["a+"]  # b and c wait
    release_a.set()
    await asyncio.gather(a, b, c)
    assert order == ["a+", "a-", "b+", "b-", "c+", "c-"]
    assert users() == 0


async def test_admit_turn_on_an_idle_conversation_stores_the_input_and_holds_the_lock(
    store: Store, store_backend: StoreBackend
) -> None:
    """The merged admission: the input is durable once it is entered, the lock held until exit;
    it never reports waiting in line (``queued`` is not called); it brings the history back (on
    SQLite: the conversation is new), PostgreSQL the compaction too."""
    queued: list[bool] = []
    async with store.admit_turn(
        _turn("r1"), [_text("u1", "hi")], lease_seconds=30, read_compaction=True, queued=queued.append
    ) as admission:
        assert store_backend.sql("SELECT request_id, state FROM turns") == [("r1", "running")]
        assert store_backend.sql("SELECT id FROM messages") == [("u1",)]
        assert queued == []  # idle: it never waited
        assert admission.history is not None
        assert [m.id for m in admission.history] == ["u1"]
        if store_backend.name == "postgres":  # one flight
            assert admission.compaction_read
            assert admission.compaction is None
            assert store_backend.sql("SELECT request_id FROM turn_queue") == [("r1",)]
        else:
            assert not admission.compaction_read
    if store_backend.name == "postgres":
        assert store_backend.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)]


async def test_admit_turn_brings_the_compaction_record(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn("r0"), [_text("u0", "first")])
    await store.finish_turn(_turn("r0", state="completed"), _text("a0", "ok", message_pb2.ROLE_ASSISTANT))
    record = _compaction()
    await store.save_compaction(record)
    async with store.admit_turn(
        _turn("r1"), [_text("u1", "hi")], lease_seconds=30, read_compaction=True, queued=lambda _: None
    ) as admission:
        if store_backend.name == "postgres":
            assert admission.compaction == record
            assert admission.history is not None
            assert [m.id for m in admission.history] == ["u0", "a0", "u1"]
    async with store.admit_turn(
        _turn("r2"), [_text("u2", "hi")], lease_seconds=30, read_compaction=False, queued=lambda _: None
    ) as admission:
        assert not admission.compaction_read
        assert admission.compaction is None


async def test_admit_turn_waits_in_line_behind_a_running_turn(
    store: Store, store_backend: StoreBackend
) -> None:
    """A turn with a turn ahead stores nothing until that one releases the lock, reports that it
    waits, and can be cancelled while it does (nothing stored, its place given up)."""
    order: list[str] = []
    reports: dict[str, list[bool]] = {"b": [], "c": []}
    a_holds = asyncio.Event()
    release_a = asyncio.Event()

    async def a() -> None:
        async with store.admit_turn(
            _turn("ra"), [_text("ua", "a")], lease_seconds=30, read_compaction=False, queued=lambda _: None
        ):
            order.append("a+")
            a_holds.set()
            await release_a.wait()
            order.append("a-")

    async def later(name: str) -> None:
        async with store.admit_turn(
            _turn(f"r{name}"),
            [_text(f"u{name}", name)],
            lease_seconds=30,
            read_compaction=False,
            queued=reports[name].append,
        ) as admission:
            order.append(f"{name}+")
            history = admission.history or await store.load_messages("conv-1")
            assert history[-1].id == f"u{name}"

    task_a = asyncio.create_task(a())
    await a_holds.wait()
    task_b = asyncio.create_task(later("b"))
    task_c = asyncio.create_task(later("c"))
    await wait_until(lambda: reports["b"] == [True] and reports["c"] == [True], what="b and c wait")
    assert store_backend.sql("SELECT request_id FROM turns ORDER BY request_id") == [("ra",)]
    task_c.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_c
    release_a.set()
    await asyncio.gather(task_a, task_b)
    assert order == ["a+", "a-", "b+"]
    assert reports["b"] == [True, False]
    assert store_backend.sql("SELECT request_id FROM turns ORDER BY request_id") == [("ra",), ("rb",)]
    assert [m.id for m in await store.load_messages("conv-1")] == ["ua", "ub"]
    if store_backend.name == "postgres":
        assert store_backend.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)]


async def test_admit_turn_applies_start_turn_rules_to_retries_and_re_sent_input(store: Store) -> None:
    """The uncommon inputs take the checking path: a re-sent message without a reply is not
    stored twice, a retry of a failed request id replaces its turn, a conflicting id stores
    nothing and releases the lock."""

    def admit(turn: TurnRecord, *messages: message_pb2.Message) -> Any:
        return store.admit_turn(
            turn, messages, lease_seconds=30, read_compaction=False, queued=lambda _: None
        )

    async with admit(_turn("r1"), _text("u1", "hi")):
        pass
    await store.finish_turn(_turn("r1", state="error"), None)
    async with admit(_turn("r1"), _text("u1", "hi")):  # the retry, same input
        pass
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]
    assert [t.request_id for t in await store.running_turns()] == ["r1"]
    await store.finish_turn(_turn("r1", state="completed"), None)
    with pytest.raises(MessageIdConflict):
        async with admit(_turn("r2"), _text("u1", "other text")):
            pass
    async with admit(_turn("r3"), _text("u3", "next")):  # the lock was released
        pass
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1", "u3"]


async def test_local_turn_locks_cancelled_waiter_and_independent_keys() -> None:
    locks = LocalTurnLocks()
    async with locks.hold("k1"):
        waiter = asyncio.create_task(locks.hold("k1").__aenter__())
        await wait_until(lambda: locks.places("k1") == 2, what="the waiter queues for k1")
        assert len(locks) == 1
        async with locks.hold("k2"):  # another key does not wait
            assert len(locks) == 2
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert len(locks) == 0


async def test_local_turn_locks_reserved_places_keep_their_turn_or_give_it_up() -> None:
    locks = LocalTurnLocks()
    order: list[str] = []

    async def hold(name: str, token: str = "") -> None:
        async with locks.hold("k", token):
            order.append(name)

    locks.reserve("k", "sub")
    locks.reserve("k", "gone")
    later = asyncio.create_task(hold("later"))
    await wait_until(lambda: locks.places("k") == 3, what="the later holder queues behind two reservations")
    assert order == []
    await hold("sub", "sub")  # from its reserved place, ahead of the later one
    assert order == ["sub"] and not later.done()
    locks.drop("gone")  # ended without running: the line moves on
    await later
    assert order == ["sub", "later"]
    assert len(locks) == 0


# ----------------------------------------------------------------------------- factory


# ----------------------------------------------------------------------------- damaged data


async def test_undecodable_rows_are_store_corrupted(store: Store, store_backend: StoreBackend) -> None:
    await store.start_turn(_turn(), [_text("u1", "hi")])
    await store.append_events("conv-1", "req-1", [(1, b"e1"), (2, b"e2")], ended=False)
    store_backend.sql("UPDATE parts SET data = ? WHERE message_id = 'u1'", (b"\xff\xff\xff",))
    store_backend.sql("UPDATE turn_events SET data = ?", (b"\x00\x01",))
    with pytest.raises(StoreCorrupted, match="cannot be decoded"):
        await store.load_messages("conv-1")
    with pytest.raises(StoreCorrupted, match="cannot be read"):
        await store.load_events("req-1", 0)


# ----------------------------------------------------------------------------- compaction (§9)


def _compaction(conversation_id: str = "conv-1", **changes: Any) -> CompactionRecord:
    summary = _text("tw-c-u1", "Summary of the earlier conversation:\nthey said hello")
    fields: dict[str, Any] = {
        "conversation_id": conversation_id,
        "through_message_id": "u1",
        "summary": summary,
        "elided_calls": (("a1", "call_0_0"), ("a1", "call_1_0")),
        "reason": "reactive",
        "strategy": "summarize",
        "tokens_before": 12_000,
        "tokens_after": 3_000,
        "create_time": T0,
    }
    fields.update(changes)
    return CompactionRecord(**fields)


async def test_a_compaction_round_trips_and_the_latest_replaces_the_previous(store: Store) -> None:
    await store.start_turn(_turn(), [_text("u1", "hello")])
    assert await store.load_compaction("conv-1") is None
    first = _compaction()
    await store.save_compaction(first)
    assert await store.load_compaction("conv-1") == first
    second = _compaction(summary=None, through_message_id="", elided_calls=(), reason="proactive")
    await store.save_compaction(second)
    assert await store.load_compaction("conv-1") == second
    # Non-destructive: the messages are untouched.
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]


async def test_a_compaction_of_a_missing_conversation_is_not_stored_and_goes_with_a_deleted_one(
    store: Store,
) -> None:
    await store.save_compaction(_compaction("nobody"))
    assert await store.load_compaction("nobody") is None
    assert await store.get_conversation("nobody") is None  # not created by the compaction
    await store.start_turn(_turn(), [_text("u1", "hello")])
    await store.save_compaction(_compaction())
    assert await store.delete_conversation("conv-1")
    assert await store.load_compaction("conv-1") is None


async def test_discard_reply_removes_the_partial_and_moves_the_turn_to_its_new_reply(store: Store) -> None:
    await store.start_turn(_turn(assistant_message_id="tw-a-1"), [_text("u1", "hello")])
    await store.save_message("conv-1", _text("tw-a-1", "partial", message_pb2.ROLE_ASSISTANT))
    assert (await store.get_conversation("conv-1")).message_count == 2  # type: ignore[union-attr]
    moved = dataclasses.replace(_turn(assistant_message_id="tw-a2-1"), recovery_count=0)
    await store.discard_reply(moved, "tw-a-1")
    assert [m.id for m in await store.load_messages("conv-1")] == ["u1"]
    assert (await store.get_conversation("conv-1")).message_count == 1  # type: ignore[union-attr]
    turn = await store.get_turn("req-1")
    assert turn is not None and turn.assistant_message_id == "tw-a2-1"
    await store.discard_reply(moved, "tw-a-1")  # nothing left to remove: not an error
    with pytest.raises(TurnNotFound):
        await store.discard_reply(_turn("req-unknown", assistant_message_id="x"), "tw-a-1")


async def test_start_turn_gives_the_history_its_commit_left_where_it_costs_no_round_trip(
    store: Store, store_backend: StoreBackend
) -> None:
    """PostgreSQL reads the history in the commit's flight (the turn's model call then needs no
    read of its own); SQLite's single writer reads it when it is few rows: a new conversation,
    or (here) the changes since the messages the first start left this process holding (when
    it holds none of an older conversation: None, test_store_sqlite.py)."""
    first = await store.start_turn(_turn("r0"), [_text("u0", "first")])
    assert first is not None and [m.id for m in first] == ["u0"]
    await store.save_message("conv-1", _text("asst-1", "reply", message_pb2.ROLE_ASSISTANT))
    history = await store.start_turn(_turn("r1", assistant_message_id="asst-2"), [_text("u1", "second")])
    assert history is not None
    assert [m.id for m in history] == ["u0", "asst-1", "u1"]
    assert history == await store.load_messages("conv-1")


async def test_roll_back_turn_removes_its_messages_and_ends_it(
    store: Store, store_backend: StoreBackend
) -> None:
    """ROLLBACK (docs/semantics.md §5, §12): the turn's input and reply go, in one transaction;
    earlier messages stay, the turn row records the end and its error."""
    await store.start_turn(_turn(request_id="req-0", assistant_message_id="asst-0"), [_text("u0", "before")])
    await store.finish_turn(
        dataclasses.replace(
            _turn(request_id="req-0", assistant_message_id="asst-0"), state="completed", end_time=T0
        ),
        _text("asst-0", "answer", message_pb2.ROLE_ASSISTANT),
    )
    before = await store.get_conversation("conv-1")
    assert before is not None
    await store.start_turn(_turn(), [_text("u1", "rolled"), _text("u2", "back")])
    await store.save_message("conv-1", _text("asst-1", "partial", message_pb2.ROLE_ASSISTANT))
    ended = dataclasses.replace(_turn(), state="aborted", end_time=T0, error=b"\x08\x0a")
    await store.roll_back_turn(ended, ["u1", "u2", "asst-1", "never-stored"])
    assert [m.id for m in await store.load_messages("conv-1")] == ["u0", "asst-0"]
    after = await store.get_conversation("conv-1")
    assert after is not None and after.message_count == before.message_count == 2
    assert store_backend.sql("SELECT state, error FROM turns WHERE request_id = ?", ("req-1",)) == [
        ("aborted", b"\x08\x0a")
    ]
    with pytest.raises(TurnNotFound):
        await store.roll_back_turn(dataclasses.replace(ended, request_id="nobody"), ["u0"])
    assert [m.id for m in await store.load_messages("conv-1")] == ["u0", "asst-0"]


async def test_queue_head_names_the_holder_then_the_first_waiting(store: Store) -> None:
    assert await store.queue_head("conv-1") is None
    a_holds = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with store.turn_lock("conv-1", request_id="a", owner="me"):
            a_holds.set()
            await release.wait()

    task = asyncio.create_task(holder())
    await a_holds.wait()
    assert await store.queue_head("conv-1") == "a"
    release.set()
    await task
    await wait_until(lambda: _head_is(store, None), what="the lock is free again")


async def _head_is(store: Store, expected: str | None) -> bool:
    return await store.queue_head("conv-1") == expected


async def test_a_place_taken_first_goes_behind_the_holder_and_earlier_first_places() -> None:
    """New input that interrupted the running turn runs next (docs/semantics.md §5): a ``first``
    place goes right behind the holder, after the ``first`` places before it, ahead of the rest."""
    locks = LocalTurnLocks()
    order: list[str] = []
    release = asyncio.Event()
    holds = asyncio.Event()

    async def turn(name: str, *, first: bool = False) -> None:
        async with locks.hold("c", name, first=first):
            if name == "a":
                holds.set()
                await release.wait()
            order.append(name)

    tasks = [asyncio.create_task(turn("a"))]
    await holds.wait()
    for name, first in (("q1", False), ("q2", False), ("i1", True), ("i2", True)):
        tasks.append(asyncio.create_task(turn(name, first=first)))
        expected = len(tasks)
        await wait_until(lambda: locks.places("c") == expected, what=f"{name} waits")  # noqa: B023 (awaited here)
    assert locks.head("c") == "a"
    locks.reserve("c", "s1")  # a submission's place, moved to the head when taken first
    tasks.append(asyncio.create_task(turn("s1", first=True)))
    await wait_until(lambda: "s1" not in locks._reserved, what="s1 took its reserved place")
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["a", "i1", "i2", "s1", "q1", "q2"]
    assert len(locks) == 0


async def test_a_reserved_place_is_taken_over_by_its_turn_or_given_up(store: Store) -> None:
    """``reserve_place``: ``only_if_idle`` takes a place only on an idle conversation (else it
    names the head and takes nothing); the turn's admission holds from that place and gives it
    up at the end; ``release_place`` gives up one no turn took."""
    assert await store.reserve_place("conv-1", "r1", owner="me", lease_seconds=30, only_if_idle=True) is None
    assert await store.queue_head("conv-1") == "r1"
    assert await store.reserve_place("conv-1", "r2", owner="me", lease_seconds=30, only_if_idle=True) == "r1"
    async with store.admit_turn(
        _turn("r1"), [_text("u1", "hi")], lease_seconds=30, read_compaction=False, queued=lambda _: None
    ):
        assert await store.queue_head("conv-1") == "r1"
    assert await store.queue_head("conv-1") is None
    assert await store.reserve_place("conv-1", "r3", owner="me", lease_seconds=30) is None
    await store.release_place("conv-1", "r3")
    assert await store.queue_head("conv-1") is None


async def test_the_store_lock_taken_first_goes_ahead_of_the_queue(
    store: Store, store_backend: StoreBackend
) -> None:
    """The store's turn lock honours ``first`` on both backends (docs/semantics.md §5: new input
    that stopped the running turn runs next): behind the holder and earlier ``first`` places,
    ahead of the turns already queued. With PostgreSQL the order is the tickets' numbers, so a
    replica of the previous schema (it holds the lowest live ticket) reads the same order."""
    order: list[str] = []
    release = asyncio.Event()
    holds = asyncio.Event()

    def waiting() -> int:
        if store_backend.name == "postgres":
            return int(store_backend.sql("SELECT COUNT(*) FROM turn_queue")[0][0])
        return int(store._locks.places("conv-1"))  # type: ignore[attr-defined]

    async def turn(name: str, *, first: bool = False) -> None:
        async with store.turn_lock("conv-1", request_id=name, owner="me", first=first):
            if name == "a":
                holds.set()
                await release.wait()
            order.append(name)

    tasks = [asyncio.create_task(turn("a"))]
    await holds.wait()
    for name, first in (("q1", False), ("q2", False), ("i1", True), ("i2", True)):
        tasks.append(asyncio.create_task(turn(name, first=first)))
        expected = len(tasks)
        await wait_until(lambda: waiting() == expected, what=f"{name} waits")  # noqa: B023 (awaited here)
    if store_backend.name == "postgres":
        line = store_backend.sql("SELECT request_id, first_in_line FROM turn_queue ORDER BY ticket")
        assert line == [("a", 0), ("i1", 1), ("i2", 1), ("q1", 0), ("q2", 0)]
    release.set()
    await asyncio.gather(*tasks)
    assert order == ["a", "i1", "i2", "q1", "q2"]
    assert waiting() == 0
