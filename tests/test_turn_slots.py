"""The engine counts a turn that runs without its caller through ``TurnSlots`` (issue 32 item 5):
from the moment its caller lets it go on (``TurnHandle.release`` under CONTINUE) or from its start
when it has none (a submission, a recovery), until its task ends; a turn over before its caller
left holds nothing. ``api/admission.py``'s ``CallGate`` counts those against the tenant's share
(``tests/e2e/test_tenant_shares_e2e.py``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

from support.engine_harness import CONV, EngineFactory, Harness


class RecordingSlots:
    """``TurnSlots`` that keeps how many slots each conversation holds, and every release."""

    def __init__(self) -> None:
        self.held: Counter[str] = Counter()
        self.releases = 0

    def hold_turn(self, conversation_id: str) -> Callable[[], None]:
        self.held[conversation_id] += 1

        def release() -> None:
            self.held[conversation_id] -= 1
            self.releases += 1

        return release


async def held_engine(
    make_engine: EngineFactory,
) -> tuple[Harness, RecordingSlots, asyncio.Event, asyncio.Event]:
    h = await make_engine()
    slots = RecordingSlots()
    h.engine.turn_slots = slots
    called, release = asyncio.Event(), asyncio.Event()

    async def hold(request: Any) -> None:
        called.set()
        await release.wait()

    h.provider.before_stream = hold
    return h, slots, called, release


async def test_a_turn_its_caller_left_running_holds_a_slot_until_it_ends(make_engine: EngineFactory) -> None:
    h, slots, called, release = await held_engine(make_engine)
    request = dataclasses.replace(h.request("go on"), disconnect="continue")
    handle = await h.engine.start(request)
    await asyncio.wait_for(called.wait(), 5)
    assert slots.held[CONV] == 0  # its caller still reads it: the call counts, not the turn
    handle.release()  # the call ended; CONTINUE lets the turn go on
    assert slots.held[CONV] == 1
    handle.release()  # said twice, counted once
    assert slots.held[CONV] == 1
    release.set()
    await asyncio.wait_for(handle.task, 5)
    assert (slots.held[CONV], slots.releases) == (0, 1)


async def test_a_turn_started_without_a_caller_holds_a_slot_from_its_start(
    make_engine: EngineFactory,
) -> None:
    h, slots, called, release = await held_engine(make_engine)
    handle = await h.engine.start(h.request("later"), detached=True)
    assert slots.held[CONV] == 1
    await asyncio.wait_for(called.wait(), 5)
    release.set()
    await asyncio.wait_for(handle.task, 5)
    assert (slots.held[CONV], slots.releases) == (0, 1)


async def test_a_turn_over_before_its_caller_left_holds_none(make_engine: EngineFactory) -> None:
    h = await make_engine()
    slots = RecordingSlots()
    h.engine.turn_slots = slots
    handle = await h.engine.start(dataclasses.replace(h.request("hi"), disconnect="continue"))
    async for _ in handle:
        pass
    await asyncio.wait_for(handle.task, 5)
    handle.release()
    assert (slots.held[CONV], slots.releases) == (0, 0)
