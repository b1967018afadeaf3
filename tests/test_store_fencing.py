"""Fencing, on every backend (docs/semantics.md §5, "Fencing"): once another replica claims a
running turn, every write of the previous owner for it (checkpoints, event batches, its reply and
end, a discarded attempt, a rollback) is refused with ``LeaseLost`` and changes nothing, while the
claimant's writes go through; a claim back by the first replica does not revive its old lease.
On PostgreSQL, the previous owner's turn-lock release leaves the ticket the claimant took over.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from support.stores import StoreBackend, leased_turn, postgres_database

from turnwire_client.v1 import message_pb2
from turnwire_server.store import HeldTurn, Store, TurnRecord
from turnwire_server.store.errors import LeaseLost
from turnwire_server.store.postgres import PostgresStore

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
LEASE = T0 + dt.timedelta(seconds=30)
LAPSED = LEASE + dt.timedelta(seconds=1)
UNTIL = LAPSED + dt.timedelta(seconds=30)


def _held(turn: TurnRecord) -> HeldTurn:
    return HeldTurn(turn.lease, turn.start_time)


def _turn(request_id: str, owner: str, conversation: str = "c") -> TurnRecord:
    return leased_turn(request_id, conversation, owner, start_time=T0)


def _message(message_id: str, text: str, role: int = message_pb2.ROLE_ASSISTANT) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=role)  # type: ignore[arg-type]
    message.parts.add().text.text = text
    return message


async def _claim(store: Store, backend: StoreBackend, owner: str) -> TurnRecord:
    # PostgreSQL claims only lapsed leases; SQLite (one process per file) any other owner's.
    now = LAPSED if backend.name == "postgres" else T0
    (claimed,) = await store.claim_interrupted_turns(owner, now, UNTIL, 10)
    return claimed


async def _reply_text(store: Store, message_id: str) -> str:
    messages = {m.id: m for m in await store.load_messages("c")}
    return "".join(p.text.text for p in messages[message_id].parts)


async def test_a_claim_fences_every_write_of_the_previous_owner(
    store: Store, store_backend: StoreBackend
) -> None:
    mine = _turn("r1", "a")
    await store.start_turn(mine, [_message("u1", "question", message_pb2.ROLE_USER)])
    await store.save_message("c", _message(mine.assistant_message_id, "before"), lease=mine.lease)
    await store.append_events("c", "r1", [(1, b"e1")], ended=False, lease=mine.lease)

    taken = await _claim(store, store_backend, "b")
    assert (taken.owner, taken.lease_epoch) == ("b", mine.lease_epoch + 1)

    late = _message(mine.assistant_message_id, "after the takeover")
    ended = dataclasses.replace(mine, state="completed", end_time=LAPSED)
    refused = [
        store.save_message("c", late, lease=mine.lease),
        store.append_events("c", "r1", [(2, b"late")], ended=False, lease=mine.lease),
        store.finish_turn(ended, late, events=[(2, b"late"), (3, b"end")], stream_ended=True),
        store.discard_reply(
            dataclasses.replace(mine, assistant_message_id="tw-a-r1-2"), mine.assistant_message_id
        ),
        store.roll_back_turn(dataclasses.replace(mine, state="aborted"), ["u1", mine.assistant_message_id]),
    ]
    for write in refused:
        with pytest.raises(LeaseLost) as caught:
            await write
        assert caught.value.request_id == "r1"
        assert "ResumeTurn" in caught.value.client_message

    # Nothing of it landed: the reply, the input, the stream and the record are as claimed.
    assert await _reply_text(store, mine.assistant_message_id) == "before"
    assert await store.load_events("r1", 0) == [b"e1"]
    record = await store.get_turn("r1")
    assert record is not None and (record.state, record.owner, record.lease_epoch) == ("running", "b", 1)

    # The claimant writes as any owner does.
    await store.append_events("c", "r1", [(2, b"b2")], ended=False, lease=taken.lease)
    await store.finish_turn(
        dataclasses.replace(taken, state="completed", end_time=UNTIL),
        _message(mine.assistant_message_id, "recovered"),
        events=[(3, b"end")],
        stream_ended=True,
    )
    assert await _reply_text(store, mine.assistant_message_id) == "recovered"
    assert await store.load_events("r1", 0) == [b"e1", b"b2", b"end"]


async def test_a_claim_back_does_not_revive_an_old_lease(store: Store, store_backend: StoreBackend) -> None:
    first = _turn("r1", "a")
    await store.start_turn(first, [_message("u1", "question", message_pb2.ROLE_USER)])
    await _claim(store, store_backend, "b")
    if store_backend.name == "postgres":  # b's lease lapses too: a takes it back
        store_backend.sql("UPDATE turns SET lease_until = ? WHERE request_id = 'r1'", (0,))
    again = await _claim(store, store_backend, "a")
    assert (again.owner, again.lease_epoch) == ("a", 2)
    # The same replica, its old attempt's token: refused; its new attempt's: written.
    with pytest.raises(LeaseLost):
        await store.save_message("c", _message(first.assistant_message_id, "stale"), lease=first.lease)
    await store.save_message("c", _message(first.assistant_message_id, "current"), lease=again.lease)
    assert await _reply_text(store, first.assistant_message_id) == "current"


async def test_a_released_lease_is_claimed_by_any_replica_its_former_owner_included(
    store: Store, store_backend: StoreBackend
) -> None:
    """``release_leases`` (a turn whose end could not be stored, docs/operate/outages.md): the
    turn, under that token and start only, gets no owner and no lease; a renewal of its former owner no
    longer extends it, and a claim of that very owner, its lease not lapsed, takes it over."""
    stranded, other = _turn("r1", "a"), _turn("r2", "a", conversation="d")
    for turn, user in ((stranded, "u1"), (other, "u2")):
        await store.start_turn(turn, [_message(user, "question", message_pb2.ROLE_USER)])
    # Not r2 as stored: another epoch; another start (a later attempt under the same id); never stored.
    stale = dataclasses.replace(other, lease_epoch=other.lease_epoch + 1)
    earlier = dataclasses.replace(other, start_time=T0 - dt.timedelta(seconds=5))
    await store.release_leases([_held(t) for t in (stranded, stale, earlier, _turn("r3", "a"))])
    assert await store.renew_leases("a", UNTIL) == [_held(other)]  # r2 only
    (claimed,) = await store.claim_interrupted_turns("a", T0, UNTIL, 10)
    assert (claimed.request_id, claimed.owner, claimed.lease_epoch) == ("r1", "a", stranded.lease_epoch + 1)
    with pytest.raises(LeaseLost):
        await store.save_message("c", _message(stranded.assistant_message_id, "stale"), lease=stranded.lease)


@pytest.mark.postgres
async def test_a_fenced_replica_leaves_the_claimants_queue_ticket() -> None:
    # PostgreSQL's shared turn queue (SQLite keeps its turn locks in its one process).
    with postgres_database() as url:
        store, backend = PostgresStore(url), StoreBackend("postgres", url=url)
        await store.open()
        try:
            stale = _turn("r1", "a")
            lock = store.turn_lock("c", request_id="r1", owner="a", lease_seconds=30)
            await lock.__aenter__()
            await store.start_turn(stale, [_message("u1", "question", message_pb2.ROLE_USER)])
            await _claim(store, backend, "b")
            await lock.__aexit__(None, None, None)  # the stale replica's turn gives its lock up
            assert backend.sql("SELECT request_id, owner FROM turn_queue") == [("r1", "b")]
            assert await store.queue_head("c") == "r1"
        finally:
            await store.close()
            await backend.close()
