"""A real ``turnwire serve`` on the PostgreSQL store (``store.url: postgresql://…``, a fresh
database per test): a chat with a server tool and a client tool call, its results, a
submission, a resume; then a SIGKILL mid-answer and the restarted sidecar's recovery finishing
the same stored message, as ``test_recovery_e2e.py`` checks on SQLite.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

WORDS = [f"w{i}" for i in range(50)]
REST = "and that is the end."
LOCATE = {"type": "object", "properties": {"precision": {"type": "string"}}}


def config() -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                "scripts": {
                    # A server tool (the demo calculator) and a client tool in one step, then an answer.
                    "tools": [
                        {
                            "text": "Computing and asking your device.",
                            "tool_calls": [
                                {"name": "calculator", "input": {"expression": "6 * 7"}},
                                {"name": "get_location", "input": {"precision": "city"}},
                            ],
                        },
                        {"text": "unreachable"},
                    ],
                    "answer": [{"text": "You are in Paris and the answer is 42."}],
                    "plain": [{"text": "Noted."}],
                    # 50 words, 60 ms before each chunk; a recovery plays `retry`.
                    "story": [{"text": " ".join(WORDS), "delay_ms": 60, "retry": {"text": REST}}],
                }
            }
        },
        "checkpoint": {"interval_ms": 20},
        "store": {"pool_size": 4},
    }


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


async def start(sidecar_factory: SidecarFactory, url: str) -> SidecarProcess:
    return await sidecar_factory(config(), env=pythonpath_env(), store_url=url).start()


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def turn_row(url: str, request_id: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT state, recovery_count FROM turns WHERE request_id = %s", (request_id,)
        ).fetchone()
    assert row is not None
    return tuple(row)


async def test_a_chat_with_tools_a_submission_and_a_resume_on_postgres(
    sidecar_factory: SidecarFactory, pg_url: str
) -> None:
    sidecar = await start(sidecar_factory, pg_url)
    log = sidecar.log_text()
    assert "(store postgres," in log  # named, never addressed (docs/operate/logs.md)
    assert "postgresql://" not in log and urlsplit(pg_url).netloc not in log
    async with TurnwireClient(sidecar.target) as client:
        locate = {"name": "get_location", "description": "where the device is", "input_schema": LOCATE}
        first = await collect(
            client.chat(
                "pg", "where am I, and 6*7?", request_id="r-1", model="scripted:tools", client_tools=[locate]
            )
        )
        assert first.status == event_pb2.TURN_STATUS_COMPLETED, first.error
        assert first.message is not None
        calls = {p.tool_call.tool_name: p.tool_call for p in first.message.parts if p.HasField("tool_call")}
        assert calls["calculator"].state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        assert calls["get_location"].state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
        assert calls["get_location"].client_executed

        answered = await collect(
            client.submit_tool_results(
                "pg",
                {calls["get_location"].tool_call_id: {"city": "Paris"}},
                model="scripted:answer",
                client_tools=[locate],
            )
        )
        assert answered.status == event_pb2.TURN_STATUS_COMPLETED, answered.error
        stored = await client.get_conversation("pg")
        [result] = [p.tool_call for p in stored.messages[1].parts if p.tool_call.tool_name == "get_location"]
        assert result.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        assert json.loads(result.output_json) == {"city": "Paris"}
        assert answered.message is not None
        assert text_of(answered.message).endswith("You are in Paris and the answer is 42.")
        assert stored.messages[-1] == answered.message

        submitted = await client.submit_messages(
            "pg", "remember that", submission_id="s-1", model="scripted:plain"
        )
        assert submitted.accepted
        again = await client.submit_messages(
            "pg", "remember that", submission_id="s-1", model="scripted:plain"
        )
        assert not again.accepted, "the same submission id is idempotent"
        watched = await collect(client.watch_submission("s-1"))
        assert watched.status == event_pb2.TURN_STATUS_COMPLETED
        assert watched.message is not None and text_of(watched.message) == "Noted."

        async def completed() -> bool:
            return (await client.get_submission("s-1")).state == chat_service_pb2.SUBMISSION_STATE_COMPLETED

        await wait_until(completed, what="the submission is completed")

        resumed = await collect(client.resume_turn("r-1"))
        assert [e.sequence_number for e in resumed.events] == [e.sequence_number for e in first.events]
        assert resumed.message == first.message
        stored = await client.get_conversation("pg")
        assert [text_of(m) for m in stored.messages][-2:] == ["remember that", "Noted."]
    assert await sidecar.terminate() == 0, sidecar.log_text()


async def test_sigkill_mid_answer_on_postgres_is_finished_by_the_recovery(
    sidecar_factory: SidecarFactory, pg_url: str
) -> None:
    first = await start(sidecar_factory, pg_url)
    last = 0
    async with TurnwireClient(first.target) as client:
        seen = 0
        try:
            async for event in client.chat("crash", "a story", request_id="r-text", model="scripted:story"):
                last = event.sequence_number
                seen += event.HasField("text_delta")
                if seen == 8:

                    async def checkpointed() -> bool:
                        stored = await client.get_conversation("crash")
                        return len(stored.messages) == 2 and bool(text_of(stored.messages[1]))

                    await wait_until(checkpointed, what="a checkpoint of the partial reply")
                    first.kill()
        except TurnwireError:
            pass
    assert turn_row(pg_url, "r-text") == ("running", 0)

    second = await start(sidecar_factory, pg_url)
    async with TurnwireClient(second.target) as client:
        events = [event async for event in client.resume_turn("r-text", last)]
        assert events[0].HasField("attempt_start"), events[0]
        attempt = events[0].attempt_start
        assert (attempt.attempt, attempt.appends, attempt.reason) == (2, True, "SERVER_RESTARTED")
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        stored = await client.get_conversation("crash")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
        reply = stored.messages[1]
        partial = text_of(attempt.message)
        assert partial and " ".join(WORDS).startswith(partial.rstrip())
        assert text_of(reply) == partial + REST, "one logical answer is one stored message"
        assert reply.id == attempt.message_id == events[-1].turn_end.message.id
    assert turn_row(pg_url, "r-text") == ("completed", 1)
    assert await second.terminate() == 0, second.log_text()
