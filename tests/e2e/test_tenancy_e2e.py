"""Tenant isolation end to end (docs/operate/authentication.md), against a real ``turnwire serve``.

Tenant A calls every ChatService RPC on tenant B's conversation, request, submission and tool
call ids, once before B has created any of them and once while they exist (B's slow turn
still running): each answer is compared byte for byte (code, message, serialized
``google.rpc.Status`` details, or the serialized responses). So another tenant's id answers
exactly as an id that does not exist. The RPCs that create things (Chat, SaveMessages,
SubmitMessages) create the caller's own: two tenants using the same conversation, request
and submission ids each see their own, and listings show only the caller's. Nothing a client
receives holds the tenant prefix of the store keys.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
import pytest
from support.endless import endless_step
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import auth_config, new_token, write_tokens_file
from support.waiting import wait_until
from support.webhook_receiver import new_secret

from turnwire_client import TurnStream, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2, webhook_pb2

WEBHOOK_SECRET_ENV = "TENANCY_WEBHOOK_SECRET"
TOKEN_A = new_token()
TOKEN_B = new_token()
TOKEN_C = new_token()
TOKEN_D = new_token()
TENANT_A = "tenant-a"
TENANT_B = "tenant-b"
TENANT_C = "tenant-c"
TENANT_D = "tenant-d"

SCRIPTS = {
    "echo": [{"text": "answered"}],
    # A client tool call and a call that needs approval, both left waiting.
    "waiting_calls": [
        {
            "tool_calls": [
                {"name": "get_location", "id": "call-client"},
                {"name": "calculator", "id": "call-approve", "input": {"expression": "6 * 7"}},
            ]
        },
        {"text": "done"},
    ],
    # 40 ms a chunk, never ending on its own: running whatever A's calls take, until B cancels it.
    "slow": [endless_step("".join(f"w{i} " for i in range(100)), 40)],
}

# Tenant B's ids (A uses the same strings).
CONVERSATION = "conv-b"
SUBMISSION_CONVERSATION = "conv-b-sub"
SLOW_CONVERSATION = "conv-b-slow"
REQUEST = "req-b"
SLOW_REQUEST = "req-b-slow"
SUBMISSION = "sub-b"
CLIENT_CALL = "call-client"
APPROVAL_CALL = "call-approve"

Outcome = tuple[object, ...]
"""What a call answered: its serialized responses, then its code, message and status details."""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("tenancy-e2e")
    tokens = write_tokens_file(
        workdir / "tokens.json",
        {
            TOKEN_A: ("alice", TENANT_A),
            TOKEN_B: ("bob", TENANT_B),
            TOKEN_C: ("carol", TENANT_C),
            TOKEN_D: ("dave", TENANT_D),
        },
    )
    config = {
        "default_model": "scripted:echo",
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {"demo": True, "require_approval": ["calculator"]},
        "auth": auth_config(tokens),
        # B's submission names this endpoint; its address is refused (loopback), so the delivery
        # fails at once: what it shows is whose listing it is in (docs/webhooks.md, "Tenancy").
        "webhooks": {
            "endpoints": {"app": {"url": "http://127.0.0.2:8080/hook", "secret_env": WEBHOOK_SECRET_ENV}},
            "poll_interval_seconds": 0.2,
        },
    }
    with running_sidecar(workdir, config, env={WEBHOOK_SECRET_ENV: new_secret()}) as process:
        yield process


@pytest.fixture
async def channel(sidecar: SidecarProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(sidecar.target) as opened:
        yield opened


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def text(value: str) -> message_pb2.Message:
    return message_pb2.Message(
        role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text=value))]
    )


def client_tools() -> list[chat_service_pb2.ClientTool]:
    return [chat_service_pb2.ClientTool(name="get_location", description="where the user is")]


def failure(error: grpc.aio.AioRpcError) -> Outcome:
    details = [value for key, value in error.trailing_metadata() or () if key == "grpc-status-details-bin"]
    return (error.code(), error.details(), tuple(details))


async def unary(call: Awaitable[Any]) -> Outcome:
    try:
        response = await call
    except grpc.aio.AioRpcError as error:
        return ("failed", *failure(error))
    return ("ok", response.SerializeToString(deterministic=True))


async def streamed(call: Any) -> Outcome:
    responses: list[bytes] = []
    try:
        async for response in call:
            responses.append(response.SerializeToString(deterministic=True))
    except grpc.aio.AioRpcError as error:
        return (tuple(responses), *failure(error))
    return (tuple(responses), "ok")


def matrix(stub: Any, metadata: Any) -> dict[str, Callable[[], Awaitable[Outcome]]]:
    """Every ChatService RPC that reads, lists, continues, cancels, resumes, watches, answers,
    writes into or deletes an existing thing, aimed at tenant B's ids."""
    m = metadata
    return {
        "GetConversation": lambda: unary(
            stub.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id=CONVERSATION), metadata=m
            )
        ),
        "ListConversations": lambda: unary(
            stub.ListConversations(chat_service_pb2.ListConversationsRequest(), metadata=m)
        ),
        "ContinueLastTurn": lambda: streamed(
            stub.ContinueLastTurn(
                chat_service_pb2.ContinueLastTurnRequest(conversation_id=CONVERSATION), metadata=m
            )
        ),
        "CancelChat(finished)": lambda: unary(
            stub.CancelChat(chat_service_pb2.CancelChatRequest(request_id=REQUEST), metadata=m)
        ),
        "CancelChat(running)": lambda: unary(
            stub.CancelChat(chat_service_pb2.CancelChatRequest(request_id=SLOW_REQUEST), metadata=m)
        ),
        "ResumeTurn(finished)": lambda: streamed(
            stub.ResumeTurn(chat_service_pb2.ResumeTurnRequest(request_id=REQUEST), metadata=m)
        ),
        "ResumeTurn(running)": lambda: streamed(
            stub.ResumeTurn(chat_service_pb2.ResumeTurnRequest(request_id=SLOW_REQUEST), metadata=m)
        ),
        "GetSubmission": lambda: unary(
            stub.GetSubmission(chat_service_pb2.GetSubmissionRequest(submission_id=SUBMISSION), metadata=m)
        ),
        "ListSubmissions": lambda: unary(
            stub.ListSubmissions(chat_service_pb2.ListSubmissionsRequest(), metadata=m)
        ),
        "ListSubmissions(conversation)": lambda: unary(
            stub.ListSubmissions(
                chat_service_pb2.ListSubmissionsRequest(conversation_id=SUBMISSION_CONVERSATION), metadata=m
            )
        ),
        "ListWebhookDeliveries": lambda: unary(
            stub.ListWebhookDeliveries(webhook_pb2.ListWebhookDeliveriesRequest(), metadata=m)
        ),
        "ListWebhookDeliveries(submission)": lambda: unary(
            stub.ListWebhookDeliveries(
                webhook_pb2.ListWebhookDeliveriesRequest(submission_id=SUBMISSION), metadata=m
            )
        ),
        "CancelSubmission": lambda: unary(
            stub.CancelSubmission(
                chat_service_pb2.CancelSubmissionRequest(submission_id=SUBMISSION), metadata=m
            )
        ),
        "WatchSubmission": lambda: streamed(
            stub.WatchSubmission(
                chat_service_pb2.WatchSubmissionRequest(submission_id=SUBMISSION), metadata=m
            )
        ),
        "AddMessages": lambda: unary(
            stub.AddMessages(
                chat_service_pb2.AddMessagesRequest(
                    conversation_id=CONVERSATION, messages=[text("injected")], allow_missing=False
                ),
                metadata=m,
            )
        ),
        "SubmitToolResults": lambda: streamed(
            stub.SubmitToolResults(
                chat_service_pb2.SubmitToolResultsRequest(
                    conversation_id=CONVERSATION,
                    results=[
                        chat_service_pb2.ToolResult(tool_call_id=CLIENT_CALL, output_json='{"city": "Oslo"}')
                    ],
                    auto_continue=True,
                    client_tools=client_tools(),
                ),
                metadata=m,
            )
        ),
        "SubmitToolApprovals": lambda: streamed(
            stub.SubmitToolApprovals(
                chat_service_pb2.SubmitToolApprovalsRequest(
                    conversation_id=CONVERSATION,
                    approvals=[chat_service_pb2.ToolApproval(tool_call_id=APPROVAL_CALL, approved=True)],
                    auto_continue=True,
                ),
                metadata=m,
            )
        ),
        "DeleteConversation": lambda: unary(
            stub.DeleteConversation(
                chat_service_pb2.DeleteConversationRequest(conversation_id=CONVERSATION), metadata=m
            )
        ),
        "ForkConversation": lambda: unary(
            stub.ForkConversation(
                chat_service_pb2.ForkConversationRequest(
                    # B's reply to REQUEST: a message of B's conversation (engine/ids.py).
                    conversation_id=CONVERSATION,
                    at_message_id=f"tw-a-{REQUEST}",
                    new_conversation_id="fork-of-b",
                ),
                metadata=m,
            )
        ),
        "DeleteConversation(include_forks)": lambda: unary(
            stub.DeleteConversation(
                chat_service_pb2.DeleteConversationRequest(conversation_id=CONVERSATION, include_forks=True),
                metadata=m,
            )
        ),
        "DeleteConversation(submissions)": lambda: unary(
            stub.DeleteConversation(
                chat_service_pb2.DeleteConversationRequest(conversation_id=SUBMISSION_CONVERSATION),
                metadata=m,
            )
        ),
    }


