"""The store's submission role: accepted requests whose turns run detached, their places in
the turn queue, their ends and expiry (docs/semantics.md §7)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from turnwire_server.store.records import SubmissionRecord, SubmissionState

__all__ = ["SubmissionStore"]


@runtime_checkable
class SubmissionStore(Protocol):
    """Submissions: accepted requests whose turns run detached (docs/semantics.md §7)."""

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        """Store ``submission`` (state ``pending``) unless it repeats one: returns the stored
        record and True when created, the existing one and False when the id or the
        (conversation, idempotency key) is already stored with the same request.

        A new submission takes its place in the conversation's turn queue at once (its turn's
        :meth:`turn_lock`, passed its id as ``request_id``, holds from that place, whichever
        replica runs it), so submissions run first in, first out by acceptance with the other
        turns of the conversation; a place :meth:`reserve_place` took under its id already (a
        REJECT submission, admitted only on an idle conversation) is that place, kept with the
        submission's owner and lease. ``submission.owner`` empty: no replica runs it yet, any may
        claim it (:meth:`claim_pending_submissions`); its place is kept meanwhile and given up
        when it ends without running (:meth:`end_submission`, :meth:`expire_submissions`,
        :meth:`delete_conversation`).

        Raises :class:`SubmissionConflict` when the id and the key name different
        submissions or the id is stored with another request, :class:`TooManySubmissions`
        past ``max_open`` pending or running submissions on the conversation. One
        transaction: concurrent duplicates create one submission.
        """
        ...

    async def get_submission(self, submission_id: str) -> SubmissionRecord | None:
        """The submission, or None."""
        ...

    async def list_submissions(
        self,
        page_size: int,
        page_token: str,
        *,
        conversation_id: str = "",
        state: str = "",
        id_prefix: str = "",
    ) -> tuple[list[SubmissionRecord], str]:
        """One page of submissions in acceptance order, optionally of one conversation and
        state, and of conversations whose id starts with ``id_prefix``; the next page token ("" on
        the last page). Raises :class:`InvalidPageToken` for a token not issued for these filters.

        A token names the page's last submission by its id less ``id_prefix`` (the API's
        submission keys carry their tenant's prefix, as conversation keys do) and its create
        time, never by anything of the rest of the store (``seq``)."""
        ...

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        """Set the submission's final ``state`` (and end time, error) when its current state is
        in ``only_from``; returns the record as stored afterwards (changed or not), None when
        it does not exist."""
        ...

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        """End up to ``limit`` (>= 1) submissions still ``pending`` that were accepted before
        ``before`` (tz-aware) as ``error`` with ``error`` (a serialized ``google.rpc.Status``);
        returns their ids (docs/semantics.md §12: pending submissions expire)."""
        ...

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        """Take over up to ``limit`` (>= 1) pending submissions that no replica claimed (accepted
        by one without a free slot) or whose replica died (lease lapsed before ``now``; with
        SQLite: any other owner), giving them ``owner`` and ``lease_until`` atomically (each goes
        to one claimant); in acceptance order. The caller starts their turns."""
        ...

    def submission_offers(self) -> AsyncIterator[None]:
        """A wake-up whenever another replica accepted a submission it left unclaimed (it had no
        free slot), so a replica with one may claim it (never ends; nothing for a store served
        by one process, which knows what it left unclaimed)."""
        ...
