"""What only the PostgreSQL store does: migrations under an advisory lock, its URLs and password
handling (never shown), connection failures, the bounded pool, and writers in separate pools
(as separate processes would be) serializing on the database's row locks.

Behaviour every backend shares is tested in ``test_store.py`` and the other store suites.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.stores import StoreBackend, postgres_database
from support.waiting import wait_until
from typer.testing import CliRunner

from turnwire.errors import CanonicalCode
from turnwire_client.v1 import message_pb2
from turnwire_server import cli
from turnwire_server.config import ConfigError, load_settings
from turnwire_server.migrate import migrate_store
from turnwire_server.store import StoreError, TurnRecord, open_store, redact_url
from turnwire_server.store.errors import StoreValueRefused, ToolCallNotPending
from turnwire_server.store.postgres import QUEUE_STEP, PostgresStore
from turnwire_server.store.postgres.migrations import apply_migrations, load_migrations
from turnwire_server.store.records import CompactionRecord, ToolCallAnswer

pytestmark = pytest.mark.postgres

T0 = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)
SECRET = "s3cr3t-Pa55"


def _closed_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _turn(request_id: str, conversation_id: str) -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=f"a-{request_id}",
        continuation=False,
        model="scripted:x",
        state="running",
        start_time=T0,
    )


def _user(message_id: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = message_id
    return message


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database of its own on the test server (dropped afterwards)."""
    with postgres_database() as url:
        yield url


# ----------------------------------------------------------------------------- migrations


