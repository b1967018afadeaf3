"""``Checkpointer.take`` (engine/checkpoints.py): another write of the turn (a step's budget
charge) stores the checkpoint; it waits for the checkpoint in flight, so its newer reply lands
after the older one, and no write of the checkpointer follows it."""

from __future__ import annotations

import asyncio

from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.engine.checkpoints import Checkpointer


def _reply(text: str) -> message_pb2.Message:
    message = message_pb2.Message(id="a", role=message_pb2.ROLE_ASSISTANT)
    message.parts.add().text.text = text
    return message


async def test_take_waits_for_the_write_in_flight_and_replaces_the_next() -> None:
    current = _reply("one")
    saved: list[str] = []
    release = asyncio.Event()

    async def save(message: message_pb2.Message) -> None:
        await release.wait()
        saved.append(message.parts[0].text.text)

    checkpoints = Checkpointer(save, lambda: current, 60.0, "r1")
    checkpoints.now()  # "one" in flight, held
    current = _reply("two")
    checkpoints.now()  # coalesced: would write "two" once "one" lands
    taken = asyncio.create_task(checkpoints.take())
    await asyncio.sleep(0)
    assert not taken.done()  # waits for "one"
    release.set()
    snapshot = await taken
    assert snapshot is not None and snapshot.parts[0].text.text == "two"
    await wait_until(lambda: saved == ["one"])
    await checkpoints.close()
    assert saved == ["one"]  # "two" is the taker's to store, not written again here


async def test_take_after_close_is_none() -> None:
    checkpoints = Checkpointer(lambda message: asyncio.sleep(0), lambda: _reply("x"), 60.0, "r1")
    await checkpoints.close()
    assert await checkpoints.take() is None
