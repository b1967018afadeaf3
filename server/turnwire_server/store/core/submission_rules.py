"""The idempotency rule of ``Store.create_submission``, shared by both backends (docs/semantics.md §7)."""

from __future__ import annotations

from turnwire_server.store.errors import SubmissionConflict
from turnwire_server.store.records import SubmissionRecord


def repeated_submission(
    submission: SubmissionRecord, by_id: SubmissionRecord | None, by_key: SubmissionRecord | None
) -> SubmissionRecord | None:
    """The stored submission ``submission`` repeats, or None when it is new.

    ``by_id`` / ``by_key`` are what the store holds under its id and under its (conversation,
    idempotency key). The same id or key with the same request is a repeat. Raises
    :class:`SubmissionConflict` when the id and the key name different submissions, or the id
    (or key) is stored with another request, conversation or key.
    """
    if by_id is not None and by_key is not None and by_id.submission_id != by_key.submission_id:
        raise SubmissionConflict(
            f"submission id {submission.submission_id!r} and idempotency key "
            f"{submission.idempotency_key!r} name different submissions "
            f"({by_id.submission_id!r} and {by_key.submission_id!r})",
            submission.submission_id,
        )
    existing = by_id or by_key
    if existing is None:
        return None
    same_key = (existing.idempotency_key or None) == (submission.idempotency_key or None)
    if (
        existing.conversation_id != submission.conversation_id
        or existing.request != submission.request
        or (by_id is not None and not same_key)
    ):
        raise SubmissionConflict(
            f"submission {existing.submission_id!r} already exists with other content; "
            "use a new submission id and idempotency key for new messages",
            existing.submission_id,
        )
    return existing
