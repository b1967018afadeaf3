"""How the OpenAI door decides where ``previous_response_id`` continues
(server/turnwire_server/http/openai_door.py, docs/api/openai.md#conversations): in the response's
own conversation when its reply is the conversation's latest assistant message, else in a fork
made at that reply. In process, over a stand-in for the in-process calls whose
``GetConversation`` pages with the servicer's own paging (``api/message_pages.py``) and counts the
messages it hands out: the decision reads the reply and what followed it, not the conversation.
Before, every follow-up request read every message of the conversation (2,000 here) before its
turn started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.protobuf.message import Message

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.message_pages import decode_token, encode_token, message_index, page_of
from turnwire_server.engine.ids import assistant_message_id
from turnwire_server.http.calls import DoorCallInfo
from turnwire_server.http.openai_door import ResponsesDoor

TURNS = 1_000
"""Turns of the conversation: 2,000 messages, a user message and a reply each."""

BOUND = 32
"""Most messages one decision may read: two of ``reply_followed``'s pages."""


class ConversationCalls:
    """``ResumeTurn`` of any response: a turn of conversation ``c``; ``GetConversation`` pages
    ``messages`` as the servicer does; ``ForkConversation`` answers the fork. Counts the
    messages ``GetConversation`` handed out (``read``) and records the forks (``forked_at``)."""

    def __init__(self, messages: list[message_pb2.Message]) -> None:
        self.messages = messages
        self.read = 0
        self.forked_at: list[str] = []

    async def unary(self, method: str, request: Any, call: Any) -> Message:
        if method.endswith("/ForkConversation"):
            self.forked_at.append(request.at_message_id)
            forked = chat_service_pb2.ForkConversationResponse()
            forked.conversation.conversation_id = request.new_conversation_id
            return forked
        assert method.endswith("/GetConversation"), method
        start = decode_token(request.page_token, "c") if request.page_token else 0
        if request.start_message_id:
            start = message_index(self.messages, request.start_message_id)
        page, following = page_of(self.messages, start, request.page_size)
        self.read += len(page)
        answer = chat_service_pb2.GetConversationResponse(
            next_page_token="" if following is None else encode_token("c", following)
        )
        answer.conversation.messages.extend(page)
        return answer

    async def stream(self, method: str, request: Any, call: Any) -> AsyncIterator[Message]:
        assert method.endswith("/ResumeTurn"), method
        yield chat_service_pb2.ResumeTurnResponse(
            event=event_pb2.TurnEvent(conversation_id="c", request_id=request.request_id, sequence_number=1)
        )


def conversation(*extra: message_pb2.Message) -> list[message_pb2.Message]:
    """``TURNS`` turns of response ids ``resp-0`` … (a user message, then the turn's reply), then
    ``extra``."""
    messages = []
    for index in range(TURNS):
        messages.append(message_pb2.Message(id=f"u{index}", role=message_pb2.ROLE_USER))
        reply = assistant_message_id(f"resp-{index}")
        messages.append(message_pb2.Message(id=reply, role=message_pb2.ROLE_ASSISTANT))
    return [*messages, *extra]


async def continued(calls: ConversationCalls, response_id: str) -> Any:
    door = ResponsesDoor(calls, 1 << 20)  # type: ignore[arg-type]
    return await door._continued_conversation(response_id, DoorCallInfo(metadata=()))


LATEST = f"resp-{TURNS - 1}"
USER = message_pb2.ROLE_USER
ASSISTANT = message_pb2.ROLE_ASSISTANT


@pytest.mark.parametrize(
    ("response_id", "extra", "forks"),
    [
        pytest.param(LATEST, (), False, id="the latest response: its own conversation"),
        pytest.param(f"resp-{TURNS // 2}", (), True, id="an earlier one: a fork at its reply"),
        pytest.param("resp-0", (), True, id="the first one: a fork at its reply"),
        pytest.param(
            LATEST,
            (message_pb2.Message(id="added", role=ASSISTANT),),
            True,
            id="the latest turn, an assistant message added after it (AddMessages): a fork",
        ),
        pytest.param(
            LATEST,
            tuple(message_pb2.Message(id=f"later{i}", role=USER) for i in range(3)),
            False,
            id="the latest reply, user messages after it: its own conversation",
        ),
        pytest.param("resp-none", (), False, id="a response with no stored reply: its conversation"),
    ],
)
async def test_a_follow_up_reads_the_reply_and_what_followed_it_not_the_conversation(
    response_id: str, extra: tuple[message_pb2.Message, ...], forks: bool
) -> None:
    calls = ConversationCalls(conversation(*extra))
    found = await continued(calls, response_id)
    if forks:
        assert calls.forked_at == [assistant_message_id(response_id)]
        assert isinstance(found, str) and found.startswith("conv-")
    else:
        assert (calls.forked_at, found) == ([], "c")
    assert calls.read <= BOUND, f"read {calls.read} of {len(calls.messages)} messages"


async def test_a_reply_followed_by_many_user_messages_reads_until_the_next_reply() -> None:
    """The only case that reads more: the messages between the reply and the next assistant
    message (here 40 user messages, added with AddMessages), still not the conversation before."""
    later = [message_pb2.Message(id=f"later{i}", role=USER) for i in range(40)]
    calls = ConversationCalls(conversation(*later, message_pb2.Message(id="added", role=ASSISTANT)))
    found = await continued(calls, LATEST)
    assert calls.forked_at == [assistant_message_id(LATEST)]
    assert isinstance(found, str)
    assert calls.read <= 42 + 16
