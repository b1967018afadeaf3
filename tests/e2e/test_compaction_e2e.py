"""Context-overflow recovery on every entry path, through a real ``turnwire serve`` process
(docs/semantics.md §9): ``Chat``, ``SaveMessages``, ``ContinueLastTurn``, ``SubmitMessages`` and
the automatic continuation after client tool results.

The sidecar runs the scripted model with a 3,000-token context window (it fails a larger
request with Anthropic's ``prompt is too long`` error), the built-in ``ContextCompaction``
middleware from the config file (summaries by ``scripted:summarizer``, reactive on) and the
default error classifier (not listed: it is in every chain). Each conversation starts with
about 6,000 tokens of history, so its first model call overflows; the turn must recover in
the same stream, keep every stored message, and leave the next turn under the window.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

BIG = "All work and no play makes a dull model. " * 100  # ~4,100 characters, ~1,000 tokens

SCRIPTS = {
    "answer": [{"text": "Here is my answer."}],
    "ask_device": [
        {"text": "Let me ask your device.", "tool_calls": [{"name": "get_location", "input": {}}]},
        {"text": "unreachable"},
    ],
}

CONFIG: dict[str, Any] = {
    "default_model": "scripted:answer",
    "providers": {"scripted": {"scripts": SCRIPTS, "context_window": 3000}},
    "middleware": [
        {
            "path": "turnwire.middlewares:ContextCompaction",
            "options": {"strategy": "summarize", "summary_model": "scripted:summarizer", "reactive": True},
        }
    ],
}

_ids = itertools.count(1)


def new_conversation(path: str) -> str:
    return f"overflow-{path}-{next(_ids)}-{time.monotonic_ns()}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("compaction-e2e"), CONFIG) as process:
        yield process


@pytest.fixture
async def client(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target) as opened:
        yield opened


def _text(role: message_pb2.Role.ValueType, text: str, message_id: str = "") -> message_pb2.Message:
    return message_pb2.Message(
        id=message_id,
        role=role,
        parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))],
    )


async def seed(client: TurnwireClient, conversation_id: str, exchanges: int = 3) -> list[str]:
    """About 2,000 tokens of history per exchange; the stored ids."""
    messages = []
    for n in range(exchanges):
        messages += [
            _text(message_pb2.ROLE_USER, f"question {n}: {BIG}", f"old-u{n}"),
            _text(message_pb2.ROLE_ASSISTANT, f"answer {n}: {BIG}", f"old-a{n}"),
        ]
    await client.add_messages(conversation_id, messages, allow_missing=True)
    return [m.id for m in messages]


def assert_recovered(result: TurnResult) -> None:
    """One reactive compaction that shortened the history, one new attempt, completed."""
    assert result.ok, (result.status_name, result.error)
    compacted = [e.context_compacted for e in result.events if e.WhichOneof("event") == "context_compacted"]
    attempts = [e.attempt_start for e in result.events if e.WhichOneof("event") == "attempt_start"]
    assert [(c.reason, c.shortened, c.attempt) for c in compacted] == [
        (event_pb2.COMPACTION_REASON_REACTIVE, True, 1)
    ]
    assert [(a.attempt, a.reason, a.appends) for a in attempts] == [(2, "CONTEXT_OVERFLOW", False)]
    assert result.message is not None and result.message.id == attempts[0].message_id


async def assert_kept_and_fits(
    client: TurnwireClient, conversation_id: str, originals: list[str], result: TurnResult
) -> None:
    """Nothing stored was lost or changed, no partial reply of the failed attempt is stored,
    and the next turn fits without compacting again."""
    conversation = await client.get_conversation(conversation_id)
    ids = [m.id for m in conversation.messages]
    assert ids[: len(originals)] == originals
    assert all(BIG in m.parts[0].text.text for m in conversation.messages[: len(originals)])
    first_attempt = next(
        e.turn_start.message_id for e in result.events if e.WhichOneof("event") == "turn_start"
    )
    assert first_attempt not in ids and ids[-1] == result.message.id  # type: ignore[union-attr]
    follow_up = await collect(client.chat(conversation_id, "thanks"))
    assert follow_up.ok and not any(e.WhichOneof("event") == "context_compacted" for e in follow_up.events)


async def test_chat_recovers_from_an_overflow(client: TurnwireClient) -> None:
    conversation = new_conversation("chat")
    originals = await seed(client, conversation)
    result = await collect(client.chat(conversation, "and now?"))
    assert_recovered(result)
    await assert_kept_and_fits(client, conversation, originals, result)


async def test_save_messages_recovers_from_an_overflow(client: TurnwireClient) -> None:
    conversation = new_conversation("save")
    originals = await seed(client, conversation)
    result = await collect(client.save_messages(conversation, [_text(message_pb2.ROLE_USER, "and now?")]))
    assert_recovered(result)
    await assert_kept_and_fits(client, conversation, originals, result)


async def test_continue_last_turn_recovers_from_an_overflow(client: TurnwireClient) -> None:
    conversation = new_conversation("continue")
    originals = await seed(client, conversation)
    result = await collect(client.continue_last_turn(conversation))
    assert_recovered(result)
    await assert_kept_and_fits(client, conversation, originals, result)


async def test_a_submission_recovers_from_an_overflow(client: TurnwireClient) -> None:
    conversation = new_conversation("submit")
    originals = await seed(client, conversation)
    accepted = await client.submit_messages(conversation, "and now?")
    result = await collect(client.watch_submission(accepted.submission.submission_id))
    assert_recovered(result)
    submission = await client.get_submission(accepted.submission.submission_id)
    assert submission.state == chat_service_pb2.SUBMISSION_STATE_COMPLETED
    await assert_kept_and_fits(client, conversation, originals, result)


async def test_the_continuation_after_client_tool_results_recovers_from_an_overflow(
    client: TurnwireClient,
) -> None:
    """The history fits until the client's tool result (about 1,500 tokens) is added: the
    automatic continuation overflows and recovers."""
    conversation = new_conversation("continuation")
    originals = await seed(client, conversation, exchanges=1)
    asked = await collect(
        client.chat(
            conversation,
            "where am I?",
            model="scripted:ask_device",
            client_tools=[{"name": "get_location", "description": "the device's location"}],
        )
    )
    assert asked.ok and not any(e.WhichOneof("event") == "context_compacted" for e in asked.events)
    (call,) = asked.tool_calls
    result = await collect(
        client.submit_tool_results(
            conversation, {call.tool_call_id: {"place": BIG * 2}}, model="scripted:answer"
        )
    )
    assert_recovered(result)
    await assert_kept_and_fits(client, conversation, originals, result)
