"""ForkConversation end to end (docs/forks.md), against a real ``turnwire serve`` on each store
(SQLite and PostgreSQL): fork at a middle message and run turns on both sides, forking a long
conversation stores no copy of its messages, an upsert of a shared message changes one side
only, deleting the source keeps the fork readable, deleting with forks removes all.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
from support.messages import text_message as msg
from support.sidecar import SidecarProcess, run_turnwire, running_sidecar
from support.stores import postgres_database

from turnwire_client import TurnwireClient, TurnwireError, collect

CONFIG: dict[str, Any] = {
    "default_model": "scripted:main",
    "providers": {"scripted": {"scripts": {"main": [{"text": "Noted."}]}}},
}

_ids = itertools.count(1)


class Sidecar:
    """A running sidecar and direct SQL on its store's database."""

    def __init__(self, process: SidecarProcess, url: str | None) -> None:
        self.process = process
        self.url = url

    def count(self, table: str, conversation_id: str) -> int:
        """Rows of ``table`` the conversation itself holds."""
        sql = f"SELECT COUNT(*) FROM {table} WHERE conversation_id = ?"
        if self.url is None:
            with sqlite3.connect(self.process.db_path) as conn:
                return int(conn.execute(sql, (conversation_id,)).fetchone()[0])
        with psycopg.connect(self.url) as conn:
            row = conn.execute(sql.replace("?", "%s").encode(), (conversation_id,)).fetchone()
            assert row is not None
            return int(row[0])


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def sidecar(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    workdir = tmp_path_factory.mktemp(f"forks-{request.param}")
    if request.param == "sqlite":
        with running_sidecar(workdir, CONFIG) as process:
            yield Sidecar(process, None)
        return
    with postgres_database() as url, running_sidecar(workdir, CONFIG, store_url=url) as process:
        yield Sidecar(process, url)


def new_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}"


async def transcript(client: TurnwireClient, conversation_id: str) -> list[str]:
    conversation = await client.get_conversation(conversation_id)
    return ["".join(part.text.text for part in m.parts) for m in conversation.messages]


async def test_fork_at_a_middle_message_then_turns_on_both_sides(sidecar: Sidecar) -> None:
    source = new_id("source")
    async with TurnwireClient(sidecar.process.target) as client:
        for text in ("one", "two", "three"):
            await collect(client.chat(source, text))
        before = await client.get_conversation(source)
        middle = before.messages[1].id  # the reply to "one"
        fork = await client.fork_conversation(source, middle, new_conversation_id=new_id("fork"))
        assert fork.message_count == 2
        assert (fork.forked_from.conversation_id, fork.forked_from.message_id) == (source, middle)

        await collect(client.chat(fork.conversation_id, "two, edited"))
        await collect(client.chat(source, "four"))
        assert await transcript(client, fork.conversation_id) == ["one", "Noted.", "two, edited", "Noted."]
        assert await transcript(client, source) == [
            "one",
            "Noted.",
            "two",
            "Noted.",
            "three",
            "Noted.",
            "four",
            "Noted.",
        ]
        # The old branch is kept and listed: the fork says where it came from.
        listed = {c.conversation_id: c for c in (await client.list_conversations()).conversations}
        assert listed[fork.conversation_id].forked_from.conversation_id == source
        assert not listed[source].HasField("forked_from")
    assert sidecar.count("messages", fork.conversation_id) == 2  # only its own two


async def test_forking_a_long_conversation_stores_no_copy(sidecar: Sidecar) -> None:
    source = new_id("long")
    async with TurnwireClient(sidecar.process.target) as client:
        # Long enough to see no copy; tests/test_store_forks.py forks 10,000 messages in the store.
        await client.add_messages(source, [msg(f"m{n}", f"text {n}") for n in range(300)], allow_missing=True)
        fork = await client.fork_conversation(source, "m299")
        assert fork.conversation_id.startswith("tw-c-") and fork.message_count == 300
        assert sidecar.count("messages", fork.conversation_id) == 0
        assert sidecar.count("parts", fork.conversation_id) == 0
        await collect(client.chat(fork.conversation_id, "and now?"))
        page = await client.get_conversation(fork.conversation_id)
        assert page.message_count == 302
    assert sidecar.count("messages", fork.conversation_id) == 2


