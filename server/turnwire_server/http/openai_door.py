"""The OpenAI-compatible door: OpenAI's Responses API over the same turns (docs/api/openai.md).

Routes (issue 36):

- ``POST /v1/responses``: a turn (``Chat``, ``SaveMessages``, ``SubmitToolResults`` for
  ``function_call_output`` items, or ``SubmitToolApprovals`` for ``mcp_approval_response`` items:
  :mod:`turnwire_server.http.openai_approvals`), streamed as OpenAI's server-sent events (``stream: true``) or
  answered as one Response object; ``background: true`` is a submission (``SubmitMessages``,
  streamed with ``WatchSubmission``).
- ``GET /v1/responses/{id}``: the response of turn ``id`` (``ResumeTurn`` from the start; it
  waits for the turn to end, a long poll; a submission not yet started answers ``queued``);
  ``?stream=true&starting_after=N`` streams its events after sequence number ``N``.
- ``POST /v1/responses/{id}/cancel``: ``CancelSubmission`` of a background response, then the
  Response; a foreground one is refused, as OpenAI refuses it.

A translator at the edge: every call goes through
:class:`~turnwire_server.http.calls.InProcessCalls` (the gRPC server's interceptors and
servicer: authentication by the ``Authorization: Bearer`` header the SDKs send, tenants, limits,
metrics, traces), and the events are the turn's own sequenced log read by
:class:`~turnwire_server.http.openai_response_log.ResponseLog`. ``conversation`` is a Turnwire
conversation id, ``model`` a Turnwire model id, a response id a turn's request id.
``previous_response_id`` continues the conversation of that response when it is the latest
response there; an older one continues a fork of that conversation made at that response
(``ForkConversation``, docs/forks.md), so the later responses stay as they were.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from google.protobuf.message import Message
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine.ids import assistant_message_id
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.door_requests import call_info, json_response, keyed_id, read_body, struct_of
from turnwire_server.http.openai_approvals import tool_approvals
from turnwire_server.http.openai_errors import bad_request, ended_error, ended_response, error_response
from turnwire_server.http.openai_request import (
    RequestProblem,
    TurnInput,
    parse_request,
    referenced_response,
    turn_input,
)
from turnwire_server.http.openai_response_log import ResponseLog, stored_events, stored_log
from turnwire_server.http.stored_turns import expired_in, reply_followed, stored_turn

_SERVICE = "/turnwire.v1.ChatService/"
_PARAMS = {"conversation_id": "conversation", "client_tools": "tools", "request_id": "response_id"}
"""Turnwire field names to this door's parameters, in error bodies."""

_Opened = tuple[Any, AsyncIterator[Any]] | CallEnded
"""A response's ``ResumeTurn`` stream opened (``ResponsesDoor._open``): its first event (None: it
ended without one) and the stream, or how the call ended."""

_SUBMISSION_QUEUED = chat_service_pb2.SUBMISSION_STATE_PENDING
_SUBMISSION_ABORTED = chat_service_pb2.SUBMISSION_STATE_ABORTED