async def test_replicas_opening_a_fresh_database_together_migrate_it_once() -> None:
    with postgres_database() as url:
        stores = [PostgresStore(url) for _ in range(4)]
        try:
            await asyncio.gather(*(store.open() for store in stores))
            check = StoreBackend("postgres", url=url)
            rows = check.sql("SELECT version, name FROM schema_migrations ORDER BY version")
            assert rows == [(m.version, m.name) for m in load_migrations()]
            assert rows == [
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
            await stores[0].start_turn(_turn("r1", "c1"), [_user("u1")])
            assert [m.id for m in await stores[3].load_messages("c1")] == ["u1"]
            assert await stores[1].migrate() == []  # nothing left to apply
            await check.close()
        finally:
            for store in stores:
                await store.close()


async def test_a_database_of_the_previous_schema_is_migrated_with_its_data_kept() -> None:
    """Upgrading: a database at schema 3 (an earlier release) gets the later migrations at open; what it
    stored is read back unchanged, its running turn (no lease renewed) counts as lapsed, and its
    conversation takes a compaction."""
    import psycopg

    with postgres_database() as url:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            applied = await apply_migrations(conn, load_migrations()[:3], where="test", now_us=1)
        assert applied == ["0001_init", "0002_durable_turns", "0003_turn_leases"]
        old = PostgresStore(url)
        # Rows as the previous release wrote them: without owner and lease.
        check = StoreBackend("postgres", url=url)
        check.sql(
            "INSERT INTO conversations (id, create_time, update_time, message_count) VALUES ('c1', 1, 1, 0)"
        )
        check.sql(
            "INSERT INTO turns (request_id, conversation_id, assistant_message_id, continuation, model,"
            " state, start_time, recovery_count)"
            " VALUES ('r-old', 'c1', 'tw-a-r-old', 0, 'scripted:x', 'running', 1, 0)"
        )
        check.sql("INSERT INTO messages (conversation_id, id, seq, role) VALUES ('c1', 'u-old', 1, 1)")
        check.sql(
            "INSERT INTO parts (conversation_id, message_id, idx, data) VALUES ('c1', 'u-old', 0, ?)",
            (_user("u-old").parts[0].SerializeToString(),),
        )
        await old.open()  # applies 0004 to 0006
        try:
            # Rows from before 0006 (version 0) are read by the first, whole read; then deltas.
            assert [m.id for m in await old.load_messages("c1")] == ["u-old"]
            await old.save_message("c1", _user("u-new"))
            assert [m.id for m in await old.load_messages("c1")] == ["u-old", "u-new"]
            assert [t.request_id for t in await old.running_turns()] == ["r-old"]
            now = dt.datetime.now(dt.UTC)
            claimed = await old.claim_interrupted_turns("me", now, now + dt.timedelta(seconds=30), 10)
            assert [(t.request_id, t.owner) for t in claimed] == [("r-old", "me")]
            versions = check.sql("SELECT version FROM schema_migrations ORDER BY version")
            assert versions == [(n,) for n in range(1, 17)]
            record = CompactionRecord("c1", "", None, (("m", "call"),), "threshold", "drop", 9, 3, now)
            await old.save_compaction(record)
            assert await old.load_compaction("c1") == record
        finally:
            await old.close()
            await check.close()


async def test_the_queue_order_migration_keeps_replicas_of_schema_4_in_line() -> None:
    """Migration 0005 only expands (a rolling upgrade): the ticket sequence restarts at a multiple
    of its new step above every live ticket, a replica still on schema 4 (plain INSERTs, the lowest
    live ticket holds) takes multiples too, and a ticket taken first in line gets a number between
    the head's and the next one's, so the schema-4 rule reads the same order. Behind a head of
    schema 4 (numbers without room between them) it queues at the back."""
    import psycopg

    with postgres_database() as url:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await apply_migrations(conn, load_migrations()[:4], where="test", now_us=1)
        check = StoreBackend("postgres", url=url)
        lease = 1 << 62
        old_ticket = (
            "INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
            " VALUES ('c1', ?, 'schema-4', ?) RETURNING ticket"
        )
        old_a, old_q = (check.sql(old_ticket, (name, lease))[0][0] for name in ("old-a", "old-q"))
        store = PostgresStore(url)
        await store.open()  # applies 0005 (and 0006)
        try:
            lease_us = 30_000_000
            i1, _ = await store._take_ticket("c1", "i1", "me", lease_us, first=True)
            assert i1 > old_q and i1 % QUEUE_STEP == 0  # no room behind a schema-4 head: the back
            old_b = check.sql(old_ticket, ("old-b", lease))[0][0]
            assert old_b > i1 and old_b % QUEUE_STEP == 0
            check.sql("DELETE FROM turn_queue WHERE ticket IN (?, ?, ?)", (old_a, old_q, i1))
            await store._take_ticket("c1", "q", "me", lease_us)
            i2, head = await store._take_ticket("c1", "i2", "me", lease_us, first=True)
            i3, _ = await store._take_ticket("c1", "i3", "me", lease_us, first=True)
            assert (head, i2, i3) == (old_b, old_b + 1, old_b + 2)
            line = check.sql("SELECT request_id, first_in_line FROM turn_queue ORDER BY ticket")
            assert line == [("old-b", False), ("i2", True), ("i3", True), ("q", False)]
            assert await store.queue_head("c1") == "old-b"
        finally:
            await store.close()
            await check.close()


async def test_migrate_reports_what_it_applied() -> None:
    with postgres_database() as url:
        store = PostgresStore(url)
        assert await store.migrate() == [
            "0001_init",
            "0002_durable_turns",
            "0003_turn_leases",
            "0004_compactions",
            "0005_queue_order",
            "0006_history_versions",
            "0007_lease_epochs",
            "0008_turn_costs",
            "0009_budgets",
            "0010_turn_timelines",
            "0011_conversation_forks",
            "0012_schedules",
            "0013_webhooks",
            "0014_writer_versions",
            "0015_lean_reservations",
            "0016_budget_periods",
        ]
        assert await store.migrate() == []
        await store.close()


# ----------------------------------------------------------------------------- URLs and passwords


def test_open_store_parses_postgres_urls_lazily() -> None:
    store = open_store("postgresql://app:" + SECRET + "@db.internal:6543/turnwire", pool_size=3)
    assert isinstance(store, PostgresStore)
    assert store.display_url == "postgresql://app:***@db.internal:6543/turnwire"
    assert isinstance(open_store("postgres://app@db.internal/turnwire"), PostgresStore)
    assert SECRET not in repr(store._target)
    with pytest.raises(ValueError, match="pool_size"):
        open_store("postgresql://app@h/db", pool_size=0)


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://",
        "postgresql://u:" + SECRET + "@h:notaport/db",
        "postgresql://u:" + SECRET + "@h/db#frag",
    ],
)
def test_malformed_postgres_urls_are_value_errors_without_the_password(url: str) -> None:
    with pytest.raises(ValueError) as raised:
        open_store(url)
    assert SECRET not in str(raised.value)


