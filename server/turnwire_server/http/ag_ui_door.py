"""The AG-UI door: ``POST /v1/ag-ui`` runs an AG-UI run as a Turnwire turn (docs/api/ag-ui.md).

AG-UI (the Agent-User Interaction protocol, https://docs.ag-ui.com) has a client POST a
``RunAgentInput`` and read the run's events back over server-sent events; ``@ag-ui/client``'s
``HttpAgent`` does exactly that, with ``Accept: text/event-stream``. The body is read by
:mod:`.ag_ui_request` (``threadId`` = conversation, ``runId`` = request id, the last user message
the input, trailing tool messages the results of pending client tool calls) and the turn's
sequenced event log translated by :class:`~turnwire_server.http.ag_ui_events.RunLog`.

A translator at the edge, like the OpenAI door: every call goes through
:class:`~turnwire_server.http.calls.InProcessCalls` (authentication by the ``Authorization:
Bearer`` header, tenants, limits, metrics, traces), with the OpenAI door's helpers
(:func:`~turnwire_server.http.door_requests.call_info`, ``read_body``, ``struct_of``).

- **Encoding.** Server-sent events, each ``data: <event JSON>`` (AG-UI's ``EventEncoder``). An
  ``Accept`` header that admits neither ``text/event-stream`` nor ``*/*`` (only AG-UI's protobuf
  encoding, ``application/vnd.ag-ui.event+proto``, say) is 406: the protobuf encoding is not served.
- **Errors.** A request refused before its run starts is an HTTP 4xx/5xx whose JSON body is a
  ``RUN_ERROR`` event (``{"type": "RUN_ERROR", "message", "code"}``; ``HttpAgent`` raises it with
  ``status`` and ``payload``): 400 ``invalid_request`` for a body that is not a ``RunAgentInput``
  this door takes, the gRPC refusal's status otherwise (401, 404, 429 …, the code its reason). A
  call that ends during the run ends the stream with a ``RUN_ERROR``.
- **Following a run again.** Posting a ``RunAgentInput`` whose ``runId`` names a turn that exists
  (running, or ended within the event retention) re-attaches to it (``ResumeTurn`` from its start):
  a run started over gRPC is read so, and a client that lost its stream reconnects so (AG-UI
  defines no resume of its own for ``HttpAgent``); a turn that ended ``ERROR``/``ABORTED`` is
  retried instead, as over gRPC (docs/semantics.md "Idempotent input").
- **Cancel.** The client aborting (``abortRun``) closes the stream: the turn follows its
  disconnect policy, the default ``CANCEL`` (docs/semantics.md "Disconnect policy").
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
import orjson
from sse_starlette import EventSourceResponse
from sse_starlette.sse import AppStatus
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.http.ag_ui_events import RunLog
from turnwire_server.http.ag_ui_request import RunInput, parse_run_input, run_input
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.door_requests import UNSERVED_METHODS, call_info, read_body, struct_of
from turnwire_server.http.openai_chat import data_lines
from turnwire_server.http.openai_errors import ended_error
from turnwire_server.http.openai_request import RequestProblem
from turnwire_server.http.openai_response_log import stored_events
from turnwire_server.http.retry_headers import retry_headers
from turnwire_server.http.stored_turns import expired_in, stored_turn

PATH = "/v1/ag-ui"
"""The door's one route."""

_SERVICE = "/turnwire.v1.ChatService/"
_PARAMS = {"conversation_id": "threadId", "request_id": "runId", "client_tools": "tools"}
"""Turnwire field names to RunAgentInput's, in error messages."""
_SSE_TYPES = ("text/event-stream", "text/*", "*/*")


