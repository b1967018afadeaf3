"""Turns left running in the store with nothing running them are given up and recovered
(docs/operate/outages.md; engine/engine.py ``release_orphaned``, engine/replica.py).

The samples (the chaos probe under CI load): a database restart cut the connection while a
turn's input was being committed (seed 902827009), or while a claimed turn's recovery was
prepared (seed 3312282815). The write had landed, the replica took the error for "nothing
stored" and let the turn go, and the turn stayed ``running`` under that replica's lease, renewed
by it for as long as it lived: never recovered, its conversation's next turns queued behind it.
Each was mended where it happened, and the kind came back by another path (seed 2811364492:
``chaos-1-r1`` running 180 s after the faults). The kind: any turn the store records running
under a live replica that the replica does not run. So the replica no longer keeps a list of the
cases: each lease renewal returns the turns the store holds under it, and those it does not run
are given up (``Replica.tick``), whatever left them there.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from support.engine_harness import CONV, EngineFactory, collect, end_of, text_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.errors import ServerStopping
from turnwire_server.engine.replica import Replica
from turnwire_server.store.errors import StoreUnreachable


async def _give_up_orphans(h: Any) -> int:
    """The first half of a lease tick (``Replica.tick``): renew, then give up what the engine
    does not run; returns how many were given up."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30)
    held = await h.store.renew_leases(h.engine.settings.replica_id, later)
    return int(await h.engine.release_orphaned(held))


