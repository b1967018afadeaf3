"""The partial replies of a conversation, and its turns without a stored reply, read the same
way by both backends.

A reply is partial when the latest turn that wrote it (a continuation writes the same message
again) is still running or ended other than completed; ``GetConversation`` lists them so a
reader can mark them (docs/semantics.md §5: a cancelled turn keeps its partial reply). A turn in
one of those states whose assistant message does not exist (cancelled before the model's first
output, still waiting for it, rolled back) has nothing to mark; ``GetConversation`` lists it
among ``turns_without_reply`` so a reader still sees that it ran and how it ended.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

from turnwire_server.store.core.rows import TURN_COLUMNS, turn_from_row
from turnwire_server.store.records import TurnRecord

PARTIAL_STATES: Final = ("running", "aborted", "error", "interrupted")


def partial_replies_sql(placeholder: str) -> str:
    """The query, with the backend's parameter ``placeholder`` (``?`` or ``%s``); one parameter,
    the conversation id. Served by the ``turns_by_conversation`` index."""
    states = ", ".join(f"'{state}'" for state in PARTIAL_STATES)
    return (
        f"SELECT {TURN_COLUMNS} FROM turns t"
        f" WHERE t.conversation_id = {placeholder} AND t.state IN ({states})"
        " AND NOT EXISTS (SELECT 1 FROM turns later WHERE later.conversation_id = t.conversation_id"
        " AND later.assistant_message_id = t.assistant_message_id"
        " AND (later.start_time > t.start_time"
        " OR (later.start_time = t.start_time AND later.request_id > t.request_id)))"
    )


def turns_without_reply_sql(placeholder: str) -> str:
    """The query of ``Store.turns_without_reply``, with the backend's parameter ``placeholder``;
    two parameters, the conversation id and the row limit. Rows are :data:`TURN_COLUMNS`, most
    recently started first. The conversation's turns come from the ``turns_by_conversation``
    index, each reply's existence from the ``messages`` primary key."""
    states = ", ".join(f"'{state}'" for state in PARTIAL_STATES)
    return (
        f"SELECT {TURN_COLUMNS} FROM turns t"
        f" WHERE t.conversation_id = {placeholder} AND t.state IN ({states})"
        " AND NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = t.conversation_id"
        " AND m.id = t.assistant_message_id)"
        f" ORDER BY t.start_time DESC, t.request_id DESC LIMIT {placeholder}"
    )


def partial_replies_of(rows: Iterable[Any]) -> dict[str, TurnRecord]:
    """``{message id: the turn that last wrote it}`` of the query's rows (:data:`TURN_COLUMNS`)."""
    return {turn.assistant_message_id: turn for turn in map(turn_from_row, rows)}