def run_error_response(
    status: int, message: str, code: str, *, headers: Mapping[str, str] | None = None
) -> Response:
    """An HTTP ``status`` answer whose body is AG-UI's ``RUN_ERROR`` event, with ``headers``
    (a refusal's retry headers: :mod:`turnwire_server.http.retry_headers`)."""
    body = {"type": "RUN_ERROR", "message": message, "code": code}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def ended_run_error(ended: CallEnded) -> tuple[int, dict[str, Any]]:
    """The HTTP status and ``RUN_ERROR`` event of a call the servicer ended: the OpenAI door's
    status mapping (:func:`~turnwire_server.http.openai_errors.ended_error`), ``code`` the
    ``google.rpc.ErrorInfo`` reason in lower case (else the gRPC code's name, lower case)."""
    status, body = ended_error(ended, param_names=_PARAMS)
    error = body["error"]
    message = error["message"] + (f" (field {error['param']})" if error["param"] else "")
    return status, {"type": "RUN_ERROR", "message": message, "code": error["code"] or ended.code.name.lower()}


def accepts_sse(accept: str | None) -> bool:
    """Whether an ``Accept`` header admits ``text/event-stream`` (absent or empty: yes)."""
    if not accept or not accept.strip():
        return True
    for item in accept.split(","):
        media, _, params = item.strip().partition(";")
        quality = next(
            (p.strip()[2:] for p in params.split(";") if p.strip().startswith("q=")),
            "1",
        )
        if media.strip().lower() in _SSE_TYPES and quality not in ("0", "0.0", "0.00", "0.000"):
            return True
    return False


async def unserved(request: Request) -> Response:
    """404 for a path or method under ``/v1/ag-ui`` this door does not serve, as AG-UI's
    ``RUN_ERROR`` (code ``unknown_url``), which ``HttpAgent`` raises with its message, naming
    the route served; not the OpenAI door's error body."""
    return run_error_response(
        404,
        f"{request.method} {request.url.path} is not served by this sidecar; its AG-UI door serves "
        f"POST {PATH} (HttpAgent's url; docs/api/ag-ui.md)",
        "unknown_url",
    )


