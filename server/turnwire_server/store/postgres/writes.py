"""The PostgreSQL store's writes not yet moved into the shared core (``start_turn``, the
transcript's and tool calls' writes are there: :mod:`turnwire_server.store.core.turn_writes`,
:mod:`~turnwire_server.store.core.transcript_writes`): the same rules as the SQLite driver's
(:mod:`turnwire_server.store.sqlite.writes`, ``.streams``, ``.submissions``), statement for
statement where it can be.

Each function here runs inside ONE transaction the caller opened (``conn.transaction()``) and
raises to roll it back (the domain errors of :mod:`turnwire_server.store.base`, or a
``psycopg`` error). ``now_us`` is the write's time, µs since the epoch.

Concurrency: SQLite applies writes one at a time; here several connections write at once, so every
write that reads and then changes a conversation first takes the conversation's lock with
:func:`~turnwire_server.store.postgres.db.lock_conversation` (a transaction-level advisory lock on
the id, then ``SELECT … FOR UPDATE`` of its row). Writers of one conversation therefore serialize
and each sees what the previous one committed (READ COMMITTED: every statement reads the latest
commits), which is what makes ``answer_tool_calls`` complete a batch exactly once and keeps message
positions gap-free. :func:`create_submission` serializes on one global advisory lock (acceptance
order ``seq`` is global, as in SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from turnwire_server.store.base import (
    SubmissionRecord,
)
from turnwire_server.store.core.rows import (
    to_us,
)
from turnwire_server.store.core.sql import just
from turnwire_server.store.core.turn_writes import (
    StartTurn,
    StartTurnPlan,
    start_turn_writes,
)
from turnwire_server.store.postgres.db import (
    CONVERSATION_LOCK_CLASS,
    DIALECT,
    Conn,
    lock_conversation,
    run,
    run_program,
    send_conversation_lock,
)

__all__ = [
    "CONVERSATION_LOCK_CLASS",
    "SUBMISSIONS_LOCK_KEY",
    "Conn",
    "free_unowned_tickets",
    "lock_conversation",
    "lock_submissions",
    "queue_submission",
    "start_new_turn",
]

SUBMISSIONS_LOCK_KEY: Final = 0x7475726E_73756273  # "turnsubs"
"""The advisory lock key serializing :func:`create_submission` (global acceptance order)."""

QUEUE_LOCK_CLASS: Final = 0x7471  # "tq"
"""First key of the advisory lock serializing the ticket takers of a conversation's turn queue
(second: ``hashtext(conversation_id)``); not the write lock, so taking a ticket never waits for a
commit of the conversation's running turn."""

UNOWNED_LEASE: Final = 1 << 62
"""The lease of the queue ticket of a submission no replica claimed yet: it never lapses, so the
submission keeps its place in line until a replica claims it (and the ticket gets its lease) or
it ends without running (and the ticket goes)."""

_FREE_UNOWNED_TICKETS: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE request_id = ANY(%s) AND owner = ''"
    " RETURNING conversation_id) SELECT pg_notify('turnwire_queue', conversation_id) FROM gone"
)
"""Delete the unclaimed tickets of submissions that end without running; wake the line."""

_OPEN: Final = ("pending", "running")


# --------------------------------------------------------------------------- helpers


async def _turn_recorded(conn: Conn, request_id: str) -> Any:
    """A cursor whose one row says whether turn ``request_id`` is recorded (not yet fetched)."""
    return await conn.execute(b"SELECT EXISTS (SELECT 1 FROM turns WHERE request_id = %s)", (request_id,))


# --------------------------------------------------------------------------- turns


_SUBMISSION_NOT_PENDING: Final = (
    # Fails the transaction (a cast no text passes) when the turn is a submission that is no
    # longer pending: nothing is written and the caller starts the turn the checking way.
    "SELECT ('turnwire: submission ' || id || ' is ' || state)::int FROM submissions"
    " WHERE id = %s AND state NOT IN ('pending', 'running')"
)


async def start_new_turn(conn: Conn, start: StartTurn, now_us: int) -> None:
    """``Store.start_turn`` for the common case, without a read to wait for: a new request id
    whose messages are all new, so the plan is known before anything is read (the shared
    :func:`~turnwire_server.store.core.turn_writes.start_turn_writes`). Writes only; meant for
    pipeline mode (nothing waits for the server). The uncommon cases make the transaction fail
    instead of deciding: a request id already recorded or a message id already stored (a
    retry, a re-sent message) by their primary keys (``UniqueViolation``), a submission no
    longer pending by :data:`_SUBMISSION_NOT_PENDING` (``InvalidTextRepresentation``); the
    caller rolls back and runs the shared :func:`~turnwire_server.store.core.turn_writes.start_turn`,
    which applies their rules."""
    await send_conversation_lock(conn, start.turn.conversation_id)
    await run(conn, _SUBMISSION_NOT_PENDING, (start.turn.request_id,))
    plan = StartTurnPlan(new_rows=start.rows, replace_earlier=False, submission_running=True)
    await run_program(conn, just(start_turn_writes(start, plan, DIALECT, now_us)))


# --------------------------------------------------------------------------- submissions


async def lock_submissions(conn: Conn) -> None:
    """Take the global submissions lock for the rest of the transaction: creations serialize, so
    concurrent duplicates create one and ``seq`` follows acceptance."""
    await conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (SUBMISSIONS_LOCK_KEY,))


async def queue_submission(conn: Conn, submission: SubmissionRecord) -> None:
    """The new ``submission``'s place in its conversation's turn queue, taken now: first in,
    first out by acceptance whichever replica later runs it (that one's turn lock takes this
    ticket over). A place reserved for it already (``Store.reserve_place``: a REJECT submission)
    is kept, with its owner. Replicas with a free slot are woken to claim an unowned one
    (delivered at commit)."""
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (QUEUE_LOCK_CLASS, submission.conversation_id)
    )
    await run(
        conn,
        "WITH old AS (UPDATE turn_queue SET owner = %(o)s, lease_until = %(l)s"
        " WHERE conversation_id = %(c)s AND request_id = %(r)s RETURNING 1)"
        " INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
        " SELECT %(c)s, %(r)s, %(o)s, %(l)s WHERE NOT EXISTS (SELECT 1 FROM old)",
        {
            "c": submission.conversation_id,
            "r": submission.submission_id,
            "o": submission.owner,
            "l": UNOWNED_LEASE
            if submission.lease_until is None
            else to_us(submission.lease_until, "lease_until"),
        },
    )
    if not submission.owner:
        await run(conn, "SELECT pg_notify('turnwire_submissions', '')")


async def free_unowned_tickets(conn: Conn, submission_ids: Sequence[str]) -> None:
    """Delete the unclaimed queue tickets of submissions that ended without running; wake the line."""
    await run(conn, _FREE_UNOWNED_TICKETS, (list(submission_ids),))
