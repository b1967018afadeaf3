"""WatchSubmission of a submission this replica is starting (docs/semantics.md §7): the store says
``pending`` or ``running`` before the engine knows the turn, and with one process per store there
is no other replica to follow. CI (stop 50) saw a scheduled fire's WatchSubmission fail NOT_FOUND
("is running and not running on this server") in that window; the watch now waits for the start.
Real :class:`Submissions` and the API's ``_watch``, with the store and engine stood in for, so the
window can be held open."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from google.rpc import status_pb2

from turnwire_client.v1 import event_pb2
from turnwire_server.api.submission_rpcs import _watch
from turnwire_server.engine.errors import TurnStreamNotFound
from turnwire_server.engine.submissions import Submissions
from turnwire_server.store.records import SubmissionRecord

RECORD = SubmissionRecord("s1", "c1", None, "pending", b"", dt.datetime.now(dt.UTC))


class _Store:
    """Stores a submission only when the test opens ``gate``."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def create_submission(self, submission: SubmissionRecord, *, max_open: int) -> tuple[Any, bool]:
        await self.gate.wait()
        return submission, True


class _Engine:
    """Starts a turn only when the test opens ``gate``; the turn is then known (``running``)."""

    draining = False

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.running: set[str] = set()
        self.settings = SimpleNamespace(replica_id="me", durability=SimpleNamespace(lease_seconds=5.0))

    async def start(self, request: Any, **_: Any) -> Any:
        await self.gate.wait()
        self.running.add(request)
        return SimpleNamespace(task=asyncio.get_running_loop().create_future(), run=None)


def _submissions(store: _Store, engine: _Engine, error_status: Any = lambda *_: None) -> Submissions:
    return Submissions(
        engine,  # type: ignore[arg-type]
        store,  # type: ignore[arg-type]
        turn_request=lambda record: record.submission_id,  # type: ignore[arg-type,return-value]
        max_open=10,
        max_running=4,
        error_status=error_status,
    )


async def test_started_here_waits_while_this_replica_stores_and_starts_the_turn() -> None:
    store, engine = _Store(), _Engine()
    submissions = _submissions(store, engine)
    submitted = asyncio.ensure_future(submissions.submit(RECORD))
    await _turns_of_the_loop()  # submit() runs up to the store's gate
    waiting = asyncio.ensure_future(submissions.started_here("s1", 30))
    store.gate.set()  # stored: the store says pending, the engine knows nothing yet
    await _turns_of_the_loop()
    assert not waiting.done()
    engine.gate.set()
    assert await asyncio.wait_for(waiting, 5) is True
    assert engine.running == {"s1"}
    await submitted
    assert await submissions.started_here("s1", 30) is False  # started: nothing to wait for
    assert await submissions.started_here("elsewhere", 30) is False


async def test_a_watch_in_the_window_follows_the_turn_once_it_started() -> None:
    store, engine = _Store(), _Engine()
    submissions = _submissions(store, engine)
    store.gate.set()
    submitted = asyncio.ensure_future(submissions.submit(RECORD))
    await _turns_of_the_loop()
    running = dataclasses.replace(RECORD, state="running")
    watched = _watching(_once_started(engine, [_completed(1)]), running, engine, submissions)
    await _turns_of_the_loop()
    assert not watched.done()  # before the fix: NOT_FOUND at once
    engine.gate.set()
    assert [e.sequence_number for e in await asyncio.wait_for(watched, 5)] == [1]
    await submitted


async def test_a_watch_whose_submission_finished_starting_between_its_looks_follows_it() -> None:
    """CI (conformance schedule-fires, twice): the replay found no turn (not started yet), and by
    the start's look the start had finished (nothing "starting" any more), the store saying
    running: the watch ended NOT_FOUND ("is running and not running on this server"). It now
    looks once more, and the engine has the turn."""
    engine = _Engine()
    submissions = _submissions(_Store(), engine)  # nothing starting here: started_here is False
    looks: list[int] = []

    async def started_on_the_second_look(request_id: str, after: int, **_: int) -> Any:
        looks.append(after)
        if len(looks) == 1:
            raise TurnStreamNotFound("no stream", request_id=request_id)
        yield [_completed(1)]

    running = dataclasses.replace(RECORD, state="running")
    watched = _watching(started_on_the_second_look, running, engine, submissions)
    assert [e.sequence_number for e in await asyncio.wait_for(watched, 5)] == [1]
    assert len(looks) == 2


async def _collect(batches: Any) -> list[event_pb2.TurnEvent]:
    return [event async for batch in batches for event in batch]


def _completed(sequence_number: int) -> event_pb2.TurnEvent:
    end = event_pb2.TurnEvent(conversation_id="c1", request_id="s1", sequence_number=sequence_number)
    end.turn_end.status = event_pb2.TURN_STATUS_COMPLETED
    return end


def _once_started(engine: _Engine, events: list[event_pb2.TurnEvent]) -> Any:
    """``TurnEngine.replay``: ``events`` once ``engine`` started the turn, before that no stream."""

    async def replay(request_id: str, after: int, **_: int) -> Any:
        if request_id not in engine.running:  # not known here yet, no stream stored
            raise TurnStreamNotFound("no stream", request_id=request_id)
        yield events

    return replay


