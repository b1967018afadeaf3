"""Where a turn without a stored reply sits among a conversation's messages
(``Conversation.turns_without_reply``, docs/semantics.md §5).

GetConversation lists such a turn on the page of its place (``api/message_pages.py``), and
``turnwire history`` prints it there (``cli/history.py``): one rule for both, in a module either
may import (the CLI imports no part of the server's API layer).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from google.protobuf import timestamp_pb2

from turnwire_client.v1 import message_pb2

__all__ = ["turn_places"]


def _instant(stamp: timestamp_pb2.Timestamp) -> tuple[int, int]:
    """``(seconds, microseconds)``: the store keeps a turn's start time to the microsecond, while
    its input's ``create_time`` (the same instant) keeps every nanosecond; compared at full
    precision, the input could count as created after the turn started."""
    return (stamp.seconds, stamp.nanos // 1000)


def turn_places(
    messages: Sequence[message_pb2.Message], starts: Sequence[timestamp_pb2.Timestamp]
) -> list[int]:
    """Where each turn start time in ``starts`` sits among ``messages`` (docs/semantics.md §5,
    ``Conversation.turns_without_reply``): the index of the first message created after it
    (``len(messages)`` when none is), so the turn comes right after message ``index - 1``. Times
    are compared to the microsecond; a message without ``create_time`` counts as created at the
    epoch. Clocks of several replicas may disagree, so times need not rise with the order: the
    first message later than the start and than every message before it is meant (a running
    maximum)."""
    latest = list(itertools.accumulate((_instant(m.create_time) for m in messages), max))
    return [bisect.bisect_right(latest, _instant(start)) for start in starts]
