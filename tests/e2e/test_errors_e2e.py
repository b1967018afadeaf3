"""Bad input end to end: the right status code, a message saying what to fix, google.rpc
details (ErrorInfo in domain ``turnwire.dev``, BadRequest field violations), and nothing
stored changes. Also: an invalid config file stops ``turnwire serve`` at start.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from support.sidecar import SidecarProcess, free_port, running_sidecar

from turnwire_client import TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

MAX_MESSAGE_BYTES = 2048
CONFIG = {"limits": {"max_message_bytes": MAX_MESSAGE_BYTES}}
EXISTING = "existing-conversation"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("errors-e2e"), CONFIG) as process:
        yield process


@pytest.fixture
async def client(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target) as turnwire:
        if not (await turnwire.list_conversations()).conversations:
            assert (await collect(turnwire.chat(EXISTING, "hello"))).ok
        yield turnwire


async def snapshot(client: TurnwireClient) -> list[chat_service_pb2.Conversation]:
    """Every stored conversation with its messages (all pages)."""
    conversations: list[chat_service_pb2.Conversation] = []
    token = ""
    while True:
        page = await client.list_conversations(page_size=1, page_token=token)
        for listed in page.conversations:
            conversations.append(await client.get_conversation(listed.conversation_id))
        token = page.next_page_token
        if not token:
            return conversations


async def rejected(client: TurnwireClient, call: Any) -> TurnwireError:
    """Run ``call`` (a coroutine) expecting a TurnwireError; fail if the store changed."""
    before = await snapshot(client)
    assert before, "the fixture stores one conversation"
    try:
        outcome = await call
    except TurnwireError as raised:
        error = raised
    else:
        if isinstance(outcome, TurnResult):
            detail = TurnwireError.from_status(outcome.error) if outcome.error else "no error"
            outcome = f"a turn that ended {outcome.status_name} ({detail})"
        changed = await snapshot(client) != before
        pytest.fail(
            f"expected the call to be rejected before anything is stored; it returned "
            f"{outcome}, and the store {'CHANGED' if changed else 'did not change'}"
        )
    assert await snapshot(client) == before, "a rejected request must store nothing"
    assert error.domain == "turnwire.dev", error
    assert error.status is not None, "google.rpc.Status details are sent"
    return error


def user_message(*parts: message_pb2.Part) -> message_pb2.Message:
    return message_pb2.Message(role=message_pb2.ROLE_USER, parts=list(parts))


async def raw_chat(sidecar: SidecarProcess, request: chat_service_pb2.ChatRequest) -> None:
    """Send a ChatRequest the client's helpers cannot build; raise TurnwireError on failure."""
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        try:
            async for _ in stub.Chat(request, timeout=10):
                pass
        except grpc.aio.AioRpcError as error:
            raise TurnwireError.from_rpc_error(error) from error


async def test_empty_conversation_id_is_invalid_argument(client: TurnwireClient) -> None:
    error = await rejected(client, collect(client.chat("", "hi")))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "INVALID_FIELD"
    assert [field for field, _ in error.field_violations] == ["conversation_id"]
    (description,) = [d for _, d in error.field_violations]
    assert "must not be empty" in description
    assert "conversation_id" in error.message


async def test_malformed_conversation_id_is_invalid_argument(client: TurnwireClient) -> None:
    error = await rejected(client, collect(client.chat("has spaces/and slashes", "hi")))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["conversation_id"]
    assert "[A-Za-z0-9._:-]" in error.field_violations[0][1]


async def test_message_without_parts_is_invalid_argument(
    client: TurnwireClient, sidecar: SidecarProcess
) -> None:
    request = chat_service_pb2.ChatRequest(conversation_id=EXISTING, message=user_message())
    error = await rejected(client, raw_chat(sidecar, request))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "INVALID_FIELD"
    assert [field for field, _ in error.field_violations] == ["message.parts"]
    assert "at least one part" in error.field_violations[0][1]


