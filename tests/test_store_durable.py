"""The store's durable-turn tables, on every backend: event streams and submissions
(docs/semantics.md §7, §8)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt

import pytest
from support.stores import StoreBackend

from turnwire_client.v1 import message_pb2
from turnwire_server.store import HeldTurn, InvalidPageToken, Store, TurnRecord
from turnwire_server.store.core.page_tokens import decode_submission_token
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.errors import SubmissionConflict, SubmissionNotPending, TooManySubmissions
from turnwire_server.store.records import SubmissionRecord

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _submission(
    sid: str, conversation: str = "c", *, key: str | None = None, body: bytes = b"r"
) -> SubmissionRecord:
    return SubmissionRecord(
        submission_id=sid,
        conversation_id=conversation,
        idempotency_key=key,
        state="pending",
        request=body,
        create_time=T0,
    )


def _turn(request_id: str, conversation: str = "c", state: str = "running") -> TurnRecord:
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation,
        assistant_message_id=f"tw-a-{request_id}",
        continuation=False,
        model="scripted:x",
        state=state,  # type: ignore[arg-type]
        start_time=T0,
    )


def _user(message_id: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = message_id
    return message


# ----------------------------------------------------------------------------- event streams


async def test_events_round_trip_in_order_and_between_bounds(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_user("u1")])
    await store.append_events("c", "r1", [(1, b"a"), (2, b"b")], ended=False)
    await store.append_events("c", "r1", [(3, b"c")], ended=False)
    stream = await store.get_stream("r1")
    assert stream is not None and stream.last_sequence_number == 3 and stream.end_time is None
    assert await store.load_events("r1", 0) == [b"a", b"b", b"c"]
    assert await store.load_events("r1", 1, before=3) == [b"b"]
    await store.append_events("c", "r1", [], ended=True)  # the end alone
    ended = await store.get_stream("r1")
    assert ended is not None and ended.end_time is not None and ended.last_sequence_number == 3
    assert await store.get_stream("nope") is None


async def test_a_retried_request_id_replaces_its_ended_stream(store: Store) -> None:
    await store.start_turn(_turn("r1"), [_user("u1")])
    await store.append_events("c", "r1", [(1, b"old1"), (2, b"old2"), (3, b"old3")], ended=True)
    await store.append_events("c", "r1", [(1, b"new1")], ended=False)
    assert await store.load_events("r1", 0) == [b"new1"]
    stream = await store.get_stream("r1")
    assert stream is not None and stream.end_time is None and stream.last_sequence_number == 1


async def test_events_of_an_unrecorded_turn_are_not_kept(store: Store) -> None:
    """A turn whose conversation was deleted while it streamed writes no stream back."""
    await store.append_events("c", "gone", [(1, b"a")], ended=True)
    assert await store.get_stream("gone") is None


async def test_event_batches_that_do_not_ascend_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="ascend"):
        await store.append_events("c", "r1", [(2, b"x"), (1, b"y")], ended=False)
    with pytest.raises(ValueError, match="needs events"):
        await store.append_events("c", "r1", [], ended=False)
    assert await store.get_stream("r1") is None


# ----------------------------------------------------------------------------- submissions


async def test_repeats_by_id_or_key_return_the_stored_submission(store: Store) -> None:
    created, fresh = await store.create_submission(_submission("s1", key="k"), max_open=10)
    assert fresh and created.seq == 1 and created.state == "pending"
    by_key, fresh = await store.create_submission(_submission("s-other", key="k"), max_open=10)
    assert not fresh and by_key.submission_id == "s1"
    by_id, fresh = await store.create_submission(_submission("s1", key="k"), max_open=10)
    assert not fresh and by_id == created


async def test_conflicting_ids_keys_and_contents_are_refused(store: Store) -> None:
    await store.create_submission(_submission("s1", key="k1"), max_open=10)
    await store.create_submission(_submission("s2", key="k2"), max_open=10)
    with pytest.raises(SubmissionConflict, match="name different submissions"):
        await store.create_submission(_submission("s1", key="k2"), max_open=10)
    with pytest.raises(SubmissionConflict, match="other content"):
        await store.create_submission(_submission("s1", key="k1", body=b"changed"), max_open=10)
    with pytest.raises(SubmissionConflict, match="other content"):
        await store.create_submission(_submission("s1", "other-conversation", key="k1"), max_open=10)
    assert [r.submission_id for r in (await store.list_submissions(10, ""))[0]] == ["s1", "s2"]


async def test_twenty_concurrent_duplicates_create_one_submission(store: Store) -> None:
    results = await asyncio.gather(
        *(store.create_submission(_submission(f"s{i}", key="same"), max_open=100) for i in range(20))
    )
    assert sum(created for _, created in results) == 1
    assert len({record.submission_id for record, _ in results}) == 1


async def test_open_submissions_are_bounded_per_conversation(store: Store) -> None:
    for index in range(3):
        await store.create_submission(_submission(f"s{index}"), max_open=3)
    with pytest.raises(TooManySubmissions):
        await store.create_submission(_submission("s3"), max_open=3)
    await store.create_submission(_submission("elsewhere", "c2"), max_open=3)  # another conversation


async def test_start_and_finish_turn_move_the_submission_and_never_overwrite_aborted(
    store: Store,
) -> None:
    await store.create_submission(_submission("s1"), max_open=10)
    await store.start_turn(_turn("s1"), [_user("u1")])
    running = await store.get_submission("s1")
    assert running is not None and running.state == "running" and running.start_time is not None
    aborted = await store.end_submission("s1", "aborted", None, only_from=("pending", "running"))
    assert aborted is not None and aborted.state == "aborted"
    # The turn completes after the cancel landed: the submission stays aborted.
    await store.finish_turn(dataclasses.replace(_turn("s1"), state="completed", end_time=T0), None)
    final = await store.get_submission("s1")
    assert final is not None and final.state == "aborted"


async def test_a_cancelled_submission_never_stores_its_input(store: Store) -> None:
    await store.create_submission(_submission("s1"), max_open=10)
    await store.end_submission("s1", "aborted", b"why", only_from=("pending",))
    with pytest.raises(SubmissionNotPending):
        await store.start_turn(_turn("s1"), [_user("u1")])
    with pytest.raises(SubmissionNotPending):  # nor when it is admitted with its lock
        async with store.admit_turn(
            _turn("s1"), [_user("u1")], lease_seconds=30, read_compaction=False, queued=lambda _: None
        ):
            pass
    assert await store.load_messages("c") == ()
    assert await store.running_turns() == []


async def test_admit_turn_moves_a_pending_submission_to_running(store: Store) -> None:
    await store.create_submission(_submission("s1"), max_open=10)
    async with store.admit_turn(
        _turn("s1"), [_user("u1")], lease_seconds=30, read_compaction=False, queued=lambda _: None
    ):
        running = await store.get_submission("s1")
        assert running is not None and running.state == "running" and running.start_time is not None
    assert [m.id for m in await store.load_messages("c")] == ["u1"]


async def test_submission_pages_follow_acceptance_order_and_their_filters(store: Store) -> None:
    for index in range(5):
        await store.create_submission(_submission(f"s{index}", "c" if index % 2 == 0 else "d"), max_open=10)
    page, token = await store.list_submissions(2, "", conversation_id="c")
    assert [r.submission_id for r in page] == ["s0", "s2"] and token
    rest, last = await store.list_submissions(2, token, conversation_id="c")
    assert [r.submission_id for r in rest] == ["s4"] and last == ""
    with pytest.raises(InvalidPageToken):
        await store.list_submissions(2, token, conversation_id="d")  # another filter
    with pytest.raises(InvalidPageToken):
        await store.list_submissions(2, "garbage!!", conversation_id="c")
    pending, _ = await store.list_submissions(10, "", state="pending")
    assert len(pending) == 5
    assert [r.submission_id for r in (await store.list_submissions(10, "", state="pending"))[0]] == [
        f"s{i}" for i in range(5)
    ]


async def test_submission_pages_of_a_tenant_carry_only_its_own_data(store: Store) -> None:
    # Tenant keys as the API makes them (api/tenancy.py). Tenant b's submissions interleave with
    # a's: a's tokens must not count them (they once carried the store-wide seq).
    for index in range(4):
        for tenant in ("a", "b"):
            record = _submission(f"{tenant}/s{index}", f"{tenant}/c{index % 2}")
            record = dataclasses.replace(record, create_time=T0 + dt.timedelta(milliseconds=index))
            await store.create_submission(record, max_open=10)
    page, token = await store.list_submissions(2, "", id_prefix="a/")
    assert [r.submission_id for r in page] == ["a/s0", "a/s1"]
    assert decode_submission_token(token, "", "", "a/") == (to_us(page[-1].create_time, "t"), "a/s1")
    payload = base64.urlsafe_b64decode(token + "==")
    assert payload.endswith(b"s1") and b"a/" not in payload and len(payload) == 1 + 8 + 8 + 2
    with pytest.raises(InvalidPageToken):  # tenant b, or the whole store, cannot use it
        await store.list_submissions(2, token, id_prefix="b/")
    with pytest.raises(InvalidPageToken):
        await store.list_submissions(2, token)
    # The page goes on after the last one seen, even when it is gone (its conversation deleted).
    await store.delete_conversation("a/c1")
    rest, last = await store.list_submissions(2, token, id_prefix="a/")
    assert [r.submission_id for r in rest] == ["a/s2"] and last == ""


# ----------------------------------------------------------------------------- leases


async def test_leases_are_renewed_in_one_write_and_interrupted_turns_claimed_once(
    store: Store, store_backend: StoreBackend
) -> None:
    lease = T0 + dt.timedelta(seconds=30)
    mine = dataclasses.replace(_turn("r-mine"), owner="me", lease_until=lease)
    theirs = dataclasses.replace(_turn("r-theirs", "c2"), owner="dead", lease_until=lease)
    await store.start_turn(mine, [_user("u1")])
    await store.start_turn(theirs, [_user("u2")])
    later = T0 + dt.timedelta(minutes=5)
    # What "me" holds, as the replica compares it with what it runs (its token and start).
    assert await store.renew_leases("me", later) == [HeldTurn(mine.lease, mine.start_time)]
    (renewed,) = [t for t in await store.running_turns() if t.request_id == "r-mine"]
    assert renewed.owner == "me" and renewed.lease_until == later
    if store_backend.name == "postgres":
        # Replicas share the database: a lease that holds means a live replica; only a lapsed one
        # (its replica stopped renewing) is claimed.
        assert await store.claim_interrupted_turns("me", T0, later, 10) == []
        now = lease + dt.timedelta(seconds=1)
    else:
        # One process per SQLite file: the other owner is dead, whatever its lease says.
        now = T0
    claimed = await store.claim_interrupted_turns("me", now, later, 10)
    assert [(t.request_id, t.owner, t.lease_until) for t in claimed] == [("r-theirs", "me", later)]
    assert await store.claim_interrupted_turns("me", now, later, 10) == [], "claimed once"
    if store_backend.name == "postgres":
        # Three survivors claim at once after both leases lapsed: each turn goes to one of them.
        expired = later + dt.timedelta(hours=1)
        survivors = await asyncio.gather(
            *(
                store.claim_interrupted_turns(f"s{n}", expired, expired + dt.timedelta(seconds=30), 10)
                for n in range(3)
            )
        )
        ids = [t.request_id for batch in survivors for t in batch]
        assert sorted(ids) == ["r-mine", "r-theirs"], ids


async def test_pending_submissions_of_a_dead_owner_are_claimed_once(
    store: Store, store_backend: StoreBackend
) -> None:
    lease = T0 + dt.timedelta(seconds=30)
    for n in range(3):
        record = dataclasses.replace(_submission(f"s{n}"), owner="dead", lease_until=lease)
        await store.create_submission(record, max_open=10)
    later = lease + dt.timedelta(seconds=30)
    if store_backend.name == "postgres":
        assert await store.claim_pending_submissions("me", T0, later, 10) == [], "the lease still holds"
    now = lease + dt.timedelta(seconds=1)
    claimed = await store.claim_pending_submissions("me", now, later, 2)
    assert [(r.submission_id, r.owner) for r in claimed] == [("s0", "me"), ("s1", "me")], "in order, bounded"
    rest = await store.claim_pending_submissions("me", now, later, 10)
    assert [r.submission_id for r in rest] == ["s2"]
    assert await store.claim_pending_submissions("me", now, later, 10) == []
    assert await store.renew_leases("me", later + dt.timedelta(hours=1)) == []  # no running turn
    renewed = await store.get_submission("s0")
    assert renewed is not None and renewed.lease_until == later + dt.timedelta(hours=1)


async def test_unclaimed_submissions_are_claimed_once_in_acceptance_order(store: Store) -> None:
    """A submission accepted by a replica without a free slot has no owner: any may claim it,
    at once (no lease to wait out), once."""
    for n in range(3):
        await store.create_submission(_submission(f"u{n}"), max_open=10)  # owner "": unclaimed
    until = T0 + dt.timedelta(seconds=30)
    first = await store.claim_pending_submissions("me", T0, until, 2)
    second = await store.claim_pending_submissions("me", T0, until, 10)
    assert [(r.submission_id, r.owner) for r in first + second] == [("u0", "me"), ("u1", "me"), ("u2", "me")]
    assert await store.claim_pending_submissions("me", T0, until, 10) == []


async def test_a_submission_takes_its_place_in_line_at_acceptance(store: Store) -> None:
    """FIFO by acceptance whoever runs it: a turn queued after an unclaimed submission waits for
    the submission's turn; a submission that ends without running gives its place up."""
    order: list[str] = []

    async def turn(request_id: str) -> None:
        async with store.turn_lock("c", request_id=request_id, owner="me", lease_seconds=30):
            order.append(request_id)

    await store.create_submission(_submission("sub"), max_open=10)
    later = asyncio.create_task(turn("later"))
    await asyncio.sleep(0)  # let it take its ticket (after the submission's) before the claim
    now = dt.datetime.now(dt.UTC)  # the claimed ticket's lease must hold while the turns run
    await store.claim_pending_submissions("me", now, now + dt.timedelta(seconds=30), 10)
    await asyncio.gather(turn("sub"), later)
    assert order == ["sub", "later"]

    await store.create_submission(_submission("gone"), max_open=10)
    await store.end_submission("gone", "aborted", None, only_from=("pending", "running"))
    await asyncio.wait_for(turn("after"), timeout=10)  # not blocked by the ended one's place
    assert order[-1] == "after"


