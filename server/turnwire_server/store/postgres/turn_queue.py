"""The statements of PostgreSQL's cross-replica turn queue (the rules:
:mod:`turnwire_server.store.postgres.replicas`): taking a ticket (in line, first in line, at the
head in the one-flight admission, or only on an idle conversation), finding the head, releasing
a ticket, a submission's ticket taken at acceptance and freed when it ends unclaimed, and taking
over a dead replica's tickets. :mod:`.admission` runs the turn lock's; the shared core's write
programs run the others as the dialect's statements
(:data:`~turnwire_server.store.postgres.db.DIALECT`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.sql import Statement
from turnwire_server.store.postgres.replicas import QUEUE_CHANNEL, SUBMISSIONS_CHANNEL
from turnwire_server.store.records import SubmissionRecord

__all__ = [
    "FIRST_SLOT",
    "HEAD",
    "QUEUE_LOCK_CLASS",
    "QUEUE_STEP",
    "RELEASE_OWN_PLACE",
    "RELEASE_PLACE",
    "RELEASE_TICKET",
    "TAKE_TICKET",
    "TAKE_TICKET_AT_HEAD",
    "TAKE_TICKET_IF_IDLE",
    "UNOWNED_LEASE",
    "free_unowned_tickets",
    "queue_submission",
    "take_over_tickets",
]

QUEUE_LOCK_CLASS: Final = 0x7471  # "tq"
"""First key of the advisory lock serializing the ticket takers of a conversation's turn queue
(second: ``hashtext(conversation_id)``); not the write lock, so taking a ticket never waits for a
commit of the conversation's running turn."""

UNOWNED_LEASE: Final = 1 << 62
"""The lease of the queue ticket of a submission no replica claimed yet: it never lapses, so the
submission keeps its place in line until a replica claims it (and the ticket gets its lease) or
it ends without running (and the ticket goes)."""

HEAD: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE conversation_id = %(c)s AND lease_until < %(stale)s)"
    " SELECT MIN(ticket) FROM turn_queue WHERE conversation_id = %(c)s AND lease_until >= %(stale)s"
)
"""Delete the conversation's tickets that lapsed before ``stale``; (the lowest live ticket)."""


RELEASE_TICKET: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE ticket = %s AND owner = %s) SELECT pg_notify(%s, %s)"
)
"""Delete a ticket its owner holds (a ticket taken over with its turn is the claimant's); wake the
line."""

RELEASE_PLACE: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE conversation_id = %s AND request_id = %s RETURNING 1)"
    " SELECT pg_notify(%s, %s) FROM (SELECT 1 FROM gone LIMIT 1) AS deleted"
)

RELEASE_OWN_PLACE: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE conversation_id = %s AND request_id = %s AND owner = %s"
    " RETURNING 1) SELECT pg_notify(%s, %s) FROM (SELECT 1 FROM gone LIMIT 1) AS deleted"
)
"""As :data:`RELEASE_PLACE`, only while its owner holds it: a ticket whose taking's answer was lost."""

TAKE_TICKET_IF_IDLE: Final = (
    # As TAKE_TICKET, but nothing is taken while the conversation has any live ticket (its own
    # request id's included: a turn running under that id elsewhere is not taken over):
    # (the request id heading the line, NULL when the ticket was taken).
    b"SET LOCAL synchronous_commit = off;"
    b" SELECT pg_advisory_xact_lock(%(lock)s, hashtext(%(c)s));"
    b" WITH head AS (SELECT request_id FROM turn_queue WHERE conversation_id = %(c)s"
    b" AND lease_until >= %(stale)s ORDER BY ticket LIMIT 1),"
    b" new AS ("
    b" INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
    b" SELECT %(c)s, %(r)s, %(owner)s, %(until)s WHERE NOT EXISTS (SELECT 1 FROM head)"
    b" RETURNING ticket),"
    b" gone AS (DELETE FROM turn_queue WHERE conversation_id = %(c)s AND lease_until < %(stale)s)"
    b" SELECT (SELECT request_id FROM head)"
)
"""Take a ticket only on an idle conversation; (the head's request id, or NULL)."""