class AgUiDoor:
    """``POST /v1/ag-ui`` over ``calls`` (see the module docstring); bodies up to ``read_max_bytes``."""

    def __init__(self, calls: InProcessCalls, read_max_bytes: int) -> None:
        self.calls = calls
        self.read_max_bytes = read_max_bytes
        # The sidecar's drain governs open streams (docs/operate/stopping.md), as for the OpenAI door.
        AppStatus.enable_automatic_graceful_drain = False

    def routes(self) -> list[Route]:
        """The door's Starlette routes."""
        return [
            Route(PATH, self.run, methods=["POST"]),
            # Last: any other path or method under the door's path, in AG-UI's error shape.
            Route(PATH, unserved, methods=UNSERVED_METHODS),
            Route(PATH + "/{path:path}", unserved, methods=UNSERVED_METHODS),
        ]

    async def run(self, request: Request) -> Response:
        """``POST /v1/ag-ui``: the run's AG-UI events over SSE, or a ``RUN_ERROR`` answer."""
        if not accepts_sse(request.headers.get("accept")):
            return run_error_response(
                406,
                "this door answers text/event-stream (AG-UI's SSE encoding); AG-UI's protobuf encoding "
                "(application/vnd.ag-ui.event+proto) is not served: accept text/event-stream",
                "not_acceptable",
            )
        call = call_info(request)
        raw = await read_body(
            request,
            call,
            self.read_max_bytes,
            self.calls,
            method="Chat",
            too_large=lambda message: run_error_response(413, message, "request_too_large"),
            refused=_ended_response,
        )
        if isinstance(raw, Response):
            return raw
        try:
            parsed = parse_run_input(raw)
            turn = run_input(parsed)
        except RequestProblem as problem:
            return run_error_response(400, problem.message, "invalid_request")
        call.checks.json_depth = True  # parse_run_input bounded the body's nesting
        method, message = _turn_request(parsed.thread_id, parsed.run_id, turn)
        log = RunLog(parsed.thread_id, parsed.run_id)
        events = self.calls.stream(_SERVICE + method, message, call)
        try:
            first = await anext(events)
        except CallEnded as ended:
            await events.aclose()  # type: ignore[attr-defined]
            if ended.code != grpc.StatusCode.ALREADY_EXISTS:
                return _ended_response(ended)
            return await self._reattach(parsed.thread_id, parsed.run_id, call, ended)
        except StopAsyncIteration:
            first = None
        return self._answer(first, events, log)

    async def _reattach(
        self, thread_id: str, run_id: str, call: DoorCallInfo, refused: CallEnded
    ) -> Response:
        """The run ``run_id`` of ``thread_id`` from its start (``ResumeTurn``), when the turn exists
        there; else the ``refused`` answer of the call that could not start it."""
        replay = self.calls.stream(
            _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=run_id), call
        )
        try:
            first = await anext(replay)
        except CallEnded as ended:
            await replay.aclose()  # type: ignore[attr-defined]
            if expired_in(ended) == thread_id:  # past the event retention: the stored run
                return await self._stored_run(thread_id, run_id, call, refused)
            return _ended_response(refused)
        except StopAsyncIteration:
            await replay.aclose()  # type: ignore[attr-defined]
            return _ended_response(refused)
        if first.event.conversation_id != thread_id:  # type: ignore[attr-defined]
            await replay.aclose()  # type: ignore[attr-defined]
            return _ended_response(refused)
        return self._answer(first, replay, RunLog(thread_id, run_id))

    async def _stored_run(
        self, thread_id: str, run_id: str, call: DoorCallInfo, refused: CallEnded
    ) -> Response:
        """The run ``run_id`` of ``thread_id`` whose events are past their retention, made from the
        turn's record and stored reply (:func:`~turnwire_server.http.stored_turns.stored_turn`,
        :func:`~turnwire_server.http.openai_response_log.stored_events`); the ``refused`` answer
        when the thread no longer holds it."""
        try:
            found = await stored_turn(self.calls, run_id, thread_id, call)
        except CallEnded as ended:
            return _ended_response(ended)
        if found is None:
            return _ended_response(refused)

        async def replayed() -> AsyncIterator[Any]:
            for event in stored_events(*found):
                yield chat_service_pb2.ResumeTurnResponse(event=event)

        events = replayed()
        return self._answer(await anext(events), events, RunLog(thread_id, run_id))

    def _answer(self, first: Any, events: AsyncIterator[Any], log: RunLog) -> Response:
        """The run's events over SSE; a ``: ping`` comment every 15 s while it is quiet keeps idle
        proxies from closing the stream (AG-UI's parser reads only ``data:`` lines). Lines end in
        ``\\n``: AG-UI's parser splits events at ``\\n\\n``."""
        return EventSourceResponse(self._sse(first, events, log), ping=15, sep="\n")

    async def _sse(self, first: Any, events: AsyncIterator[Any], log: RunLog) -> AsyncIterator[bytes]:
        try:
            if first is not None:
                if frames := data_lines(log.feed(first.event)):
                    yield frames
                async for item in events:
                    if frames := data_lines(log.feed(item.event)):
                        yield frames
        except CallEnded as ended:
            _, error = ended_run_error(ended)
            yield data_lines([error])
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def _turn_request(thread_id: str, run_id: str, turn: RunInput) -> tuple[str, Any]:
    common: dict[str, Any] = {
        "conversation_id": thread_id,
        "request_id": run_id,
        "model": turn.model,
        "client_tools": turn.client_tools,
        "body": struct_of(turn.body),
    }
    if turn.message is None:
        return "SubmitToolResults", chat_service_pb2.SubmitToolResultsRequest(
            results=turn.results, auto_continue=True, **common
        )
    return "Chat", chat_service_pb2.ChatRequest(message=turn.message, **common)


def _ended_response(ended: CallEnded) -> Response:
    status, body = ended_run_error(ended)
    return run_error_response(status, body["message"], body["code"], headers=retry_headers(ended))


__all__ = ["PATH", "AgUiDoor", "accepts_sse", "ended_run_error", "run_error_response", "unserved"]