async def test_submission_pages_filter_by_conversation_id_prefix(store: Store) -> None:
    # Keys as the API makes them: a submission's id has its conversation's tenant prefix.
    for index, conversation in enumerate(["t_a/c", "t_a/d", "tXa/c", "t_ab/c", "c"]):
        tenant = conversation.rpartition("/")[0]
        await store.create_submission(
            _submission(f"{tenant}/s{index}".lstrip("/"), conversation), max_open=10
        )
    page, token = await store.list_submissions(1, "", id_prefix="t_a/")
    assert [r.submission_id for r in page] == ["t_a/s0"] and token
    rest, last = await store.list_submissions(1, token, id_prefix="t_a/")
    assert [r.submission_id for r in rest] == ["t_a/s1"] and last == ""
    with pytest.raises(InvalidPageToken):
        await store.list_submissions(1, token, id_prefix="tXa/")  # a token is bound to its prefix
    with pytest.raises(InvalidPageToken):
        await store.list_submissions(1, token)
    everything, _ = await store.list_submissions(10, "")
    assert len(everything) == 5


async def test_a_submission_keeps_the_place_reserved_for_it(
    store: Store, store_backend: StoreBackend
) -> None:
    """A REJECT submission's place is taken when it is admitted (``reserve_place``, only on an
    idle conversation); storing the submission keeps that one place (unclaimed: it never
    lapses) instead of taking a second, and the place still heads the line."""
    assert await store.reserve_place("c", "s1", owner="me", lease_seconds=30, only_if_idle=True) is None
    await store.create_submission(_submission("s1"), max_open=10)
    assert await store.queue_head("c") == "s1"
    assert await store.reserve_place("c", "s2", owner="me", lease_seconds=30, only_if_idle=True) == "s1"
    if store_backend.name == "postgres":
        assert store_backend.sql("SELECT request_id, owner FROM turn_queue") == [("s1", "")]


# ----------------------------------------------------------------------------- tool starts


async def test_a_tool_calls_started_and_interrupted_marks_are_stored(store: Store) -> None:
    """docs/semantics.md §8, "Tool effects": the started record rides the reply's checkpoint
    (``save_message``) and its final write (``finish_turn``), read back exactly by a new reader."""
    await store.start_turn(_turn("r1"), [_user("u1")])
    reply = message_pb2.Message(id="tw-a-r1", role=message_pb2.ROLE_ASSISTANT)
    call = reply.parts.add().tool_call
    call.tool_call_id, call.tool_name, call.input_json = "c1", "send", "{}"
    call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    call.started = True
    await store.save_message("c", reply)
    (stored,) = [m for m in await store.load_messages("c") if m.id == "tw-a-r1"]
    assert stored.parts[0].tool_call.started and not stored.parts[0].tool_call.interrupted
    call.state, call.error_text, call.interrupted = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR, "gone", True
    await store.finish_turn(dataclasses.replace(_turn("r1"), state="completed", end_time=T0), reply)
    (stored,) = [m for m in await store.load_messages("c") if m.id == "tw-a-r1"]
    assert stored == reply
    assert stored.parts[0].tool_call.started and stored.parts[0].tool_call.interrupted
