"""Deleting a conversation: its turns are stopped first, then its rows go in one store transaction.

docs/semantics.md §12 (deleting, retention). Shared by the ``DeleteConversation`` RPC and the
retention sweep (:mod:`turnwire_server.engine.maintenance`), so both delete the same way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from turnwire_server.engine.engine import TurnEngine
from turnwire_server.engine.subagents import CHILD_MARK


async def delete_conversation(
    engine: TurnEngine,
    conversation_id: str,
    *,
    updated_before: dt.datetime | None = None,
    forks: Sequence[str] = (),
    children: bool = True,
) -> bool:
    """Delete ``conversation_id`` with everything stored of it; False when nothing was stored.
    Its forks stay readable (docs/forks.md); with ``forks`` (its :meth:`fork_descendants`, read
    by :func:`delete_with_forks`) their turns are cancelled too and every conversation forked
    from it is deleted in the same store transaction.

    Without ``updated_before`` (DeleteConversation): every running or queued turn of the
    conversation is cancelled and waited for (:meth:`TurnEngine.cancel_conversation`), so its
    final write lands before the delete and nothing of it is written after. With
    ``updated_before`` (retention, tz-aware): nothing is cancelled; a conversation with an active
    turn, or updated since ``updated_before``, is left alone (False).

    The delete runs under the conversation's turn lock, so no turn can store input into it
    meanwhile; a turn admitted later starts a fresh conversation. With ``children`` (the default)
    the sub-agents' child conversations of a deleted conversation go with it
    (:func:`delete_children`; docs/subagents.md). Raises
    :class:`~turnwire_server.store.errors.StoreError` when the store fails.
    """
    store = engine.store
    if updated_before is None:
        for fork in forks:
            await engine.cancel_conversation(fork)
        await engine.cancel_conversation(conversation_id)
    elif engine.active_turns(conversation_id):
        return False
    # No await between the check above and taking the lock: no turn of it can slip in between.
    settings = engine.settings
    async with store.turn_lock(
        conversation_id,
        request_id="delete",
        owner=settings.replica_id,
        lease_seconds=settings.durability.lease_seconds,
    ):
        if updated_before is not None:
            record = await store.get_conversation(conversation_id)
            if record is None or record.update_time >= updated_before:
                return False
        deleted = await store.delete_conversation(conversation_id, with_forks=bool(forks))
    if children:
        deleted = await delete_children(engine, conversation_id) > 0 or deleted
    return deleted


async def delete_with_forks(engine: TurnEngine, conversation_id: str) -> tuple[bool, int]:
    """Delete ``conversation_id`` and every conversation forked from it, directly or not (an
    erasure request; docs/forks.md), with its sub-agents' child conversations as
    :func:`delete_conversation`: whether the conversation was deleted and how many forks were
    listed for deletion with it. Raises as :func:`delete_conversation`."""
    forks = await engine.store.fork_descendants(conversation_id)
    if not forks:
        return await delete_conversation(engine, conversation_id), 0
    return await delete_conversation(engine, conversation_id, forks=forks), len(forks)


async def delete_children(engine: TurnEngine, conversation_id: str) -> int:
    """Delete the sub-agents' child conversations of ``conversation_id``, every level (their ids
    start with its own and :data:`~turnwire_server.engine.subagents.CHILD_MARK`), each as
    ``DeleteConversation`` deletes (its turns cancelled first); returns how many went. Raises
    :class:`~turnwire_server.store.errors.StoreError`."""
    prefix = f"{conversation_id}{CHILD_MARK}"
    deleted = 0
    while True:
        records, _ = await engine.store.list_conversations(100, "", id_prefix=prefix)
        went = [r for r in records if await delete_conversation(engine, r.conversation_id, children=False)]
        deleted += len(went)
        if not went:  # none left (or none that would go: never loop on it)
            return deleted