class ResponsesDoor:
    """The Responses routes over ``calls`` (see the module docstring); request bodies up to
    ``read_max_bytes``."""

    def __init__(self, calls: InProcessCalls, read_max_bytes: int) -> None:
        self.calls = calls
        self.read_max_bytes = read_max_bytes
        # The sidecar's drain and grace govern open streams (docs/operate/stopping.md), not
        # sse-starlette's own watch for uvicorn's exit, which would end them at once.
        AppStatus.enable_automatic_graceful_drain = False

    def routes(self) -> list[Route]:
        """The door's Starlette routes."""
        return [
            Route("/v1/responses", self.create, methods=["POST"]),
            Route("/v1/responses/{response_id}", self.retrieve, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self.cancel, methods=["POST"]),
        ]

    # -- POST /v1/responses ----------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        """``POST /v1/responses``."""
        call = call_info(request)
        raw = await read_body(request, call, self.read_max_bytes, self.calls, method="Chat")
        if isinstance(raw, Response):
            return raw
        try:
            parsed = parse_request(raw)
            referenced = referenced_response(parsed)
            if referenced is not None:  # the input's history is a stored response's: continue it
                parsed.previous_response_id, start = referenced
                if start == len(parsed.input):
                    raise RequestProblem(
                        "input: nothing after its last item_reference (the stored history): send "
                        "a message or function_call_output items",
                        "input",
                    )
            turn = turn_input(parsed, referenced[1] if referenced else 0)
        except RequestProblem as problem:
            return bad_request(problem.message, problem.param)
        call.checks.json_depth = True  # parse_request bounded the body's nesting
        key = request.headers.get("idempotency-key")
        response_id = keyed_id("resp-", key) if key else f"resp-{uuid.uuid4().hex}"
        if key:  # a retry answers the first request's response
            earlier = await self._earlier(response_id, call)
            if earlier is not None:
                return await self._read(response_id, call, stream=bool(parsed.stream), opened=earlier)
        if parsed.conversation_id and parsed.previous_response_id:
            return bad_request(
                "conversation and previous_response_id cannot both be given: name one",
                "previous_response_id",
                "mutually_exclusive",
            )
        if turn.approvals and not (parsed.previous_response_id or parsed.conversation_id):
            return bad_request(
                "input: mcp_approval_response items answer the approval requests of a response: send "
                "them with previous_response_id, that response's id",
                "previous_response_id",
            )
        conversation = parsed.conversation_id
        if parsed.previous_response_id:
            found = await self._continued_conversation(parsed.previous_response_id, call)
            if isinstance(found, Response):
                return found
            conversation = found
        conversation = conversation or "conv-" + response_id.removeprefix("resp-")
        for index, stored in enumerate(turn.messages if key else ()):  # a retry stores them once
            stored.id = stored.id or f"{response_id}.m{index}"
        echo = turn.echo | {"background": bool(parsed.background)}
        if parsed.background:
            return await self._submit(
                conversation,
                parsed.model or "",
                turn,
                echo,
                call,
                stream=bool(parsed.stream),
                submission_id=response_id,
            )
        approvals: list[chat_service_pb2.ToolApproval] = []
        if turn.approvals:
            answers = await tool_approvals(self.calls, conversation, turn.approvals, call)
            if isinstance(answers, Response):
                return answers
            approvals = answers
            if turn.results and (refused := await self._store_results(conversation, turn, call)):
                return refused
        method, message = self._turn_request(conversation, response_id, parsed.model or "", turn, approvals)
        events = self.calls.stream(_SERVICE + method, message, call)
        if key:
            try:
                first = await anext(events)
            except CallEnded as ended:
                await events.aclose()  # type: ignore[attr-defined]
                if ended.code.name != "ALREADY_EXISTS":
                    return ended_response(ended, param_names=_PARAMS | turn.params)
                # The same key sent at once twice: the other request started it; follow it.
                return await self._read(response_id, call, stream=bool(parsed.stream))
            events = _after(first, events)
        log = ResponseLog(response_id, echo=echo)
        return await self._answer(events, log, stream=bool(parsed.stream), params=_PARAMS | turn.params)

    async def _earlier(self, response_id: str, call: DoorCallInfo) -> _Opened | None:
        """The turn stream of response ``response_id`` opened (:meth:`_open`), when a response (a
        turn, or a submission) of that id exists, its events past their retention included, for
        :meth:`_read` to answer without opening it again; None when none exists."""
        opened = await self._open(response_id, call)
        if not isinstance(opened, CallEnded) or opened.code.name != "NOT_FOUND" or expired_in(opened):
            return opened
        try:
            await self.calls.unary(
                _SERVICE + "GetSubmission",
                chat_service_pb2.GetSubmissionRequest(submission_id=response_id),
                call,
            )
        except CallEnded:
            return None
        return opened

    async def _open(self, response_id: str, call: DoorCallInfo) -> _Opened:
        """Turn ``response_id``'s ``ResumeTurn`` stream from its start, its first event read: the
        event (None: the stream ended without one) and the stream, or how the call ended."""
        replay = self.calls.stream(
            _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=response_id), call
        )
        try:
            return await anext(replay), replay
        except CallEnded as ended:
            await replay.aclose()  # type: ignore[attr-defined]
            return ended
        except StopAsyncIteration:
            return None, replay

    async def _store_results(self, conversation: str, turn: TurnInput, call: DoorCallInfo) -> Response | None:
        """Store ``turn.results`` without continuing (``SubmitToolResults``), for a request that
        also answers approvals, which then continue the turn (as the AI SDK door does); the
        refusal's answer, or None."""
        stored = chat_service_pb2.SubmitToolResultsRequest(
            conversation_id=conversation, results=turn.results, auto_continue=False
        )
        try:
            async for _ in self.calls.stream(_SERVICE + "SubmitToolResults", stored, call):
                pass
        except CallEnded as ended:
            return ended_response(ended, param_names=_PARAMS | turn.params)
        return None

    def _turn_request(
        self,
        conversation: str,
        response_id: str,
        model: str,
        turn: TurnInput,
        approvals: Sequence[chat_service_pb2.ToolApproval] = (),
    ) -> tuple[str, Message]:
        common: dict[str, Any] = {
            "conversation_id": conversation,
            "request_id": response_id,
            "model": model,
            "client_tools": turn.client_tools,
            "body": struct_of(turn.body),
        }
        if approvals:
            return "SubmitToolApprovals", chat_service_pb2.SubmitToolApprovalsRequest(
                approvals=approvals, auto_continue=True, **common
            )
        if turn.results:
            return "SubmitToolResults", chat_service_pb2.SubmitToolResultsRequest(
                results=turn.results, auto_continue=True, **common
            )
        if len(turn.messages) == 1 and turn.messages[0].role == message_pb2.ROLE_USER:
            return "Chat", chat_service_pb2.ChatRequest(message=turn.messages[0], **common)
        return "SaveMessages", chat_service_pb2.SaveMessagesRequest(messages=turn.messages, **common)

    async def _submit(
        self,
        conversation: str,
        model: str,
        turn: TurnInput,
        echo: dict[str, Any],
        call: DoorCallInfo,
        *,
        stream: bool,
        submission_id: str,
    ) -> Response:
        if turn.results or turn.approvals:
            return bad_request(
                "background: function_call_output and mcp_approval_response items continue a "
                "response in the foreground; send them without background",
                "background",
            )
        submit = chat_service_pb2.SubmitMessagesRequest(
            conversation_id=conversation,
            messages=turn.messages,
            submission_id=submission_id,
            model=model,
            client_tools=turn.client_tools,
            body=struct_of(turn.body),
        )
        try:
            await self.calls.unary(_SERVICE + "SubmitMessages", submit, call)
        except CallEnded as ended:
            return ended_response(ended, param_names=_PARAMS | turn.params)
        log = ResponseLog(submission_id, echo=echo, status="queued")
        log.response["conversation"] = {"id": conversation}
        log.response["model"] = model
        if not stream:
            return json_response(log.snapshot())
        watch = chat_service_pb2.WatchSubmissionRequest(submission_id=submission_id)
        return await self._answer(
            self.calls.stream(_SERVICE + "WatchSubmission", watch, call), log, stream=True
        )

    async def _continued_conversation(self, response_id: str, call: DoorCallInfo) -> str | Response:
        """The conversation to continue response ``response_id`` in: its own when it is that
        conversation's latest response, else a new fork of it made at that response (a branch:
        docs/forks.md); OpenAI's 404 when the response is unknown."""
        replay = self.calls.stream(
            _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=response_id), call
        )
        try:
            first = await anext(replay)
            conversation = str(first.event.conversation_id)  # type: ignore[attr-defined]
        except CallEnded as ended:
            # Past the event retention the stored conversation still holds the response.
            stored_in = expired_in(ended)
            if stored_in is None:
                return error_response(
                    404 if ended.code.name == "NOT_FOUND" else 400,
                    f"previous_response_id: no response {response_id!r}",
                    "invalid_request_error",
                    "previous_response_id",
                    "previous_response_not_found",
                )
            conversation = stored_in
        finally:
            await replay.aclose()  # type: ignore[attr-defined]
        own = assistant_message_id(response_id)
        try:
            followed = await reply_followed(self.calls, conversation, own, call)
        except CallEnded as ended:
            return ended_response(ended, param_names=_PARAMS)
        if followed:
            fork = chat_service_pb2.ForkConversationRequest(
                conversation_id=conversation,
                at_message_id=own,
                new_conversation_id=f"conv-{uuid.uuid4().hex}",
            )
            try:
                forked = await self.calls.unary(_SERVICE + "ForkConversation", fork, call)
            except CallEnded as ended:
                return ended_response(ended, param_names=_PARAMS)
            return str(forked.conversation.conversation_id)  # type: ignore[attr-defined]
        return conversation

    # -- answering: one Response, or its events over SSE -----------------------------------------

    async def _answer(
        self,
        events: AsyncIterator[Any],
        log: ResponseLog,
        *,
        stream: bool,
        after: int = -1,
        params: dict[str, str] = _PARAMS,
    ) -> Response:
        """The Response of the turn ``events`` carry, or (``stream``) its events after sequence
        number ``after`` as server-sent events. A call refused before its first event is
        OpenAI's error answer, its ``param`` renamed by ``params`` (Turnwire field → request
        parameter)."""
        try:
            first = await anext(events)
        except CallEnded as ended:
            return ended_response(ended, param_names=params)
        except StopAsyncIteration:
            first = None
        if not stream:
            try:
                if first is not None:
                    log.feed(first.event)
                    async for item in events:
                        log.feed(item.event)
            except CallEnded as ended:
                return ended_response(ended, param_names=params, started=first is not None)
            return json_response(log.snapshot())
        return EventSourceResponse(self._sse(first, events, log, after, params), ping=15)

    async def _sse(
        self, first: Any, events: AsyncIterator[Any], log: ResponseLog, after: int, params: dict[str, str]
    ) -> AsyncIterator[bytes]:
        try:
            if first is not None:
                if frames := _frames(log.feed(first.event), after):
                    yield frames
                async for item in events:
                    if frames := _frames(log.feed(item.event), after):
                        yield frames
        except CallEnded as ended:
            # OpenAI's ResponseErrorEvent: code, message, param; the error's own ``type`` would
            # replace the event's.
            _, body = ended_error(ended, param_names=params)
            fields = {key: body["error"][key] for key in ("code", "message", "param")}
            yield _frames([{"type": "error", "sequence_number": log.next_sequence_number, **fields}], -1)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    # -- GET /v1/responses/{id}, POST /v1/responses/{id}/cancel ----------------------------------

    async def retrieve(self, request: Request) -> Response:
        """``GET /v1/responses/{id}`` (see the module docstring)."""
        response_id = request.path_params["response_id"]
        stream = request.query_params.get("stream", "false").lower() == "true"
        after_text = request.query_params.get("starting_after", "")
        try:
            after = int(after_text) if after_text else -1
        except ValueError:
            return bad_request("starting_after: a sequence number (an integer)", "starting_after")
        return await self._read(response_id, call_info(request), stream=stream, after=after)

    async def _read(
        self,
        response_id: str,
        call: DoorCallInfo,
        *,
        stream: bool,
        after: int = -1,
        opened: _Opened | None = None,
    ) -> Response:
        """Response ``response_id`` (``stream``: its events after sequence number ``after``), from
        its turn stream: ``opened`` (:meth:`_open`) when the caller opened it already, else opened
        here."""
        if not stream and (opened is None or isinstance(opened, CallEnded)):
            # A submission that has not run answers at once, not when it has run.
            pending = await self._pending_submission(response_id, call)
            if pending is not None:
                return pending
        if opened is None:
            opened = await self._open(response_id, call)
        if isinstance(opened, CallEnded):
            ended = opened
            if ended.code.name != "NOT_FOUND":
                return ended_response(ended, param_names=_PARAMS)
            conversation = expired_in(ended)
            if conversation is not None and after < 0:
                stored = await self._stored(response_id, conversation, call, stream=stream)
                if stored is not None:
                    return stored
            return await self._submission(response_id, call, stream=stream, after=after, ended=ended)
        first, replay = opened
        events = replay if first is None else _after(first, replay)
        return await self._answer(events, ResponseLog(response_id), stream=stream, after=after)

    async def _stored(
        self, response_id: str, conversation: str, call: DoorCallInfo, *, stream: bool
    ) -> Response | None:
        """The Response of turn ``response_id`` of ``conversation`` whose events are past their
        retention, made from its record and its stored reply
        (:func:`~turnwire_server.http.stored_turns.stored_turn`): the reply outlives the events, so
        the response stays readable as long as the conversation is stored
        (:func:`~turnwire_server.http.openai_response_log.stored_events`; ``stream``: as events,
        numbered afresh). None when the conversation no longer holds the turn."""
        try:
            found = await stored_turn(self.calls, response_id, conversation, call)
        except CallEnded as ended:
            return ended_response(ended, param_names=_PARAMS)
        if found is None:
            return None
        turn, reply = found
        log = stored_log(turn, reply)
        events = stored_events(turn, reply)
        if not stream:
            for event in events:
                log.feed(event)
            return json_response(log.snapshot())

        async def replayed() -> AsyncIterator[Any]:
            for event in events:
                yield chat_service_pb2.ResumeTurnResponse(event=event)

        return await self._answer(replayed(), log, stream=True)

    async def _pending_submission(self, response_id: str, call: DoorCallInfo) -> Response | None:
        """The Response of submission ``response_id`` when it is queued or was cancelled before it
        ran; None when there is no such submission or it has run (its turn stream tells)."""
        try:
            found = await self.calls.unary(
                _SERVICE + "GetSubmission",
                chat_service_pb2.GetSubmissionRequest(submission_id=response_id),
                call,
            )
        except CallEnded:
            return None
        submission = found.submission  # type: ignore[attr-defined]
        if submission.state not in (_SUBMISSION_QUEUED, _SUBMISSION_ABORTED) or submission.start_time.seconds:
            return None
        log = ResponseLog(response_id, status="queued", echo={"background": True})
        log.response["conversation"] = {"id": submission.conversation_id}
        if submission.state == _SUBMISSION_ABORTED:
            log.response["status"] = "cancelled"
        return json_response(log.snapshot())

    async def _submission(
        self, response_id: str, call: DoorCallInfo, *, stream: bool, after: int, ended: CallEnded
    ) -> Response:
        """A response whose turn stream ``ResumeTurn`` does not find: a submission (queued, cancelled
        before it ran, or started since), read with ``WatchSubmission``; else ``ended`` (404), whose
        message, about a stream to resume, is kept for ``stream`` and for events expired; a plain
        retrieve of an id nothing holds is told that no such response exists."""
        try:
            found = await self.calls.unary(
                _SERVICE + "GetSubmission",
                chat_service_pb2.GetSubmissionRequest(submission_id=response_id),
                call,
            )
        except CallEnded:
            if stream or _events_expired(ended):
                return ended_response(ended, param_names=_PARAMS)
            return _no_such_response(response_id, ended)
        submission = found.submission  # type: ignore[attr-defined]
        log = ResponseLog(response_id, status="queued", echo={"background": True})
        log.response["conversation"] = {"id": submission.conversation_id}
        if not stream and submission.state in (_SUBMISSION_QUEUED, _SUBMISSION_ABORTED):
            if submission.state == _SUBMISSION_ABORTED:
                log.response["status"] = "cancelled"
            return json_response(log.snapshot())
        watch = chat_service_pb2.WatchSubmissionRequest(submission_id=response_id)
        return await self._answer(
            self.calls.stream(_SERVICE + "WatchSubmission", watch, call), log, stream=stream, after=after
        )

    async def cancel(self, request: Request) -> Response:
        """``POST /v1/responses/{id}/cancel``: a background response (a submission) is cancelled
        and its Response answered once it has ended. A foreground response, running or ended, is
        refused as OpenAI refuses it ("Only responses created with the background parameter set to
        true can be cancelled", OpenAI's API reference): 400 ``invalid_request_error`` with
        OpenAI's message, ``param`` and ``code`` null, and the turn left to run. An id no
        response has: 404, as for a retrieve."""
        response_id = request.path_params["response_id"]
        call = call_info(request)
        try:
            await self.calls.unary(
                _SERVICE + "CancelSubmission",
                chat_service_pb2.CancelSubmissionRequest(submission_id=response_id),
                call,
            )
        except CallEnded as ended:
            if ended.code.name != "NOT_FOUND":
                return ended_response(ended, param_names=_PARAMS)
            replay = self.calls.stream(
                _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=response_id), call
            )
            try:
                await anext(replay)
            except CallEnded as missing:
                if missing.code.name != "NOT_FOUND":
                    return ended_response(missing, param_names=_PARAMS)
                if expired_in(missing) is None:
                    return _no_such_response(response_id, missing)
            except StopAsyncIteration:
                pass
            finally:
                await replay.aclose()  # type: ignore[attr-defined]
            return error_response(
                400,
                "Cannot cancel a synchronous response. Only a response created with background: true "
                "can be cancelled; a foreground response is cancelled by closing its connection "
                "(docs/api/openai.md#routes)",
                "invalid_request_error",
            )
        return await self._read(response_id, call, stream=False)


