"""Durability end to end: restarts, SIGKILL mid-turn, and SIGTERM during a turn.

Every test runs sidecar processes one after the other on the same directory, so
they share one SQLite database.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import json_format
from support.endless import endless_step, is_prefix_of_repeats
from support.sidecar import SidecarFactory, SidecarProcess
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

WORDS = [f"w{i}" for i in range(60)]
ENDLESS = "".join(f"{word} " for word in WORDS)
SLOW_TOOL_TEXT = "checking the numbers"
AFTER_THE_CALL = "it is 2 "
RESOLVED = (
    message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
    message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
    message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
)


def config(*, grace: float = 10.0) -> dict[str, object]:
    """Recovery on start is off here: these tests check what a crash leaves stored (recovery
    itself is tests/e2e/test_recovery_e2e.py)."""
    return {
        "durability": {"recover_on_start": False},
        "providers": {
            "scripted": {
                "scripts": {
                    # 10 words, 250 ms before each chunk: about 2.75 s, so still running for
                    # about 2 s after the third delta (a SIGTERM), well within a 10 s grace.
                    "short": [{"text": " ".join(WORDS[:10]), "delay_ms": 250}],
                    # Never ends: a SIGTERM's short grace always finds it running.
                    "long": [endless_step(ENDLESS, 50)],
                    # Text, then a tool call (150 ms before each chunk), then a reply that never
                    # ends: the SIGKILL always comes mid-turn, however long the checkpoint takes.
                    "slow-tool": [
                        {
                            "text": SLOW_TOOL_TEXT,
                            "tool_calls": [{"name": "calculator", "input": {"expression": "1 + 1"}}],
                            "delay_ms": 150,
                        },
                        endless_step(AFTER_THE_CALL, 150),
                    ],
                    # A complete tool call, then the model pauses 1.2 s before finishing, then a
                    # reply that never ends (the SIGKILL ends the turn).
                    "pause-after-call": [
                        {
                            "tool_calls": [{"name": "calculator", "input": {"expression": "1 + 1"}}],
                            "delay_ms": 1200,
                        },
                        endless_step(AFTER_THE_CALL, 50),
                    ],
                }
            }
        },
        "limits": {"shutdown_grace_seconds": grace},
        "checkpoint": {"interval_ms": 20},
    }


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def streamed_text(events: list[event_pb2.TurnEvent]) -> str:
    return "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")


def tool_calls_of(message: message_pb2.Message) -> list[message_pb2.ToolCallPart]:
    return [p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"]


def call_checkpointed(
    client: TurnwireClient, conversation_id: str, streamed_input: object
) -> Callable[[], Awaitable[bool]]:
    """A check for :func:`wait_until`: the stored (checkpointed) reply holds a tool call whose
    input is ``streamed_input``. A checkpoint can hold the call before its input is complete
    (``{}``), so the input is compared, not just the call's presence."""

    async def check() -> bool:
        stored = await client.get_conversation(conversation_id)
        calls = tool_calls_of(stored.messages[1]) if len(stored.messages) == 2 else []
        return bool(calls) and json_format.MessageToDict(calls[0].input) == streamed_input

    return check


async def test_conversation_survives_a_graceful_restart(sidecar_factory: SidecarFactory) -> None:
    first = await sidecar_factory(config()).start()
    async with TurnwireClient(first.target) as client:
        result = await collect(client.chat("durable", "What's the weather in Paris?"))
        assert result.ok, result.error
        before = await client.get_conversation("durable")
        listed_before = await client.list_conversations()
    assert await first.terminate() == 0, first.log_text()

    second = await sidecar_factory(config()).start()
    async with TurnwireClient(second.target) as client:
        after = await client.get_conversation("durable")
        assert after == before
        assert await client.list_conversations() == listed_before
        assert after.messages[1] == result.message

        again = await collect(client.chat("durable", "And what is 12 * 7?"))
        assert again.ok, again.error
        assert [c.tool_name for c in again.tool_calls] == ["calculator"]
        final = await client.get_conversation("durable")
    assert list(final.messages[:2]) == list(before.messages)
    assert [m.role for m in final.messages[2:]] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert final.messages[3] == again.message
    assert await second.terminate() == 0, second.log_text()


async def test_sigkill_mid_turn_keeps_the_user_message_and_the_conversation_usable(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await sidecar_factory(config()).start()
    events: list[event_pb2.TurnEvent] = []
    async with TurnwireClient(first.target) as client:
        try:
            async for event in client.chat("crash", "count for me", model="scripted:slow-tool"):
                events.append(event)
                if event.HasField("tool_input_available"):
                    # Wait for a checkpoint holding the call (without its result) to reach the disk.
                    streamed_input = json_format.MessageToDict(event.tool_input_available.input)
                    await wait_until(
                        call_checkpointed(client, "crash", streamed_input),
                        what="the call and its input are checkpointed",
                    )
                    first.kill()
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.UNAVAILABLE, error
        else:
            raise AssertionError(f"the stream should break when the server dies: {events[-1]}")
    assert not any(e.HasField("turn_end") for e in events)
    assert first.returncode == -signal.SIGKILL

    second = await sidecar_factory(config()).start()
    async with TurnwireClient(second.target) as client:
        stored = await client.get_conversation("crash")
        assert stored.messages[0].role == message_pb2.ROLE_USER
        assert text_of(stored.messages[0]) == "count for me"
        partials = list(stored.messages[1:])
        assert len(partials) == 1, "the checkpointed partial reply survives the crash"
        partial = partials[0]
        assert partial.role == message_pb2.ROLE_ASSISTANT
        # Stored as streamed: part of the text before the call, or all of it and part of the
        # (endless) reply after the call's result.
        stored_text = text_of(partial)
        assert SLOW_TOOL_TEXT.startswith(stored_text) or (
            stored_text.startswith(SLOW_TOOL_TEXT)
            and is_prefix_of_repeats(stored_text[len(SLOW_TOOL_TEXT) :], AFTER_THE_CALL)
        ), stored_text
        calls = tool_calls_of(partial)
        assert [c.tool_name for c in calls] == ["calculator"]
        assert calls[0].state in RESOLVED, calls[0]

        result = await collect(client.chat("crash", "What's the weather in Paris?"))
        assert result.ok, result.error
        final = await client.get_conversation("crash")
    assert list(final.messages[: len(stored.messages)]) == list(stored.messages)
    assert [m.role for m in final.messages[len(stored.messages) :]] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]
    assert final.messages[-1] == result.message
    assert await second.terminate() == 0, second.log_text()


