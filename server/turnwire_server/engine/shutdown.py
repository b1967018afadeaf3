"""Stopping the turns still running at shutdown (docs/operate/stopping.md): the grace they get,
then a cancel, or a stop that leaves them to the next start's recovery.

:meth:`TurnEngine.drain <turnwire_server.engine.engine.TurnEngine.drain>` stops admitting turns,
then calls :func:`stop_turns` with the ones running.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection
from typing import Any

from turnwire_server.engine.errors import CancelledByShutdown, ServerStopping
from turnwire_server.engine.turn_handle import TurnHandle

__all__ = ["stop_turns"]

log = logging.getLogger("turnwire.engine")


async def stop_turns(
    handles: Collection[TurnHandle], grace_seconds: float, cut_short: asyncio.Event | None = None
) -> None:
    """Let ``handles`` finish for ``grace_seconds`` (or until ``cut_short`` is set: an operator's
    second Ctrl-C), then cancel the rest (they store their partial replies) and wait for them to
    end. A turn that runs without its caller (disconnect policy CONTINUE, a submission, a
    recovery) is not cancelled but stopped with :class:`ServerStopping`: its partial reply is
    stored and it stays running in the store, so the next start recovers it."""
    by_task = {h.task: h for h in handles}
    if not by_task:
        return
    began = time.monotonic()
    # Either every turn ends, the grace runs out, or the operator cuts it short.
    all_ended = asyncio.ensure_future(asyncio.wait(by_task))
    race: set[asyncio.Future[Any]] = {all_ended}
    if cut_short is not None:
        race.add(asyncio.ensure_future(cut_short.wait()))
    try:
        await asyncio.wait(race, timeout=grace_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in race:
            waiter.cancel()  # asyncio.wait's own cancel leaves the turn tasks running
    pending = {task for task in by_task if not task.done()}
    # The time they really had: a second signal may have cut the grace short.
    why = (
        "a second signal cut the grace short"
        if cut_short is not None and cut_short.is_set()
        else f"the {grace_seconds:g} s grace ran out"
    )
    for task in pending:
        handle = by_task[task]
        run = handle.run
        if (run.request.disconnect == "continue" and run.messages_persisted) or handle.detached:
            # No caller waits: a started turn is recovered at the next start, a submission
            # that has not started runs then (its watchers are told why it stopped).
            run.cancel(ServerStopping())
        else:
            handle.cancel(CancelledByShutdown(f"shutdown: {why}"))
    if pending:
        log.warning(
            "shutdown: cancelled %d turn(s) still running after %.1f s (%s)",
            len(pending),
            time.monotonic() - began,
            why,
        )
        await asyncio.wait(pending)