async def test_an_input_commit_cut_off_after_it_landed_is_recovered(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    await _recovered_once(h, "r-cut", await _a_stranded_turn_claimed(h, "r-cut"))


async def test_a_cut_off_commit_that_did_not_land_releases_nothing(make_engine: EngineFactory) -> None:
    """The same error when nothing was stored: the release matches no turn, and a later attempt
    under the same request id, running when the release comes, is left running (its start
    differs)."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    admit = h.store.admit_turn

    @asynccontextmanager
    async def refused(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise StoreUnreachable("connection lost before the COMMIT arrived", in_flight=True)
        yield  # never reached: a generator for asynccontextmanager

    h.store.admit_turn = refused  # type: ignore[method-assign]
    events = await collect(await h.start("question", request_id="r-again"))
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    h.store.admit_turn = admit  # type: ignore[method-assign]
    retry = await h.start("question", request_id="r-again", message_id="u-again")
    async for response in retry:
        if response.event.HasField("turn_start"):
            break  # the retry's turn is stored and running
    assert await _give_up_orphans(h) == 0  # the retry's turn runs here: not given up
    events = await collect(retry)
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED


async def test_a_call_refused_before_anything_was_sent_is_not_stranded(make_engine: EngineFactory) -> None:
    """During an outage most calls are refused at once (nothing sent): nothing is left running."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})

    @asynccontextmanager
    async def refused(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise StoreUnreachable("the database is unreachable")
        yield  # never reached: a generator for asynccontextmanager

    h.store.admit_turn = refused  # type: ignore[method-assign]
    for n in range(3):
        events = await collect(await h.start("question", request_id=f"r-refused-{n}"))
        assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert await _give_up_orphans(h) == 0


async def _stranded(h: Any, request_id: str, conversation_id: str = CONV) -> None:
    """A turn running in the store with nothing running it: its input's commit cut off after it
    landed (never acknowledged), under this replica's lease."""
    admit = h.store.admit_turn

    @asynccontextmanager
    async def landed_then_cut_off(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with admit(*args, **kwargs):
            raise StoreUnreachable("connection lost during COMMIT", in_flight=True)
        yield  # never reached: a generator for asynccontextmanager

    h.store.admit_turn = landed_then_cut_off
    events = await collect(await h.start("question", conversation_id=conversation_id, request_id=request_id))
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert not any(e.HasField("turn_start") for e in events)  # never acknowledged
    h.store.admit_turn = admit


async def _a_stranded_turn_claimed(h: Any, request_id: str) -> list[Any]:
    """A stranded turn (:func:`_stranded`), its lease given up, then claimed by this replica for
    recovery."""
    await _stranded(h, request_id)
    (running,) = await h.store.running_turns()
    assert running.request_id == request_id
    assert await _give_up_orphans(h) == 1
    now = dt.datetime.now(dt.UTC)
    claimed = await h.store.claim_interrupted_turns(h.engine.settings.replica_id, now, now, 10)
    assert [turn.request_id for turn in claimed] == [request_id]
    return list(claimed)


async def _recovered_once(h: Any, request_id: str, claimed: list[Any] | None = None) -> None:
    """Recover ``claimed`` (None: claim the stranded turn first) and check that it answers once."""
    if claimed is None:
        now = dt.datetime.now(dt.UTC)
        claimed = await h.store.claim_interrupted_turns(h.engine.settings.replica_id, now, now, 10)
        assert [turn.request_id for turn in claimed] == [request_id], "the stranded turn is claimable again"
    await h.engine.recover_turns(claimed)
    await _wait_answered(h, request_id)


async def test_claimed_turns_whose_recovery_the_store_cut_off_are_given_up(
    make_engine: EngineFactory,
) -> None:
    """The chaos probe's sample (seed 3312282815): a replica claimed a turn, then the database
    restarted while it prepared the recovery (reading the stored reply); the turn stayed
    ``running`` under that replica's lease, renewed, and was never run."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    claimed = await _a_stranded_turn_claimed(h, "r-claimed")
    load = h.store.load_messages

    async def cut_off(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnreachable("terminating connection due to administrator command", in_flight=True)

    h.store.load_messages = cut_off  # type: ignore[method-assign]
    try:
        await h.engine.recover_turns(claimed)
    except StoreUnreachable:
        pass
    else:
        raise AssertionError("the recovery's store error propagates (the tick logs it)")
    h.store.load_messages = load  # type: ignore[method-assign]
    assert await _give_up_orphans(h) == 1
    await _recovered_once(h, "r-claimed")


async def test_a_recovery_whose_turn_lock_fails_is_given_up(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    claimed = await _a_stranded_turn_claimed(h, "r-lock")
    lock = h.store.turn_lock

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnreachable("the database is unreachable")

    h.store.turn_lock = refused  # type: ignore[method-assign]
    await h.engine.recover_turns(claimed)  # a detached run: it fails at its turn lock
    await wait_until(lambda: h.engine.handle("r-lock") is None, timeout=10, what="the failed recovery ended")
    await _ran_no_recovery(h, "r-lock")
    assert await _give_up_orphans(h) == 1
    h.store.turn_lock = lock  # type: ignore[method-assign]
    await _recovered_once(h, "r-lock")


async def test_a_one_flight_admission_that_landed_then_a_refusal_is_recovered(
    make_engine: EngineFactory,
) -> None:
    """The chaos probe's sample (old code, seed 2924828388, on one core: ``chaos-2-r4`` running
    under a live replica's renewed lease 180 s after the faults). A database restart cut
    PostgreSQL's one-flight admission (ticket, input and COMMIT in one flight) after its COMMIT
    landed; the admission took the broken connection for "nothing stored" and went the waiting
    path, whose ticket was refused at once (``StoreUnreachable``, not in flight: the store knew
    the database gone by then). The turn was not taken for stranded, and its replica renewed its
    lease for good (the client's retry was told "still running")."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    admit = h.store.admit_turn

    @asynccontextmanager
    async def landed_then_refused(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with admit(*args, **kwargs):
            raise StoreUnreachable("postgres store: turn_lock: the database is unreachable")
        yield  # never reached: a generator for asynccontextmanager

    h.store.admit_turn = landed_then_refused  # type: ignore[method-assign]
    events = await collect(await h.start("question", request_id="r-flight"))
    h.store.admit_turn = admit  # type: ignore[method-assign]
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert [t.request_id for t in await h.store.running_turns()] == ["r-flight"]
    assert await Replica(h.engine, resume=True).tick() == 1, "given up and claimed again in one tick"
    await _wait_answered(h, "r-flight")


async def test_a_claim_whose_answer_was_lost_is_recovered_by_the_next_tick(
    make_engine: EngineFactory,
) -> None:
    """A claim of a dead replica's turns committed, and the database went away before its answer
    came back (``StoreUnreachable``, in flight): the claimed turns are this replica's, renewed by
    it, and it never heard of them. The lease loop gives them up and claims them again."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    await _a_stranded_turn_claimed(h, "r-lost-claim")  # claimed; the claim's answer is dropped
    replica = Replica(h.engine, resume=True)
    assert await replica.tick() == 1, "given up and claimed again in one tick"
    await _wait_answered(h, "r-lost-claim")


@pytest.mark.filterwarnings("error::RuntimeWarning", "error::pytest.PytestUnraisableExceptionWarning")
async def test_a_stop_right_after_a_claim_leaves_no_recovery_unawaited(make_engine: EngineFactory) -> None:
    """``Replica.stop`` just after a tick took turns over, before their recovery's task ran:
    the recovery is closed, not left an unawaited coroutine (before: a RuntimeWarning at
    shutdown, its stranded turn left for the next claim all the same)."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    await _a_stranded_turn_claimed(h, "r-stopped")  # claimed; given up and claimed again below
    replica = Replica(h.engine, resume=True)
    assert await replica.tick() == 1
    await replica.stop()  # the recovery's task has not run yet
    gc.collect()  # an unawaited coroutine warns when collected: an error here (the marks)
    assert h.engine.handle("r-stopped") is None  # it never started here
    assert [t.request_id for t in await h.store.running_turns()] == ["r-stopped"]


async def test_a_recovery_that_fails_to_start_is_recovered_by_the_next_tick(
    make_engine: EngineFactory,
) -> None:
    """A claimed turn's recovery refused or failed by something other than the store (a turn
    of the same request id still here, a bug) is logged, not raised (the claim's other turns
    are recovered), and the turn is not left claimed and unrun."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer", repeat=True)]})
    first = await _a_stranded_turn_claimed(h, "r-refused")
    start = h.engine.start

    async def refused_once(request: Any, **kwargs: Any) -> Any:
        h.engine.start = start  # type: ignore[method-assign]
        raise RuntimeError("a recovery that does not start")

    h.engine.start = refused_once  # type: ignore[method-assign]
    await h.engine.recover_turns(first)  # logged, not raised: the lease loop goes on
    assert [t.request_id for t in await h.store.running_turns()] == ["r-refused"]
    replica = Replica(h.engine, resume=True)
    assert await replica.tick() == 1
    await _wait_answered(h, "r-refused")


async def _the_lock_held(h: Any) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Another turn (``r-ahead``) holds the conversation's lock until the returned event is set;
    returns that event and the holder's task, once the lock is held."""
    held, release = asyncio.Event(), asyncio.Event()

    async def hold_the_lock() -> None:
        async with h.store.turn_lock(CONV, request_id="r-ahead"):
            held.set()
            await release.wait()

    holder = asyncio.create_task(hold_the_lock())
    await held.wait()
    return release, holder


async def _a_recovery_in_line(h: Any, request_id: str) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """A stranded turn claimed and recovered while another holds its conversation's lock: its
    recovery waits in line. Returns the event that lets the holder go, and the holder's task."""
    claimed = await _a_stranded_turn_claimed(h, request_id)
    release, holder = await _the_lock_held(h)
    await h.engine.recover_turns(claimed)
    assert h.engine.handle(request_id) is not None
    return release, holder


@pytest.mark.parametrize("cancelled_first", [False, True], ids=["shutdown", "cancel-then-shutdown"])
async def test_a_recovery_stopped_by_a_shutdown_while_it_waits_for_its_lock_is_recovered_once(
    make_engine: EngineFactory, cancelled_first: bool
) -> None:
    """A recovery a shutdown stops while queued for its conversation's lock is left running in
    the store as a crash would leave it, its stream with no end, its recovery not counted
    (nothing ran): given up and recovered, its stream ends once. A shutdown does not wait for
    the line of a recovery ``CancelChat`` left to end in it (``cancelled_first``)."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    release, holder = await _a_recovery_in_line(h, "r-queued")
    handle = h.engine.handle("r-queued")
    if cancelled_first:
        assert handle is not None and handle.cancel()
    assert handle is not None and handle.cancel(ServerStopping())
    await wait_until(
        lambda: h.engine.handle("r-queued") is None, timeout=10, what="the queued recovery ended"
    )
    await _ran_no_recovery(h, "r-queued")
    release.set()
    await holder
    replica = Replica(h.engine, resume=True)
    assert await replica.tick() == 1
    await _wait_answered(h, "r-queued")


@pytest.mark.parametrize("in_line", [True, False], ids=["waiting-in-line", "before-it-ran"])
async def test_cancel_chat_on_a_recovery_that_has_not_run_ends_it_aborted(
    make_engine: EngineFactory, in_line: bool
) -> None:
    """``CancelChat`` on a recovery queued for its conversation's lock (``in_line``), or sent
    right after the recovery started, is honoured as for a queued turn (docs/semantics.md §5,
    Cancellation): the turn ends ``ABORTED`` when its turn comes, its question kept, its stream
    ended once, and nothing recovers it again; the model is never called."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    if in_line:
        release, holder = await _a_recovery_in_line(h, "r-cancelled")
        assert await h.engine.cancel_anywhere("r-cancelled")
        release.set()
        await holder
    else:
        await h.engine.recover_turns(await _a_stranded_turn_claimed(h, "r-cancelled"))
        assert await h.engine.cancel_anywhere("r-cancelled")
    await wait_until(
        lambda: h.engine.handle("r-cancelled") is None, timeout=10, what="the cancelled recovery ended"
    )
    turn = await h.store.get_turn("r-cancelled")
    assert turn is not None and turn.state == "aborted"
    assert await h.store.running_turns() == []
    assert await Replica(h.engine, resume=True).tick() == 0
    assert [text_of(m) for m in await h.store.load_messages(CONV)] == ["question"]
    assert h.provider.calls == 0
    stored = [event async for batch in h.engine.replay("r-cancelled", 0) for event in batch]
    ends = [e.turn_end for e in stored if e.HasField("turn_end")]
    assert [end.status for end in ends] == [event_pb2.TURN_STATUS_ABORTED]


async def _ran_no_recovery(h: Any, request_id: str) -> None:
    """``request_id`` is running in the store with no recovery counted (docs/semantics.md §8:
    one that ran nothing is not)."""
    (turn,) = await h.store.running_turns()
    assert (turn.request_id, turn.recovery_count) == (request_id, 0)


async def _wait_answered(h: Any, request_id: str) -> None:
    """Wait until ``request_id``'s recovery answered once, and nothing is left running."""

    async def answered() -> list[message_pb2.Message] | None:
        messages = await h.store.load_messages(CONV)
        return list(messages) if len(messages) == 2 and not await h.store.running_turns() else None

    messages = await wait_until(answered, timeout=10, what=f"{request_id}'s recovery answers")
    assert messages is not None and [text_of(m) for m in messages] == ["question", "the answer"]
    stored = [event async for batch in h.engine.replay(request_id, 0) for event in batch]
    assert sum(1 for e in stored if e.HasField("turn_end")) == 1


async def test_a_recovery_refused_for_its_request_id_in_use_spends_no_recovery(
    make_engine: EngineFactory,
) -> None:
    """A claimed turn whose recovery is refused because its request id is in use here (another
    attempt under it, queued: a client's retry) is not counted against ``recovery_budget``
    (docs/semantics.md §8): that refusal ran nothing. Recovered once the other attempt is gone,
    it is the turn's first recovery."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]}, recovery_budget=1)
    claimed = await _a_stranded_turn_claimed(h, "r-in-use")
    release, holder = await _the_lock_held(h)
    retry = await h.start("question", request_id="r-in-use")  # queued behind the lock holder
    await h.engine.recover_turns(claimed)  # refused: RequestIdInUse (logged)
    await _ran_no_recovery(h, "r-in-use")
    release.set()
    await holder
    assert end_of(await collect(retry)).status == event_pb2.TURN_STATUS_ERROR  # the id is taken
    assert await Replica(h.engine, resume=True).tick() == 1
    await _wait_answered(h, "r-in-use")
    ended = await h.store.get_turn("r-in-use")
    assert ended is not None and (ended.state, ended.recovery_count) == ("completed", 1)


async def test_a_recovery_waiting_on_its_first_write_keeps_the_lease_loop_going(
    make_engine: EngineFactory,
) -> None:
    """A taken-over turn's recovery whose first write waits (the conversation's lock held by a
    paused replica's session, a slow store) does not hold up the lease loop: the tick returns,
    the next renews every lease, the waiting turn's included, and does not give that turn up
    as one nothing runs; once the write goes through, the turn is answered once."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    await _a_stranded_turn_claimed(h, "r-slow-write")
    finish_turn, written = h.store.finish_turn, asyncio.Event()

    async def waits(*args: Any, **kwargs: Any) -> Any:
        await written.wait()
        return await finish_turn(*args, **kwargs)

    h.store.finish_turn = waits  # type: ignore[method-assign]
    replica = Replica(h.engine, resume=True)
    assert await asyncio.wait_for(replica.tick(), 5) == 1, "given up, claimed again; not awaited"
    (before,) = await h.store.running_turns()
    assert await asyncio.wait_for(replica.tick(), 5) == 0
    (after,) = await h.store.running_turns()
    assert after.owner == h.engine.settings.replica_id, "not given up while its recovery starts"
    assert after.lease_until is not None and before.lease_until is not None
    assert after.lease_until >= before.lease_until, "renewed"
    written.set()
    await _wait_answered(h, "r-slow-write")
    h.store.finish_turn = finish_turn  # type: ignore[method-assign]
    await replica.stop()


async def test_a_refused_recovery_is_given_up_while_another_of_its_claim_still_waits(
    make_engine: EngineFactory,
) -> None:
    """A claim of two turns: the first's recovery is refused (nothing runs it), the second's
    first read waits. The next tick gives the first up at once, not after the second started."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer", repeat=True)]})
    for request_id in ("r-a-refused", "r-b-waits"):
        await _stranded(h, request_id, f"c-{request_id}")
    assert await _give_up_orphans(h) == 2
    start, load, release = h.engine.start, h.store.load_messages, h.store.release_leases
    gate, released = asyncio.Event(), list[str]()

    async def refused(request: Any, **kwargs: Any) -> Any:
        if request.request_id == "r-a-refused":
            raise RuntimeError("a recovery that does not start")
        return await start(request, **kwargs)

    async def waits(conversation_id: str) -> Any:
        if conversation_id == "c-r-b-waits":
            await gate.wait()
        return await load(conversation_id)

    async def recorded(turns: Any) -> None:
        released.extend(turn.lease.request_id for turn in turns)
        await release(turns)

    h.engine.start, h.store.load_messages = refused, waits  # type: ignore[method-assign]
    h.store.release_leases = recorded  # type: ignore[method-assign]
    replica = Replica(h.engine, resume=True)
    assert await replica.tick() == 2
    await wait_until(lambda: "r-a-refused" not in h.engine._recovering, what="the refusal")
    await asyncio.wait_for(replica.tick(), 5)
    assert "r-a-refused" in released, "given up by the next renewal"
    assert "r-b-waits" not in released, "still starting: kept"
    gate.set()
    h.engine.start, h.store.load_messages = start, load  # type: ignore[method-assign]
    h.store.release_leases = release  # type: ignore[method-assign]
    await replica.stop()


async def test_the_recovery_line_names_its_turn_in_the_log_fields(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A recovery starts in the replica's claim loop, outside any call or turn: before, its
    ``recovering turn …`` line named the turn in its text only, without the ``conversation_id``
    and ``request_id`` fields every turn's lines carry, so filtering a JSON log by the turn's
    request id (docs/operate/logs.md) missed the line that says another replica took it over."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    claimed = await _a_stranded_turn_claimed(h, "r-logged")
    caplog.set_level(logging.WARNING, logger="turnwire.engine")
    await _recovered_once(h, "r-logged", claimed)
    (line,) = [r for r in caplog.records if r.getMessage().startswith("recovering turn")]
    assert (getattr(line, "conversation_id", None), getattr(line, "request_id", None)) == (CONV, "r-logged")
