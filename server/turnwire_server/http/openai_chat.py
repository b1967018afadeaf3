"""OpenAI's Chat Completions (``POST /v1/chat/completions``) over Turnwire turns.

docs/api/openai.md#chat-completions. The caller keeps the history and sends it whole, as Chat
Completions callers do. The sidecar runs a turn on it all the same: the hook chain, the model
through the configured provider, and the tool loop for the sidecar's own tools (only the
model's text and the calls of the request's own ``tools`` come back). By default nothing
outlives the call: the messages are stored under a conversation of their own for the turn's
duration (the engine runs turns on stored conversations) and deleted when it ends, so there is
no stored history and no resume. Naming a conversation (``"conversation": "<id>"`` in the body,
``extra_body`` in the SDKs) keeps it: the request's messages after its last assistant message
are appended to that conversation (``tool`` messages answer its pending calls), the stored
history is what the model sees, and the turn is readable and resumable from every door.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
from google.protobuf.message import Message
from google.rpc import status_pb2
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.door_requests import call_info, json_response, keyed_id, read_body, struct_of
from turnwire_server.http.openai_errors import bad_request, ended_error, ended_response
from turnwire_server.http.openai_request import RequestProblem, check_nesting, item_params

_SERVICE = "/turnwire.v1.ChatService/"
_PARAMS = {"conversation_id": "conversation", "client_tools": "tools", "messages": "messages"}
_NO_REASON = status_pb2.Status(code=grpc.StatusCode.INTERNAL.value[0], message="the turn failed")
"""A failed turn's error when its ``TurnEnd`` carries none."""
_ROLES = {
    "user": message_pb2.ROLE_USER,
    "system": message_pb2.ROLE_SYSTEM,
    "developer": message_pb2.ROLE_SYSTEM,
    "assistant": message_pb2.ROLE_ASSISTANT,
}
_FOR_HOOKS = (
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "tool_choice",
    "parallel_tool_calls",
    "metadata",
    "user",
    "stop",
    "seed",
    "response_format",
    "reasoning_effort",
)
_FINISH = {
    event_pb2.FINISH_REASON_LENGTH: "length",
    event_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    event_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
}