async def _no_stream(request_id: str, after: int, **_: int) -> Any:
    raise TurnStreamNotFound("no stream", request_id=request_id)
    yield []


def _watching(
    replay: Any,
    record: SubmissionRecord | Callable[[], SubmissionRecord],
    engine: _Engine,
    submissions: Submissions | None = None,
) -> asyncio.Future[list[event_pb2.TurnEvent]]:
    """The API's ``_watch`` of ``RECORD``, collected on a task: the engine's ``replay``, the
    store's submission ``record`` (a record, or a function giving the current one), one process
    per store (``wait_for_events`` follows nobody)."""

    async def get_submission(_: str) -> SubmissionRecord:
        return record if isinstance(record, SubmissionRecord) else record()

    async def wait_for_events(*_: Any) -> bool:
        return False  # one process per store: nobody else writes

    servicer = SimpleNamespace(
        engine=SimpleNamespace(replay=replay, settings=engine.settings),
        store=SimpleNamespace(get_submission=get_submission, wait_for_events=wait_for_events),
        submissions=submissions,
    )
    return asyncio.ensure_future(_collect(_watch(servicer, RECORD, 0, 1, 0)))


async def _turns_of_the_loop() -> None:
    """Let every task that can run without the test run (nothing here waits on I/O)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_watch_of_a_fire_not_yet_claimed_waits_for_this_replicas_claim() -> None:
    """CI (tool stop 50): a schedule's fire commits its submission unclaimed, then the scheduler
    claims it; a WatchSubmission between the two, on a store one process uses, ended NOT_FOUND
    ("is pending and not running on this server"). It now waits for the claim."""
    engine = _Engine()
    engine.gate.set()
    claim_gate = asyncio.Event()

    class _ClaimingStore(_Store):
        async def claim_pending_submissions(self, *_: Any) -> list[SubmissionRecord]:
            await claim_gate.wait()
            return [RECORD]

    submissions = _submissions(_ClaimingStore(), engine)
    engine.handle = lambda request_id: None  # type: ignore[attr-defined]
    # RECORD is pending: stored by the fire, nobody claimed it yet.
    watched = _watching(_once_started(engine, [_completed(1)]), RECORD, engine, submissions)
    claimed = asyncio.ensure_future(submissions.claim())  # waits at the store's claim
    await _turns_of_the_loop()
    assert not watched.done()  # before the fix: NOT_FOUND at once
    claim_gate.set()
    assert [e.sequence_number for e in await asyncio.wait_for(watched, 5)] == [1]
    assert await claimed == 1
    assert submissions._watched == {}  # nothing left behind by the watch


async def test_a_watch_of_a_pending_submission_ends_with_its_cancel() -> None:
    engine = _Engine()
    store = _Store()
    cancelled = dataclasses.replace(RECORD, state="aborted")
    states = [RECORD]

    async def get_submission(_: str) -> SubmissionRecord:
        return states[-1]

    async def end_submission(*_: Any, **__: Any) -> SubmissionRecord:
        states.append(cancelled)
        return cancelled

    async def cancel_anywhere(_: str) -> None:
        return None

    store.get_submission = get_submission  # type: ignore[attr-defined]
    store.end_submission = end_submission  # type: ignore[attr-defined]
    engine.cancel_anywhere = cancel_anywhere  # type: ignore[attr-defined]
    engine.handle = lambda request_id: None  # type: ignore[attr-defined]
    submissions = _submissions(store, engine, error_status=lambda *_: status_pb2.Status(code=9))
    watched = _watching(_no_stream, lambda: states[-1], engine, submissions)  # lease 5 s: the wake is sooner
    await _turns_of_the_loop()
    assert not watched.done()
    await submissions.cancel("s1")
    events = await asyncio.wait_for(watched, 2)
    assert [e.turn_end.status for e in events] == [event_pb2.TURN_STATUS_ABORTED]


async def test_a_watch_that_finds_the_submission_ended_looks_for_its_stream_once_more() -> None:
    """CI (this stop, the Go runner's schedule-fires): the watch found no stream and no turn,
    then read the submission ``completed``: its turn had started and ended between the two reads.
    The watch answered with a TurnEnd made from the record alone; it now reads the stored stream,
    which a turn that ran stores with its end."""
    ran: list[bool] = []
    start = event_pb2.TurnEvent(conversation_id="c1", request_id="s1", sequence_number=1)
    start.turn_start.SetInParent()

    async def replay(request_id: str, after: int, **_: int) -> Any:
        if not ran:
            ran.append(True)  # the turn runs and ends right after this look
            raise TurnStreamNotFound("no stream", request_id=request_id)
        yield [start, _completed(2)]

    completed = dataclasses.replace(RECORD, state="completed")
    events = await asyncio.wait_for(_watching(replay, completed, _Engine()), 5)
    assert [e.WhichOneof("event") for e in events] == ["turn_start", "turn_end"]


async def test_a_submission_that_ended_without_running_gets_a_turn_end_from_its_record() -> None:
    aborted = dataclasses.replace(RECORD, state="aborted")
    events = await asyncio.wait_for(_watching(_no_stream, aborted, _Engine()), 5)
    assert [e.turn_end.status for e in events] == [event_pb2.TURN_STATUS_ABORTED]
