"""The partial replies of a conversation, read the same way by both backends.

A reply is partial when the latest turn that wrote it (a continuation writes the same message
again) is still running or ended other than completed; ``GetConversation`` lists them so a
reader can mark them (docs/semantics.md §5: a cancelled turn keeps its partial reply).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, cast

from turnwire_server.store.base import TurnState

PARTIAL_STATES: Final = ("running", "aborted", "error", "interrupted")


def partial_replies_sql(placeholder: str) -> str:
    """The query, with the backend's parameter ``placeholder`` (``?`` or ``%s``); one parameter,
    the conversation id. Served by the ``turns_by_conversation`` index."""
    states = ", ".join(f"'{state}'" for state in PARTIAL_STATES)
    return (
        "SELECT t.assistant_message_id, t.request_id, t.state FROM turns t"
        f" WHERE t.conversation_id = {placeholder} AND t.state IN ({states})"
        " AND NOT EXISTS (SELECT 1 FROM turns later WHERE later.conversation_id = t.conversation_id"
        " AND later.assistant_message_id = t.assistant_message_id"
        " AND (later.start_time > t.start_time"
        " OR (later.start_time = t.start_time AND later.request_id > t.request_id)))"
    )


def partial_replies_of(rows: Iterable[Any]) -> dict[str, tuple[str, TurnState]]:
    """``{message id: (request id, state)}`` of the query's rows."""
    return {str(row[0]): (str(row[1]), cast(TurnState, str(row[2]))) for row in rows}