def test_redact_url_masks_only_the_password() -> None:
    assert redact_url("postgresql://u:p%40ss@h:5432/db?sslmode=require") == (
        "postgresql://u:***@h:5432/db?sslmode=require"
    )
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert redact_url("sqlite:///turnwire.db") == "sqlite:///turnwire.db"


def test_password_env_names_the_variable_holding_the_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TEST_DB_PASSWORD", SECRET)
    store = open_store("postgresql://app@h/db", password_env="TW_TEST_DB_PASSWORD")
    assert isinstance(store, PostgresStore)
    assert store._target.password == SECRET
    assert SECRET not in store._target.conninfo
    monkeypatch.delenv("TW_TEST_DB_PASSWORD")
    with pytest.raises(ValueError, match="TW_TEST_DB_PASSWORD"):
        open_store("postgresql://app@h/db", password_env="TW_TEST_DB_PASSWORD")


def test_settings_accept_postgres_urls_pool_size_and_password_env() -> None:
    settings = load_settings(
        store={"url": "postgresql://app@h:5432/db", "pool_size": 4, "password_env": "DB_PW"}
    )
    assert (settings.store.url, settings.store.pool_size, settings.store.password_env) == (
        "postgresql://app@h:5432/db",
        4,
        "DB_PW",
    )
    assert load_settings().store.pool_size == 10
    with pytest.raises(ConfigError, match=r"store\.pool_size"):
        load_settings(store={"url": "postgresql://app@h/db", "pool_size": 0})
    with pytest.raises(ConfigError, match=r"store\.url"):
        load_settings(store={"url": "mysql://app@h/db"})


async def test_an_unreachable_server_is_a_store_error_that_never_shows_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    port = _closed_port()
    url = f"postgresql://app:{SECRET}@127.0.0.1:{port}/turnwire"
    store = PostgresStore(url)
    with pytest.raises(StoreError) as raised:
        await store.open()
    message = str(raised.value)
    assert message.startswith("postgres store: connecting failed"), message
    for address in (SECRET, "127.0.0.1", str(port)):  # no address, even for the operator
        assert address not in message, message
    assert raised.value.__cause__ is None  # the driver's exception (with its own text) is not chained
    with pytest.raises(StoreError, match="not open"):
        await store.get_conversation("c")


