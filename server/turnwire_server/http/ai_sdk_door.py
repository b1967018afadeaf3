"""The AI SDK door: the Vercel AI SDK's UI message stream over the same turns (docs/api/ai-sdk.md).

Routes (issue 36), what the AI SDK's ``DefaultChatTransport`` calls with
``api: "<sidecar>/v1/ai-sdk/chat"``:

- ``POST /v1/ai-sdk/chat``: a turn (``Chat`` for a user message; ``SubmitToolResults`` /
  ``SubmitToolApprovals`` for an assistant message carrying client tool outputs or approval
  answers, :mod:`turnwire_server.http.ai_sdk_request`), answered as the UI message stream: SSE
  ``data:`` lines of UI message chunks (:mod:`turnwire_server.http.ai_sdk_chunks`) ended by
  ``data: [DONE]``, with the ``x-vercel-ai-ui-message-stream: v1`` header, as the AI SDK's own
  ``createUIMessageStreamResponse`` writes them.
- ``GET /v1/ai-sdk/chat/{id}/stream``: the transport's ``reconnectToStream``: 204 when
  conversation ``id`` has no running turn, else that turn's stream from its start
  (``ResumeTurn``).

A translator at the edge, like the OpenAI door: every call goes through
:class:`~turnwire_server.http.calls.InProcessCalls` (authentication by the ``Authorization:
Bearer`` header, tenants, limits, metrics, traces). A refused request answers the HTTP status of
its gRPC code with the message as plain text, which the transport raises as the ``Error`` the
chat holds (``chat.error.message``); a refusal after the stream began is an ``error`` chunk.
Leaving the stream follows the turn's disconnect policy (``disconnectPolicy`` in the body:
``cancel``, the default, or ``continue``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

from google.protobuf.message import Message
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.http.ai_sdk_chunks import UIMessageStream
from turnwire_server.http.ai_sdk_request import ChatTurn, parse_body, turn_input
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.door_requests import UNSERVED_METHODS, call_info, read_body, struct_of
from turnwire_server.http.openai_chat import data_lines
from turnwire_server.http.openai_errors import ended_error
from turnwire_server.http.openai_request import RequestProblem
from turnwire_server.http.retry_headers import retry_headers

_SERVICE = "/turnwire.v1.ChatService/"

HEADERS = {"x-vercel-ai-ui-message-stream": "v1", "cache-control": "no-cache"}
"""The AI SDK's ``UI_MESSAGE_STREAM_HEADERS`` beyond what the SSE response sets itself
(``content-type: text/event-stream``, ``x-accel-buffering: no``)."""

_DONE = b"data: [DONE]\n\n"


def refused(ended: CallEnded) -> Response:
    """The answer to a call the servicer refused: its HTTP status, its message as plain text, the
    refusal's retry headers (:func:`~turnwire_server.http.retry_headers.retry_headers`)."""
    status, body = ended_error(ended)
    return PlainTextResponse(body["error"]["message"], status_code=status, headers=retry_headers(ended))


async def unserved(request: Request) -> Response:
    """404 for a path or method under ``/v1/ai-sdk`` this door does not serve, in the door's own
    error shape (the message as plain text, which the AI SDK's transport raises as the ``Error``
    the chat holds), naming what it serves; not the OpenAI door's JSON error body."""
    return PlainTextResponse(
        f"{request.method} {request.url.path} is not served by this sidecar; its AI SDK door serves "
        "POST /v1/ai-sdk/chat (the transport's api) and GET /v1/ai-sdk/chat/{id}/stream "
        "(docs/api/ai-sdk.md)",
        status_code=404,
    )


