"""The store's writes written once: each driver's store class inherits :class:`CoreWrites` and
gives it :meth:`CoreWrites._commit`, which runs a core write program in one transaction of the
driver's (SQLite's writer thread, a pooled PostgreSQL connection). Each write here validates
its arguments in the caller's task (raising :class:`ValueError` before anything is queued),
builds its program (the statements and the rule: the ``*_writes`` modules of this package) and
says how it may commit; the dialect adds what only a driver's database does in the same
transaction (:class:`~turnwire_server.store.core.sql.Dialect`). The contracts are the role
protocols' (the modules :mod:`turnwire_server.store.base` joins).

How a write may commit is a :class:`Commit`, whose facts each driver reads as it needs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, TypeVar

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core import (
    budget_writes,
    compaction_writes,
    fork_writes,
    lease_writes,
    message_writes,
    retention_writes,
    stream_writes,
    submission_writes,
    transcript_writes,
)
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.rows import compaction_params, to_us
from turnwire_server.store.core.sql import Dialect, Program, joined
from turnwire_server.store.records import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    BudgetCharge,
    BudgetGrant,
    CompactionRecord,
    ConversationRecord,
    HeldTurn,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
    TurnLease,
    TurnRecord,
)

__all__ = ["ALONE", "Commit", "CoreWrites"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Commit:
    """How a write may commit."""

    conversation_id: str | None = None
    """The conversation it writes: writes naming the same one are applied in call order."""
    grouped: bool = False
    """It may share a transaction with other writes queued meanwhile (PostgreSQL group-commits
    only these: the hot writes of a running turn)."""
    urgent: bool = True
    """A caller waits on its durability (SQLite's writer, which always group-commits, does not
    hold the batch open for more writes then)."""
    pipelined: bool = False
    """Alone, its transaction may run in pipeline mode (its program has no ``count`` statement):
    on PostgreSQL ``BEGIN`` and the writes cost no round trip of their own, a batch's reads one
    (a group commit is pipelined anyway; SQLite has no round trips)."""


ALONE: Final = Commit()
"""A write of no one conversation, urgent, in a transaction of its own."""


class CoreWrites:
    """The writes of :class:`~turnwire_server.store.base.Store` that run a core program."""

    _dialect: Dialect
    """The driver's SQL spelling."""

    _locks: LocalTurnLocks | None = None
    """The conversations' turn locks and reserved places when one process serves the store
    (SQLite: they live in memory, and the writes that end or drop a turn or a submission give
    its place up here); None when the database keeps them (PostgreSQL: the dialect's statements
    move them in the writes' transactions). One process per store also means every other owner
    is dead, so a claim need not wait for a lease to lapse."""

    async def _commit(self, what: str, program: Callable[[int], Program[T]], how: Commit = ALONE) -> T:
        """Run ``program(now_us)`` (``now_us``: the write's time, µs since the epoch) in one
        transaction, committed as ``how`` allows, and return its result once committed. Raises
        what the program raised (nothing is written then), or :class:`StoreError` naming
        ``what`` when the database fails."""
        raise NotImplementedError

    # ------------------------------------------------------------------ a turn's writes

    async def save_message(
        self, conversation_id: str, message: message_pb2.Message, *, lease: TurnLease | None = None
    ) -> None:
        row = message_writes.prepare_save_message(message)
        if row is None:
            return
        await self._commit(
            f"save_message({conversation_id!r}, {message.id!r})",
            lambda now_us: message_writes.save_message(conversation_id, row, lease, self._dialect, now_us),
            Commit(conversation_id, grouped=True, urgent=False),
        )

    async def finish_turn(
        self,
        turn: TurnRecord,
        message: message_pb2.Message | None,
        *,
        events: Sequence[tuple[int, bytes]] = (),
        stream_ended: bool = False,
        budget: BudgetCharge | None = None,
    ) -> BudgetGrant | None:
        finish = message_writes.prepare_finish_turn(turn, message, events, stream_ended=stream_ended)
        try:
            if budget is None:
                await self._commit(
                    f"finish_turn({turn.request_id!r})",
                    lambda now_us: message_writes.finish_turn(finish, self._dialect, now_us),
                    # The turn waits for it before its TurnEnd, but shares the commit.
                    Commit(turn.conversation_id, grouped=True),
                )
                return None
            _, grant = await self._commit(
                f"finish_turn({turn.request_id!r})",
                lambda now_us: joined(
                    message_writes.finish_turn(finish, self._dialect, now_us),
                    # The final write reads and locks the turn's token: the charge need not.
                    budget_writes.charge_budget(budget, self._dialect, fenced=budget.lease == turn.lease),
                ),
                # Not grouped: the budget rows it locks (a tenant's) are shared with other
                # conversations, whose writes a shared commit would hold behind those locks.
                Commit(turn.conversation_id, pipelined=True),
            )
            return grant
        finally:
            if self._locks is not None and turn.state != "running":  # else a recovery runs it on
                self._locks.drop(turn.request_id)

    async def discard_reply(self, turn: TurnRecord, message_id: str) -> None:
        await self._commit(
            f"discard_reply({turn.request_id!r})",
            lambda now_us: compaction_writes.discard_reply(turn, message_id, self._dialect, now_us),
            Commit(turn.conversation_id),
        )

    async def roll_back_turn(
        self,
        turn: TurnRecord,
        message_ids: Sequence[str],
        *,
        events: Sequence[tuple[int, bytes]] = (),
        stream_ended: bool = False,
    ) -> None:
        finish, ids = message_writes.prepare_roll_back(turn, message_ids, events, stream_ended=stream_ended)
        try:
            await self._commit(
                f"roll_back_turn({turn.request_id!r})",
                lambda now_us: message_writes.roll_back_turn(finish, ids, self._dialect, now_us),
                Commit(turn.conversation_id),
            )
        finally:
            if self._locks is not None:
                self._locks.drop(turn.request_id)

    async def save_compaction(self, record: CompactionRecord) -> None:
        params = compaction_params(record)  # invalid values fail here, before anything is queued
        await self._commit(
            f"save_compaction({record.conversation_id!r})",
            lambda _: compaction_writes.save_compaction(record.conversation_id, params),
            Commit(record.conversation_id),
        )

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
        lease: TurnLease | None = None,
    ) -> None:
        batch = stream_writes.prepare_events(events, ended=ended)
        await self._commit(
            f"append_events({request_id!r})",
            lambda now_us: stream_writes.append_events(
                conversation_id, request_id, batch, self._dialect, now_us, lease=lease
            ),
            # Only the stream's end is urgent: its turn waits for it.
            Commit(conversation_id, grouped=True, urgent=ended),
        )

    # ------------------------------------------------------------------ submissions

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        submission_writes.check_new(submission)
        record, created = await self._commit(
            f"create_submission({submission.submission_id!r})",
            lambda _: submission_writes.create_submission(submission, max_open, self._dialect),
        )
        if created and self._locks is not None:  # its place in the conversation's line
            self._locks.reserve(record.conversation_id, record.submission_id)
        return record, created

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        submission_writes.check_end(state)
        allowed = tuple(only_from)
        record = await self._commit(
            f"end_submission({submission_id!r})",
            lambda now_us: submission_writes.end_submission(
                submission_id, state, error, only_from=allowed, dialect=self._dialect, now_us=now_us
            ),
        )
        if self._locks is not None and record is not None and record.state not in submission_writes.OPEN:
            self._locks.drop(submission_id)  # ended before its turn took the place
        return record

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        before_us = to_us(before, "before")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        expired = await self._commit(
            "expire_submissions",
            lambda now_us: submission_writes.expire_submissions(
                before_us, limit, error, self._dialect, now_us
            ),
            Commit(urgent=False),
        )
        if self._locks is not None:
            for submission_id in expired:
                self._locks.drop(submission_id)
        return expired

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
        return await self._commit(
            f"add_messages({conversation_id!r})",
            lambda now_us: make(self._dialect, now_us),
            Commit(conversation_id),
        )

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        batch = transcript_writes.prepare_answers(answers)
        return await self._commit(
            f"answer_tool_calls({conversation_id!r})",
            lambda now_us: transcript_writes.answer_tool_calls(
                conversation_id, batch, expired_before, self._dialect, now_us
            ),
            Commit(conversation_id),
        )

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        cutoff_us = to_us(cutoff, "cutoff")
        return await self._commit(
            "expire_pending_tool_calls",
            lambda now_us: transcript_writes.expire_pending_tool_calls(cutoff_us, self._dialect, now_us),
        )

    async def delete_conversation(self, conversation_id: str, *, with_forks: bool = False) -> bool:
        deleted, forks = await self._commit(
            f"delete_conversation({conversation_id!r})",
            lambda _: transcript_writes.delete_conversation(
                conversation_id, self._dialect, with_forks=with_forks
            ),
            Commit(conversation_id),
        )
        if self._locks is not None:
            for gone in (conversation_id, *forks):
                self._locks.drop_all(gone)  # the places of its deleted pending submissions
        return deleted

    async def fork_conversation(
        self, conversation_id: str, message_id: str, fork_id: str
    ) -> ConversationRecord:
        return await self._commit(
            f"fork_conversation({conversation_id!r}, {message_id!r}, {fork_id!r})",
            lambda now_us: fork_writes.fork_conversation(
                conversation_id, message_id, fork_id, self._dialect, now_us
            ),
            Commit(conversation_id),
        )

    async def expire_events(self, before: dt.datetime, limit: int) -> int:
        make = retention_writes.expire_events(to_us(before, "before"), limit)
        return await self._commit("expire_events", lambda _: make(self._dialect), Commit(urgent=False))

    async def expire_budget_periods(self, day: str, month: str, limit: int) -> int:
        make = retention_writes.expire_budget_periods(day, month, limit)
        return await self._commit(
            "expire_budget_periods", lambda _: make(self._dialect), Commit(urgent=False)
        )

    async def expire_turn_budgets(self, limit: int) -> int:
        make = retention_writes.expire_turn_budgets(limit)
        return await self._commit("expire_turn_budgets", lambda _: make(self._dialect), Commit(urgent=False))

    async def charge_budget(
        self, charge: BudgetCharge, *, checkpoint: message_pb2.Message | None = None
    ) -> BudgetGrant:
        row = None if checkpoint is None else message_writes.prepare_save_message(checkpoint)
        if row is None:
            return await self._commit(
                f"charge_budget({charge.request_id!r})",
                lambda _: budget_writes.charge_budget(charge, self._dialect),
                Commit(charge.conversation_id, pipelined=True),
            )
        _, grant = await self._commit(
            f"charge_budget({charge.request_id!r})",
            lambda now_us: joined(
                message_writes.save_message(charge.conversation_id, row, charge.lease, self._dialect, now_us),
                # A fenced checkpoint reads and locks the turn's token: the charge need not.
                budget_writes.charge_budget(charge, self._dialect, fenced=charge.lease is not None),
            ),
            Commit(charge.conversation_id, pipelined=True),
        )
        return grant

    # ------------------------------------------------------------------ leases and claims

    async def renew_leases(self, owner: str, until: dt.datetime) -> list[HeldTurn]:
        until_us = to_us(until, "until")
        return await self._commit(
            "renew_leases",
            lambda _: lease_writes.renew_leases(owner, until_us, self._dialect),
            Commit(urgent=False),
        )

    async def release_leases(self, turns: Sequence[HeldTurn]) -> None:
        if turns:
            await self._commit("release_leases", lambda _: lease_writes.release_leases(turns))

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        return await self._claim_turns(owner, now, lease_until, limit)

    async def _claim_turns(
        self,
        owner: str,
        now: dt.datetime,
        lease_until: dt.datetime,
        limit: int,
        passed_over: Sequence[str] = (),
    ) -> list[TurnRecord]:
        """:meth:`claim_interrupted_turns`, leaving the turns of the owners ``passed_over`` alone
        (a driver's own reason: PostgreSQL's stuck sessions)."""
        make = lease_writes.claim_interrupted_turns(
            owner, self._lapsed_before(now), to_us(lease_until, "lease_until"), limit, passed_over=passed_over
        )
        return await self._commit("claim_interrupted_turns", lambda _: make(self._dialect))

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        make = lease_writes.claim_pending_submissions(
            owner, self._lapsed_before(now), to_us(lease_until, "lease_until"), limit
        )
        return await self._commit("claim_pending_submissions", lambda _: make(self._dialect))

    def _lapsed_before(self, now: dt.datetime) -> int | None:
        """A claim's lease condition (:mod:`~turnwire_server.store.core.lease_writes`): ``now``,
        or None (every other owner is dead) when one process serves the store."""
        now_us = to_us(now, "now")
        return None if self._locks is not None else now_us
