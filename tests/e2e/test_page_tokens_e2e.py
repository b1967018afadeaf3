"""Crafted ListConversations page tokens end to end: a malformed token is the client's mistake,
INVALID_ARGUMENT with reason INVALID_PAGE_TOKEN, and nothing stored changes (issue 9 item 7:
a huge integer was UNKNOWN OverflowError, nested brackets UNKNOWN RecursionError, a lone
surrogate UNAVAILABLE STORE_UNAVAILABLE with a retry hint)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from support.page_tokens import CRAFTED_TOKENS, ISSUE_9_TOKENS, SENDABLE_TOKENS
from support.sidecar import SidecarFactory, SidecarProcess
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect

CONVERSATIONS = ("conv-a", "conv-b", "conv-c")


@pytest.fixture
async def sidecar(sidecar_factory: SidecarFactory) -> AsyncIterator[SidecarProcess]:
    """A running server that stores three conversations."""
    process = await sidecar_factory().start()
    async with TurnwireClient(process.target) as client:
        for conversation_id in CONVERSATIONS:
            assert (await collect(client.chat(conversation_id, "hello"))).ok

    def streams_stored() -> bool:
        # A turn's stream is stored just after its TurnEnd is sent: the tests compare stored rows.
        ended = [row for row in stored_rows(process.db_path)["turn_streams"] if row[4] is not None]
        return len(ended) == len(CONVERSATIONS)

    await wait_until(streams_stored, what="every turn's stream is stored")
    yield process


def stored_rows(database: Path) -> dict[str, list[Any]]:
    """Every row of every table, read beside the server (WAL: readers see committed data)."""
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}


async def refused(client: TurnwireClient, token: str) -> TurnwireError:
    try:
        page = await client.list_conversations(page_size=2, page_token=token)
    except TurnwireError as error:
        return error
    raise AssertionError(f"page token {token[:60]!r} was accepted: {page}")


def assert_invalid_page_token(error: TurnwireError, token: str) -> None:
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PAGE_TOKEN"), (
        token[:60],
        error,
    )
    assert [field for field, _ in error.field_violations] == ["page_token"]
    assert "next_page_token" in error.field_violations[0][1]  # says what to do instead


@pytest.mark.parametrize("name", ISSUE_9_TOKENS)
async def test_issue_9_crafted_tokens_are_invalid_page_token(sidecar: SidecarProcess, name: str) -> None:
    before = stored_rows(sidecar.db_path)
    async with TurnwireClient(sidecar.target) as client:
        error = await refused(client, ISSUE_9_TOKENS[name])
        assert_invalid_page_token(error, ISSUE_9_TOKENS[name])
        assert error.status is not None and error.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        # The server is fine and the listing works from the start.
        page = await client.list_conversations(page_size=10)
        assert sorted(c.conversation_id for c in page.conversations) == sorted(CONVERSATIONS)
    assert stored_rows(sidecar.db_path) == before
    assert "Traceback" not in sidecar.log_text()


async def test_every_crafted_token_is_invalid_page_token(sidecar: SidecarProcess) -> None:
    before = stored_rows(sidecar.db_path)
    async with TurnwireClient(sidecar.target) as client:
        for token in CRAFTED_TOKENS.values():
            assert_invalid_page_token(await refused(client, token), token)
    assert stored_rows(sidecar.db_path) == before
    assert "Traceback" not in sidecar.log_text()


async def test_issued_tokens_still_page_through_everything(sidecar: SidecarProcess) -> None:
    seen: list[str] = []
    token = ""
    async with TurnwireClient(sidecar.target) as client:
        while True:
            page = await client.list_conversations(page_size=1, page_token=token)
            seen += [c.conversation_id for c in page.conversations]
            token = page.next_page_token
            if not token:
                break
    assert seen == list(reversed(CONVERSATIONS))  # most recently updated first


@settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(token=SENDABLE_TOKENS)
async def test_any_page_token_lists_or_is_invalid_page_token_and_changes_nothing(
    sidecar: SidecarProcess, token: str
) -> None:
    before = stored_rows(sidecar.db_path)
    async with TurnwireClient(sidecar.target) as client:
        try:
            page = await client.list_conversations(page_size=2, page_token=token)
        except TurnwireError as error:
            assert_invalid_page_token(error, token)
        else:  # a well-formed token, forged or not: stored conversations only
            assert {c.conversation_id for c in page.conversations} <= set(CONVERSATIONS)
    assert stored_rows(sidecar.db_path) == before