async def test_sigkill_loses_at_most_the_last_few_hundred_ms_of_output(
    sidecar_factory: SidecarFactory,
) -> None:
    """docs/semantics.md §8: a streaming reply is checkpointed often enough that a
    crash loses at most the last few hundred milliseconds of output. Here the model streamed
    a complete tool call, then paused (1.2 s); the checkpoint holding the call must be on disk
    within 700 ms (the checkpoint interval is 20 ms), and it must survive a SIGKILL."""
    first = await sidecar_factory(config()).start()
    streamed_input = None
    async with TurnwireClient(first.target) as client:
        with contextlib.suppress(TurnwireError):
            async for event in client.chat("pause", "add", model="scripted:pause-after-call"):
                if event.HasField("tool_input_available"):
                    streamed_input = json_format.MessageToDict(event.tool_input_available.input)
                    await wait_until(
                        call_checkpointed(client, "pause", streamed_input),
                        timeout=0.7,
                        what="the call and its input are checkpointed",
                    )
                    first.kill()
    assert streamed_input == {"expression": "1 + 1"}

    second = await sidecar_factory(config()).start()
    async with TurnwireClient(second.target) as client:
        stored = await client.get_conversation("pause")
    assert len(stored.messages) == 2, "the partial reply was checkpointed"
    calls = [p.tool_call for p in stored.messages[1].parts if p.WhichOneof("kind") == "tool_call"]
    assert len(calls) == 1
    assert calls[0].tool_name == "calculator"
    assert calls[0].state in RESOLVED, "recovery gives the interrupted call a result"
    assert json_format.MessageToDict(calls[0].input) == streamed_input, (
        "the call's input, checkpointed before the crash, did not survive it"
    )


async def sigterm_during_turn(
    sidecar: SidecarProcess, model: str
) -> tuple[list[event_pb2.TurnEvent], TurnwireError | None]:
    """Chat; send SIGTERM after the third text delta. The events and the call's error, if any."""
    events: list[event_pb2.TurnEvent] = []
    async with TurnwireClient(sidecar.target) as client:
        try:
            async for event in client.chat("shutdown", "talk", model=model, timeout=20):
                events.append(event)
                if sum(e.HasField("text_delta") for e in events) == 3 and event.HasField("text_delta"):
                    sidecar.send_signal(signal.SIGTERM)
        except TurnwireError as error:
            return events, error
    return events, None


async def test_sigterm_lets_a_turn_within_the_grace_period_complete(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await sidecar_factory(config(grace=10)).start()
    events, error = await sigterm_during_turn(first, "scripted:short")
    assert error is None, f"{error}\n{first.log_text()}"
    end = events[-1]
    assert end.HasField("turn_end")
    assert end.turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.turn_end.message) == " ".join(WORDS[:10])
    assert await first.wait() == 0, first.log_text()

    second = await sidecar_factory(config(grace=10)).start()
    async with TurnwireClient(second.target) as client:
        stored = await client.get_conversation("shutdown")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[1] == end.turn_end.message


async def test_sigterm_past_the_grace_period_aborts_the_turn_and_stores_the_partial(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await sidecar_factory(config(grace=0.3)).start()
    events, error = await sigterm_during_turn(first, "scripted:long")
    assert await first.wait() == 0, first.log_text()
    delivered = streamed_text(events)

    second = await sidecar_factory(config(grace=0.3)).start()
    async with TurnwireClient(second.target) as client:
        stored = await client.get_conversation("shutdown")
        assert [m.role for m in stored.messages] == [
            message_pb2.ROLE_USER,
            message_pb2.ROLE_ASSISTANT,
        ]
        partial = stored.messages[1]
        # The reply never ends on its own: only the end of the grace stopped it (ABORTED below).
        assert delivered and text_of(partial).startswith(delivered)
        assert is_prefix_of_repeats(text_of(partial), ENDLESS)

        # The conversation goes on after the aborted turn.
        assert (await collect(client.chat("shutdown", "hello again"))).ok

    # The client is told how its turn ended, even though the server is going away.
    assert error is None, (
        f"the stream failed with {error} instead of ending with a TurnEnd "
        f"(last event: {events[-1].WhichOneof('event') if events else None})"
    )
    end = events[-1]
    assert end.HasField("turn_end")
    assert end.turn_end.status == event_pb2.TURN_STATUS_ABORTED
    assert end.turn_end.message == partial
