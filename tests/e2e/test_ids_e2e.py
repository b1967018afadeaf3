"""Ids end to end: every id an RPC takes must match the id pattern as a whole, so one with a
trailing newline (which ``re.match`` with ``$`` would let through) is INVALID_ARGUMENT naming
the field, and nothing is stored."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

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
