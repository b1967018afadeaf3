"""The store's reads written once: each driver's store class inherits :class:`CoreReads` and gives
it :meth:`CoreReads._read`, one statement's rows on the driver's read connection (SQLite's
read-only reader, a pooled PostgreSQL connection). The statements are in the SQL both dialects
accept, with ``?`` placeholders (see :mod:`turnwire_server.store.core.sql`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, Final

from turnwire.types import Cost
from turnwire_client.v1 import message_pb2
from turnwire_server.store.core.budget_writes import read_spends, spends_from_rows
from turnwire_server.store.core.fork_rules import DESCENDANTS_SQL
from turnwire_server.store.core.message_cache import DecodedMessages
from turnwire_server.store.core.page_tokens import (
    decode_page_token,
    decode_turn_token,
    encode_page_token,
    encode_turn_token,
)
from turnwire_server.store.core.partial_replies import (
    partial_replies_of,
    partial_replies_sql,
    turns_without_reply_sql,
)
from turnwire_server.store.core.rows import (
    COMPACTION_COLUMNS,
    CONVERSATION_COLUMNS,
    TURN_COLUMNS,
    TURN_LISTING_COLUMNS,
    compaction_from_row,
    conversation_from_row,
    to_us,
    turn_from_row,
)
from turnwire_server.store.core.stream_rows import STREAM_COLUMNS, events_from_rows, stream_from_row
from turnwire_server.store.core.submission_rows import (
    PREFIX_FILTER,
    SUBMISSION_COLUMNS,
    submission_from_row,
    submission_page,
    submission_page_query,
)
from turnwire_server.store.records import (
    BudgetKey,
    BudgetSpend,
    CompactionRecord,
    ConversationRecord,
    ConversationView,
    StreamRecord,
    SubmissionRecord,
    TurnRecord,
)

__all__ = ["LOAD_COMPACTION_SQL", "CoreReads"]

LOAD_COMPACTION_SQL: Final = f"SELECT {COMPACTION_COLUMNS} FROM compactions WHERE conversation_id = ?"
"""A conversation's compaction row (:func:`compaction_from_row`)."""

_PARTIAL_REPLIES_SQL: Final = partial_replies_sql("?")
_TURNS_WITHOUT_REPLY_SQL: Final = turns_without_reply_sql("?")
_CONVERSATION_SQL: Final = f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?"
_FAILED_STATES: Final = "('error', 'aborted', 'interrupted')"
_CONVERSATION_COST_SQL: Final = (
    "SELECT cost_source, SUM(cost_usd), COUNT(*) - COUNT(cost_usd) FROM turns"
    " WHERE conversation_id = ? AND state <> 'running'"
    " GROUP BY cost_source ORDER BY MIN(start_time), MIN(request_id)"
)
"""The conversation's ended turns' cost summed by the database, one row per distinct
``cost_source``, in the order of the first turn that names it (turns of a conversation start at
distinct times; ``MIN(request_id)`` only makes a tie's order stable): a read of a long conversation
sends a few rows, not one per turn (GetConversation, the doors' follow-ups)."""


def _cost_of(rows: Sequence[Any]) -> Cost | None:
    """The conversation's cost of :data:`_CONVERSATION_COST_SQL`'s rows (``ConversationView.cost``):
    None when no turn ended or one's cost is unknown."""
    if not rows or any(unknown for _, _, unknown in rows):
        return None
    sources = dict.fromkeys(part for source, _, _ in rows if source for part in source.split(", "))
    return Cost(sum(usd for _, usd, _ in rows), ", ".join(sources))