TAKE_TICKET_AT_HEAD: Final = (
    # As TAKE_TICKET (under the queue lock the caller took), but failing the transaction (a cast
    # no text passes) unless the ticket heads the queue: a turn with turns ahead stores nothing
    # and takes no ticket in the one-flight admission.
    b"WITH old AS ("
    b" UPDATE turn_queue SET owner = %(owner)s, lease_until = %(until)s"
    b" WHERE conversation_id = %(c)s AND request_id = %(r)s AND request_id <> '' RETURNING ticket),"
    b" new AS ("
    b" INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
    b" SELECT %(c)s, %(r)s, %(owner)s, %(until)s WHERE NOT EXISTS (SELECT 1 FROM old)"
    b" RETURNING ticket),"
    b" gone AS (DELETE FROM turn_queue WHERE conversation_id = %(c)s AND lease_until < %(stale)s"
    b" AND request_id <> %(r)s),"
    b" mine AS (SELECT ticket FROM old UNION ALL SELECT ticket FROM new),"
    b" earliest AS (SELECT MIN(ticket) AS ticket FROM turn_queue"
    b" WHERE conversation_id = %(c)s AND lease_until >= %(stale)s)"
    b" SELECT CASE WHEN earliest.ticket IS NULL OR earliest.ticket >= mine.ticket THEN mine.ticket"
    b" ELSE ('turnwire: queued behind ticket ' || earliest.ticket)::bigint END"
    b" FROM mine, earliest"
)
"""Take or re-own a ticket that heads the queue; (the ticket). Fails behind a live ticket."""

QUEUE_STEP: Final = 65536
"""The step of the ticket sequence (migration 0005): plain tickets are multiples of it, and the
numbers between two are left for tickets taken first in line, right behind the head's."""

FIRST_SLOT: Final = (
    # The number after the head and the tickets taken first in line behind it (lapsed ones too,
    # so no number is taken twice), when that stays within the head's block: the head is a plain
    # ticket of this schema (a multiple of the step) or itself taken first; else none (the ticket
    # then queues at the back). No other conversation ever takes a number inside that block.
    b" head AS (SELECT ticket, first_in_line FROM turn_queue"
    b" WHERE conversation_id = %(c)s AND lease_until >= %(stale)s ORDER BY ticket LIMIT 1),"
    b" slot AS (SELECT MAX(q.ticket) + 1 AS ticket FROM turn_queue AS q, head"
    b" WHERE q.conversation_id = %(c)s AND q.ticket >= head.ticket"
    b" AND (q.ticket = head.ticket OR q.first_in_line)),"
    b" jump AS (SELECT slot.ticket FROM slot, head WHERE %(first)s"
    b" AND (mod(head.ticket, " + str(QUEUE_STEP).encode() + b") = 0 OR head.first_in_line)"
    b" AND mod(slot.ticket, " + str(QUEUE_STEP).encode() + b") <> 0"
    b" AND NOT EXISTS (SELECT 1 FROM turn_queue WHERE ticket = slot.ticket)),"
)

