"""Detached sub-agents end to end (docs/subagents.md, "Detached sub-agents"): the call returns a
handle at once, the calling turn ends, the child runs on, and its answer arrives as a submission
on the calling conversation, whose turn continues it; a SIGKILL during the child recovers it
once, and its answer still arrives, once; a crash after the child's end is stored and before its
answer's submission is leaves the answer to the next start, which submits it, once.
"""

from __future__ import annotations

import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, message_pb2

WORDS = " ".join(f"w{n}" for n in range(1, 31))

CONFIG: dict[str, Any] = {
    "default_model": "scripted:top",
    "providers": {
        "scripted": {
            "scripts": {
                "top": [
                    {"tool_calls": [{"name": "background", "input": {"prompt": "Work slowly."}}]},
                    {"text": "Started it."},
                ],
                "followup": [{"text": "Got the result."}],
                "slow": [{"text": WORDS, "delay_ms": 100, "retry": {"text": "recovered."}}],
            }
        }
    },
    "subagents": [
        {
            "name": "background",
            "description": "Works in the background.",
            "model": "scripted:slow",
            "detached": True,
        }
    ],
    "middleware": [
        {"path": "support.subagent_hooks:FollowupModel", "options": {"model": "scripted:followup"}}
    ],
    "checkpoint": {"interval_ms": 20},
}


def texts(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


async def call_in_background(client: TurnwireClient, conversation: str) -> dict[str, Any]:
    """Run the calling turn to its end; the sub-agent's handle, as the call's result."""
    result = await collect(client.chat(conversation, "Start the work."))
    assert result.ok, result.error
    assert result.text == "Started it."
    (call,) = [e.tool_output_available for e in result.events if e.HasField("tool_output_available")]
    handle: dict[str, Any] = json.loads(call.output_json)
    assert handle["status"] == "running" and handle["subagent"] == "background"
    assert handle["conversation_id"].startswith(f"{conversation}:sub-")
    return handle


async def delivered(client: TurnwireClient, conversation: str) -> chat_service_pb2.Conversation | None:
    """The calling conversation once the answer's turn stored its reply, else None."""
    stored = await client.get_conversation(conversation)
    return stored if len(stored.messages) >= 4 and texts(stored.messages[-1]) == "Got the result." else None


async def test_the_answer_arrives_as_a_submission_and_the_conversation_continues(
    sidecar_factory: Any,
) -> None:
    sidecar: SidecarProcess = await sidecar_factory(CONFIG, env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target) as client:
        handle = await call_in_background(client, "detached")
        child = await client.get_conversation(handle["conversation_id"])
        assert len(child.messages) <= 2 and not (
            len(child.messages) == 2 and texts(child.messages[1]) == WORDS
        )
        stored = await wait_until(lambda: delivered(client, "detached"), timeout=30, what="the answer's turn")
        assert stored is not None
        answer = stored.messages[2]
        assert answer.role == message_pb2.ROLE_USER
        assert texts(answer) == f"Sub-agent background (call call_0_0) answered: {WORDS}"
        child = await client.get_conversation(handle["conversation_id"])
        assert [texts(m) for m in child.messages] == ["Work slowly.", WORDS]


async def test_sigkill_during_the_child_recovers_it_once(sidecar_factory: Any) -> None:
    first: SidecarProcess = await sidecar_factory(CONFIG, env=pythonpath_env()).start()
    async with TurnwireClient(first.target) as client:
        handle = await call_in_background(client, "crash")

        async def partly_stored() -> bool:
            child = await client.get_conversation(handle["conversation_id"])
            return len(child.messages) == 2 and len(texts(child.messages[1]).split()) >= 3

        await wait_until(partly_stored, timeout=30, what="a checkpoint of the child's partial reply")
    first.kill()

    second: SidecarProcess = await sidecar_factory(CONFIG, env=pythonpath_env()).start()
    async with TurnwireClient(second.target) as client:
        stored = await wait_until(lambda: delivered(client, "crash"), timeout=30, what="the recovered answer")
        assert stored is not None
        answers = [m for m in stored.messages if texts(m).startswith("Sub-agent background")]
        assert len(answers) == 1, [texts(m) for m in stored.messages]
        assert texts(answers[0]).endswith("recovered.")
        child = await client.get_conversation(handle["conversation_id"])
        assert [m.role for m in child.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    with sqlite3.connect(second.db_path) as db:
        rows = db.execute(
            "SELECT state, recovery_count FROM turns WHERE conversation_id = ?", (handle["conversation_id"],)
        ).fetchall()
    assert rows == [("completed", 1)]
    assert await second.terminate() == 0, second.log_text()


def crashing_after_the_child(config: dict[str, Any], go_file: Path) -> dict[str, Any]:
    """``config`` with a quick child whose process exits right after its end is stored, once
    ``go_file`` exists."""
    crashing = copy.deepcopy(config)
    crashing["providers"]["scripted"]["scripts"]["quick"] = [{"text": "Done quickly."}]
    (background,) = crashing["subagents"]
    background["model"] = "scripted:quick"
    background["middleware"] = [
        {"path": "support.exits:ExitsAfterTurnEnd", "options": {"go_file": str(go_file)}}
    ]
    return crashing


def submissions_of(db_path: Any) -> list[tuple[str, str]]:
    with sqlite3.connect(db_path) as db:
        return db.execute("SELECT id, conversation_id FROM submissions ORDER BY seq").fetchall()


async def test_a_crash_between_the_childs_end_and_its_submission_delivers_once_at_restart(
    sidecar_factory: Any, tmp_path: Path
) -> None:
    go = tmp_path / "crash-now"
    first: SidecarProcess = await sidecar_factory(
        crashing_after_the_child(CONFIG, go), env=pythonpath_env()
    ).start()
    async with TurnwireClient(first.target) as client:
        handle = await call_in_background(client, "gap")
    go.touch()  # the calling turn has ended: the child's process may crash now
    assert await first.wait() == 3, first.log_text()  # exited in the child's on_chat_response
    with sqlite3.connect(first.db_path) as db:
        child_turn = db.execute(
            "SELECT state FROM turns WHERE conversation_id = ?", (handle["conversation_id"],)
        ).fetchall()
    assert child_turn == [("completed",)]  # its end is stored ...
    assert submissions_of(first.db_path) == []  # ... its answer's submission is not

    second: SidecarProcess = await sidecar_factory(CONFIG, env=pythonpath_env()).start()
    async with TurnwireClient(second.target) as client:
        stored = await wait_until(
            lambda: delivered(client, "gap"), timeout=30, what="the answer after restart"
        )
        assert stored is not None
        answers = [texts(m) for m in stored.messages if texts(m).startswith("Sub-agent background")]
        assert answers == ["Sub-agent background (call call_0_0) answered: Done quickly."]
        child = await client.get_conversation(handle["conversation_id"])
        assert [texts(m) for m in child.messages] == ["Work slowly.", "Done quickly."]  # not run again
    # One submission, though the start-up and the maintenance sweep may both have looked.
    assert await second.terminate() == 0, second.log_text()
    (submission,) = submissions_of(second.db_path)
    assert submission[1] == "gap" and "tw-r-" in submission[0]
