"""Recovery that finishes the answer (docs/semantics.md §5, §8, §12).

After a SIGKILL mid-text or mid-tool, the restarted sidecar recovers the turn: it continues the
interrupted assistant message under the same id (one stored message), its stream (ResumeTurn)
carries an AttemptStart, and the recovery runs once, within a budget counted in the store
across repeated crashes. A stall before the first chunk re-runs the turn in the same stream.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory, SidecarProcess
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

WORDS = [f"w{i}" for i in range(50)]
REST = "and that is the end."


def config(*, budget: int = 2, retry_delay_ms: float = 0) -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                "scripts": {
                    # 50 words, 60 ms before each chunk; a recovery plays `retry`.
                    "story": [
                        {
                            "text": " ".join(WORDS),
                            "delay_ms": 60,
                            "retry": {"text": REST, "delay_ms": retry_delay_ms},
                        }
                    ],
                    # Text, a tool call to a tool that waits 30 s, then (step 1) an answer.
                    "tool": [
                        {
                            "text": "let me wait",
                            "tool_calls": [{"name": "wait", "input": {"seconds": 30}}],
                            "retry": {"text": "the wait was interrupted; done anyway"},
                        },
                        {"text": "waited"},
                    ],
                }
            }
        },
        "tools": {"python": ["support.durable_tools:wait"]},
        "checkpoint": {"interval_ms": 20},
        "durability": {"recovery_budget": budget},
    }


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def turn_row(sidecar: SidecarProcess, request_id: str) -> tuple[str, int]:
    with sqlite3.connect(Path(sidecar.db_path)) as db:
        row = db.execute(
            "SELECT state, recovery_count FROM turns WHERE request_id = ?", (request_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1]


async def start(sidecar_factory: SidecarFactory, cfg: dict[str, object]) -> SidecarProcess:
    return await sidecar_factory(cfg, env=pythonpath_env()).start()


async def kill_after(client: TurnwireClient, sidecar: SidecarProcess, stream: object, deltas: int) -> int:
    """Read ``stream`` until ``deltas`` text deltas arrived and a checkpoint of them is stored,
    then SIGKILL the sidecar; returns the last sequence number seen."""
    seen = 0
    last = 0
    try:
        async for event in stream:  # type: ignore[attr-defined]
            last = event.sequence_number
            seen += event.HasField("text_delta")
            if seen == deltas:

                async def checkpointed() -> bool:
                    stored = await client.get_conversation("crash")
                    return len(stored.messages) == 2 and bool(text_of(stored.messages[1]))

                await wait_until(checkpointed, what="a checkpoint of the partial reply")
                sidecar.kill()
    except TurnwireError:
        pass
    return last


async def test_sigkill_mid_text_recovery_finishes_the_same_message_once(
    sidecar_factory: SidecarFactory,
) -> None:
    first = await start(sidecar_factory, config())
    async with TurnwireClient(first.target) as client:
        last = await kill_after(
            client, first, client.chat("crash", "a story", request_id="r-text", model="scripted:story"), 8
        )

    second = await start(sidecar_factory, config())
    async with TurnwireClient(second.target) as client:
        events = [event async for event in client.resume_turn("r-text", last)]
        attempt = next(e for e in events if e.HasField("attempt_start")).attempt_start
        assert attempt.attempt == 2
        assert attempt.appends, "something was committed: the recovery continues that message"
        assert attempt.reason == "SERVER_RESTARTED"
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        # Events the crash lost were numbered at most `last`; the recovery numbers above any of
        # them, so a reader resuming from what it saw still gets the AttemptStart first.
        assert events[0].HasField("attempt_start"), events[0]

        stored = await client.get_conversation("crash")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
        reply = stored.messages[1]
        assert reply.id == attempt.message_id == events[-1].turn_end.message.id
        partial = text_of(attempt.message)
        assert partial and " ".join(WORDS).startswith(partial.rstrip())
        assert text_of(reply) == partial + REST, "one logical answer is one stored message"
        assert reply == events[-1].turn_end.message
        assert turn_row(second, "r-text") == ("completed", 1)
    assert await second.terminate() == 0, second.log_text()

    third = await start(sidecar_factory, config())  # a clean restart recovers nothing more
    async with TurnwireClient(third.target) as client:
        assert (await client.get_conversation("crash")).messages[1] == reply
    assert turn_row(third, "r-text") == ("completed", 1)
    assert await third.terminate() == 0, third.log_text()


async def test_sigkill_mid_tool_recovery_finishes_the_answer(sidecar_factory: SidecarFactory) -> None:
    first = await start(sidecar_factory, config())
    async with TurnwireClient(first.target) as client:
        try:
            async for event in client.chat(
                "crash", "wait for me", request_id="r-tool", model="scripted:tool"
            ):
                if event.HasField("tool_input_available"):

                    async def call_stored() -> bool:
                        stored = await client.get_conversation("crash")
                        return len(stored.messages) == 2 and any(
                            p.WhichOneof("kind") == "tool_call" and p.tool_call.input_json
                            for p in stored.messages[1].parts
                        )

                    await wait_until(call_stored, what="the tool call is checkpointed")
                    first.kill()
        except TurnwireError:
            pass

    second = await start(sidecar_factory, config())
    async with TurnwireClient(second.target) as client:
        events = [event async for event in client.resume_turn("r-tool")]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, events[-1]
        stored = await client.get_conversation("crash")
        assert len(stored.messages) == 2
        reply = stored.messages[1]
        calls = [p.tool_call for p in reply.parts if p.WhichOneof("kind") == "tool_call"]
        assert [c.state for c in calls] == [message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR]
        assert "interrupted" in calls[0].error_text
        assert text_of(reply) == "let me wait" + "the wait was interrupted; done anyway"
        assert turn_row(second, "r-tool") == ("completed", 1)
    assert await second.terminate() == 0, second.log_text()


async def test_the_recovery_budget_holds_across_repeated_crashes(sidecar_factory: SidecarFactory) -> None:
    cfg = config(budget=1, retry_delay_ms=5000)  # the recovery itself hangs: it gets killed too
    first = await start(sidecar_factory, cfg)
    async with TurnwireClient(first.target) as client:
        await kill_after(
            client, first, client.chat("crash", "a story", request_id="r-budget", model="scripted:story"), 4
        )

    second = await start(sidecar_factory, cfg)
    async with TurnwireClient(second.target) as client:
        stream = client.resume_turn("r-budget")
        async for event in stream:
            if event.HasField("attempt_start"):
                break  # the recovery runs: kill it mid-way
        assert turn_row(second, "r-budget") == ("running", 1), "counted before it ran"
        second.kill()

    third = await start(sidecar_factory, cfg)
    async with TurnwireClient(third.target) as client:
        events = [event async for event in client.resume_turn("r-budget")]
        end = events[-1].turn_end
        assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
        assert "recovery budget of 1 is spent" in end.error.message
        assert turn_row(third, "r-budget") == ("interrupted", 1), "no second recovery"
        stored = await client.get_conversation("crash")
        assert len(stored.messages) == 2 and text_of(stored.messages[1]), "the partial reply is kept"
    assert await third.terminate() == 0, third.log_text()


async def test_a_stall_before_the_first_chunk_reruns_the_turn_in_the_same_stream(
    sidecar_factory: SidecarFactory,
) -> None:
    cfg = {
        "providers": {
            "scripted": {
                "scripts": {
                    "stall": [{"text": "never sent", "delay_ms": 3000, "retry": {"text": "fresh answer"}}]
                }
            }
        },
        "limits": {"stream_stall_timeout_seconds": 0.3},
        "durability": {"stall_recovery": True, "recovery_budget": 1},
    }
    sidecar = await sidecar_factory(cfg).start()
    async with TurnwireClient(sidecar.target) as client:
        events = [
            event
            async for event in client.chat("stall", "hello", request_id="r-stall", model="scripted:stall")
        ]
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "turn_start"
        attempt = next(e for e in events if e.HasField("attempt_start")).attempt_start
        assert (attempt.attempt, attempt.appends, attempt.reason) == (2, False, "STREAM_STALLED")
        assert kinds.count("turn_end") == 1
        end = events[-1].turn_end
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
        assert text_of(end.message) == "fresh answer"
        stored = await client.get_conversation("stall")
        assert [text_of(m) for m in stored.messages] == ["hello", "fresh answer"]
        assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
        assert turn_row(sidecar, "r-stall") == ("completed", 1)
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_sigterm_leaves_a_continue_turn_and_pending_submissions_for_the_next_start(
    sidecar_factory: SidecarFactory,
) -> None:
    """Shutdown: a turn with no caller waiting (disconnect policy CONTINUE, a submission) that
    outlives the grace period is not aborted but left running, its partial reply stored; the next
    start finishes it in the same message. A pending submission stays pending and runs then."""
    cfg = config(retry_delay_ms=0)
    cfg["limits"] = {"shutdown_grace_seconds": 0.2}
    first = await start(sidecar_factory, cfg)
    async with TurnwireClient(first.target) as client:
        seen = 0
        async with client.chat(
            "crash", "a story", request_id="r-term", model="scripted:story", disconnect="continue"
        ) as stream:
            async for event in stream:
                seen += event.HasField("text_delta")
                if seen == 3:
                    break  # the caller leaves; the turn goes on
        queued = await client.submit_messages("crash", "and after that?", submission_id="s-after")
        assert queued.accepted
    assert await first.terminate() == 0, first.log_text()
    assert turn_row(first, "r-term")[0] == "running", "left for the next start, not aborted"

    second = await start(sidecar_factory, cfg)
    async with TurnwireClient(second.target) as client:
        events = [event async for event in client.resume_turn("r-term")]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        assert any(e.HasField("attempt_start") for e in events)
        stored = await client.get_conversation("crash")
        assert text_of(stored.messages[1]).endswith(REST)
        assert turn_row(second, "r-term") == ("completed", 1)

        async def submission_done() -> bool:
            return (
                await client.get_submission("s-after")
            ).state == chat_service_pb2.SUBMISSION_STATE_COMPLETED

        await wait_until(submission_done, what="the pending submission runs after the restart")
        stored = await client.get_conversation("crash")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 2
    assert await second.terminate() == 0, second.log_text()
