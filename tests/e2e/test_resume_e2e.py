"""Resumable streams end to end (docs/semantics.md §5 disconnect policy, §8 resumable streams).

A caller with disconnect policy CONTINUE drops its stream mid-turn and re-attaches with
ResumeTurn from the last sequence number it saw; every event arrives exactly once, the turn
runs once. Also: re-attaching after the turn finished, a second reader while the caller is
still attached, an unknown request id, and a turn past the event retention.
"""

from __future__ import annotations

import grpc
from support.endless import endless_step
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

WORDS = [f"w{i}" for i in range(40)]


def config(**durability: object) -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                "scripts": {
                    # 40 words, 120 ms before each chunk: about 5 s, so a re-attach made a few
                    # calls after the first events still finds it running on a loaded machine.
                    "slow": [{"text": " ".join(WORDS), "delay_ms": 120}],
                    # Never ends on its own: only the hang-up ends it.
                    "endless": [endless_step("".join(f"{word} " for word in WORDS), 40)],
                    "fast": [{"text": "quick answer"}],
                }
            }
        },
        "checkpoint": {"interval_ms": 50},
        "durability": dict(durability),
    }


def numbers(events: list[event_pb2.TurnEvent]) -> list[int]:
    return [e.sequence_number for e in events]


def text(events: list[event_pb2.TurnEvent]) -> str:
    return "".join(e.text_delta.delta for e in events if e.HasField("text_delta"))


async def test_continue_then_resume_gets_every_event_exactly_once(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config()).start()
    async with TurnwireClient(sidecar.target) as client:
        seen: list[event_pb2.TurnEvent] = []
        async with client.chat(
            "resume", "tell me", request_id="r-continue", model="scripted:slow", disconnect="continue"
        ) as stream:
            async for event in stream:
                seen.append(event)
                if len([e for e in seen if e.HasField("text_delta")]) == 5:
                    break  # the caller hangs up mid-turn
        assert seen[0].HasField("turn_start")
        last = seen[-1].sequence_number

        rest = [event async for event in client.resume_turn("r-continue", last)]
        events = seen + rest
        assert numbers(events) == list(range(1, len(events) + 1)), "every event once, in order, no gap"
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        assert text(events) == " ".join(WORDS)
        stored = await client.get_conversation("resume")
        assert [m.id for m in stored.messages][1] == events[0].turn_start.message_id
        assert events[-1].turn_end.message == stored.messages[1]

        # After the end: the whole stream again, byte for byte, and the turn did not run twice.
        again = [event async for event in client.resume_turn("r-continue")]
        assert [e.SerializeToString() for e in again] == [e.SerializeToString() for e in events]
        assert len((await client.get_conversation("resume")).messages) == 2
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_cancel_policy_still_aborts_when_the_caller_hangs_up(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config()).start()
    async with TurnwireClient(sidecar.target) as client:
        async with client.chat(
            "hangup", "tell me", request_id="r-cancel", model="scripted:endless"
        ) as stream:
            async for event in stream:
                if event.HasField("text_delta"):
                    break
        resumed = [event async for event in client.resume_turn("r-cancel")]
        assert resumed[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
        assert numbers(resumed) == list(range(1, len(resumed) + 1))
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_a_second_reader_sees_the_live_turn_while_the_caller_reads_it(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(config()).start()
    async with TurnwireClient(sidecar.target) as client:
        caller = client.chat("two", "tell me", request_id="r-two", model="scripted:slow")
        first = await anext(caller)
        assert first.HasField("turn_start")
        watcher = [event async for event in client.resume_turn("r-two")]
        caller_events = [first] + [event async for event in caller]
        assert [e.SerializeToString() for e in watcher] == [e.SerializeToString() for e in caller_events]
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_resume_of_an_unknown_request_is_not_found_and_says_why(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(config()).start()
    async with TurnwireClient(sidecar.target) as client:
        try:
            async for _ in client.resume_turn("no-such-turn"):
                pass
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.NOT_FOUND, error
            assert error.reason == "TURN_NOT_FOUND"
            assert "no turn with request_id 'no-such-turn'" in error.message
        else:
            raise AssertionError("ResumeTurn of an unknown request id must fail")
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_resume_past_the_retention_is_not_found_and_says_why(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(config(event_retention_seconds=0.5)).start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("old", "hi", request_id="r-old", model="scripted:fast"))
        assert result.ok, result.error
        assert [e async for e in client.resume_turn("r-old")][-1].HasField("turn_end"), "within retention"

        async def expired() -> bool:
            try:
                async for _ in client.resume_turn("r-old"):
                    pass
            except TurnwireError as error:
                assert error.code == grpc.StatusCode.NOT_FOUND, error
                assert "event_retention_seconds" in error.message, error.message
                return True
            return False

        await wait_until(expired, timeout=10, what="the turn's events expire")
    assert await sidecar.terminate() == 0, sidecar.log_text()
