"""AddMessages and DeleteConversation end to end, against real ``turnwire serve`` processes.

docs/semantics.md §1 (AddMessages: a transcript write, no turn, no lock, no hooks; idempotent by
message id; upsert in place) and §12 (deleting: a running turn is cancelled first and writes
nothing back; retention deletes idle conversations).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.endless import endless_step
from support.hooks import pythonpath_env
from support.messages import text_message as msg
from support.sidecar import SidecarFactory, SidecarProcess, running_sidecar
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

CONFIG: dict[str, Any] = {
    "default_model": "scripted:main",
    "providers": {
        "scripted": {
            "scripts": {
                "main": [{"text": "Noted."}],
                # Never ends on its own: the delete ends it.
                "slow": [endless_step("word ", 5)],
                "note": [
                    {
                        "tool_calls": [
                            {"name": "add_note", "input": {"message_id": "note-1", "text": "inside"}}
                        ]
                    },
                    {"text": "Added."},
                ],
            }
        }
    },
    "tools": {"python": ["support.transcript:add_note"]},
    "middleware": [{"path": "support.transcript:HistoryProbe"}],
    "checkpoint": {"interval_ms": 20},
}

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A conversation id unique within the shared sidecar."""
    return f"{prefix}-{next(_ids)}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """One server for the module, with ``tests/`` on its PYTHONPATH (for support.transcript)."""
    with running_sidecar(tmp_path_factory.mktemp("transcript-e2e"), CONFIG, pythonpath_env()) as process:
        yield process


def texts(conversation: Any) -> list[tuple[str, str]]:
    return [(m.id, "".join(p.text.text for p in m.parts)) for m in conversation.messages]


async def failure(call: Any) -> TurnwireError:
    with pytest.raises(TurnwireError) as raised:
        await call
    return raised.value


def stored_rows(db_path: Path, conversation_id: str) -> dict[str, int]:
    """Rows each table holds for the conversation, read from the SQLite file directly."""
    tables = {
        "conversations": "id",
        "messages": "conversation_id",
        "parts": "conversation_id",
        "turns": "conversation_id",
        "turn_streams": "conversation_id",
        "submissions": "conversation_id",
    }
    with sqlite3.connect(db_path) as conn:
        return {
            table: conn.execute(
                f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (conversation_id,)
            ).fetchone()[0]
            for table, column in tables.items()
        }


# --------------------------------------------------------------------------- AddMessages


async def test_add_messages_appends_to_an_existing_conversation_in_order(sidecar: SidecarProcess) -> None:
    conversation_id = new_id("append")
    async with TurnwireClient(sidecar.target) as client:
        await collect(client.chat(conversation_id, "hello"))
        response = await client.add_messages(
            conversation_id, [msg("n1", "a note"), msg("n2", "an answer", message_pb2.ROLE_ASSISTANT)]
        )
        assert (response.added_count, response.updated_count, response.unchanged_count) == (2, 0, 0)
        assert response.conversation.message_count == 4
        conversation = await client.get_conversation(conversation_id)
    assert [t for _, t in texts(conversation)] == ["hello", "Noted.", "a note", "an answer"]
    assert [m.id for m in conversation.messages][2:] == ["n1", "n2"]


async def test_add_messages_repeated_is_unchanged(sidecar: SidecarProcess) -> None:
    conversation_id = new_id("repeat")
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages(conversation_id, [msg("n1", "note")], allow_missing=True)
        again = await client.add_messages(conversation_id, [msg("n1", "note")])
        assert (again.added_count, again.updated_count, again.unchanged_count) == (0, 0, 1)
        assert texts(await client.get_conversation(conversation_id)) == [("n1", "note")]


async def test_add_messages_other_content_under_a_stored_id_is_already_exists_and_writes_nothing(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("conflict")
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages(conversation_id, [msg("n1", "note")], allow_missing=True)
        error = await failure(client.add_messages(conversation_id, [msg("n2", "new"), msg("n1", "changed")]))
        assert error.code == grpc.StatusCode.ALREADY_EXISTS
        assert "n1" in error.message
        assert texts(await client.get_conversation(conversation_id)) == [("n1", "note")]


async def test_add_messages_to_an_unknown_conversation_is_not_found_and_creates_nothing(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("unknown")
    async with TurnwireClient(sidecar.target) as client:
        error = await failure(client.add_messages(conversation_id, [msg("n1", "note")]))
        assert error.code == grpc.StatusCode.NOT_FOUND
        assert error.reason == "CONVERSATION_NOT_FOUND"
        missing = await failure(client.get_conversation(conversation_id))
        assert missing.code == grpc.StatusCode.NOT_FOUND
        created = await client.add_messages(conversation_id, [msg("n1", "note")], allow_missing=True)
        assert created.added_count == 1 and created.conversation.conversation_id == conversation_id
        assert texts(await client.get_conversation(conversation_id)) == [("n1", "note")]


async def test_add_messages_upsert_replaces_in_place_keeping_the_position(sidecar: SidecarProcess) -> None:
    conversation_id = new_id("upsert")
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages(
            conversation_id, [msg("m1", "one"), msg("m2", "two"), msg("m3", "three")], allow_missing=True
        )
        response = await client.add_messages(
            conversation_id, [msg("m2", "TWO"), msg("m4", "four")], upsert=True
        )
        assert (response.added_count, response.updated_count, response.unchanged_count) == (1, 1, 0)
        assert texts(await client.get_conversation(conversation_id)) == [
            ("m1", "one"),
            ("m2", "TWO"),
            ("m3", "three"),
            ("m4", "four"),
        ]


async def test_add_messages_upsert_may_edit_a_stored_server_id_but_not_add_one(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("server-ids")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation_id, "hello"))
        assert result.message is not None
        reply_id = result.message.id
        assert reply_id.startswith("tw-a-")
        edited = await client.add_messages(
            conversation_id, [msg(reply_id, "edited reply", message_pb2.ROLE_ASSISTANT)], upsert=True
        )
        assert edited.updated_count == 1
        assert texts(await client.get_conversation(conversation_id))[1] == (reply_id, "edited reply")
        refused = await failure(
            client.add_messages(
                conversation_id, [msg("tw-a-invented", "x", message_pb2.ROLE_ASSISTANT)], upsert=True
            )
        )
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.field_violations[0][0] == "messages[0].id"
        appended = await failure(
            client.add_messages(conversation_id, [msg(reply_id, "edited reply", message_pb2.ROLE_ASSISTANT)])
        )
        assert appended.field_violations[0][0] == "messages[0].id"  # append mode: tw- is the server's
        assert len((await client.get_conversation(conversation_id)).messages) == 2


@pytest.mark.parametrize(
    ("case", "field"),
    [
        ("no messages", "messages"),
        ("no role", "messages[0].role"),
        ("no parts", "messages[0].parts"),
        ("reserved id", "messages[0].id"),
        ("repeated id", "messages[1].id"),
        ("bad conversation id", "conversation_id"),
    ],
)
async def test_add_messages_validation_names_the_field(
    sidecar: SidecarProcess, case: str, field: str
) -> None:
    conversation_id = new_id("invalid")
    messages = {
        "no messages": [],
        "no role": [
            message_pb2.Message(id="m1", parts=[message_pb2.Part(text=message_pb2.TextPart(text="x"))])
        ],
        "no parts": [message_pb2.Message(id="m1", role=message_pb2.ROLE_USER)],
        "reserved id": [msg("tw-u-mine", "x")],
        "repeated id": [msg("m1", "x"), msg("m1", "x")],
        "bad conversation id": [msg("m1", "x")],
    }[case]
    if case == "bad conversation id":
        conversation_id = "not valid!"
    async with TurnwireClient(sidecar.target) as client:
        error = await failure(client.add_messages(conversation_id, messages, allow_missing=True))
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert field in [f for f, _ in error.field_violations], error
        if case != "bad conversation id":
            assert (await failure(client.get_conversation(conversation_id))).code == grpc.StatusCode.NOT_FOUND


async def test_add_messages_from_inside_a_running_turn_is_allowed(sidecar: SidecarProcess) -> None:
    """A tool calls AddMessages on its own conversation with the parent request id: no lock,
    so no deadlock and no NESTED_TURN refusal; the note is stored and the turn completes."""
    conversation_id = new_id("nested")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation_id, "note this", model="scripted:note", timeout=20))
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result
        [call] = result.tool_calls
        assert call.output["added"] == 1, call
        conversation = await client.get_conversation(conversation_id)
    assert ("note-1", "inside") in texts(conversation)
    assert texts(conversation)[0] == (conversation.messages[0].id, "note this")


async def test_a_chat_after_add_messages_sends_the_added_history_to_the_model(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("history")
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages(
            conversation_id,
            [msg("q1", "first question"), msg("a1", "first answer", message_pb2.ROLE_ASSISTANT)],
            allow_missing=True,
        )
        await collect(client.chat(conversation_id, "second question", request_id="r-history"))
    seen = json.loads((sidecar.workdir / "history-r-history-0.json").read_text())
    assert seen == [
        ["ROLE_USER", "first question"],
        ["ROLE_ASSISTANT", "first answer"],
        ["ROLE_USER", "second question"],
    ]


# --------------------------------------------------------------------------- DeleteConversation


async def test_a_deleted_conversation_is_gone_from_every_rpc(sidecar: SidecarProcess) -> None:
    conversation_id = new_id("gone")
    async with TurnwireClient(sidecar.target) as client:
        done = await collect(client.chat(conversation_id, "hello", request_id=f"r-{conversation_id}"))
        assert done.status == event_pb2.TURN_STATUS_COMPLETED
        await client.delete_conversation(conversation_id)

        missing = await failure(client.get_conversation(conversation_id))
        assert (missing.code, missing.reason) == (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
        listed = await client.list_conversations(page_size=1000)
        assert conversation_id not in [c.conversation_id for c in listed.conversations]
        assert await client.cancel_chat(f"r-{conversation_id}") is False
        assert not any(stored_rows(sidecar.db_path, conversation_id).values())

        fresh = await collect(client.chat(conversation_id, "again"))
        assert fresh.status == event_pb2.TURN_STATUS_COMPLETED
        conversation = await client.get_conversation(conversation_id)
        assert [t for _, t in texts(conversation)] == ["again", "Noted."]


async def test_save_messages_with_none_on_an_unknown_conversation_is_refused_as_continue_last_turn(
    sidecar: SidecarProcess,
) -> None:
    """Issue 32 item 13: no model call with no messages, and no conversation that starts with an
    assistant message (docs/semantics.md §1)."""
    conversation_id = new_id("no-history")
    async with TurnwireClient(sidecar.target) as client:
        refused = await failure(collect(client.save_messages(conversation_id, [])))
        continued = await failure(collect(client.continue_last_turn(conversation_id)))
        for error in (refused, continued):
            assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
        assert refused.message == continued.message
        missing = await failure(client.get_conversation(conversation_id))
        assert missing.code == grpc.StatusCode.NOT_FOUND
    assert not any(stored_rows(sidecar.db_path, conversation_id).values())


async def test_delete_of_an_unknown_conversation_is_not_found_unless_allow_missing(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("never")
    async with TurnwireClient(sidecar.target) as client:
        error = await failure(client.delete_conversation(conversation_id))
        assert (error.code, error.reason) == (grpc.StatusCode.NOT_FOUND, "CONVERSATION_NOT_FOUND")
        await client.delete_conversation(conversation_id, allow_missing=True)
        invalid = await failure(client.delete_conversation("not valid!"))
        assert invalid.code == grpc.StatusCode.INVALID_ARGUMENT


async def test_deleting_during_a_streaming_turn_aborts_it_and_nothing_of_it_comes_back(
    sidecar: SidecarProcess,
) -> None:
    conversation_id = new_id("mid-stream")
    async with TurnwireClient(sidecar.target) as client:
        events: list[event_pb2.TurnEvent] = []

        async def read() -> None:
            async for event in client.chat(
                conversation_id, "a long story", model="scripted:slow", timeout=30
            ):
                events.append(event)

        reader = asyncio.create_task(read())
        await wait_until(
            lambda: sum(e.WhichOneof("event") == "text_delta" for e in events) >= 5, what="the reply streams"
        )
        await wait_until(
            lambda: stored_rows(sidecar.db_path, conversation_id)["messages"] >= 2,
            what="a checkpoint of the reply",
        )
        await client.delete_conversation(conversation_id)
        await asyncio.wait_for(reader, 10)  # the turn's stream ended

        end = events[-1].turn_end
        assert events[-1].WhichOneof("event") == "turn_end"
        assert end.status == event_pb2.TURN_STATUS_ABORTED
        assert TurnwireError.from_status(end.error).reason == "CONVERSATION_DELETED"
        # Its final write happened before the delete: the store holds nothing of it.
        assert stored_rows(sidecar.db_path, conversation_id) == dict.fromkeys(
            ("conversations", "messages", "parts", "turns", "turn_streams", "submissions"), 0
        )
        missing = await failure(client.get_conversation(conversation_id))
        assert missing.code == grpc.StatusCode.NOT_FOUND
        assert await client.cancel_chat(events[0].request_id) is False


# --------------------------------------------------------------------------- retention


async def test_retention_deletes_an_idle_conversation_and_keeps_a_recently_updated_one(
    sidecar_factory: SidecarFactory,
) -> None:
    config = {
        "default_model": "scripted:demo",
        "durability": {"conversation_retention_seconds": 1.0, "sweep_interval_seconds": 0.1},
    }
    sidecar = await sidecar_factory(config).start()
    async with TurnwireClient(sidecar.target) as client:
        await client.add_messages("idle", [msg("m1", "old news")], allow_missing=True)
        await client.add_messages("active", [msg("m1", "kept busy")], allow_missing=True)
        touches = itertools.count(2)

        async def idle_gone_while_active_is_touched() -> bool:
            # Each check updates "active", so it never goes a full retention period unchanged.
            await client.add_messages("active", [msg(f"m{next(touches)}", "still here")])
            listed = await client.list_conversations(page_size=100)
            return "idle" not in [c.conversation_id for c in listed.conversations]

        await wait_until(
            idle_gone_while_active_is_touched,
            timeout=15,
            interval=0.2,
            what="the idle conversation is deleted",
        )
        assert (await failure(client.get_conversation("idle"))).code == grpc.StatusCode.NOT_FOUND
        assert (await client.get_conversation("active")).messages[0].id == "m1"
    assert "maintenance sweep removed 1 conversations" in sidecar.log_text()
