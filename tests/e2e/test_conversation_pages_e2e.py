"""GetConversation pages its messages, each page readable with gRPC's default 4 MiB limit.

Before: the whole conversation came in one response, so a conversation that had grown past
4 MiB could never be read again by a client with default settings (docs/semantics.md §11).
"""

from __future__ import annotations

import asyncio

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2


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


_SCRIPTS = {
    "providers": {
        "scripted": {
            "scripts": {
                "silent": [{"text": "late", "delay_ms": 60_000}],  # a cancel lands before any output
                "hello": [{"text": "Hello."}],
            }
        }
    }
}


async def test_turns_without_a_reply_are_listed_on_the_page_of_their_place(
    sidecar_factory: SidecarFactory,
) -> None:
    """Issue 16: a turn cancelled before any reply was stored showed nowhere. GetConversation lists
    it in `turns_without_reply` on the page holding the message stored just before it started
    (its own input); a turn rolled back from an empty conversation sits before every message, on
    the first page (docs/semantics.md §5)."""
    sidecar = await sidecar_factory(_SCRIPTS).start()
    async with TurnwireClient(sidecar.target) as client:

        async def cut_short(text: str, request_id: str) -> None:
            ends = []
            async for event in client.chat("paged", text, request_id=request_id, model="scripted:silent"):
                if event.HasField("turn_start"):
                    assert await client.cancel_chat(request_id)
                if event.HasField("turn_end"):
                    ends.append(event.turn_end.status)
            assert ends == [event_pb2.TURN_STATUS_ABORTED]

        # r-rolled is rolled back by the next input: its input goes, so it precedes every message.
        rolled = asyncio.ensure_future(
            collect(client.chat("paged", "gone", request_id="r-rolled", model="scripted:silent"))
        )

        async def rolled_running() -> bool:
            try:
                return bool((await client.get_conversation("paged")).turns_without_reply)
            except TurnwireError as error:  # the conversation is not created yet
                assert error.code == grpc.StatusCode.NOT_FOUND
                return False

        await wait_until(rolled_running, timeout=30)
        await collect(
            client.chat("paged", "q1", request_id="r-1", model="scripted:hello", concurrent_input="rollback")
        )
        assert (await rolled).status_name == "ABORTED"
        await cut_short("q2", "r-cut")  # after q2
        await collect(client.chat("paged", "q3", request_id="r-3", model="scripted:hello"))
        await cut_short("q4", "r-cut-2")  # after q4, the last message

        pages: list[tuple[list[str], list[tuple[str, event_pb2.TurnStatus.ValueType]]]] = []
        token = ""
        while True:
            page = await client.get_conversation_page("paged", page_size=2, page_token=token)
            texts = ["".join(p.text.text for p in m.parts) for m in page.conversation.messages]
            turns = [(t.request_id, t.status) for t in page.conversation.turns_without_reply]
            pages.append((texts, turns))
            token = page.next_page_token
            if not token:
                break
        whole = await client.get_conversation("paged")
    aborted = event_pb2.TURN_STATUS_ABORTED
    assert pages == [
        (["q1", "Hello."], [("r-rolled", aborted)]),
        (["q2", "q3"], [("r-cut", aborted)]),
        (["Hello.", "q4"], [("r-cut-2", aborted)]),
    ]
    assert [t.request_id for t in whole.turns_without_reply] == ["r-rolled", "r-cut", "r-cut-2"]
    reason = error_details_pb2.ErrorInfo()
    assert any(d.Unpack(reason) for d in whole.turns_without_reply[0].error.details)
    assert reason.reason == "ROLLED_BACK"
    assert not whole.partial_replies


async def test_a_page_starts_at_a_named_message(sidecar_factory: SidecarFactory) -> None:
    """``start_message_id``: the page holds that message and those after it, its token goes on
    after them; a message the conversation does not hold answers an empty page; not with a
    ``page_token``. What the OpenAI door reads for ``previous_response_id`` instead of every page."""
    sidecar = await sidecar_factory({}).start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        add = chat_service_pb2.AddMessagesRequest(
            conversation_id="named", messages=[_user(i, f"text {i}") for i in range(6)], allow_missing=True
        )
        await stub.AddMessages(add)

        async def page(**fields: object) -> tuple[list[str], str]:
            request = chat_service_pb2.GetConversationRequest(conversation_id="named", **fields)  # type: ignore[arg-type]
            response = await stub.GetConversation(request)
            return [m.id for m in response.conversation.messages], response.next_page_token

        ids, token = await page(start_message_id="m3", page_size=2)
        assert ids == ["m3", "m4"] and token
        assert await page(page_token=token, page_size=2) == (["m5"], "")
        assert await page(start_message_id="m5") == (["m5"], "")
        assert await page(start_message_id="m-none", page_size=2) == ([], "")
        try:
            await page(start_message_id="m3", page_token=token)
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            status = rpc_status.from_call(error)
            violation = error_details_pb2.BadRequest()
            assert status is not None and any(d.Unpack(violation) for d in status.details)
            assert [v.field for v in violation.field_violations] == ["start_message_id"]
        else:
            raise AssertionError("start_message_id was accepted with a page_token")