async def test_an_upsert_on_a_shared_message_changes_one_side_only(sidecar: Sidecar) -> None:
    source = new_id("upsert")
    async with TurnwireClient(sidecar.process.target) as client:
        await client.add_messages(source, [msg("a", "first"), msg("b", "second")], allow_missing=True)
        fork = (await client.fork_conversation(source, "b")).conversation_id
        await client.add_messages(fork, [msg("a", "first, fork's")], upsert=True)
        await client.add_messages(source, [msg("b", "second, source's")], upsert=True)
        assert await transcript(client, fork) == ["first, fork's", "second"]
        assert await transcript(client, source) == ["first", "second, source's"]


async def test_deleting_the_source_keeps_the_fork_and_delete_with_forks_removes_all(sidecar: Sidecar) -> None:
    source = new_id("erase")
    async with TurnwireClient(sidecar.process.target) as client:
        await collect(client.chat(source, "hello"))
        kept = (
            await client.fork_conversation(source, (await client.get_conversation(source)).messages[1].id)
        ).conversation_id
        assert await client.delete_conversation(source)
        assert await transcript(client, kept) == ["hello", "Noted."]
        await collect(client.chat(kept, "still here"))

        first = (await client.get_conversation(kept)).messages[0].id
        child = (await client.fork_conversation(kept, first)).conversation_id
        grandchild = (await client.fork_conversation(child, first)).conversation_id
        assert await client.delete_conversation(kept, include_forks=True)
        for gone in (kept, child, grandchild):
            with pytest.raises(TurnwireError) as raised:
                await client.get_conversation(gone)
            assert raised.value.code == grpc.StatusCode.NOT_FOUND
    for gone in (kept, child, grandchild):
        assert sidecar.count("messages", gone) == 0


async def test_a_bad_fork_says_what_to_fix(sidecar: Sidecar) -> None:
    source = new_id("bad")
    async with TurnwireClient(sidecar.process.target) as client:
        await client.add_messages(source, [msg("a", "first")], allow_missing=True)
        with pytest.raises(TurnwireError) as raised:
            await client.fork_conversation(source, "nope")
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert [field for field, _ in raised.value.field_violations] == ["at_message_id"]
        with pytest.raises(TurnwireError) as raised:
            await client.fork_conversation(new_id("missing"), "a")
        assert raised.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(TurnwireError) as raised:
            await client.fork_conversation(source, "a", new_conversation_id=source)
        assert raised.value.code == grpc.StatusCode.ALREADY_EXISTS
        with pytest.raises(TurnwireError) as raised:
            await client.fork_conversation(source, "a", new_conversation_id="tw-c-mine")
        assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("sidecar", ["sqlite"], indirect=True)  # the CLI is the same on both
async def test_the_cli_forks_and_lists_the_branch(sidecar: Sidecar) -> None:
    source = new_id("cli")
    async with TurnwireClient(sidecar.process.target) as client:
        await collect(client.chat(source, "the question"))
    target = ("--target", sidecar.process.target)
    async with TurnwireClient(sidecar.process.target) as client:
        first = (await client.get_conversation(source)).messages[0].id
    fork_id = new_id("cli-fork")
    forked = await run_turnwire("fork", source, first, "--as", fork_id, *target)
    assert forked.code == 0, forked.stderr
    assert forked.stdout.splitlines()[0] == fork_id
    assert "1 message shared" in forked.stdout
    listed = await run_turnwire("conversations", *target)
    assert f"forked from {source} at {first}" in listed.stdout
