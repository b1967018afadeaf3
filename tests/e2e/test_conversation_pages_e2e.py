"""GetConversation pages its messages, each page readable with gRPC's default 4 MiB limit.

Before: the whole conversation came in one response, so a conversation that had grown past
4 MiB could never be read again by a client with default settings (docs/semantics.md §11).
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2


def _user(i: int, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=f"m{i}", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


async def test_a_conversation_over_4_mib_reads_back_in_pages(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory({"limits": {"max_message_bytes": 1 << 20}}).start()
    big = "z" * 900_000
    async with grpc.aio.insecure_channel(sidecar.target) as channel:  # default 4 MiB receive limit
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        for i in range(6):  # about 5.4 MB of user text, plus the replies
            save = chat_service_pb2.SaveMessagesRequest(conversation_id="big", messages=[_user(i, big)])
            async for _ in stub.SaveMessages(save):
                pass
        ids: list[str] = []
        request = chat_service_pb2.GetConversationRequest(conversation_id="big")
        pages = 0
        while True:
            response = await stub.GetConversation(request)
            pages += 1
            assert response.ByteSize() < 4 * 1024 * 1024
            ids.extend(m.id for m in response.conversation.messages)
            if not response.next_page_token:
                break
            request.page_token = response.next_page_token
        assert pages > 1
        assert [i for i in ids if i.startswith("m")] == [f"m{i}" for i in range(6)]
        assert len(ids) == len(set(ids)) == 12
        # page_size bounds a page by count too
        small = await stub.GetConversation(
            chat_service_pb2.GetConversationRequest(conversation_id="big", page_size=1)
        )
        assert len(small.conversation.messages) == 1 and small.next_page_token
        # a token is for its conversation only
        try:
            await stub.GetConversation(
                chat_service_pb2.GetConversationRequest(
                    conversation_id="other", page_token=small.next_page_token
                )
            )
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            status = rpc_status.from_call(error)
            info = error_details_pb2.ErrorInfo()
            assert status is not None and any(d.Unpack(info) for d in status.details)
            assert info.reason == "INVALID_PAGE_TOKEN"
        else:
            raise AssertionError("a page token was accepted for another conversation")
    async with TurnwireClient(sidecar.target) as client:  # the client follows the pages itself
        assert len((await client.get_conversation("big")).messages) == 12
