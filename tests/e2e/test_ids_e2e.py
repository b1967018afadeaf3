"""Ids end to end: every id an RPC takes must match the id pattern as a whole, so one with a
trailing newline (which ``re.match`` with ``$`` would let through) is INVALID_ARGUMENT naming
the field, and nothing is stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import message_pb2

BAD = "id-1\n"

Call = Callable[[TurnwireClient], Awaitable[object]]


def _user_message(message_id: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "hi"
    return message


# (the RPC field, a call that sends BAD in it)
CASES: list[tuple[str, Call]] = [
    ("conversation_id", lambda client: collect(client.chat(BAD, "hi"))),
    ("request_id", lambda client: collect(client.chat("conv-1", "hi", request_id=BAD))),
    ("messages[0].id", lambda client: collect(client.save_messages("conv-1", [_user_message(BAD)]))),
    ("conversation_id", lambda client: collect(client.continue_last_turn(BAD))),
    ("conversation_id", lambda client: client.get_conversation(BAD)),
    ("request_id", lambda client: client.cancel_chat(BAD)),  # CancelChat
]


async def test_an_id_with_a_trailing_newline_is_refused_by_every_rpc(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory().start()
    async with TurnwireClient(sidecar.target) as client:
        for field, call in CASES:
            try:
                outcome = await call(client)
            except TurnwireError as error:
                assert error.code == grpc.StatusCode.INVALID_ARGUMENT, (field, error)
                assert [f for f, _ in error.field_violations] == [field], (field, error)
                assert "is not a valid id" in error.field_violations[0][1]
            else:
                raise AssertionError(f"{field}={BAD!r} was accepted: {outcome}")
        assert (await client.list_conversations()).conversations == []
        # The same ids without the newline are fine.
        assert (await collect(client.chat("id-1", "hi", request_id="id-1"))).ok


async def test_a_client_message_id_never_takes_a_reply_of_the_server(sidecar_factory: SidecarFactory) -> None:
    """Before: ``Chat(request_id="r1", message.id="msg_r1")`` stored only the assistant message
    ``msg_r1`` (the user text was gone), and turn 1 with ``message.id="msg_a2"`` then turn 2
    with ``request_id="a2"`` left ``[assistant, assistant, user]`` (docs/semantics.md §5)."""
    sidecar = await sidecar_factory().start()
    async with TurnwireClient(sidecar.target) as client:
        user = _user_message("msg_r1")
        assert (await collect(client.save_messages("c1", [user], request_id="r1"))).ok
        first = await client.get_conversation("c1")
        assert [(m.id, m.role) for m in first.messages] == [
            ("msg_r1", message_pb2.ROLE_USER),
            ("tw-a-r1", message_pb2.ROLE_ASSISTANT),
        ]
        assert (await collect(client.save_messages("c2", [_user_message("msg_a2")]))).ok
        assert (await collect(client.chat("c2", "again", request_id="a2"))).ok
        roles = [m.role for m in (await client.get_conversation("c2")).messages]
        assert roles == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * 2
        # The server's namespace is refused for ids a client chooses ...
        calls: tuple[Callable[[], Awaitable[Any]], ...] = (
            lambda: collect(client.chat("c3", "hi", request_id="tw-a-x")),
            lambda: collect(client.save_messages("c3", [_user_message("tw-a-r1")])),
        )
        for call in calls:
            try:
                await call()
            except TurnwireError as error:
                assert error.code == grpc.StatusCode.INVALID_ARGUMENT
                assert "reserved for ids the server assigns" in error.field_violations[0][1]
            else:
                raise AssertionError("a client chose an id in the server's namespace")
        # ... but refers to them freely.
        assert (await client.cancel_chat("tw-r-0123")) is False


async def test_a_refusal_after_admission_still_ends_the_call_with_its_status(
    sidecar_factory: SidecarFactory,
) -> None:
    """An id conflict found when the input is written (no TurnStart) is a refusal like any other:
    the call ends with its status, so ``collect`` raises (before: a lone TurnEnd with ERROR)."""
    sidecar = await sidecar_factory().start()
    async with TurnwireClient(sidecar.target) as client:
        assert (await collect(client.chat("c1", "hi", request_id="r-done"))).ok
        try:
            await collect(client.chat("c2", "hi", request_id="r-done"))
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.ALREADY_EXISTS
            assert "already exists" in error.message
        else:
            raise AssertionError("a completed turn's request id was accepted again")


async def test_repeating_a_failed_chat_under_its_request_id_stores_the_question_once(
    sidecar_factory: SidecarFactory,
) -> None:
    """Issue 32 item 12: ``chat(c, "q", request_id="r1")`` failed at the provider, the same call
    then answered ALREADY_EXISTS "use a new request_id", and ``chat(c, "q")`` stored
    ``[user, user, assistant]``. The client now derives the message id from the request id, so
    the same call is the retry the server accepts, and the question is stored once."""
    config = {
        "providers": {
            "scripted": {"scripts": {"down": [{"error": {"message": "overloaded", "status": 529}}]}}
        }
    }
    sidecar = await sidecar_factory(config).start()
    async with TurnwireClient(sidecar.target) as client:
        failed = await collect(client.chat("retry", "q", request_id="r1", model="scripted:down"))
        assert failed.status_name == "ERROR"
        retried = await collect(client.chat("retry", "q", request_id="r1"))
        assert retried.ok, retried.error
        conversation = await client.get_conversation("retry")
        roles = [message.role for message in conversation.messages]
        assert roles == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
        # Without a request id of the caller's, the stream names the turn: retry under that one.
        stream = client.chat("retry-2", "q", model="scripted:down")
        assert (await collect(stream)).status_name == "ERROR"
        assert (await collect(client.chat("retry-2", "q", request_id=stream.request_id))).ok
        assert (await client.get_conversation("retry-2")).message_count == 2
