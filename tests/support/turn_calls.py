"""Raw ``ChatService`` calls for end-to-end tests of concurrent input (issue 18): a Chat call read
in the background, its refusal status, and the stored transcript."""

from __future__ import annotations

import asyncio

import grpc
from google.rpc import error_details_pb2, status_pb2

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2


class Turn:
    """One Chat call read in the background: its events, and its call status when refused."""

    def __init__(
        self, stub: chat_service_pb2_grpc.ChatServiceStub, request: chat_service_pb2.ChatRequest
    ) -> None:
        self.request_id = request.request_id
        self.events: list[event_pb2.TurnEvent] = []
        self.refused: grpc.aio.AioRpcError | None = None
        self._call = stub.Chat(request)
        self.task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for response in self._call:
                self.events.append(response.event)
        except grpc.aio.AioRpcError as error:
            self.refused = error

    def kinds(self) -> list[str]:
        return [str(e.WhichOneof("event")) for e in self.events]

    def started(self) -> bool:
        return "turn_start" in self.kinds()

    def text_seen(self) -> bool:
        return "text_delta" in self.kinds()

    async def end(self) -> event_pb2.TurnEnd:
        await asyncio.wait_for(asyncio.shield(self.task), 30)
        assert self.refused is None, self.refused
        last = self.events[-1]
        assert last.WhichOneof("event") == "turn_end", self.kinds()
        return last.turn_end


def chat(
    stub: chat_service_pb2_grpc.ChatServiceStub,
    conversation_id: str,
    request_id: str,
    model: str,
    strategy: int = 0,
) -> Turn:
    message = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = f"from {request_id}"
    request = chat_service_pb2.ChatRequest(
        conversation_id=conversation_id,
        request_id=request_id,
        message=message,
        model=f"scripted:{model}",
        concurrent_input_strategy=strategy,  # type: ignore[arg-type]
    )
    return Turn(stub, request)


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no google.rpc.ErrorInfo in {status}")


def call_status(error: grpc.aio.AioRpcError) -> status_pb2.Status:
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            return status_pb2.Status.FromString(value)
    raise AssertionError(f"no status details in {error}")


async def transcript(stub: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str) -> list[str]:
    """The stored messages as ``role:id`` strings, oldest first."""
    response = await stub.GetConversation(
        chat_service_pb2.GetConversationRequest(conversation_id=conversation_id)
    )
    messages = response.conversation.messages
    return [f"{message_pb2.Role.Name(m.role).removeprefix('ROLE_').lower()}:{m.id}" for m in messages]


async def stored(
    stub: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str
) -> list[message_pb2.Message]:
    response = await stub.GetConversation(
        chat_service_pb2.GetConversationRequest(conversation_id=conversation_id)
    )
    return list(response.conversation.messages)


async def has_reply(
    stub: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str, message_id: str
) -> bool:
    """True once ``message_id`` is stored with parts (a running turn's first checkpoint of its
    reply): the transcript's list of messages stops changing under a test that compares it."""
    return any(m.id == message_id and m.parts for m in await stored(stub, conversation_id))
