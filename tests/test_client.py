"""Tests for the Python client (``turnwire``) and the CLI renderers (``turnwire_server.cli``).

They run the real client against an in-process grpc.aio ``ChatService`` fake that plays back
scripted event streams and errors.
"""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2, timestamp_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status
from rich.console import Console
from support.sidecar import free_port
from support.waiting import wait_until

from turnwire_client import ProtocolError, TurnResult, TurnwireClient, TurnwireError, Usage, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2
from turnwire_server.cli.connection import DEFAULT_TARGET, Connection
from turnwire_server.cli.history import run_history
from turnwire_server.cli.turns import _follow_up, run_cancel, run_chat

CONV = "conv-1"
REQ = "req-1"


# -- building events -------------------------------------------------------------------------


def _struct(data: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(data)
    return struct


def _value(data: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    value.CopyFrom(_struct({"v": data}).fields["v"])
    return value


def events(*bodies: tuple[str, Any], start: int = 1) -> list[event_pb2.TurnEvent]:
    """Number ``(oneof name, message)`` pairs into TurnEvents of one turn."""
    out = []
    for offset, (name, body) in enumerate(bodies):
        event = event_pb2.TurnEvent(conversation_id=CONV, request_id=REQ, sequence_number=start + offset)
        getattr(event, name).CopyFrom(body)
        out.append(event)
    return out


USAGE = message_pb2.Usage(input_tokens=30, output_tokens=12, total_tokens=42)

TOOL_CALL = message_pb2.ToolCallPart(
    tool_call_id="call-1",
    tool_name="get_weather",
    input=_struct({"city": "Paris"}),
    state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
    output=_value({"temp_c": 21, "sky": "sunny"}),
)

ASSISTANT = message_pb2.Message(
    id="msg-a",
    role=message_pb2.ROLE_ASSISTANT,
    parts=[
        message_pb2.Part(step_start=message_pb2.StepStartPart()),
        message_pb2.Part(text=message_pb2.TextPart(text="Let me check the weather. ")),
        message_pb2.Part(tool_call=TOOL_CALL),
        message_pb2.Part(step_start=message_pb2.StepStartPart()),
        message_pb2.Part(text=message_pb2.TextPart(text="It is sunny in Paris.")),
    ],
)


def weather_turn(
    status: event_pb2.TurnStatus.ValueType = event_pb2.TURN_STATUS_COMPLETED,
    error: status_pb2.Status | None = None,
) -> list[event_pb2.TurnEvent]:
    """A two-step turn: text, a get_weather call and its result, more text, TurnEnd."""
    end = event_pb2.TurnEnd(status=status, message=ASSISTANT, usage=USAGE, step_count=2)
    if error is not None:
        end.error.CopyFrom(error)
    return events(
        ("turn_start", event_pb2.TurnStart(message_id="msg-a", model="scripted:test")),
        ("step_start", event_pb2.StepStart(step_number=0)),
        ("text_start", event_pb2.TextStart(id="t1")),
        ("text_delta", event_pb2.TextDelta(id="t1", delta="Let me check")),
        ("text_delta", event_pb2.TextDelta(id="t1", delta=" the weather. ")),
        ("text_end", event_pb2.TextEnd(id="t1")),
        (
            "tool_input_start",
            event_pb2.ToolInputStart(tool_call_id="call-1", tool_name="get_weather"),
        ),
        (
            "tool_input_available",
            event_pb2.ToolInputAvailable(
                tool_call_id="call-1", tool_name="get_weather", input=_struct({"city": "Paris"})
            ),
        ),
        (
            "tool_output_available",
            event_pb2.ToolOutputAvailable(
                tool_call_id="call-1", output=_value({"temp_c": 21, "sky": "sunny"})
            ),
        ),
        (
            "step_finish",
            event_pb2.StepFinish(step_number=0, finish_reason=event_pb2.FINISH_REASON_TOOL_CALLS),
        ),
        ("step_start", event_pb2.StepStart(step_number=1)),
        ("text_start", event_pb2.TextStart(id="t2")),
        ("text_delta", event_pb2.TextDelta(id="t2", delta="It is sunny in Paris.")),
        ("text_end", event_pb2.TextEnd(id="t2")),
        (
            "step_finish",
            event_pb2.StepFinish(step_number=1, finish_reason=event_pb2.FINISH_REASON_STOP),
        ),
        ("turn_end", end),
    )


def rich_status(
    code: int,
    message: str,
    reason: str,
    violations: Sequence[tuple[str, str]] = (),
) -> status_pb2.Status:
    """A google.rpc.Status with ErrorInfo (domain turnwire.dev) and optional BadRequest."""
    status = status_pb2.Status(code=code, message=message)
    status.details.add().Pack(
        error_details_pb2.ErrorInfo(reason=reason, domain="turnwire.dev", metadata={"k": "v"})
    )
    if violations:
        status.details.add().Pack(
            error_details_pb2.BadRequest(
                field_violations=[
                    error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in violations
                ]
            )
        )
    return status


INVALID = rich_status(
    code_pb2.INVALID_ARGUMENT,
    "invalid ChatRequest",
    "INVALID_FIELD",
    [
        ("conversation_id", "must be 1-128 characters of [A-Za-z0-9._:-]"),
        ("message.parts", "must not be empty"),
    ],
)


# -- the fake service ------------------------------------------------------------------------


@dataclass
class FakeChatService(chat_service_pb2_grpc.ChatServiceServicer):
    """Plays back ``stream`` for the turn-running RPCs, or aborts with ``abort_with``."""

    stream: list[event_pb2.TurnEvent] = field(default_factory=list)
    abort_with: status_pb2.Status | None = None
    plain_abort: bool = False  # abort with abort_with's code and message but no details
    hang_after: int | None = None  # block forever after this many events
    requests: list[Any] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)
    conversations: dict[str, chat_service_pb2.Conversation] = field(default_factory=dict)
    # GetConversation pages of a conversation, tokens "page-1", "page-2", …; overrides conversations
    pages: dict[str, list[chat_service_pb2.Conversation]] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    hanging: asyncio.Event = field(default_factory=asyncio.Event)  # set once hang_after is reached

    def _record(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})

    async def _abort(self, context: grpc.aio.ServicerContext, status: status_pb2.Status) -> None:
        grpc_status = rpc_status.to_status(status)
        await context.abort(grpc_status.code, grpc_status.details, grpc_status.trailing_metadata)

    async def _play(self, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        self._record(request, context)
        if self.abort_with is not None and self.plain_abort:
            await context.abort(rpc_status.to_status(self.abort_with).code, self.abort_with.message)
        if self.abort_with is not None:
            await self._abort(context, self.abort_with)
        try:
            for index, event in enumerate(self.stream):
                if self.hang_after is not None and index >= self.hang_after:
                    self.hanging.set()
                    await asyncio.Event().wait()
                yield event
        except asyncio.CancelledError:
            self.stream_cancelled.set()
            raise

    async def Chat(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for event in self._play(request, context):
            yield chat_service_pb2.ChatResponse(event=event)

    async def SaveMessages(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for event in self._play(request, context):
            yield chat_service_pb2.SaveMessagesResponse(event=event)

    async def ContinueLastTurn(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for event in self._play(request, context):
            yield chat_service_pb2.ContinueLastTurnResponse(event=event)

    async def GetConversation(self, request: Any, context: Any) -> Any:
        self._record(request, context)
        if request.conversation_id in self.pages:
            pages = self.pages[request.conversation_id]
            index = int(request.page_token.removeprefix("page-") or 0)
            following = f"page-{index + 1}" if index + 1 < len(pages) else ""
            return chat_service_pb2.GetConversationResponse(
                conversation=pages[index], next_page_token=following
            )
        if request.conversation_id not in self.conversations:
            await self._abort(
                context,
                rich_status(
                    code_pb2.NOT_FOUND,
                    f"conversation {request.conversation_id} not found",
                    "CONVERSATION_NOT_FOUND",
                ),
            )
        return chat_service_pb2.GetConversationResponse(
            conversation=self.conversations[request.conversation_id]
        )

    async def ListConversations(self, request: Any, context: Any) -> Any:
        self._record(request, context)
        if request.page_token not in ("", "page-2"):
            await self._abort(
                context,
                rich_status(code_pb2.INVALID_ARGUMENT, "bad page token", "INVALID_PAGE_TOKEN"),
            )
        ids = sorted(self.conversations)
        size = request.page_size or 50
        first = size if request.page_token == "page-2" else 0
        page = [
            chat_service_pb2.Conversation(
                conversation_id=c, message_count=len(self.conversations[c].messages)
            )
            for c in ids[first : first + size]
        ]
        more = first + size < len(ids)
        return chat_service_pb2.ListConversationsResponse(
            conversations=page, next_page_token="page-2" if more else ""
        )

    async def CancelChat(self, request: Any, context: Any) -> Any:
        self._record(request, context)
        found = request.request_id in self.running
        self.running.discard(request.request_id)
        return chat_service_pb2.CancelChatResponse(cancelled=found)


@pytest.fixture
async def service() -> AsyncIterator[tuple[FakeChatService, str]]:
    # The generated stubs make every RPC abstract; at runtime the base answers UNIMPLEMENTED for
    # the ones this fake leaves out.
    fake = FakeChatService()  # type: ignore[abstract]
    server = grpc.aio.server()
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield fake, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def agen(items: Iterable[event_pb2.TurnEvent]) -> AsyncIterator[event_pb2.TurnEvent]:
    for item in items:
        yield item


def capture() -> tuple[Console, Callable[[], str]]:
    buffer = io.StringIO()
    return Console(file=buffer, width=100), buffer.getvalue


# -- client: streams -------------------------------------------------------------------------


async def test_chat_sends_request_and_yields_events_in_order(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.stream = weather_turn()
    async with TurnwireClient(target, metadata=[("x-tenant", "acme")]) as client:
        got = [
            e
            async for e in client.chat(
                CONV, "Weather in Paris?", request_id=REQ, body={"user": "ann"}, model="p:m"
            )
        ]
    assert got == fake.stream
    assert [e.sequence_number for e in got] == list(range(1, len(fake.stream) + 1))
    (request,) = fake.requests
    assert isinstance(request, chat_service_pb2.ChatRequest)
    assert request.conversation_id == CONV
    assert request.request_id == REQ
    assert request.model == "p:m"
    assert dict(request.body) == {"user": "ann"}
    assert request.message.role == message_pb2.ROLE_USER
    assert [p.text.text for p in request.message.parts] == ["Weather in Paris?"]
    assert fake.metadata[0]["x-tenant"] == "acme"


async def test_chat_defaults_leave_optional_fields_empty(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.stream = weather_turn()
    async with TurnwireClient(target) as client:
        stream = client.chat(CONV, "hi")
        await collect(stream)
    (request,) = fake.requests
    # The client names every turn (so it can be retried, cancelled or resumed before any event).
    assert re.fullmatch(r"r-[0-9a-f]{32}", request.request_id)
    assert stream.request_id == request.request_id
    assert request.model == ""
    assert not request.HasField("body")


async def test_every_input_message_gets_an_id_that_a_retry_under_the_request_id_repeats(
    service: tuple[FakeChatService, str],
) -> None:
    """A retried send must re-send its message ids, or the server stores the question twice
    (issue 32 item 12: chat(c, "q", request_id="r1") → 529 → the same call was ALREADY_EXISTS)."""
    fake, target = service
    given = message_pb2.Message(
        id="mine", role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text="b"))]
    )
    unnamed = message_pb2.Message(
        role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text="a"))]
    )
    long_id = "r" * 128
    async with TurnwireClient(target) as client:
        for _ in range(2):
            fake.stream = weather_turn()
            await collect(client.chat(CONV, "q", request_id="r1"))
            fake.stream = weather_turn()
            await collect(client.save_messages(CONV, [unnamed, given, unnamed], request_id="r2"))
            fake.stream = weather_turn()
            await collect(client.chat(CONV, "q", request_id=long_id))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "q"))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "q"))
    first, saved, long, again, saved_again, long_again, fresh, other = fake.requests
    assert first.message.id == again.message.id == "r1.m0"
    assert (
        [m.id for m in saved.messages] == [m.id for m in saved_again.messages] == ["r2.m0", "mine", "r2.m2"]
    )
    assert long.message.id == long_again.message.id
    assert re.fullmatch(r"m0-[0-9a-f]{64}", long.message.id)
    assert fresh.message.id == f"{fresh.request_id}.m0"
    assert fresh.message.id != other.message.id  # a new send is a new message
    assert not unnamed.id  # the caller's own messages are not changed