async def test_a_store_error_tells_a_client_nothing_of_the_stores_address(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32 item 3: the client's text of a store error names the operation, never the user,
    host, port or database (nor the driver's text, which names them); nor does the operator's (a
    log line names no store address: docs/operate/logs.md)."""
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "2")
    port = _closed_port()
    store = PostgresStore(f"postgresql://tenant_app:{SECRET}@127.0.0.1:{port}/orders_db")
    with pytest.raises(StoreError) as raised:
        await store.open()
    shown = raised.value.client_message
    assert shown.startswith("store unavailable: postgres store: connecting failed"), shown
    for part in ("tenant_app", "127.0.0.1", str(port), "orders_db", SECRET):
        assert part not in shown
    logged = str(raised.value)
    assert 'connection to server at "<host>", port <port> failed' in logged, logged
    for part in ("127.0.0.1", str(port), SECRET):
        assert part not in logged


async def test_a_value_the_database_refuses_is_the_callers_error(pg_url: str) -> None:
    """A NUL in a text value (refused by PostgreSQL, accepted by SQLite) is INVALID_ARGUMENT, not a
    retryable STORE_UNAVAILABLE (the API refuses the fields it knows before; this is the net)."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        with pytest.raises(StoreValueRefused) as raised:
            await store.start_turn(
                dataclasses.replace(_turn("r-nul", "c-nul"), model="scripted:a\x00b"), [_user("u1")]
            )
    finally:
        await store.close()
    error = raised.value
    assert (error.status_code, error.retryable) == (CanonicalCode.INVALID_ARGUMENT, False)
    assert "postgresql://" not in error.client_message and "start_turn" in error.client_message


async def test_a_closed_store_refuses_calls_and_cannot_reopen(pg_url: str) -> None:
    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(StoreError, match="not open"):
        await store.start_turn(_turn("r1", "c1"), [_user("u1")])
    with pytest.raises(StoreError, match="closed"):
        await store.open()


# ----------------------------------------------------------------------------- pool, concurrency


async def test_the_pool_is_bounded_and_serves_more_callers_than_connections(pg_url: str) -> None:
    store = PostgresStore(pg_url, pool_size=2)
    await store.open()
    try:
        assert store._pool is not None and store._pool.max_size == 2
        await asyncio.gather(
            *(store.start_turn(_turn(f"r{i}", f"c{i}"), [_user(f"u{i}")]) for i in range(20))
        )
        assert store._pool.get_stats()["pool_size"] <= 2
        assert len(await store.running_turns()) == 20
    finally:
        await store.close()


async def test_answers_through_separate_pools_complete_the_batch_exactly_once(pg_url: str) -> None:
    """Two stores (two pools, as two processes would have) answer the same calls at once: the
    conversation's row lock serializes them, so exactly one write completes the batch."""
    stores = [PostgresStore(pg_url, pool_size=4) for _ in range(2)]
    for store in stores:
        await store.open()
    try:
        for round_ in range(5):
            conversation = f"c{round_}"
            await stores[0].start_turn(_turn(f"r{round_}", conversation), [_user(f"u{round_}")])
            reply = message_pb2.Message(id=f"a{round_}", role=message_pb2.ROLE_ASSISTANT)
            for n in range(3):
                call = reply.parts.add().tool_call
                call.tool_call_id = f"call-{n}"
                call.tool_name = "client_tool"
                call.client_executed = True
                call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
            await stores[0].save_message(conversation, reply)
            attempts = [
                stores[i % 2].answer_tool_calls(
                    conversation,
                    [ToolCallAnswer(f"call-{i % 3}", "output", output_json=f'{{"n": {i}}}')],
                    expired_before=None,
                )
                for i in range(12)
            ]
            results = await asyncio.gather(*attempts, return_exceptions=True)
            answered = [r for r in results if not isinstance(r, BaseException)]
            refused = [r for r in results if isinstance(r, BaseException)]
            assert len(answered) == 3  # one per call
            assert all(isinstance(r, ToolCallNotPending) for r in refused)
            assert sum(r.completed for r in answered) == 1
            [stored] = [m for m in await stores[1].load_messages(conversation) if m.id == reply.id]
            assert all(
                p.tool_call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE for p in stored.parts
            )
    finally:
        for store in stores:
            await store.close()


async def test_concurrent_first_turns_of_one_new_conversation_keep_positions_gap_free(pg_url: str) -> None:
    stores = [PostgresStore(pg_url) for _ in range(3)]
    for store in stores:
        await store.open()
    try:
        await asyncio.gather(
            *(stores[i % 3].start_turn(_turn(f"r{i}", "new"), [_user(f"u{i}")]) for i in range(15))
        )
        check = StoreBackend("postgres", url=pg_url)
        seqs = [
            seq for (seq,) in check.sql("SELECT seq FROM messages WHERE conversation_id = 'new' ORDER BY seq")
        ]
        await check.close()
        assert seqs == list(range(1, 16))
        record = await stores[0].get_conversation("new")
        assert record is not None and record.message_count == 15
    finally:
        for store in stores:
            await store.close()


# ----------------------------------------------------------------------------- turnwire migrate


def test_turnwire_migrate_applies_pending_migrations_and_says_which(pg_url: str) -> None:
    runner = CliRunner()
    url = pg_url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")
    first = runner.invoke(cli.app, ["migrate", "--store-url", url])
    assert first.exit_code == 0, first.output
    assert first.output.splitlines()[:16] == [
        "applied 0001_init",
        "applied 0002_durable_turns",
        "applied 0003_turn_leases",
        "applied 0004_compactions",
        "applied 0005_queue_order",
        "applied 0006_history_versions",
        "applied 0007_lease_epochs",
        "applied 0008_turn_costs",
        "applied 0009_budgets",
        "applied 0010_turn_timelines",
        "applied 0011_conversation_forks",
        "applied 0012_schedules",
        "applied 0013_webhooks",
        "applied 0014_writer_versions",
        "applied 0015_lean_reservations",
        "applied 0016_budget_periods",
    ]
    assert "16 migration(s) applied" in first.output
    again = runner.invoke(cli.app, ["migrate", "--store-url", url])
    assert again.exit_code == 0, again.output
    assert "applied 0001" not in again.output and "0 migration(s) applied" in again.output
    assert SECRET not in first.output + again.output
    check = StoreBackend("postgres", url=pg_url)
    assert check.sql("SELECT COUNT(*) FROM schema_migrations") == [(16,)]
    asyncio.run(check.close())


def test_turnwire_migrate_reads_the_config_file_turnwire_config_names(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``serve`` does: a deploy job with the sidecar's environment migrates the configured
    PostgreSQL store. It migrated a new SQLite file in the working directory instead, and said
    the schema was current."""
    config = tmp_path / "turnwire.yaml"
    config.write_text(f"store:\n  url: {pg_url}\n")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.app, ["migrate"], env={"TURNWIRE_CONFIG": str(config)})
    assert result.exit_code == 0, result.output
    assert "16 migration(s) applied" in result.output and "sqlite" not in result.output
    assert not (tmp_path / "turnwire.db").exists()
    check = StoreBackend("postgres", url=pg_url)
    assert check.sql("SELECT COUNT(*) FROM schema_migrations") == [(16,)]
    asyncio.run(check.close())


async def test_a_database_never_reached_is_not_said_to_have_stopped_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``turnwire migrate`` (or a start) against a database that never answered printed "the
    database stopped answering; refusing work until it answers again" above its own error, as
    if a running replica had lost it."""
    with pytest.raises(StoreError, match="Connection refused"):
        await migrate_store(f"postgresql://app@127.0.0.1:{_closed_port()}/db")
    assert "stopped answering" not in caplog.text


def test_turnwire_migrate_fails_clearly_without_showing_the_password() -> None:
    runner = CliRunner()
    unreachable = runner.invoke(
        cli.app, ["migrate", "--store-url", f"postgresql://app:{SECRET}@127.0.0.1:{_closed_port()}/db"]
    )
    assert unreachable.exit_code == 1
    assert "cannot migrate postgresql://app:***@127.0.0.1:" in unreachable.output
    bad = runner.invoke(cli.app, ["migrate", "--store-url", f"mysql://app:{SECRET}@h/db"])
    assert bad.exit_code == 2
    assert "mysql://app:***@h/db" in bad.output
    assert SECRET not in unreachable.output + bad.output


# ----------------------------------------------------------------------------- one-flight admission


async def test_admissions_that_wait_in_line_leave_the_connection_usable(pg_url: str) -> None:
    """The one-flight admission of a turn with a turn ahead fails on the server and the turn
    waits in line; its connection is not reused. On one pooled connection, a dozen such
    admissions between ones that go through (psycopg prepares a statement on its sixth use, so
    some preparations fall in failed flights) are followed by writes and reads that work."""
    store = PostgresStore(pg_url, pool_size=1)
    await store.open()
    try:
        for index in range(12):
            assert await _one_behind_another(store, f"a{index}", f"b{index}") == [f"ua{index}", f"ub{index}"]
        assert len(await store.load_messages("c")) == 24
    finally:
        await store.close()


async def _one_behind_another(store: PostgresStore, first_id: str, second_id: str) -> list[str]:
    """Turn ``first_id`` is admitted on conversation ``c``; ``second_id`` is admitted while it holds
    the lock, and waits in line; both complete. The last two messages the second one's admission
    read."""
    queued: list[bool] = []
    holds, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        async with store.admit_turn(
            _turn(first_id, "c"),
            [_user(f"u{first_id}")],
            lease_seconds=30,
            read_compaction=True,
            queued=lambda _: None,
        ):
            holds.set()
            await release.wait()
        await store.finish_turn(dataclasses.replace(_turn(first_id, "c"), state="completed"), None)

    async def second() -> list[str]:
        async with store.admit_turn(
            _turn(second_id, "c"),
            [_user(f"u{second_id}")],
            lease_seconds=30,
            read_compaction=True,
            queued=queued.append,
        ) as admission:
            assert admission.history is not None
            history = [m.id for m in admission.history]
        await store.finish_turn(dataclasses.replace(_turn(second_id, "c"), state="completed"), None)
        return history[-2:]

    ahead = asyncio.create_task(first())
    await holds.wait()
    behind = asyncio.create_task(second())
    await wait_until(lambda: queued == [True], what="the second turn waits in line")
    release.set()
    await ahead
    return await behind


# ----------------------------------------------------------------------------- REJECT across replicas


@pytest.mark.parametrize("reject_first", [False, True], ids=["enqueue-first", "reject-first"])
async def test_a_reject_racing_another_replicas_turn_is_decided_under_the_queue_lock(
    pg_url: str, reject_first: bool
) -> None:
    """Two replicas admit a turn on one idle conversation at the same instant, one of them a
    REJECT (docs/semantics.md §5). A gate holds the conversation's queue lock while both wait
    for it, in a known order (PostgreSQL grants a lock's waiters first come, first served), then
    opens: the REJECT is refused iff the other's ticket committed first, naming it, and takes
    nothing; else it holds the line and the other waits behind it. Never both run."""
    import psycopg

    from turnwire_server.store.postgres.turn_queue import QUEUE_LOCK_CLASS

    replica_a, replica_b = PostgresStore(pg_url), PostgresStore(pg_url)
    await replica_a.open()
    await replica_b.open()
    check = StoreBackend("postgres", url=pg_url)
    holding, release = asyncio.Event(), asyncio.Event()

    async def enqueue() -> None:
        async with replica_a.turn_lock("c1", request_id="e", owner="a"):
            holding.set()
            await release.wait()

    def waiting_for_the_gate() -> int:
        rows = check.sql(  # this test's database only: other tests' run beside it on the same server
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        return int(rows[0][0])

    try:
        async with await psycopg.AsyncConnection.connect(pg_url, autocommit=True) as gate:
            async with gate.transaction():
                await gate.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (QUEUE_LOCK_CLASS, "c1"))
                tasks: list[asyncio.Future[object]] = []
                reject = replica_b.reserve_place("c1", "r", owner="b", lease_seconds=30, only_if_idle=True)
                for start in [reject, enqueue()] if reject_first else [enqueue(), reject]:
                    tasks.append(asyncio.ensure_future(start))
                    expected = len(tasks)
                    await wait_until(
                        lambda: waiting_for_the_gate() == expected,  # noqa: B023 (awaited here)
                        what="waiting for the gate",
                    )
            refused = await tasks[0 if reject_first else 1]

        def line() -> list[str]:
            return [row[0] for row in check.sql("SELECT request_id FROM turn_queue ORDER BY ticket")]

        if reject_first:
            assert refused is None  # taken: it heads the line, the other waits behind it
            await wait_until(lambda: line() == ["r", "e"], what="the other turn waits behind the REJECT")
            assert not holding.is_set()
            await replica_b.release_place("c1", "r")
            await asyncio.wait_for(holding.wait(), 10)
        else:
            await asyncio.wait_for(holding.wait(), 10)
            assert refused == "e"  # refused, naming the turn that holds the line
            assert line() == ["e"]  # the refused request took nothing
        release.set()
        await asyncio.gather(*tasks)
        assert check.sql("SELECT COUNT(*) FROM turn_queue") == [(0,)]
    finally:
        release.set()
        await replica_a.close()
        await replica_b.close()
        await check.close()


async def test_pooled_sessions_end_on_the_server_when_their_client_is_gone(pg_url: str) -> None:
    """Each pooled session carries the server's side of the timeouts (connection.py
    ``_IDLE_IN_TRANSACTION``, ``_SERVER_TCP``): a replica frozen inside a transaction, or whose
    route dropped, does not hold its row locks (a turn's, which another replica's claim skips)
    for the operating system's default of hours."""
    store = PostgresStore(pg_url)
    await store.open()
    try:
        pool = store._pool  # the pool's own configure callback ran on this connection
        assert pool is not None
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT current_setting('idle_in_transaction_session_timeout'),"
                " current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'),"
                " current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')"
            )
            settings = await cursor.fetchone()
    finally:
        await store.close()
    assert settings == ("5s", "5", "2", "3", "15000"), settings  # seconds, seconds, count, ms
