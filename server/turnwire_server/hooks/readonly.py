"""The messages a hook sees, without copying the history for it (issue 17).

The engine's messages are shared: the store hands out its kept message objects to every turn
(``store/core/message_cache.py``), and the provider adapters' conversion caches take a message object
to stand for its content. A hook (``TurnContext``, ``StepContext``, ``ToolCallContext``
``.messages``, a compaction strategy's ``CompactionContext.messages``) must therefore never reach
those objects: a change in place would reach the store's copy and every later turn.

:class:`MessagesView` gives the hook an immutable sequence (no ``append``, no item assignment:
list changes fail at once) whose items are copies made when the hook first reads them, so a hook
that reads nothing, or ``len()`` only, costs nothing per message. Afterwards the caller takes
:meth:`MessagesView.settled`: the messages with each copy the hook changed in place standing in
for its original, as if the hook had returned them (the contract is "read-only, return new
messages in ``TurnConfig.messages`` / ``StepConfig.messages``"; an in-place change still reaches
this turn's request, never the store or a later turn). :meth:`MessagesView.restore` maps the
unchanged copies in what a hook returned back to their originals, so a hook that filters or
extends the history keeps the originals' identity (and the caches' hits).
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sequence
from typing import overload

from turnwire_client.v1 import message_pb2


class MessagesView(Sequence[message_pb2.Message]):
    """A read-only sequence over ``messages`` whose items are copies, made on first read (the same
    copy on every later read of that index). Slices are tuples of copies. Not thread-safe (one
    hook call at a time, on the event loop)."""

    __slots__ = ("_copies", "_messages")

    def __init__(self, messages: Sequence[message_pb2.Message]) -> None:
        self._messages = messages
        self._copies: dict[int, message_pb2.Message] = {}

    def __len__(self) -> int:
        return len(self._messages)

    @overload
    def __getitem__(self, index: int) -> message_pb2.Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[message_pb2.Message, ...]: ...

    def __getitem__(self, index: int | slice) -> message_pb2.Message | tuple[message_pb2.Message, ...]:
        size = len(self._messages)
        if isinstance(index, slice):
            return tuple(self._copy(i) for i in range(*index.indices(size)))
        position = operator.index(index)
        if position < 0:
            position += size
        if not 0 <= position < size:
            raise IndexError("message index out of range")
        return self._copy(position)

    def __iter__(self) -> Iterator[message_pb2.Message]:
        for position in range(len(self._messages)):
            yield self._copy(position)

    def __repr__(self) -> str:
        return f"MessagesView({len(self._messages)} messages)"

    def _copy(self, position: int) -> message_pb2.Message:
        copy = self._copies.get(position)
        if copy is None:
            copy = message_pb2.Message()
            copy.CopyFrom(self._messages[position])
            self._copies[position] = copy
        return copy

    @staticmethod
    def read_only(messages: Sequence[message_pb2.Message]) -> Sequence[message_pb2.Message]:
        """The messages behind ``messages`` when it is a view (else ``messages``), for code that
        only reads them and copies what it keeps (a serializer: a remote hook's request), so
        nothing is copied twice."""
        return messages._messages if isinstance(messages, MessagesView) else messages

    def settled(self) -> Sequence[message_pb2.Message]:
        """The viewed messages, each copy the hook changed in place in its original's place (a new
        list); the viewed sequence itself when none changed. Compares only the copies made."""
        messages = self._messages
        changed = [(i, copy) for i, copy in self._copies.items() if copy != messages[i]]
        if not changed:
            return messages
        settled = list(messages)
        for position, copy in changed:
            settled[position] = copy
        return settled

    def restore(self, returned: Sequence[message_pb2.Message]) -> list[message_pb2.Message]:
        """``returned`` (messages a hook gave back) as a new list, each unchanged copy this view made
        replaced by its original; other messages (new ones, changed copies) as they are."""
        originals = {id(copy): position for position, copy in self._copies.items()}
        messages = self._messages
        restored: list[message_pb2.Message] = []
        for message in returned:
            position = originals.get(id(message))
            unchanged = position is not None and message == messages[position]
            restored.append(messages[position] if position is not None and unchanged else message)
        return restored