async def test_collect_reconstructs_turn_result(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = weather_turn()
    async with TurnwireClient(target) as client:
        result = await collect(client.chat(CONV, "Weather in Paris?"))
    assert isinstance(result, TurnResult)
    assert result.conversation_id == CONV
    assert result.request_id == REQ
    assert result.status == event_pb2.TURN_STATUS_COMPLETED
    assert result.ok
    assert result.status_name == "COMPLETED"
    assert result.text == "Let me check the weather.\n\nIt is sunny in Paris."
    assert [s.text for s in result.steps] == ["Let me check the weather. ", "It is sunny in Paris."]
    assert result.message == ASSISTANT
    # A server without the JSON text fields: the Struct/Value views, whole numbers as ints.
    assert [(c.tool_name, c.input, c.output, c.state) for c in result.tool_calls] == [
        ("get_weather", {"city": "Paris"}, {"temp_c": 21, "sky": "sunny"}, "output-available")
    ]
    assert result.usage == Usage(input_tokens=30, output_tokens=12, total_tokens=42)
    assert result.step_count == 2
    assert result.error is None
    assert result.events == fake.stream
    result.raise_for_error()  # no error: no raise


async def test_turn_error_is_returned_not_raised(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    failure = rich_status(code_pb2.UNAVAILABLE, "provider timed out", "PROVIDER_ERROR")
    fake.stream = weather_turn(event_pb2.TURN_STATUS_ERROR, failure)
    async with TurnwireClient(target) as client:
        result = await collect(client.chat(CONV, "hi"))
    assert result.status == event_pb2.TURN_STATUS_ERROR
    assert not result.ok
    assert result.error == failure
    with pytest.raises(TurnwireError) as caught:
        result.raise_for_error()
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert caught.value.reason == "PROVIDER_ERROR"
    assert caught.value.message == "provider timed out"


async def test_save_messages_and_continue_last_turn(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    skipped = events(
        ("turn_end", event_pb2.TurnEnd(status=event_pb2.TURN_STATUS_SKIPPED)),
    )
    user = message_pb2.Message(
        role=message_pb2.ROLE_USER, parts=[message_pb2.Part(text=message_pb2.TextPart(text="a"))]
    )
    async with TurnwireClient(target) as client:
        fake.stream = weather_turn()
        saved = await collect(client.save_messages(CONV, [user, user], model="p:m"))
        fake.stream = skipped
        cont = await collect(client.continue_last_turn(CONV, request_id="r2", body={"n": 1}))
    assert saved.ok
    assert cont.status == event_pb2.TURN_STATUS_SKIPPED
    assert cont.message is None
    assert cont.text == ""
    assert cont.tool_calls == []
    save_request, continue_request = fake.requests
    assert isinstance(save_request, chat_service_pb2.SaveMessagesRequest)
    assert [m.parts for m in save_request.messages] == [user.parts, user.parts]
    assert [m.id for m in save_request.messages] == [f"{save_request.request_id}.m{i}" for i in (0, 1)]
    assert save_request.model == "p:m"
    assert isinstance(continue_request, chat_service_pb2.ContinueLastTurnRequest)
    assert continue_request.request_id == "r2"
    assert dict(continue_request.body) == {"n": 1}


async def test_leaving_the_stream_early_cancels_the_call(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.stream = weather_turn()
    fake.hang_after = 2
    async with TurnwireClient(target) as client:
        stream = client.chat(CONV, "hi")
        got = [await anext(stream), await anext(stream)]
        # The server waits for its next event (a cancel landing while it still wrote the last one
        # ends its handler outside the stream's generator, which then never sees it).
        await asyncio.wait_for(fake.hanging.wait(), timeout=5)
        await stream.aclose()
        await asyncio.wait_for(fake.stream_cancelled.wait(), timeout=5)
    assert [e.sequence_number for e in got] == [1, 2]


# -- client: collect's protocol checks --------------------------------------------------------


async def test_collect_rejects_a_sequence_gap() -> None:
    stream = weather_turn()
    del stream[3]
    with pytest.raises(ProtocolError, match="expected sequence number 4, got 5"):
        await collect(agen(stream))


async def test_collect_rejects_a_gap_from_the_server(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = weather_turn()
    fake.stream[0].sequence_number = 0
    async with TurnwireClient(target) as client:
        with pytest.raises(ProtocolError) as caught:
            await collect(client.chat(CONV, "hi"))
    assert isinstance(caught.value, TurnwireError)
    assert caught.value.code == grpc.StatusCode.INTERNAL


async def test_collect_requires_a_turn_end() -> None:
    with pytest.raises(ProtocolError, match="without TurnEnd"):
        await collect(agen(weather_turn()[:-1]))
    with pytest.raises(ProtocolError, match="without TurnEnd"):
        await collect(agen([]))


async def test_collect_rejects_events_after_turn_end() -> None:
    stream = weather_turn()
    stream += events(("text_delta", event_pb2.TextDelta(delta="late")), start=len(stream) + 1)
    with pytest.raises(ProtocolError, match="after TurnEnd"):
        await collect(agen(stream))


async def test_collect_rejects_mixed_turns() -> None:
    stream = weather_turn()
    stream[5].request_id = "someone-else"
    with pytest.raises(ProtocolError, match="someone-else"):
        await collect(agen(stream))


# -- client: errors --------------------------------------------------------------------------


async def test_rejected_turn_raises_turnwire_error_with_details(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.abort_with = INVALID
    async with TurnwireClient(target) as client:
        with pytest.raises(TurnwireError) as caught:
            await collect(client.chat("bad id!", "hi"))
    error = caught.value
    assert not isinstance(error, ProtocolError)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert error.message == "invalid ChatRequest"
    assert error.reason == "INVALID_FIELD"
    assert error.domain == "turnwire.dev"
    assert error.error_metadata == {"k": "v"}
    assert error.field_violations == [
        ("conversation_id", "must be 1-128 characters of [A-Za-z0-9._:-]"),
        ("message.parts", "must not be empty"),
    ]
    assert error.status == INVALID
    assert isinstance(error.__cause__, grpc.aio.AioRpcError)
    assert "INVALID_ARGUMENT [INVALID_FIELD]: invalid ChatRequest" in str(error)
    assert "message.parts: must not be empty" in str(error)


async def test_unary_errors_carry_details(service: tuple[FakeChatService, str]) -> None:
    _, target = service
    async with TurnwireClient(target) as client:
        with pytest.raises(TurnwireError) as not_found:
            await client.get_conversation("nope")
        with pytest.raises(TurnwireError) as bad_token:
            await client.list_conversations(page_token="forged")
    assert not_found.value.code == grpc.StatusCode.NOT_FOUND
    assert not_found.value.reason == "CONVERSATION_NOT_FOUND"
    assert not_found.value.field_violations == []
    assert bad_token.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_token.value.reason == "INVALID_PAGE_TOKEN"


async def test_error_without_details_has_empty_reason(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.abort_with = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="busy")
    fake.plain_abort = True
    async with TurnwireClient(target) as client:
        with pytest.raises(TurnwireError) as caught:
            await collect(client.continue_last_turn(CONV))
    assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.message == "busy"
    assert caught.value.reason == ""
    assert caught.value.field_violations == []
    assert caught.value.status is None


async def test_unreachable_sidecar_raises_unavailable() -> None:
    async with TurnwireClient(f"127.0.0.1:{free_port()}") as client:
        with pytest.raises(TurnwireError) as caught:
            await collect(client.chat(CONV, "hi"))
    assert caught.value.code == grpc.StatusCode.UNAVAILABLE
    assert caught.value.reason == ""


# -- client: unary round trips ---------------------------------------------------------------


async def test_cancel_get_list_round_trip(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.running.add("r-running")
    for cid in ("a", "b", "c"):
        fake.conversations[cid] = chat_service_pb2.Conversation(
            conversation_id=cid, message_count=1, messages=[ASSISTANT]
        )
    channel = grpc.aio.insecure_channel(target)
    async with TurnwireClient(target, channel=channel) as client:
        assert await client.cancel_chat("r-running") is True
        assert await client.cancel_chat("r-running") is False
        conversation = await client.get_conversation("b")
        first = await client.list_conversations(page_size=2)
        second = await client.list_conversations(page_size=2, page_token=first.next_page_token)
    # The client leaves a channel it was given open.
    assert channel.get_state() != grpc.ChannelConnectivity.SHUTDOWN
    await channel.close()
    assert conversation.conversation_id == "b"
    assert list(conversation.messages) == [ASSISTANT]
    assert [c.conversation_id for c in first.conversations] == ["a", "b"]
    assert first.next_page_token == "page-2"
    assert [c.conversation_id for c in second.conversations] == ["c"]
    assert second.next_page_token == ""
    assert [r.request_id for r in fake.requests[:2]] == ["r-running", "r-running"]


# -- console: run_chat -----------------------------------------------------------------------


async def test_run_chat_renders_turn_and_returns_0(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = weather_turn()
    console, output = capture()
    code = await run_chat(Connection(target), CONV, "Weather in Paris?", model="p:m", console=console)
    text = output()
    assert code == 0
    assert "\x1b" not in text
    lines = text.splitlines()
    assert "Let me check the weather. " in lines
    assert '→ get_weather {"city": "Paris"}' in lines
    assert '← get_weather: {"sky": "sunny", "temp_c": 21}' in lines
    assert "It is sunny in Paris." in lines
    assert lines[-1].startswith("COMPLETED")
    assert "2 steps" in lines[-1]
    assert "tokens in 30 / out 12" in lines[-1]
    # Order: text, call, result, second step's text, status.
    order = [
        text.index("Let me check"),
        text.index("→ get_weather"),
        text.index("← get_weather"),
        text.index("It is sunny"),
        text.index("COMPLETED"),
    ]
    assert order == sorted(order)
    assert fake.requests[0].model == "p:m"


async def test_run_chat_shows_reasoning_and_tool_errors(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.stream = events(
        ("turn_start", event_pb2.TurnStart()),
        ("reasoning_start", event_pb2.ReasoningStart(id="r")),
        ("reasoning_delta", event_pb2.ReasoningDelta(id="r", delta="thinking hard")),
        ("reasoning_end", event_pb2.ReasoningEnd(id="r")),
        (
            "tool_input_available",
            event_pb2.ToolInputAvailable(tool_call_id="c", tool_name="lookup", input=_struct({})),
        ),
        ("tool_output_error", event_pb2.ToolOutputError(tool_call_id="c", error_text="boom")),
        ("step_finish", event_pb2.StepFinish(finish_reason=event_pb2.FINISH_REASON_TOOL_CALLS)),
        ("turn_end", event_pb2.TurnEnd(status=event_pb2.TURN_STATUS_COMPLETED, step_count=1)),
    )
    console, output = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console) == 0
    lines = output().splitlines()
    assert "thinking hard" in lines
    assert "→ lookup {}" in lines
    assert "← lookup: error: boom" in lines
    assert lines[-1] == "COMPLETED · 1 step"


async def test_run_chat_turn_error_returns_1(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    failure = rich_status(code_pb2.UNAVAILABLE, "provider timed out", "PROVIDER_ERROR")
    fake.stream = weather_turn(event_pb2.TURN_STATUS_ERROR, failure)
    console, output = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console) == 1
    last = output().splitlines()[-1]
    assert last.startswith("ERROR [PROVIDER_ERROR]: provider timed out · 2 steps")


async def test_run_chat_aborted_returns_1(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = events(
        ("turn_start", event_pb2.TurnStart()),
        ("turn_end", event_pb2.TurnEnd(status=event_pb2.TURN_STATUS_ABORTED)),
    )
    console, output = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console) == 1
    assert output().splitlines()[-1].startswith("ABORTED")


async def test_run_chat_protocol_error_returns_1(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = weather_turn()
    del fake.stream[4]
    console, output = capture()
    err, errors = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console, err_console=err) == 1
    assert "protocol error: expected sequence number 5, got 6" in errors()
    assert "protocol error" not in output()


async def test_run_chat_rejected_call_returns_2(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.abort_with = INVALID
    console, output = capture()
    err, errors = capture()
    assert await run_chat(Connection(target), "bad id!", "hi", console=console, err_console=err) == 2
    # Errors go to stderr, and a refused call never showed a request to cancel.
    assert output() == ""
    lines = errors().splitlines()
    assert lines[0] == "INVALID_ARGUMENT [INVALID_FIELD]: invalid ChatRequest"
    assert "  conversation_id: must be 1-128 characters of [A-Za-z0-9._:-]" in lines
    assert "  message.parts: must not be empty" in lines


async def test_run_chat_unreachable_returns_3() -> None:
    target = f"127.0.0.1:{free_port()}"
    console, output = capture()
    err, errors = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console, err_console=err) == 3
    assert output() == ""
    assert errors().splitlines()[0] == f"cannot reach the sidecar at {target}: is `turnwire serve` running?"


async def _lose_the_sidecar_mid_turn(
    stream: list[event_pb2.TurnEvent], hang_after: int
) -> tuple[int, str, str, str]:
    """``run_chat`` against a sidecar that plays ``hang_after`` events of ``stream`` and then goes
    away (its server stopped, every call cancelled): the exit code, the sidecar's address, the
    turn's request id and what the command printed on stderr."""
    fake = FakeChatService(stream=stream, hang_after=hang_after)  # type: ignore[abstract]
    server = grpc.aio.server()
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    console, _ = capture()
    err, errors = capture()
    target = f"127.0.0.1:{port}"
    chat = asyncio.create_task(run_chat(Connection(target), CONV, "hi", console=console, err_console=err))
    try:
        await wait_until(fake.hanging.is_set, what="the turn's first events reached the command")
    finally:
        await server.stop(None)
    code = await chat
    return code, target, fake.requests[0].request_id, errors()


async def test_run_chat_that_lost_the_sidecar_after_the_turn_started_says_how_to_follow_it() -> None:
    """Fresh-user trial: a sidecar gone mid-turn left only "lost the connection to the sidecar at
    … (Stream removed (Socket closed))", though the turn was stored (and recovered when the
    sidecar started again). After TurnStart the command names the turn and `turnwire resume` (with
    the sidecar's address when it is not the default one)."""
    code, target, request_id, errors = await _lose_the_sidecar_mid_turn(weather_turn(), hang_after=3)
    assert code == 3
    lines = errors.splitlines()
    assert f"lost the connection to the sidecar at {target}" in lines, lines
    assert (
        f"turn {request_id} is stored: `turnwire resume {request_id} --target {target}` follows it, "
        "or shows how it ended, once the sidecar answers again"
    ) in lines, lines
    assert _follow_up("r1", CONV, DEFAULT_TARGET, stored=True).startswith(
        "turn r1 is stored: `turnwire resume r1` follows it"
    )


async def test_run_chat_that_lost_the_sidecar_before_the_turn_started_says_it_may_not_be_stored() -> None:
    """Before TurnStart (a queued turn's keepalive came) the input may not have been stored."""
    queued = event_pb2.TurnEvent(conversation_id=CONV, request_id=REQ)  # keepalives have no number
    queued.progress.phase = event_pb2.PROGRESS_PHASE_QUEUED
    code, target, request_id, errors = await _lose_the_sidecar_mid_turn(
        [queued, *weather_turn()], hang_after=1
    )
    assert code == 3
    assert (
        f"turn {request_id} had not started, so your message may not be stored: "
        f"`turnwire resume {request_id} --target {target}` follows it if it is, and "
        f"`turnwire history {CONV} --target {target}` shows whether it is"
    ) in errors.splitlines(), errors


# -- console: run_history --------------------------------------------------------------------


async def test_run_history_prints_messages(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    user = message_pb2.Message(
        id="msg-u",
        role=message_pb2.ROLE_USER,
        parts=[message_pb2.Part(text=message_pb2.TextPart(text="Weather in Paris?"))],
        create_time=timestamp_pb2.Timestamp(seconds=1_700_000_000),
    )
    assistant = message_pb2.Message()
    assistant.CopyFrom(ASSISTANT)
    assistant.parts.insert(
        0, message_pb2.Part(reasoning=message_pb2.ReasoningPart(text="user wants weather"))
    )
    assistant.parts.append(
        message_pb2.Part(
            tool_call=message_pb2.ToolCallPart(
                tool_name="book",
                input=_struct({"n": 2}),
                state=message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
                error_text="sold out",
            )
        )
    )
    fake.conversations[CONV] = chat_service_pb2.Conversation(
        conversation_id=CONV, message_count=2, messages=[user, assistant]
    )
    console, output = capture()
    assert await run_history(Connection(target), CONV, console=console) == 0
    text = output()
    lines = text.splitlines()
    assert "\x1b" not in text
    assert lines[0] == f"conversation {CONV} · 2 messages"
    assert "user · 2023-11-14 22:13:20 UTC · msg-u" in lines
    assert "Weather in Paris?" in lines
    assert "assistant · msg-a" in lines
    assert "user wants weather" in lines
    assert '→ get_weather {"city": "Paris"}' in lines
    assert '← get_weather: {"sky": "sunny", "temp_c": 21}' in lines
    assert '→ book {"n": 2}' in lines
    assert "← book: error: sold out" in lines
    assert text.index("Weather in Paris?") < text.index("It is sunny in Paris.")


async def test_run_history_marks_calls_the_provider_ran(service: tuple[FakeChatService, str]) -> None:
    """Issue 31a: a server tool's call (web search) and its result, and one still without a result."""
    fake, target = service
    reply = message_pb2.Message(id="msg-p", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().tool_call.CopyFrom(
        message_pb2.ToolCallPart(
            tool_call_id="srvtoolu_1",
            tool_name="web_search",
            input_json='{"query":"example-lib"}',
            output_json='[{"title":"Changelog","url":"https://example.org/c"}]',
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
            provider_executed=True,
        )
    )
    reply.parts.add().tool_call.CopyFrom(
        message_pb2.ToolCallPart(
            tool_call_id="srvtoolu_2",
            tool_name="code_execution",
            input_json='{"code":"1+1"}',
            state=message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE,
            provider_executed=True,
        )
    )
    fake.conversations[CONV] = chat_service_pb2.Conversation(
        conversation_id=CONV, message_count=1, messages=[reply]
    )
    console, output = capture()
    assert await run_history(Connection(target), CONV, console=console) == 0
    lines = output().splitlines()
    assert '→ web_search {"query": "example-lib"} (run by the provider)' in lines
    assert '← web_search: [{"title": "Changelog", "url": "https://example.org/c"}]' in lines
    assert '→ code_execution {"code": "1+1"} (run by the provider)' in lines
    assert "← code_execution: (no result from the provider)" in lines


def _said(message_id: str, role: message_pb2.Role.ValueType, text: str, seconds: int) -> message_pb2.Message:
    return message_pb2.Message(
        id=message_id,
        role=role,
        parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))],
        create_time=timestamp_pb2.Timestamp(seconds=seconds),
    )


def _unreplied(
    request_id: str, status: event_pb2.TurnStatus.ValueType, seconds: int, reason: str = ""
) -> chat_service_pb2.TurnWithoutReply:
    turn = chat_service_pb2.TurnWithoutReply(
        request_id=request_id, status=status, start_time=timestamp_pb2.Timestamp(seconds=seconds)
    )
    if reason:
        turn.error.CopyFrom(rich_status(code_pb2.ABORTED, "stopped", reason))
    return turn


async def test_run_history_marks_turns_without_a_reply_in_place(service: tuple[FakeChatService, str]) -> None:
    """Issue 16: a turn that ended before any reply was stored is marked after the message stored
    just before it started (its own input); the client merges every page's marks."""
    fake, target = service
    user, assistant = message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT
    fake.pages[CONV] = [
        chat_service_pb2.Conversation(
            conversation_id=CONV,
            message_count=4,
            messages=[_said("u1", user, "first", 100), _said("u2", user, "second", 200)],
            turns_without_reply=[
                _unreplied("r-rolled", event_pb2.TURN_STATUS_ABORTED, 50, "ROLLED_BACK"),
                _unreplied("r-early", event_pb2.TURN_STATUS_ABORTED, 100),
            ],
        ),
        chat_service_pb2.Conversation(
            conversation_id=CONV,
            message_count=4,
            messages=[_said("a2", assistant, "answer", 200), _said("u3", user, "third", 300)],
            partial_replies=[
                chat_service_pb2.PartialReply(
                    message_id="a2", request_id="r-2", status=event_pb2.TURN_STATUS_INTERRUPTED
                )
            ],
            turns_without_reply=[
                _unreplied("r-failed", event_pb2.TURN_STATUS_ERROR, 300, "PROVIDER_ERROR"),
                _unreplied("r-live", event_pb2.TURN_STATUS_UNSPECIFIED, 301),
            ],
        ),
    ]
    async with TurnwireClient(target) as client:
        whole = await client.get_conversation(CONV)
    assert [m.id for m in whole.messages] == ["u1", "u2", "a2", "u3"]
    assert [p.message_id for p in whole.partial_replies] == ["a2"]
    assert [t.request_id for t in whole.turns_without_reply] == ["r-rolled", "r-early", "r-failed", "r-live"]

    console, output = capture()
    assert await run_history(Connection(target), CONV, console=console) == 0
    lines = [
        line for line in output().splitlines() if line and not line.startswith(("user ·", "assistant ·"))
    ]
    assert lines == [
        f"conversation {CONV} · 4 messages",
        "(turn r-rolled ended ABORTED: rolled back, its input and reply removed)",
        "first",
        "(turn r-early ended ABORTED before any reply was stored)",
        "second",
        "answer",
        "(partial: turn r-2 ended INTERRUPTED)",
        "third",
        "(turn r-failed ended ERROR before any reply was stored: PROVIDER_ERROR)",
        "(turn r-live is running; no reply stored yet)",
    ]


async def test_run_history_not_found_returns_2(service: tuple[FakeChatService, str]) -> None:
    _, target = service
    console, output = capture()
    err, errors = capture()
    assert await run_history(Connection(target), "missing", console=console, err_console=err) == 2
    assert output() == ""
    assert "conversation 'missing' not found" in errors()


async def test_run_history_unreachable_returns_3() -> None:
    console, output = capture()
    err, errors = capture()
    assert (
        await run_history(Connection(f"127.0.0.1:{free_port()}"), CONV, console=console, err_console=err) == 3
    )
    assert output() == ""
    assert "cannot reach the sidecar" in errors()


async def test_collect_takes_a_resumed_stream_and_the_jump_of_a_crash_recovery() -> None:
    """A resumed stream starts after the number asked for, and an AttemptStart after a crash
    recovery is numbered far above the lost attempt's events (docs/semantics.md §8)."""
    stream = weather_turn()
    resumed = stream[3:]
    result = await collect(agen(resumed))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED
    assert [e.sequence_number for e in result.events] == [e.sequence_number for e in resumed]

    recovered = [stream[0], stream[1]]
    attempt = event_pb2.TurnEvent(conversation_id=CONV, request_id=stream[0].request_id)
    attempt.sequence_number = 65_539
    attempt.attempt_start.attempt = 2
    end = event_pb2.TurnEvent()
    end.CopyFrom(stream[-1])
    end.sequence_number = 65_540
    result = await collect(agen([*recovered, attempt, end]))
    assert result.status == end.turn_end.status

    gap = [stream[0], stream[1], end]  # a jump to anything but an AttemptStart is still a gap
    with pytest.raises(ProtocolError, match="expected sequence number 3"):
        await collect(agen(gap))


async def test_run_chat_shows_a_spinner_on_a_terminal_until_output(
    service: tuple[FakeChatService, str],
) -> None:
    fake, target = service
    fake.stream = weather_turn()
    buffer = io.StringIO()
    console = Console(file=buffer, width=100, force_terminal=True, color_system=None)
    assert await run_chat(Connection(target), CONV, "Weather in Paris?", console=console) == 0
    shown = buffer.getvalue()
    assert "waiting for the model… · request cli-" in shown and "Ctrl-C cancels" in shown
    assert "running the tool…" in shown
    # The spinner is gone before the reply and the status line are printed.
    assert shown.rindex("waiting for the model") < shown.index("It is sunny in Paris.")
    assert "COMPLETED" in shown.splitlines()[-1]


async def test_run_chat_piped_shows_no_spinner(service: tuple[FakeChatService, str]) -> None:
    fake, target = service
    fake.stream = weather_turn()
    console, output = capture()
    err, errors = capture()
    assert await run_chat(Connection(target), CONV, "hi", console=console, err_console=err) == 0
    assert "waiting" not in output() and "\x1b" not in output()
    # The request id `turnwire cancel` needs goes to stderr once the turn was accepted.
    [announced] = errors().splitlines()
    # Named with the sidecar's --target (not the default one here): the command must reach it.
    assert re.fullmatch(
        rf"request (cli-\w+) · `turnwire cancel \1 --target {re.escape(target)}` cancels it while it runs",
        announced,
    )


async def test_run_cancel_of_an_unknown_turn_says_so_on_stderr(service: tuple[FakeChatService, str]) -> None:
    """Trial 3: `turnwire cancel <unknown>` printed its answer on stdout, as a success would."""
    fake, target = service
    fake.running.add("r-running")
    console, output = capture()
    err, errors = capture()
    assert await run_cancel(Connection(target), "r-gone", console=console, err_console=err) == 1
    assert output() == ""
    assert errors().startswith("no running or queued turn r-gone")
    assert await run_cancel(Connection(target), "r-running", console=console, err_console=err) == 0
    assert output() == "cancelled r-running: its turn ends ABORTED\n"


async def test_the_concurrent_input_strategy_is_sent_on_each_input_call(
    service: tuple[FakeChatService, str],
) -> None:
    """Issue 18: the calls that bring new input take ``concurrent_input``; unset sends
    UNSPECIFIED (the server's default)."""
    fake, target = service
    async with TurnwireClient(target) as client:
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi", concurrent_input="reject"))
        fake.stream = weather_turn()
        await collect(client.save_messages(CONV, [], concurrent_input="interrupt"))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi", concurrent_input="rollback"))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi", concurrent_input="enqueue"))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi"))
    assert [r.concurrent_input_strategy for r in fake.requests] == [
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT,
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT,
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK,
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE,
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_UNSPECIFIED,
    ]


async def test_a_turns_own_budget_is_sent_on_the_calls_that_start_one(
    service: tuple[FakeChatService, str],
) -> None:
    """``budget=`` (docs/cost.md, "Budgets": a request lowers its own) is sent as
    ``TurnBudget``; unset sends none; a key the message lacks is refused before any call."""
    fake, target = service
    async with TurnwireClient(target) as client:
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi", budget={"max_tokens": 500, "max_usd": 0.25}))
        fake.stream = weather_turn()
        await collect(client.save_messages(CONV, [], budget=chat_service_pb2.TurnBudget(max_usd=1.5)))
        fake.stream = weather_turn()
        await collect(client.chat(CONV, "hi"))
        with pytest.raises(ValueError, match="max_tokens and max_usd, not \\['tokens'\\]"):
            await collect(client.chat(CONV, "hi", budget={"tokens": 5}))
    sent = [(r.HasField("budget"), r.budget.max_tokens, r.budget.max_usd) for r in fake.requests]
    assert sent == [(True, 500, 0.25), (True, 0, 1.5), (False, 0, 0.0)]
    assert not fake.requests[1].budget.HasField("max_tokens")


def test_a_submissions_own_budget_is_in_its_request() -> None:
    from turnwire_client._requests import submit_messages_request

    def request(**budget: Any) -> chat_service_pb2.SubmitMessagesRequest:
        none: dict[str, Any] = dict.fromkeys(
            ("submission_id", "idempotency_key", "metadata", "body", "model")
        )
        return submit_messages_request(CONV, "later", client_tools=(), **none, **budget)

    assert request(budget={"max_usd": 2}).budget == chat_service_pb2.TurnBudget(max_usd=2.0)
    assert not request().HasField("budget")