async def run_matrix(stub: Any, metadata: Any) -> dict[str, Outcome]:
    return {name: await call() for name, call in matrix(stub, metadata).items()}


def stored_keys(sidecar: SidecarProcess, sql: str) -> set[str]:
    with sqlite3.connect(f"file:{sidecar.db_path}?mode=ro", uri=True) as db:
        return {row[0] for row in db.execute(sql)}


async def test_another_tenants_ids_answer_exactly_as_ids_that_do_not_exist(
    sidecar: SidecarProcess, channel: grpc.aio.Channel
) -> None:
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    as_a, as_b = bearer(TOKEN_A), bearer(TOKEN_B)

    nothing_yet = await run_matrix(stub, as_a)
    assert nothing_yet["GetConversation"][1] == grpc.StatusCode.NOT_FOUND
    assert nothing_yet["ResumeTurn(finished)"][1] == grpc.StatusCode.NOT_FOUND
    assert nothing_yet["GetSubmission"][1] == grpc.StatusCode.NOT_FOUND

    # Tenant B creates everything A will aim at.
    waiting = await collect(
        TurnStream(
            stub.Chat(
                chat_service_pb2.ChatRequest(
                    conversation_id=CONVERSATION,
                    request_id=REQUEST,
                    message=text("where am I?"),
                    model="scripted:waiting_calls",
                    client_tools=client_tools(),
                ),
                metadata=as_b,
            )
        )
    )
    assert waiting.status == event_pb2.TURN_STATUS_COMPLETED, waiting
    submitted = await stub.SubmitMessages(
        chat_service_pb2.SubmitMessagesRequest(
            conversation_id=SUBMISSION_CONVERSATION,
            submission_id=SUBMISSION,
            messages=[text("later")],
            webhook=webhook_pb2.WebhookTarget(endpoint="app"),
        ),
        metadata=as_b,
    )
    assert submitted.accepted
    slow = TurnStream(
        stub.Chat(
            chat_service_pb2.ChatRequest(
                conversation_id=SLOW_CONVERSATION,
                request_id=SLOW_REQUEST,
                message=text("take your time"),
                model="scripted:slow",
            ),
            metadata=as_b,
        )
    )
    slow_result = asyncio.ensure_future(collect(slow))

    async def slow_running() -> bool:
        listed = await stub.ListConversations(chat_service_pb2.ListConversationsRequest(), metadata=as_b)
        return SLOW_CONVERSATION in [c.conversation_id for c in listed.conversations]

    await wait_until(slow_running, timeout=10, what="B's slow turn started")

    async def b_delivery_listed() -> bool:
        listed = await stub.ListWebhookDeliveries(
            webhook_pb2.ListWebhookDeliveriesRequest(submission_id=SUBMISSION), metadata=as_b
        )
        ids = [(d.submission_id, d.conversation_id) for d in listed.deliveries]
        return ids == [(SUBMISSION, SUBMISSION_CONVERSATION)]  # B's own ids, no tenant prefix

    await wait_until(b_delivery_listed, what="B's submission's webhook delivery is listed to B")

    while_they_exist = await run_matrix(stub, as_a)
    assert not slow_result.done(), "B's slow turn must still run while A's calls are made"
    for name, outcome in nothing_yet.items():
        assert while_they_exist[name] == outcome, f"{name}: A sees B's thing differently from nothing"

    # B's things are untouched: the slow turn still runs (A's CancelChat was a no-op) until B
    # cancels it, the tool calls still wait, the submission and transcripts are B's alone.
    cancelled = await stub.CancelChat(
        chat_service_pb2.CancelChatRequest(request_id=SLOW_REQUEST), metadata=as_b
    )
    assert cancelled.cancelled, "B's own CancelChat finds its slow turn running"
    assert (await slow_result).status == event_pb2.TURN_STATUS_ABORTED
    conversation = await stub.GetConversation(
        chat_service_pb2.GetConversationRequest(conversation_id=CONVERSATION), metadata=as_b
    )
    assert [m.role for m in conversation.conversation.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]
    calls = [
        p.tool_call
        for p in conversation.conversation.messages[1].parts
        if p.WhichOneof("kind") == "tool_call"
    ]
    assert {c.tool_call_id for c in calls} == {CLIENT_CALL, APPROVAL_CALL}
    submission = await stub.GetSubmission(
        chat_service_pb2.GetSubmissionRequest(submission_id=SUBMISSION), metadata=as_b
    )
    assert submission.submission.conversation_id == SUBMISSION_CONVERSATION
    listed = await stub.ListConversations(chat_service_pb2.ListConversationsRequest(), metadata=as_b)
    assert {c.conversation_id for c in listed.conversations} == {
        CONVERSATION,
        SUBMISSION_CONVERSATION,
        SLOW_CONVERSATION,
    }
    # In the store, every key is B's: A's calls created nothing.
    assert stored_keys(sidecar, "SELECT id FROM conversations") == {
        f"{TENANT_B}/{CONVERSATION}",
        f"{TENANT_B}/{SUBMISSION_CONVERSATION}",
        f"{TENANT_B}/{SLOW_CONVERSATION}",
    }


