"""The store's transcript role: conversations and their messages, read and written outside a
turn (the API's transcript RPCs, forks, compaction, tool-call answers; docs/semantics.md §1, §6)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from turnwire_client.v1 import message_pb2
from turnwire_server.store.records import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    CompactionRecord,
    ConversationRecord,
    ConversationView,
    ToolCallAnswer,
    TurnRecord,
)

__all__ = ["TranscriptStore"]


@runtime_checkable
class TranscriptStore(Protocol):
    """Conversations and their messages, read and written outside a turn (the API's transcript RPCs,
    compaction, tool-call answers)."""

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record, or ``None`` when it does not exist."""
        ...

    async def list_conversations(
        self, page_size: int, page_token: str, *, id_prefix: str = ""
    ) -> tuple[list[ConversationRecord], str]:
        """One page of conversations, most recently updated first; with ``id_prefix`` only those
        whose id starts with it (the API's tenant scope, api/tenancy.py).

        Returns the records and the next page token ("" on the last page).
        Raises :class:`InvalidPageToken` for a token it did not issue, whatever the
        token holds (never another error: the API reports it as the client's mistake).
        """
        ...

    async def load_messages(self, conversation_id: str) -> Sequence[message_pb2.Message]:
        """All messages of the conversation, oldest first (empty when none). Read-only: the
        messages may be shared with other readers and later reads (the SQL stores hand out their
        kept objects, ``store/core/message_cache.py``); copy one (``CopyFrom``) to change it."""
        ...

    async def conversation_view(self, conversation_id: str, unreplied_limit: int) -> ConversationView | None:
        """The conversation's record, messages, partial replies, at most ``unreplied_limit``
        (>= 1) turns without reply and cost (:class:`ConversationView`), all read on one
        snapshot; None when the conversation does not exist. Index-served (docs/semantics.md
        §5). Raises :class:`ValueError` when ``unreplied_limit`` < 1, :class:`StoreCorrupted`
        for a message that cannot be decoded."""
        ...

    async def list_turns(
        self, conversation_id: str, page_size: int, page_token: str, *, failed_only: bool = False
    ) -> tuple[list[TurnRecord], str]:
        """Up to ``page_size`` (>= 1) of the conversation's turns, most recently started first
        (ties by request id, descending), with their cost and timeline; only those that ended
        ``error``, ``aborted`` or ``interrupted`` with ``failed_only``. Returns the records and
        the next page's token ("" on the last page; pass "" for the first). Served by the
        ``turns_by_conversation`` index. Raises :class:`InvalidPageToken` for a token not issued
        for this listing, :class:`ValueError` when ``page_size`` < 1."""
        ...

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        mode: AddMode,
        allow_missing: bool,
        replace_only: Collection[str] = (),
    ) -> AddResult:
        """Write ``messages`` into the transcript without a turn (docs/semantics.md §1, AddMessages).

        One transaction, all or nothing. New ids are appended in order. A stored id with the same
        role and parts counts as unchanged; with other content it is :class:`MessageIdConflict`
        in ``append`` mode and replaced in place (same position) in ``upsert`` mode, except the
        assistant message of a ``running`` turn (:class:`MessageBeingWritten`). Raises
        :class:`ConversationNotFound` when the conversation does not exist and not
        ``allow_missing`` (then it is created), :class:`ValueError` for a message without parts
        or an id repeated within ``messages``, and :class:`UnknownMessage` when an id of
        ``replace_only`` is not stored (those may replace, never be appended). Takes no turn lock.
        """
        ...

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Record the client's ``answers`` into the assistant message holding the calls, atomically
        (docs/semantics.md §6, §12).

        One read-modify-write, applied alone: of concurrent calls answering the calls of one
        message, exactly one gets ``completed`` (the one that answered the last waiting call),
        so exactly one continuation runs. A client result needs a client call in
        ``input-available``; an approval answer a call in ``approval-requested``; either way no
        user message may follow the call's message (moved past). ``expired_before``: a call
        whose message was created before it has expired (None: no expiry).

        Raises, storing nothing: :class:`ToolCallNotFound`, :class:`ToolCallNotPending`,
        :class:`ToolCallExpired`, :class:`ToolCallsSpanMessages`; :class:`ValueError` for an
        empty ``answers``.
        """
        ...

    async def fork_conversation(
        self, conversation_id: str, message_id: str, fork_id: str
    ) -> ConversationRecord:
        """Create conversation ``fork_id`` holding ``conversation_id``'s history up to and
        including message ``message_id`` without copying it (O(1) rows, whatever the history's
        length), with the source's compaction when it covers only those messages; later changes
        on either side are copy-on-write (docs/forks.md). Returns the new conversation's record.

        Raises, storing nothing: :class:`ForkSourceNotFound`, :class:`ConversationExists` when
        ``fork_id`` is a conversation, :class:`ForkPointNotFound` when ``message_id`` is not in
        the source's history.
        """
        ...

    async def load_compaction(self, conversation_id: str) -> CompactionRecord | None:
        """The conversation's latest compaction, None when it has none. Raises
        :class:`StoreCorrupted` when it cannot be decoded."""
        ...

    async def save_compaction(self, record: CompactionRecord) -> None:
        """Durably make ``record`` its conversation's compaction (replacing the previous one).
        A no-op when the conversation no longer exists (it was deleted meanwhile)."""
        ...
