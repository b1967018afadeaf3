"""The PostgreSQL store's writes: each runs the shared core's program
(:mod:`turnwire_server.store.core`) in one transaction, and adds what only this driver has: the
cross-replica queue tickets of submissions (:mod:`.turn_queue`), the ``NOTIFY`` that wakes
readers following a turn from another replica, and the global lock that orders acceptance.

How each write commits is this driver's choice: a transaction of its own, applied in call order
per conversation (:meth:`PostgresConnection._write`), or the group commit for the hot ones
(checkpoints, event batches, turn ends: :meth:`PostgresConnection._write_batched`). Starting a
turn is :mod:`.admission`'s (it comes with the turn's ticket).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Final

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    CompactionRecord,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
    TurnRecord,
)
from turnwire_server.store.core import (
    compaction_writes,
    message_writes,
    retention_writes,
    stream_writes,
    submission_writes,
    transcript_writes,
)
from turnwire_server.store.core.rows import compaction_params, to_us
from turnwire_server.store.postgres import turn_queue
from turnwire_server.store.postgres.connection import PostgresConnection
from turnwire_server.store.postgres.db import DIALECT, Conn, run_program
from turnwire_server.store.postgres.replicas import EVENTS_CHANNEL

__all__ = ["SUBMISSIONS_LOCK_KEY", "Writes"]

SUBMISSIONS_LOCK_KEY: Final = 0x7475726E_73756273  # "turnsubs"
"""The advisory lock key serializing submission creations: concurrent duplicates create one,
and ``seq`` (acceptance order) is global, as in SQLite."""


class Writes(PostgresConnection):
    """The store's writes (the contracts: :mod:`turnwire_server.store.base`)."""

    async def save_message(
        self, conversation_id: str, message: message_pb2.Message, *, turn_request_id: str = ""
    ) -> None:
        row = message_writes.prepare_save_message(message)
        if row is None:
            return
        await self._write_batched(
            f"save_message({conversation_id!r}, {message.id!r})",
            lambda conn, now_us: run_program(
                conn, message_writes.save_message(conversation_id, row, turn_request_id, DIALECT, now_us)
            ),
            conversation_id=conversation_id,
        )

    async def finish_turn(self, turn: TurnRecord, message: message_pb2.Message | None) -> None:
        finish = message_writes.prepare_finish_turn(turn, message)
        # Group-committed with the checkpoints and event batches queued meanwhile (as SQLite's
        # writer does): the turn waits for this commit before its TurnEnd, but shares it.
        await self._write_batched(
            f"finish_turn({turn.request_id!r})",
            lambda conn, now_us: run_program(conn, message_writes.finish_turn(finish, DIALECT, now_us)),
            conversation_id=turn.conversation_id,
        )

    async def discard_reply(self, turn: TurnRecord, message_id: str) -> None:
        await self._write(
            f"discard_reply({turn.request_id!r})",
            lambda conn, now_us: run_program(
                conn, compaction_writes.discard_reply(turn, message_id, DIALECT, now_us)
            ),
            conversation_id=turn.conversation_id,
        )

    async def roll_back_turn(self, turn: TurnRecord, message_ids: Sequence[str]) -> None:
        finish, ids = message_writes.prepare_roll_back(turn, message_ids)
        await self._write(
            f"roll_back_turn({turn.request_id!r})",
            lambda conn, now_us: run_program(
                conn, message_writes.roll_back_turn(finish, ids, DIALECT, now_us)
            ),
            conversation_id=turn.conversation_id,
        )

    async def save_compaction(self, record: CompactionRecord) -> None:
        params = compaction_params(record)  # invalid values fail here, before a connection is taken
        await self._write(
            f"save_compaction({record.conversation_id!r})",
            lambda conn, _: run_program(
                conn, compaction_writes.save_compaction(record.conversation_id, params)
            ),
            conversation_id=record.conversation_id,
        )

    # ------------------------------------------------------------------ event streams

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
    ) -> None:
        """Group-committed, the stream's end too (its turn waits for it, but shares the commit);
        readers following the turn from another replica are woken at commit."""
        batch = stream_writes.prepare_events(events, ended=ended)

        async def append(conn: Conn, now_us: int) -> None:
            program = stream_writes.append_events(conversation_id, request_id, batch, DIALECT, now_us)
            if await run_program(conn, program):
                await conn.execute(b"SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, request_id))

        await self._write_batched(f"append_events({request_id!r})", append, conversation_id=conversation_id)

    # ------------------------------------------------------------------ submissions

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        """Under a global advisory lock (acceptance order); a new submission's queue ticket is
        taken in the same transaction (:func:`.turn_queue.queue_submission`)."""
        submission_writes.check_new(submission)

        async def create(conn: Conn, now_us: int) -> tuple[SubmissionRecord, bool]:
            await conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (SUBMISSIONS_LOCK_KEY,))
            record, created = await run_program(
                conn, submission_writes.create_submission(submission, max_open)
            )
            if created:
                await turn_queue.queue_submission(conn, submission)
            return record, created

        return await self._write(f"create_submission({submission.submission_id!r})", create)

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        """An ended submission's unclaimed queue ticket goes in the same transaction."""
        submission_writes.check_end(state)
        allowed = tuple(only_from)

        async def end(conn: Conn, now_us: int) -> SubmissionRecord | None:
            program = submission_writes.end_submission(submission_id, state, error, allowed, now_us)
            record = await run_program(conn, program)
            if record is not None and record.state not in submission_writes.OPEN:
                await turn_queue.free_unowned_tickets(conn, [submission_id])
            return record

        return await self._write(f"end_submission({submission_id!r})", end)

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        """The expired submissions' unclaimed queue tickets go in the same transaction."""
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        before_us = to_us(before, "before")

        async def expire(conn: Conn, now_us: int) -> list[str]:
            program = submission_writes.expire_submissions(before_us, limit, error, DIALECT, now_us)
            ids = await run_program(conn, program)
            await turn_queue.free_unowned_tickets(conn, ids)
            return ids

        return await self._write("expire_submissions", expire)

    # ------------------------------------------------------------------ transcript, retention

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        mode: AddMode,
        allow_missing: bool,
        replace_only: Collection[str] = (),
    ) -> AddResult:
        make = transcript_writes.adding(
            conversation_id, messages, mode=mode, allow_missing=allow_missing, replace_only=replace_only
        )
        return await self._write(
            f"add_messages({conversation_id!r})",
            lambda conn, now_us: run_program(conn, make(DIALECT, now_us)),
            conversation_id=conversation_id,
        )

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Exact across connections: the transaction holds the conversation's row and its
        message rows ``FOR UPDATE``."""
        batch = transcript_writes.prepare_answers(answers)
        return await self._write(
            f"answer_tool_calls({conversation_id!r})",
            lambda conn, now_us: run_program(
                conn,
                transcript_writes.answer_tool_calls(conversation_id, batch, expired_before, DIALECT, now_us),
            ),
            conversation_id=conversation_id,
        )

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        cutoff_us = to_us(cutoff, "cutoff")
        return await self._write(
            "expire_pending_tool_calls",
            lambda conn, now_us: run_program(
                conn, transcript_writes.expire_pending_tool_calls(cutoff_us, DIALECT, now_us)
            ),
        )

    async def delete_conversation(self, conversation_id: str) -> bool:
        return await self._write(
            f"delete_conversation({conversation_id!r})",
            lambda conn, _: run_program(
                conn, transcript_writes.delete_conversation(conversation_id, DIALECT)
            ),
            conversation_id=conversation_id,
        )

    async def expire_events(self, before: dt.datetime, limit: int) -> int:
        program = retention_writes.expire_events(to_us(before, "before"), limit)
        return await self._write("expire_events", lambda conn, _: run_program(conn, program(DIALECT)))