class AiSdkDoor:
    """The AI SDK routes over ``calls`` (see the module docstring); bodies up to ``read_max_bytes``."""

    def __init__(self, calls: InProcessCalls, read_max_bytes: int) -> None:
        self.calls = calls
        self.read_max_bytes = read_max_bytes
        # As the OpenAI door: the sidecar's drain and grace govern open streams
        # (docs/operate/stopping.md), not sse-starlette's own watch for uvicorn's exit.
        AppStatus.enable_automatic_graceful_drain = False

    def routes(self) -> list[Route]:
        """The door's Starlette routes."""
        return [
            Route("/v1/ai-sdk/chat", self.send, methods=["POST"]),
            Route("/v1/ai-sdk/chat/{chat_id}/stream", self.reconnect, methods=["GET"]),
            # Last: any other path or method under the door's prefix, in the door's error shape.
            Route("/v1/ai-sdk", unserved, methods=UNSERVED_METHODS),
            Route("/v1/ai-sdk/{path:path}", unserved, methods=UNSERVED_METHODS),
        ]

    async def send(self, request: Request) -> Response:
        """``POST /v1/ai-sdk/chat``: the transport's ``sendMessages``."""
        call = call_info(request)
        raw = await read_body(
            request,
            call,
            self.read_max_bytes,
            self.calls,
            method="Chat",
            too_large=lambda message: PlainTextResponse(message, status_code=413),
            refused=refused,
        )
        if isinstance(raw, Response):
            return raw
        try:
            turn = turn_input(parse_body(raw))
        except RequestProblem as problem:
            return PlainTextResponse(problem.message, status_code=400)
        call.checks.json_depth = True  # parse_body bounded the body's nesting
        try:
            events = await self._events(turn, call)
            first = await anext(events)
        except CallEnded as ended:
            return refused(ended)
        except StopAsyncIteration:
            first = None
        chunks = UIMessageStream(message_id=turn.continues, known_calls=turn.known_calls)
        return self._answer(first, events, chunks)

    async def _events(self, turn: ChatTurn, call: DoorCallInfo) -> AsyncIterator[Any]:
        """The turn's event stream; results and approvals in one request store the results first
        (without continuing), then the approvals continue the turn."""
        common = dict(
            turn.common, body=struct_of(turn.common["body"]), request_id=f"aisdk-{uuid.uuid4().hex}"
        )
        method: str
        message: Message
        if turn.message is not None:
            method, message = "Chat", chat_service_pb2.ChatRequest(message=turn.message, **common)
        elif turn.approvals:
            if turn.results:
                stored = chat_service_pb2.SubmitToolResultsRequest(
                    results=turn.results, auto_continue=False, **dict(common, request_id="")
                )
                async for _ in self.calls.stream(_SERVICE + "SubmitToolResults", stored, call):
                    pass
            method = "SubmitToolApprovals"
            message = chat_service_pb2.SubmitToolApprovalsRequest(
                approvals=turn.approvals, auto_continue=True, **common
            )
        else:
            method = "SubmitToolResults"
            message = chat_service_pb2.SubmitToolResultsRequest(
                results=turn.results, auto_continue=True, **common
            )
        return self.calls.stream(_SERVICE + method, message, call)

    async def reconnect(self, request: Request) -> Response:
        """``GET /v1/ai-sdk/chat/{id}/stream``: the transport's ``reconnectToStream``."""
        call = call_info(request)
        try:
            request_id = await self._running_turn(request.path_params["chat_id"], call)
        except CallEnded as ended:
            return refused(ended)
        if request_id is None:
            return Response(status_code=204)
        replay = self.calls.stream(
            _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=request_id), call
        )
        try:
            first = await anext(replay)
        except CallEnded as ended:
            await replay.aclose()  # type: ignore[attr-defined]
            return Response(status_code=204) if ended.code.name == "NOT_FOUND" else refused(ended)
        except StopAsyncIteration:
            first = None
        return self._answer(first, replay, UIMessageStream())

    async def _running_turn(self, conversation: str, call: DoorCallInfo) -> str | None:
        """The request id of the turn running on ``conversation``; None when none runs or there is
        no such conversation (for this caller's tenant). Reads every page of the conversation:
        a running turn is a partial reply or a turn without reply whose status is not set yet."""
        token = ""
        running: str | None = None
        while True:
            try:
                page = await self.calls.unary(
                    _SERVICE + "GetConversation",
                    chat_service_pb2.GetConversationRequest(conversation_id=conversation, page_token=token),
                    call,
                )
            except CallEnded as ended:
                if ended.code.name == "NOT_FOUND":
                    return None
                raise
            found = page.conversation  # type: ignore[attr-defined]
            for turn in [*found.partial_replies, *found.turns_without_reply]:
                if turn.status == event_pb2.TURN_STATUS_UNSPECIFIED:
                    running = turn.request_id
            token = page.next_page_token  # type: ignore[attr-defined]
            if not token:
                return running

    def _answer(self, first: Any, events: AsyncIterator[Any], chunks: UIMessageStream) -> Response:
        return EventSourceResponse(self._sse(first, events, chunks), ping=15, headers=HEADERS)

    async def _sse(
        self, first: Any, events: AsyncIterator[Any], chunks: UIMessageStream
    ) -> AsyncIterator[bytes]:
        try:
            if first is not None:
                if lines := data_lines(chunks.feed(first.event)):
                    yield lines
                async for item in events:
                    if lines := data_lines(chunks.feed(item.event)):
                        yield lines
            yield _DONE
        except CallEnded as ended:
            _, body = ended_error(ended)
            yield data_lines([{"type": "error", "errorText": body["error"]["message"]}]) + _DONE
        finally:
            await events.aclose()  # type: ignore[attr-defined]


__all__ = ["HEADERS", "AiSdkDoor", "refused", "unserved"]
