"""The embedded SQLite store serves one process: a second ``turnwire serve`` on the same file
is refused at start-up, before it reads or writes anything (issue: it used to start silently,
mark the first server's live turn as crashed, and run turns on one conversation at once)."""

from __future__ import annotations

from support.endless import endless_step
from support.sidecar import SidecarError, SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                # Never ends on its own: live however long the second server takes to start and
                # exit; its own client cancels it after.
                "endless": [endless_step("one two three four ", 400)],
                "slow": [{"text": "one two three four", "delay_ms": 400}],
            }
        }
    }
}


async def test_a_second_server_on_the_same_database_is_refused_and_the_first_is_untouched(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(first.target) as client:
        stream = client.chat("c1", "go", model="scripted:endless", request_id="live")
        events = []
        # anext, not `async for`: leaving such a loop would cancel the turn, which must stay live.
        while (event := await anext(stream)).WhichOneof("event") != "text_delta":
            events.append(event)
        events.append(event)  # the turn is live now; its stream stays open below
        second = sidecar_factory(CONFIG)  # same folder: same turnwire.db
        try:
            await second.start()
        except SidecarError:
            pass
        else:
            raise AssertionError("a second server started on a database another server is using")
        await wait_until(lambda: second.returncode is not None, what="the second server exits")
        assert second.returncode != 0
        log = second.log_text()
        assert "is in use by another turnwire process" in log
        assert "recovered" not in log and "Traceback" not in log
        # The first server's live turn was not touched: still running, it ends when its own
        # client cancels it, and the conversation goes on normally.
        assert await client.cancel_chat("live"), "the live turn still runs after the second server"
        assert (await collect(stream)).status == event_pb2.TURN_STATUS_ABORTED
        rest = await collect(client.chat("c1", "again", model="scripted:slow"))
    assert rest.status == event_pb2.TURN_STATUS_COMPLETED


async def test_the_database_is_free_again_once_its_server_is_killed(sidecar_factory: SidecarFactory) -> None:
    first = await sidecar_factory(CONFIG).start()
    first.kill()  # SIGKILL: the OS releases the file lock
    second = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(second.target) as client:
        assert (await collect(client.chat("c2", "hi"))).status == event_pb2.TURN_STATUS_COMPLETED