class CoreReads:
    """The reads of :class:`~turnwire_server.store.base.Store` that only select and decode."""

    _store_name: str
    """``"sqlite"`` or ``"postgres"``, for messages (``"{name} store: …"``)."""

    _text_holds_nul: bool = True
    """Whether a TEXT column can hold NUL (PostgreSQL's cannot: a parameter with one is refused,
    so :meth:`list_conversations` must not send a forged page token's NUL)."""

    _decoded: DecodedMessages
    """The conversations' messages decoded last (:meth:`load_messages`)."""

    async def _read(self, what: str, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of ``sql`` (``?`` placeholders); raises :class:`StoreError` naming ``what``."""
        raise NotImplementedError

    async def _read_together(
        self, what: str, statements: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[Any]]:
        """Each of ``statements``' rows (``?`` placeholders), all read on one snapshot; raises
        :class:`StoreError` naming ``what``."""
        raise NotImplementedError

    async def list_conversations(
        self, page_size: int, page_token: str, *, id_prefix: str = ""
    ) -> tuple[list[ConversationRecord], str]:
        """Up to ``page_size`` (>= 1) conversations, most recently updated first, of ids
        starting with ``id_prefix`` (all when "").

        Ties on update time are ordered by id, descending. Returns the records
        and the token of the next page ("" on the last page); pass "" for the
        first page. Pagination is by key, so a conversation updated between
        pages moves to the front and is not seen again. Raises
        :class:`InvalidPageToken` for a token this store did not issue and
        :class:`ValueError` when ``page_size`` < 1.
        """
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        columns = f"SELECT {CONVERSATION_COLUMNS} FROM conversations"
        order = " ORDER BY update_time DESC, id DESC LIMIT ?"
        where: list[str] = []
        params: list[object] = []
        if page_token:
            update_us, after_id = decode_page_token(page_token, id_prefix)
            # Where TEXT cannot hold NUL, no stored id does: for a (forged) token id p + NUL +
            # rest, the stored ids below it in code-point order are exactly those <= p.
            prefix, nul, _ = after_id.partition("\x00")
            if nul and not self._text_holds_nul:
                where.append("(update_time < ? OR (update_time = ? AND id <= ?))")
                params.extend((update_us, update_us, prefix))
            else:
                where.append("(update_time, id) < (?, ?)")
                params.extend((update_us, after_id))
        if id_prefix:
            where.append(PREFIX_FILTER.format(column="id", mark="?"))
            params.extend((len(id_prefix), id_prefix))
        sql = columns + (" WHERE " + " AND ".join(where) if where else "") + order
        rows = await self._read("list_conversations", sql, (*params, page_size + 1))
        records = [conversation_from_row(row) for row in rows[:page_size]]
        next_token = ""
        if len(rows) > page_size:
            last = rows[page_size - 1]
            next_token = encode_page_token(last[2], last[0], id_prefix)
        return records, next_token

    async def load_messages(self, conversation_id: str) -> Sequence[message_pb2.Message]:
        """All messages of the conversation in append order ([] when none or no conversation).
        Raises :class:`StoreCorrupted` for a message that cannot be decoded."""
        read = self._decoded.read(conversation_id)
        rows = await self._read("load_messages", read.sql, read.params)
        return self._decoded.messages(read, rows)

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (times tz-aware UTC), or ``None`` when it does not exist."""
        rows = await self._read("get_conversation", _CONVERSATION_SQL, (conversation_id,))
        return conversation_from_row(rows[0]) if rows else None

    async def fork_descendants(self, conversation_id: str) -> list[str]:
        """See :meth:`~turnwire_server.store.maintenance.MaintenanceStore.fork_descendants`."""
        rows = await self._read("fork_descendants", DESCENDANTS_SQL, (conversation_id,))
        return sorted(row[0] for row in rows)

    async def budget_spends(self, keys: Sequence[BudgetKey]) -> dict[BudgetKey, BudgetSpend]:
        """See :meth:`~turnwire_server.store.budgets.BudgetStore.budget_spends`."""
        if not keys:
            return {}
        sql, params = read_spends(keys)
        return spends_from_rows(await self._read("budget_spends", sql, params))

    async def conversation_view(self, conversation_id: str, unreplied_limit: int) -> ConversationView | None:
        """See :meth:`~turnwire_server.store.transcripts.TranscriptStore.conversation_view`."""
        if unreplied_limit < 1:
            raise ValueError(f"unreplied_limit must be >= 1, got {unreplied_limit}")
        read = self._decoded.read(conversation_id)
        found, messages, partial, unreplied, costs = await self._read_together(
            "conversation_view",
            [
                (_CONVERSATION_SQL, (conversation_id,)),
                (read.sql, read.params),
                (_PARTIAL_REPLIES_SQL, (conversation_id,)),
                (_TURNS_WITHOUT_REPLY_SQL, (conversation_id, unreplied_limit)),
                (_CONVERSATION_COST_SQL, (conversation_id,)),
            ],
        )
        if not found:
            return None
        return ConversationView(
            record=conversation_from_row(found[0]),
            messages=self._decoded.messages(read, messages),
            partial_replies=partial_replies_of(partial),
            turns_without_reply=[turn_from_row(row) for row in reversed(unreplied)],
            cost=_cost_of(costs),
        )

    async def list_turns(
        self, conversation_id: str, page_size: int, page_token: str, *, failed_only: bool = False
    ) -> tuple[list[TurnRecord], str]:
        """See :meth:`~turnwire_server.store.transcripts.TranscriptStore.list_turns`."""
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        where = ["conversation_id = ?"]
        params: list[object] = [conversation_id]
        if failed_only:
            where.append(f"state IN {_FAILED_STATES}")
        if page_token:
            start_us, after_id = decode_turn_token(page_token, conversation_id, failed_only)
            where.append("(start_time < ? OR (start_time = ? AND request_id < ?))")
            params.extend((start_us, start_us, after_id))
        sql = (
            f"SELECT {TURN_LISTING_COLUMNS} FROM turns WHERE {' AND '.join(where)}"
            " ORDER BY start_time DESC, request_id DESC LIMIT ?"
        )
        rows = await self._read("list_turns", sql, (*params, page_size + 1))
        turns = [turn_from_row(row) for row in rows[:page_size]]
        token = ""
        if len(rows) > page_size:
            last = turns[-1]
            token = encode_turn_token(
                to_us(last.start_time, "start_time"), last.request_id, conversation_id, failed_only
            )
        return turns, token

    async def load_compaction(self, conversation_id: str) -> CompactionRecord | None:
        """The conversation's compaction, None when none. Raises :class:`StoreCorrupted`."""
        rows = await self._read("load_compaction", LOAD_COMPACTION_SQL, (conversation_id,))
        return compaction_from_row(rows[0]) if rows else None

    async def running_turns(self) -> list[TurnRecord]:
        """Turns whose state is ``running``, oldest start first."""
        rows = await self._read(
            "running_turns",
            f"SELECT {TURN_COLUMNS} FROM turns WHERE state = 'running' ORDER BY start_time, request_id",
            (),
        )
        return [turn_from_row(row) for row in rows]

    async def ended_turns_marked(
        self, mark: str, since: dt.datetime, limit: int, after: tuple[dt.datetime, str] | None = None
    ) -> list[TurnRecord]:
        """Up to ``limit`` (>= 1) ended turns whose conversation id contains ``mark`` and whose
        stream ended at or after ``since`` with its events kept, oldest end first (ties by
        request id), after the turn ``after`` (its end time and request id; None: from the
        start). Served by the ``turn_streams_by_end`` index. Raises :class:`ValueError` for a
        ``mark`` with a LIKE wildcard (``%``, ``_``) or ``limit`` < 1."""
        if not mark or "%" in mark or "_" in mark or "\\" in mark:
            raise ValueError(f"mark must be a non-empty string without %, _ or \\, got {mark!r}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        after_us, after_id = (to_us(after[0], "after"), after[1]) if after is not None else (-1, "")
        rows = await self._read(
            "ended_turns_marked",
            f"SELECT {TURN_COLUMNS} FROM turns WHERE request_id IN ("
            " SELECT request_id FROM turn_streams WHERE end_time IS NOT NULL AND events_expired = 0"
            " AND end_time >= ? AND conversation_id LIKE ?)"
            " AND state <> 'running' AND end_time IS NOT NULL"
            " AND (end_time > ? OR (end_time = ? AND request_id > ?))"
            " ORDER BY end_time, request_id LIMIT ?",
            (to_us(since, "since"), f"%{mark}%", after_us, after_us, after_id, limit),
        )
        return [turn_from_row(row) for row in rows]

    async def get_turn(self, request_id: str) -> TurnRecord | None:
        """The turn recorded under ``request_id``, or None."""
        rows = await self._read(
            "get_turn", f"SELECT {TURN_COLUMNS} FROM turns WHERE request_id = ?", (request_id,)
        )
        return turn_from_row(rows[0]) if rows else None

    async def get_stream(self, request_id: str) -> StreamRecord | None:
        """The stored stream of ``request_id``, or None."""
        rows = await self._read(
            "get_stream", f"SELECT {STREAM_COLUMNS} FROM turn_streams WHERE request_id = ?", (request_id,)
        )
        return stream_from_row(rows[0]) if rows else None

    async def load_events(self, request_id: str, after: int, before: int | None = None) -> list[bytes]:
        """Serialized events of ``request_id`` with ``after < sequence_number < before``, in order.
        Raises :class:`StoreCorrupted` for a stored batch that cannot be read back."""
        rows = await self._read(
            "load_events",
            "SELECT data FROM turn_events WHERE request_id = ? AND last_sequence_number > ?"
            " AND first_sequence_number < ? ORDER BY first_sequence_number",
            (request_id, after, (1 << 62) if before is None else before),
        )
        return events_from_rows(rows, request_id, after, before, self._store_name)

    async def get_submission(self, submission_id: str) -> SubmissionRecord | None:
        """The submission, or None."""
        rows = await self._read(
            "get_submission", f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE id = ?", (submission_id,)
        )
        return submission_from_row(rows[0]) if rows else None

    async def list_submissions(
        self,
        page_size: int,
        page_token: str,
        *,
        conversation_id: str = "",
        state: str = "",
        id_prefix: str = "",
    ) -> tuple[list[SubmissionRecord], str]:
        """Up to ``page_size`` (>= 1) submissions in acceptance order, filtered; the next token.
        Raises :class:`InvalidPageToken` for a token not issued for these filters."""
        sql, params = submission_page_query(
            page_size, page_token, conversation_id, state, mark="?", id_prefix=id_prefix
        )
        rows = await self._read("list_submissions", sql, params)
        return submission_page(rows, page_size, conversation_id, state, id_prefix)

    async def expired_conversations(self, before: dt.datetime, limit: int) -> list[str]:
        """Up to ``limit`` (>= 1) ids of conversations updated before ``before`` with no running
        turn, least recently updated first."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        rows = await self._read(
            "expired_conversations",
            "SELECT c.id FROM conversations AS c WHERE c.update_time < ? AND NOT EXISTS"
            " (SELECT 1 FROM turns AS t WHERE t.conversation_id = c.id AND t.state = 'running')"
            " ORDER BY c.update_time, c.id LIMIT ?",
            (to_us(before, "before"), limit),
        )
        return [row[0] for row in rows]