async def test_two_tenants_with_the_same_ids_each_have_their_own(
    sidecar: SidecarProcess, channel: grpc.aio.Channel
) -> None:
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    received: list[bytes] = []
    for token, words in ((TOKEN_C, "from C"), (TOKEN_D, "from D")):
        metadata = bearer(token)
        async for response in stub.Chat(
            chat_service_pb2.ChatRequest(
                conversation_id="shared", request_id="shared-request", message=text(words)
            ),
            metadata=metadata,
        ):
            received.append(response.SerializeToString())
            event = response.event
            assert (event.conversation_id, event.request_id) == ("shared", "shared-request")
        saved = [
            r
            async for r in stub.SaveMessages(
                chat_service_pb2.SaveMessagesRequest(
                    conversation_id="shared", messages=[text(words + " again")]
                ),
                metadata=metadata,
            )
        ]
        request_id = saved[0].event.request_id
        assert request_id.startswith("tw-r-") and "/" not in request_id  # server-assigned, unscoped
        received.extend(r.SerializeToString() for r in saved)
        submitted = await stub.SubmitMessages(
            chat_service_pb2.SubmitMessagesRequest(
                conversation_id="shared", submission_id="shared-submission", messages=[text(words + " later")]
            ),
            metadata=metadata,
        )
        assert submitted.accepted, "the same submission id is another tenant's own"
        generated = await stub.SubmitMessages(
            chat_service_pb2.SubmitMessagesRequest(conversation_id="shared", messages=[text(words + " too")]),
            metadata=metadata,
        )
        assert generated.submission.submission_id.startswith("tw-r-")
        received.append(submitted.SerializeToString())
        received.append(generated.SerializeToString())

    for token, words, other in ((TOKEN_C, "from C", "from D"), (TOKEN_D, "from D", "from C")):
        metadata = bearer(token)

        async def settled(metadata: Any = metadata) -> bool:
            page = await stub.ListSubmissions(
                chat_service_pb2.ListSubmissionsRequest(conversation_id="shared"), metadata=metadata
            )
            return all(s.state == chat_service_pb2.SUBMISSION_STATE_COMPLETED for s in page.submissions)

        await wait_until(settled, timeout=20, what="the submissions ran")
        conversation = (
            await stub.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id="shared"), metadata=metadata
            )
        ).conversation
        received.append(conversation.SerializeToString())
        texts = [
            p.text.text for m in conversation.messages for p in m.parts if p.WhichOneof("kind") == "text"
        ]
        assert words in texts and not any(other in t for t in texts), texts
        assert all("/" not in m.id for m in conversation.messages)
        submissions = await stub.ListSubmissions(chat_service_pb2.ListSubmissionsRequest(), metadata=metadata)
        received.append(submissions.SerializeToString())
        assert {s.conversation_id for s in submissions.submissions} == {"shared"}
        assert len(submissions.submissions) == 2
        watched = [
            r
            async for r in stub.WatchSubmission(
                chat_service_pb2.WatchSubmissionRequest(submission_id="shared-submission"), metadata=metadata
            )
        ]
        assert watched[-1].event.HasField("turn_end")
        received.extend(r.SerializeToString() for r in watched)
        replayed = [
            r
            async for r in stub.ResumeTurn(
                chat_service_pb2.ResumeTurnRequest(request_id="shared-request"), metadata=metadata
            )
        ]
        assert {(r.event.conversation_id, r.event.request_id) for r in replayed} == {
            ("shared", "shared-request")
        }
        assert replayed[-1].event.HasField("turn_end")
        received.extend(r.SerializeToString() for r in replayed)

    listed_a = await stub.ListConversations(
        chat_service_pb2.ListConversationsRequest(), metadata=bearer(TOKEN_C)
    )
    assert [c.conversation_id for c in listed_a.conversations] == ["shared"]
    assert {f"{TENANT_C}/shared", f"{TENANT_D}/shared"} <= stored_keys(
        sidecar, "SELECT id FROM conversations"
    )
    for payload in received:
        assert TENANT_C.encode() not in payload and TENANT_D.encode() not in payload, payload