@pytest.mark.parametrize("text", ["", "  \n\t"])
@pytest.mark.parametrize("path", ["Chat", "SaveMessages", "SubmitMessages", "AddMessages"])
async def test_a_user_message_of_blank_text_is_invalid_argument_on_every_entry_path(
    client: TurnwireClient, path: str, text: str
) -> None:
    # A fresh-user trial: `turnwire chat conv ""` stored an empty message and ran a turn on it.
    blank = message_pb2.Message(role=message_pb2.ROLE_USER)
    blank.parts.add().text.text = text
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "Chat": lambda: collect(client.chat(EXISTING, text)),
        "SaveMessages": lambda: collect(client.save_messages(EXISTING, text)),
        "SubmitMessages": lambda: client.submit_messages(EXISTING, text),
        "AddMessages": lambda: client.add_messages(EXISTING, [blank]),
    }
    error = await rejected(client, calls[path]())
    assert (error.code, error.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    ((field, description),) = error.field_violations
    assert field in ("message.parts", "messages[0].parts")
    assert "the message has no content" in description and "send some text" in description


async def test_missing_message_is_invalid_argument(client: TurnwireClient, sidecar: SidecarProcess) -> None:
    request = chat_service_pb2.ChatRequest(conversation_id="brand-new")
    error = await rejected(client, raw_chat(sidecar, request))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["message"]
    assert "required" in error.field_violations[0][1]


async def test_unknown_conversation_is_not_found(client: TurnwireClient) -> None:
    error = await rejected(client, client.get_conversation("no-such-conversation"))
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.reason == "CONVERSATION_NOT_FOUND"
    assert error.error_metadata.get("conversation_id") == "no-such-conversation"
    assert "no-such-conversation" in error.message
    assert "does not exist" in error.message


async def test_continue_last_turn_on_unknown_conversation_is_not_found(client: TurnwireClient) -> None:
    error = await rejected(client, collect(client.continue_last_turn("never-created")))
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.reason == "CONVERSATION_NOT_FOUND"


async def test_oversized_message_is_rejected_as_too_large(client: TurnwireClient) -> None:
    error = await rejected(client, collect(client.chat(EXISTING, "x" * 10_000)))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "MESSAGE_TOO_LARGE"
    assert [field for field, _ in error.field_violations] == ["message"]
    description = error.field_violations[0][1]
    assert "2,048 bytes" in description
    assert "limits.max_message_bytes" in description


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("nope:some-model", "nope"),  # no such provider
        ("no-colon", "no-colon"),  # not provider:model
        ("scripted:no-such-script", "no-such-script"),  # a configured provider, unknown model
    ],
)
async def test_unknown_model_is_invalid_argument(client: TurnwireClient, model: str, named: str) -> None:
    error = await rejected(client, collect(client.chat("model-check", "hi", model=model)))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
    assert error.reason == "UNKNOWN_MODEL"
    assert [field for field, _ in error.field_violations] == ["model"]
    assert named in error.field_violations[0][1]


async def test_bad_page_token_is_invalid_argument(client: TurnwireClient) -> None:
    error = await rejected(client, client.list_conversations(page_size=2, page_token="not-a-token"))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.reason == "INVALID_PAGE_TOKEN"
    assert [field for field, _ in error.field_violations] == ["page_token"]
    assert "next_page_token" in error.field_violations[0][1]


async def test_negative_page_size_is_invalid_argument(client: TurnwireClient) -> None:
    error = await rejected(client, client.list_conversations(page_size=-1))
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in error.field_violations] == ["page_size"]


@pytest.mark.parametrize(
    ("config", "field", "says"),
    [
        ({"limits": {"max_steps": 0}}, "limits.max_steps", "greater than or equal to 1"),
        ({"limitz": {"max_steps": 3}}, "limitz", "unknown field"),
        (
            {"providers": {"scripted": {"scripts": {"s": [{"delay_ms": -5}]}}}},
            "providers.scripted.scripts.s.0.delay_ms",
            "greater than or equal to 0",
        ),
    ],
)
def test_invalid_config_file_stops_serve_with_the_field_named(
    tmp_path: Path, config: dict[str, Any], field: str, says: str
) -> None:
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(yaml.safe_dump(config))
    database = tmp_path / "turnwire.db"
    command = [
        sys.executable,
        "-m",
        "turnwire_server",
        "serve",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--store",
        f"sqlite:///{database}",
        "--config",
        str(config_file),
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode != 0, done.stderr
    assert f"{field}:" in done.stderr, done.stderr
    assert says in done.stderr, done.stderr
    assert str(config_file) in done.stderr, "the message says which file is wrong"
    assert "Traceback" not in done.stderr
    assert not database.exists(), "nothing is created when the config is invalid"