def _no_such_response(response_id: str, ended: CallEnded) -> Response:
    """The 404 of an id no response has (``ended``: the refusal that found none), saying what a
    response id is."""
    status, body = ended_error(ended, param_names=_PARAMS)
    return error_response(
        status,
        f"no response with id {response_id!r}: a response id is the id of a response this "
        "door created (resp-<hex>, from POST /v1/responses) or the request id of a turn "
        "started over gRPC, Connect or another door; a response whose conversation was "
        "deleted is not found either",
        body["error"]["type"],
        body["error"]["param"],
        body["error"]["code"],
    )


async def _after(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """``first``, then ``rest``'s items; closing it closes ``rest``."""
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def _events_expired(ended: CallEnded) -> bool:
    """Whether ``ResumeTurn``'s NOT_FOUND says the turn's events are past their retention (the
    ``expired`` metadata of its ``google.rpc.ErrorInfo``) rather than that no such turn exists."""
    info = ended.error_info()
    return info is not None and info.metadata.get("expired") == "true"


def _frames(events: list[dict[str, Any]], after: int) -> bytes:
    """The server-sent events of ``events`` numbered above ``after``, as one chunk: one write per
    turn event rather than per OpenAI event (compact JSON holds no newline, so one ``data:`` line)."""
    return b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        for event in events
        if event["sequence_number"] > after
    )


__all__ = ["ResponsesDoor"]