async def test_errors_quote_the_clients_ids(sidecar: SidecarProcess, channel: grpc.aio.Channel) -> None:
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetConversation(
            chat_service_pb2.GetConversationRequest(conversation_id="missing"), metadata=bearer(TOKEN_A)
        )
    assert (
        raised.value.details() == "conversation 'missing' does not exist; start it with Chat or SaveMessages"
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.GetConversation(
            chat_service_pb2.GetConversationRequest(conversation_id=f"{TENANT_B}/conv-b"),
            metadata=bearer(TOKEN_A),
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"'{TENANT_B}/conv-b' is not a valid id" in raised.value.details()


async def test_a_partial_reply_names_the_clients_request_id(
    sidecar: SidecarProcess, channel: grpc.aio.Channel
) -> None:
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    metadata = bearer(TOKEN_C)
    call = stub.Chat(
        chat_service_pb2.ChatRequest(
            conversation_id="partial", request_id="cut-short", message=text("go"), model="scripted:slow"
        ),
        metadata=metadata,
    )
    async for response in call:
        if response.event.HasField("text_delta"):
            break
    cancelled = await stub.CancelChat(
        chat_service_pb2.CancelChatRequest(request_id="cut-short"), metadata=metadata
    )
    assert cancelled.cancelled
    call.cancel()

    async def aborted() -> bool:
        conversation = (
            await stub.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id="partial"), metadata=metadata
            )
        ).conversation
        return [(p.request_id, p.status) for p in conversation.partial_replies] == [
            ("cut-short", event_pb2.TURN_STATUS_ABORTED)
        ]

    await wait_until(aborted, timeout=20, what="the partial reply is stored as aborted")