class _Problem(Exception):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else part
                raise _Problem(
                    f"{where}[{index}]: this door takes text parts only; got {kind!r}", f"{where}[{index}]"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise _Problem(f"{where}: a string or a list of text parts", where)


def _messages(raw: list[Any], offset: int = 0) -> tuple[list[message_pb2.Message], list[str]]:
    """The request's messages as Turnwire messages: an assistant's ``tool_calls`` become tool-call
    parts, completed by the ``tool`` messages that answer them; and the request parameter of each
    (``messages[i]``, ``raw`` being the request's messages from index ``offset`` on)."""
    messages: list[message_pb2.Message] = []
    sources: list[str] = []
    calls: dict[str, message_pb2.ToolCallPart] = {}
    for index, item in enumerate(raw, offset):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise _Problem(f"{where}: a message object", where)
        role = item.get("role")
        if role == "tool":
            call = calls.get(str(item.get("tool_call_id")))
            if call is None:
                raise _Problem(
                    f"{where}.tool_call_id: no earlier assistant tool call has this id",
                    f"{where}.tool_call_id",
                )
            output = _text(item.get("content"), f"{where}.content")
            call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
            call.output_json = _json_text(output)
            continue
        if role not in _ROLES:
            raise _Problem(
                f"{where}.role: one of system, developer, user, assistant, tool; got {role!r}",
                f"{where}.role",
            )
        message = message_pb2.Message(role=_ROLES[role])
        text = _text(item.get("content"), f"{where}.content")
        if text or role != "assistant":
            message.parts.add(text=message_pb2.TextPart(text=text))
        for number, tool_call in enumerate(item.get("tool_calls") or []) if role == "assistant" else ():
            function = tool_call.get("function") or {}
            part = message.parts.add().tool_call
            part.tool_call_id = str(tool_call.get("id") or f"call-{index}-{number}")
            part.tool_name = str(function.get("name", ""))
            part.input_json = function.get("arguments") or "{}"
            part.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
            part.client_executed = True
            calls[part.tool_call_id] = part
        messages.append(message)
        sources.append(where)
    return messages, sources


def _json_text(output: str) -> str:
    try:
        orjson.loads(output)
    except orjson.JSONDecodeError:
        return orjson.dumps(output).decode()
    return output


def _client_tools(raw: list[Any]) -> list[chat_service_pb2.ClientTool]:
    tools = []
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise _Problem(
                f"tools[{index}]: only function tools are taken by this door", f"tools[{index}].type"
            )
        offered = chat_service_pb2.ClientTool(
            name=str(function.get("name", "")), description=str(function.get("description") or "")
        )
        if isinstance(function.get("parameters"), dict):
            offered.input_schema.update(function["parameters"])
        tools.append(offered)
    return tools


_BLOCK_SEPARATOR = "\n\n"  # between the text blocks of a turn in one message's content


class _Completion:
    """The chat completion a turn's events make (text, pending client tool calls, usage).
    ``include_usage`` (``stream_options.include_usage``): every chunk has ``usage: null``, as
    OpenAI's do, and the last one before ``[DONE]`` the usage."""

    def __init__(
        self, completion_id: str, model: str, client_tools: set[str], *, include_usage: bool = False
    ) -> None:
        self.id, self.model, self.client_tools = completion_id, model, client_tools
        self.include_usage = include_usage
        self.created = int(time.time())
        self.text: list[str] = []
        self.calls: dict[str, dict[str, Any]] = {}
        self.finish = "stop"
        self.usage: dict[str, Any] | None = None
        self.error: CallEnded | None = None  # the failed turn's TurnEnd.error

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        chunk = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def feed(self, event: event_pb2.TurnEvent) -> list[dict[str, Any]]:
        """The chunks ``event`` makes when streamed."""
        kind = event.WhichOneof("event")
        if kind == "turn_start":
            self.model = self.model or event.turn_start.model
            return [self.chunk({"role": "assistant", "content": ""})]
        if kind == "step_start" and event.step_start.model:
            # Chunks and the completion name the model of the step that made them (a fallback's
            # included), as OpenAI names the model that answered rather than the one asked for.
            self.model = event.step_start.model
        if kind == "text_start" and self.text:
            # Another text block (a later step's, after tool calls): apart from the one before.
            self.text.append(_BLOCK_SEPARATOR)
            return [self.chunk({"content": _BLOCK_SEPARATOR})]
        if kind == "text_delta":
            self.text.append(event.text_delta.delta)
            return [self.chunk({"content": event.text_delta.delta})]
        if kind == "tool_input_available" and event.tool_input_available.tool_name in self.client_tools:
            available = event.tool_input_available
            call = {
                "index": len(self.calls),
                "id": available.tool_call_id,
                "type": "function",
                "function": {"name": available.tool_name, "arguments": available.input_json or "{}"},
            }
            self.calls[available.tool_call_id] = call
            return [self.chunk({"tool_calls": [call]})]
        if kind in ("tool_output_available", "tool_output_error", "tool_output_denied"):
            self.calls.pop(getattr(event, kind).tool_call_id, None)
        elif kind == "step_finish":
            self.finish = _FINISH.get(event.step_finish.finish_reason, "stop")
        elif kind == "turn_end":
            end = event.turn_end
            usage = end.usage
            self.usage = {
                "prompt_tokens": usage.input_tokens,
                "completion_tokens": usage.output_tokens,
                "total_tokens": usage.total_tokens or usage.input_tokens + usage.output_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
                "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            }
            if self.calls:
                self.finish = "tool_calls"
            elif self.finish == "tool_calls":
                self.finish = "stop"
            if end.status in (event_pb2.TURN_STATUS_ERROR, event_pb2.TURN_STATUS_INTERRUPTED):
                error = end.error if end.HasField("error") else _NO_REASON
                self.error = CallEnded.of_status(error)
            return [self.chunk({}, self.finish)]
        return []

    def whole(self) -> dict[str, Any]:
        """The non-streamed ``chat.completion``."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.text) or None,
            "refusal": None,
        }
        if self.calls:
            message["tool_calls"] = [
                {k: v for k, v in c.items() if k != "index"} for c in self.calls.values()
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish, "logprobs": None}],
            "usage": self.usage,
        }


def _turn_request(
    sent: list[Any], named: bool, common: dict[str, Any]
) -> tuple[str, Message, dict[str, str]]:
    """The RPC and request for the request's ``messages``: all of them (``SaveMessages``) in a
    conversation of the call's own; with a named conversation, those after the last assistant
    message: ``tool`` messages answer its pending calls (``SubmitToolResults``), other messages
    are appended (``SaveMessages``). Third, the request parameter of each message or result by
    the Turnwire field naming it in a refusal (:func:`~.openai_request.item_params`)."""
    if not named:
        messages, sources = _messages(sent)
        request = chat_service_pb2.SaveMessagesRequest(messages=messages, **common)
        return "SaveMessages", request, item_params(sources)
    last = max(
        (i for i, m in enumerate(sent) if isinstance(m, dict) and m.get("role") == "assistant"), default=-1
    )
    tail = sent[last + 1 :]
    answers = [m for m in tail if isinstance(m, dict) and m.get("role") == "tool"]
    if answers and len(answers) < len(tail):
        raise _Problem(
            "messages: after the last assistant message, send either its tool results or new messages, "
            "not both (with a named conversation)",
            "messages",
        )
    if answers:
        results = [
            chat_service_pb2.ToolResult(
                tool_call_id=str(m.get("tool_call_id", "")),
                output_json=_json_text(_text(m.get("content"), f"messages[{last + 1 + i}].content")),
            )
            for i, m in enumerate(answers)
        ]
        submit = chat_service_pb2.SubmitToolResultsRequest(results=results, auto_continue=True, **common)
        return (
            "SubmitToolResults",
            submit,
            item_params([], [f"messages[{last + 1 + i}]" for i in range(len(results))]),
        )
    if not tail:
        raise _Problem("messages: nothing new after the last assistant message", "messages")
    messages, sources = _messages(tail, last + 1)
    return (
        "SaveMessages",
        chat_service_pb2.SaveMessagesRequest(messages=messages, **common),
        item_params(sources),
    )


def data_lines(chunks: list[dict[str, Any]]) -> bytes:
    """``chunks`` as server-sent ``data:`` lines, one write (compact JSON holds no newline)."""
    return b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)


class ChatCompletionsDoor:
    """``POST /v1/chat/completions`` over ``calls`` (see the module docstring)."""

    def __init__(self, calls: InProcessCalls, read_max_bytes: int) -> None:
        self.calls = calls
        self.read_max_bytes = read_max_bytes

    def routes(self) -> list[Route]:
        """The door's Starlette routes."""
        return [Route("/v1/chat/completions", self.create, methods=["POST"])]

    async def create(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        call = call_info(request)
        # SaveMessages: a request that names no conversation (the usual one) stores its messages.
        raw = await read_body(request, call, self.read_max_bytes, self.calls, method="SaveMessages")
        if isinstance(raw, Response):
            return raw
        try:
            body = orjson.loads(raw or b"{}")
        except orjson.JSONDecodeError as error:
            return bad_request(f"the body is not JSON: {error}", None)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            return bad_request("messages: a non-empty list of messages", "messages")
        try:
            check_nesting(body)
        except RequestProblem as problem:
            return bad_request(problem.message, problem.param)
        call.checks.json_depth = True
        if body.get("n") not in (None, 1):
            # One turn makes one reply: n choices would be n turns, each stored and billed.
            return bad_request(
                f"n: this door answers one choice per request (a turn makes one reply); got {body['n']!r}: "
                "send n requests for n choices",
                "n",
                "unsupported_value",
            )
        named = body.get("conversation")
        if named is not None and not isinstance(named, str):
            return bad_request("conversation: a Turnwire conversation id (a string)", "conversation")
        key = request.headers.get("idempotency-key")
        completion_id = keyed_id("chatcmpl-", key) if key else f"chatcmpl-{uuid.uuid4().hex}"
        conversation = named or completion_id
        common: dict[str, Any] = {
            "conversation_id": conversation,
            "request_id": completion_id,
            "model": str(body.get("model") or ""),
            "body": struct_of({name: body[name] for name in _FOR_HOOKS if name in body}),
        }
        try:
            client_tools = _client_tools(body.get("tools") or [])
            method, message, items = _turn_request(body["messages"], bool(named), common)
        except _Problem as problem:
            return bad_request(problem.message, problem.param)
        message.client_tools.extend(client_tools)  # type: ignore[attr-defined]
        for index, stored in enumerate(getattr(message, "messages", ()) if key else ()):
            stored.id = stored.id or f"{completion_id}.m{index}"  # a retry's input is the same input
        params = _PARAMS | items
        include_usage = bool(body.get("stream")) and bool(
            (body.get("stream_options") or {}).get("include_usage")
        )
        completion = _Completion(
            completion_id,
            str(body.get("model") or ""),
            {t.name for t in client_tools},
            include_usage=include_usage,
        )
        forget = None if named else conversation
        opened = await self._open(method, message, call, completion_id if key else None, forget)
        if isinstance(opened, CallEnded):
            return ended_response(opened, param_names=params)
        first, events, forget = opened
        if body.get("stream"):
            return EventSourceResponse(
                self._sse(
                    first,
                    events,
                    completion,
                    forget=forget,
                    call=call,
                    params=params,
                ),
                ping=15,
            )
        try:
            if first is not None:
                completion.feed(first.event)
                async for item in events:
                    completion.feed(item.event)
        except CallEnded as ended:
            return ended_response(ended, param_names=params, started=first is not None)
        finally:
            await self._forget(forget, call)
        if completion.error is not None:
            # The turn ran: sent again, it would run again (its tools, its billed steps).
            return ended_response(completion.error, param_names=params, started=True)
        return json_response(completion.whole())

    async def _sse(
        self,
        first: Any,
        events: AsyncIterator[Any],
        completion: _Completion,
        *,
        forget: str | None,
        call: DoorCallInfo,
        params: dict[str, str],
    ) -> AsyncIterator[bytes]:
        try:
            if first is not None:
                if chunks := data_lines(completion.feed(first.event)):
                    yield chunks
                async for item in events:
                    if chunks := data_lines(completion.feed(item.event)):
                        yield chunks
            if completion.error is not None:
                yield data_lines([ended_error(completion.error, param_names=params)[1]])
            elif completion.include_usage:
                yield data_lines([{**completion.chunk({}), "choices": [], "usage": completion.usage}])
            yield b"data: [DONE]\n\n"
        except CallEnded as ended:
            _, error = ended_error(ended, param_names=params)
            yield data_lines([error])
        finally:
            await events.aclose()  # type: ignore[attr-defined]
            await self._forget(forget, call)

    async def _open(
        self, method: str, message: Message, call: DoorCallInfo, keyed: str | None, forget: str | None
    ) -> tuple[Any, AsyncIterator[Any], str | None] | CallEnded:
        """The turn's first event (None: its stream ended without one), its events, and the
        conversation to delete at the end (``forget``, or None when this request follows another's
        turn); or the refusal to answer (``forget`` deleted). ``keyed``: the completion id an
        ``Idempotency-Key`` made: a turn recorded under it is that key's first request's, followed
        or read again instead of running again (docs/api/openai.md#retries-and-idempotency-keys)."""
        if keyed is not None and (followed := await self._follow(keyed, call)) is not None:
            return (*followed, None)
        events: AsyncIterator[Any] = self.calls.stream(_SERVICE + method, message, call)
        try:
            return await anext(events), events, forget
        except StopAsyncIteration:
            return None, events, forget
        except CallEnded as ended:
            # The same key sent twice at once: the other request's turn started first.
            if (
                keyed is not None
                and ended.code == grpc.StatusCode.ALREADY_EXISTS
                and (followed := await self._follow(keyed, call)) is not None
            ):
                return (*followed, None)
            await self._forget(forget, call)
            return ended

    async def _follow(self, completion_id: str, call: DoorCallInfo) -> tuple[Any, AsyncIterator[Any]] | None:
        """The first event of turn ``completion_id`` and its events from its start (``ResumeTurn``);
        None when there is no such turn or its events cannot be read (its conversation was
        deleted, they are past their retention)."""
        replay: AsyncIterator[Any] = self.calls.stream(
            _SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=completion_id), call
        )
        try:
            return await anext(replay), replay
        except (CallEnded, StopAsyncIteration):
            await replay.aclose()  # type: ignore[attr-defined]
            return None

    async def _forget(self, conversation: str | None, call: DoorCallInfo) -> None:
        """Delete the call's own conversation (none was named): nothing outlives the call."""
        if conversation is None:
            return
        request = chat_service_pb2.DeleteConversationRequest(conversation_id=conversation, allow_missing=True)
        with contextlib.suppress(CallEnded):
            await self.calls.unary(_SERVICE + "DeleteConversation", request, call)


__all__ = ["ChatCompletionsDoor", "data_lines"]