TAKE_TICKET: Final = (
    # No WAL flush of its own: the ticket is visible to the other replicas at commit, and the
    # turn's start_turn commit (which flushes the WAL up to itself) makes it durable before
    # anything is sent to the client; a database crash before that loses the turn anyway.
    b"SET LOCAL synchronous_commit = off;"
    b" SELECT pg_advisory_xact_lock(%(lock)s, hashtext(%(c)s));"
    b" WITH" + FIRST_SLOT + b" old AS ("
    # A re-owned ticket (a submission's place) taken first moves up to the slot when it is ahead.
    b" UPDATE turn_queue SET owner = %(owner)s, lease_until = %(until)s,"
    b" ticket = LEAST(turn_queue.ticket, COALESCE((SELECT ticket FROM jump), turn_queue.ticket)),"
    b" first_in_line = turn_queue.first_in_line"
    b" OR turn_queue.ticket > COALESCE((SELECT ticket FROM jump), turn_queue.ticket)"
    b" WHERE conversation_id = %(c)s AND request_id = %(r)s AND request_id <> '' RETURNING ticket),"
    b" jumped AS ("
    b" INSERT INTO turn_queue (ticket, conversation_id, request_id, owner, lease_until, first_in_line)"
    b" SELECT jump.ticket, %(c)s, %(r)s, %(owner)s, %(until)s, true FROM jump"
    b" WHERE NOT EXISTS (SELECT 1 FROM old) RETURNING ticket),"
    b" new AS ("
    b" INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
    b" SELECT %(c)s, %(r)s, %(owner)s, %(until)s"
    b" WHERE NOT EXISTS (SELECT 1 FROM old) AND NOT EXISTS (SELECT 1 FROM jump)"
    b" RETURNING ticket),"
    b" gone AS (DELETE FROM turn_queue WHERE conversation_id = %(c)s AND lease_until < %(stale)s"
    b" AND request_id <> %(r)s)"
    b" SELECT (SELECT ticket FROM old UNION ALL SELECT ticket FROM jumped UNION ALL SELECT ticket FROM new),"
    b" (SELECT MIN(ticket) FROM turn_queue"
    b" WHERE conversation_id = %(c)s AND lease_until >= %(stale)s)"
)
"""Take or re-own a ticket (``first``: right behind the head and the tickets taken first before
it, when the head's block has room), drop lapsed ones; (the ticket, the lowest live ticket
before it)."""


def take_over_tickets(request_ids: Sequence[str], owner: str, until_us: int) -> list[Statement]:
    """The queue tickets of turns (or submissions) taken over from a dead replica become
    ``owner``'s, so the recovered work keeps its place in line (first in, first out)."""
    return [
        Statement(
            "UPDATE turn_queue SET owner = %s, lease_until = %s WHERE request_id = ANY(%s)",
            (owner, until_us, list(request_ids)),
        )
    ]


def queue_submission(submission: SubmissionRecord) -> list[Statement]:
    """The new ``submission``'s place in its conversation's turn queue, taken in the transaction
    that accepts it: first in, first out by acceptance whichever replica later runs it (that
    one's turn lock takes this ticket over). A place reserved for it already
    (``Store.reserve_place``: a REJECT submission) is kept, with its owner. Replicas with a free
    slot are woken to claim an unowned one (delivered at commit)."""
    lease_until = submission.lease_until
    statements = [
        Statement(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (QUEUE_LOCK_CLASS, submission.conversation_id)
        ),
        Statement(
            "WITH old AS (UPDATE turn_queue SET owner = %(o)s, lease_until = %(l)s"
            " WHERE conversation_id = %(c)s AND request_id = %(r)s RETURNING 1)"
            " INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
            " SELECT %(c)s, %(r)s, %(o)s, %(l)s WHERE NOT EXISTS (SELECT 1 FROM old)",
            {
                "c": submission.conversation_id,
                "r": submission.submission_id,
                "o": submission.owner,
                "l": UNOWNED_LEASE if lease_until is None else to_us(lease_until, "lease_until"),
            },
        ),
    ]
    if not submission.owner:
        statements.append(Statement("SELECT pg_notify(%s, '')", (SUBMISSIONS_CHANNEL,)))
    return statements


def free_unowned_tickets(submission_ids: Sequence[str]) -> list[Statement]:
    """Delete the unclaimed queue tickets of submissions that ended without running; wake the line."""
    if not submission_ids:
        return []
    return [
        Statement(
            "WITH gone AS (DELETE FROM turn_queue WHERE request_id = ANY(%s) AND owner = ''"
            " RETURNING conversation_id) SELECT pg_notify(%s, conversation_id) FROM gone",
            (list(submission_ids), QUEUE_CHANNEL),
        )
    ]
