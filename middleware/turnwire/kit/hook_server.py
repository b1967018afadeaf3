"""A hook server in a few lines: subclass :class:`HookServer`, override the hooks you need.

Each hook takes the ``turnwire.v1`` request message of its RPC (``protos/turnwire/v1/hooks.proto``,
typed by the generated ``hooks_pb2.pyi``) and returns its response message, or ``None`` for "no
change" (an empty response). ``GetHookSubscriptions`` lists exactly the hooks the subclass
overrides, so the sidecar calls nothing else; :class:`HookServer` also serves ``HookSession`` (the
sidecar then sends a turn's hook calls as messages of one stream, docs/semantics.md §4, remote
middleware), answering with the same methods, ``on_chunks`` included: its batches come on the
stream too (``hook_session_chunks``), each answered once queued for the turn's ``on_chunks``, the
last once ``on_chunks`` has returned.

A hook that raises fails its call: the unary RPC ends ``UNKNOWN`` (what gRPC's own servers send
for a handler's unhandled exception; the TypeScript and Go kits send the same) with the
exception's text (on ``HookSession``: ``HookAnswer.error``, the stream goes on); one that answers
with another message type fails it ``INTERNAL`` (a bug of the hook server, not of the turn). The
sidecar then applies the entry's failure mode (``open``: as if it answered nothing; ``closed``:
the tool call is blocked or the turn fails). When the sidecar's deadline passes or the turn ends,
the call is cancelled: the hook's task gets ``asyncio.CancelledError``. Inside a hook,
:func:`turnwire.kit.call_info` gives the call's metadata and W3C trace context.

The ``google.rpc.Status`` a hook gets (``OnChatResponseRequest.error``, ``ChatErrorInfo.error``)
carries ``google.rpc`` details (``ErrorInfo``, ``BadRequest``, ``RetryInfo``, ``QuotaFailure``)
packed in ``Any``; importing the kit registers their types, so ``json_format.MessageToJson``
of a request, or of the status, renders them instead of raising ``TypeError`` (``Can not find
message descriptor by type_url``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import grpc
from google.rpc import code_pb2, status_pb2
from google.rpc import error_details_pb2 as _error_details  # noqa: F401 - registers the details' types

from turnwire.kit import calls
from turnwire.values import dumps, loads
from turnwire_client.v1 import event_pb2, hooks_pb2, hooks_pb2_grpc

logger = logging.getLogger("turnwire.kit")


def tool_input(call: hooks_pb2.ToolCallInfo) -> dict[str, Any]:
    """The call's input (``input_json``) as a JSON object, integers of any size exact."""
    value = loads(call.input_json or "{}")
    if not isinstance(value, dict):
        raise ValueError(f"the input of tool call {call.tool_call_id!r} is not a JSON object")
    return value


def tool_output(request: hooks_pb2.AfterToolCallRequest) -> Any:
    """A finished call's output (``output_json``) as a JSON value; ``None`` when it has none."""
    return loads(request.output_json) if request.output_json else None


def allow(input: dict[str, Any] | None = None) -> hooks_pb2.BeforeToolCallResponse:
    """A before_tool_call decision: run the call, with ``input`` instead of the model's when given
    (written exactly, integers of any size kept)."""
    if input is None:
        return hooks_pb2.BeforeToolCallResponse(allow=hooks_pb2.BeforeToolCallResponse.Allow())
    return hooks_pb2.BeforeToolCallResponse(
        allow_with_input=hooks_pb2.BeforeToolCallResponse.AllowWithInput(input_json=dumps(input))
    )


def block(reason: str = "") -> hooks_pb2.BeforeToolCallResponse:
    """A before_tool_call decision: do not run the call; the model reads ``reason`` (empty: the
    sidecar's ``Tool "<name>" was blocked by beforeToolCall.``)."""
    return hooks_pb2.BeforeToolCallResponse(block=hooks_pb2.BeforeToolCallResponse.Block(reason=reason))


def substitute(output: Any) -> hooks_pb2.BeforeToolCallResponse:
    """A before_tool_call decision: do not run the call; the model reads ``output`` (any JSON
    value) as its result."""
    return hooks_pb2.BeforeToolCallResponse(
        substitute=hooks_pb2.BeforeToolCallResponse.Substitute(output_json=dumps(output))
    )


class HookServer:
    """Base class of a hook server: override the hooks you implement (``async def``).

    ``include_messages``: ask for the message history in ``BeforeTurnRequest`` and
    ``BeforeStepRequest`` (it can be large). ``hook_session``: offer the ``HookSession`` stream
    (the sidecar uses it unless its config entry says ``hook_session: false``), and let the
    sidecar keep it open from turn to turn (``reuse_hook_session``: each call's turn comes with
    the call, :func:`turnwire.kit.call_info` gives it). Serve it with
    :func:`turnwire.kit.serve` (or add :meth:`servicer` to your own ``grpc.aio.Server``).
    """

    include_messages: ClassVar[bool] = False
    hook_session: ClassVar[bool] = True
    observed_hooks: ClassVar[frozenset[str]] = frozenset()
    """Hooks of this class that only observe, so a turn need not wait for them (hooks.proto,
    ``GetHookSubscriptionsResponse.observed_hooks``): deciding hooks (``before_turn``,
    ``before_step``, ``before_tool_call``), whose answers the sidecar ignores and does not wait
    for on ``HookSession``, and the turn's end hooks (``on_chat_response``, ``on_chat_error``),
    which it sends before ``TurnEnd`` and then sends ``TurnEnd`` without waiting for the answer
    (``on_chat_error``'s ignored). One that returns a change is answered empty, with a warning."""

    async def before_turn(self, request: hooks_pb2.BeforeTurnRequest) -> hooks_pb2.BeforeTurnResponse | None:
        """Once per attempt of a turn, before its first step: change the turn."""
        return None

    async def before_step(self, request: hooks_pb2.BeforeStepRequest) -> hooks_pb2.BeforeStepResponse | None:
        """Before every step: change this step."""
        return None

    async def before_tool_call(
        self, request: hooks_pb2.BeforeToolCallRequest
    ) -> hooks_pb2.BeforeToolCallResponse | None:
        """Before each server-executed tool call: :func:`allow`, :func:`block`, :func:`substitute`
        (``None``: run it as it is). :func:`tool_input` parses its input."""
        return None

    async def after_tool_call(self, request: hooks_pb2.AfterToolCallRequest) -> None:
        """After each tool call's outcome is known (observation)."""

    async def on_step_finish(self, request: hooks_pb2.OnStepFinishRequest) -> None:
        """After each step, once its tool calls are done (observation)."""

    async def on_chunks(self, turn: hooks_pb2.TurnInfo, events: AsyncIterator[event_pb2.TurnEvent]) -> None:
        """The turn's streamed events, in order, as they come (observation; one call per turn).
        Events left unread when it returns are read and dropped. On ``HookSession`` at most
        :data:`MAX_WAITING_EVENTS` wait for it to read them; past that they are dropped (logged),
        so a slow ``on_chunks`` never holds the turn's other hooks."""

    async def on_chat_response(self, request: hooks_pb2.OnChatResponseRequest) -> None:
        """After the reply is stored (observation)."""

    async def classify_chat_error(
        self, request: hooks_pb2.ClassifyChatErrorRequest
    ) -> hooks_pb2.ClassifyChatErrorResponse | None:
        """When a turn fails: what kind of failure it is (``None``: no opinion)."""
        return None

    async def on_chat_error(
        self, request: hooks_pb2.OnChatErrorRequest
    ) -> hooks_pb2.OnChatErrorResponse | None:
        """Once per failed turn: the error the client sees instead (``None``: unchanged)."""
        return None

    def implemented_hooks(self) -> list[hooks_pb2.Hook.ValueType]:
        """The hooks this server subscribes to: those its class overrides, in ``Hook`` order."""
        return [
            spec.hook
            for name, spec in HOOKS.items()
            if getattr(type(self), name) is not getattr(HookServer, name)
        ]

    def servicer(self) -> hooks_pb2_grpc.TurnHooksServiceServicer:
        """The ``TurnHooksService`` implementation that calls this server's hooks. Raises
        ``TypeError`` when :attr:`observed_hooks` names a hook that cannot be observed (:data:`OBSERVABLE`)
        or that this class does not implement."""
        return _Servicer(self)


@dataclass(frozen=True, slots=True)
class _Hook:
    """One hook of the contract: its enum value, and its response type (sent empty when the hook
    returns ``None``)."""

    hook: hooks_pb2.Hook.ValueType
    response: type[Any]


HOOKS: dict[str, _Hook] = {
    "before_turn": _Hook(hooks_pb2.HOOK_BEFORE_TURN, hooks_pb2.BeforeTurnResponse),
    "before_step": _Hook(hooks_pb2.HOOK_BEFORE_STEP, hooks_pb2.BeforeStepResponse),
    "before_tool_call": _Hook(hooks_pb2.HOOK_BEFORE_TOOL_CALL, hooks_pb2.BeforeToolCallResponse),
    "after_tool_call": _Hook(hooks_pb2.HOOK_AFTER_TOOL_CALL, hooks_pb2.AfterToolCallResponse),
    "on_step_finish": _Hook(hooks_pb2.HOOK_ON_STEP_FINISH, hooks_pb2.OnStepFinishResponse),
    "on_chunks": _Hook(hooks_pb2.HOOK_ON_CHUNKS, hooks_pb2.OnChunksResponse),
    "on_chat_response": _Hook(hooks_pb2.HOOK_ON_CHAT_RESPONSE, hooks_pb2.OnChatResponseResponse),
    "classify_chat_error": _Hook(hooks_pb2.HOOK_CLASSIFY_CHAT_ERROR, hooks_pb2.ClassifyChatErrorResponse),
    "on_chat_error": _Hook(hooks_pb2.HOOK_ON_CHAT_ERROR, hooks_pb2.OnChatErrorResponse),
}
"""Every hook of ``TurnHooksService``, keyed by the :class:`HookServer` method (and the
``HookCall``/``HookAnswer`` oneof field) that carries it, in ``Hook`` enum order."""

_HOOK_PREFIXES = ("before_", "after_", "on_", "classify_")


def _warn_near_misses(server: HookServer) -> None:
    """Warn about coroutine methods named like a hook that is none (``on_chunk``, a misspelt
    ``on_chat_responce``): never called, they are easy to miss (the TypeScript kit refuses them)."""
    for name in dir(type(server)):
        method = getattr(type(server), name)
        if name.startswith(_HOOK_PREFIXES) and name not in HOOKS and inspect.iscoroutinefunction(method):
            logger.warning(
                "%s.%s is no hook of the kit (%s) and is never called",
                type(server).__name__,
                name,
                ", ".join(HOOKS),
            )


OBSERVABLE = frozenset(
    {"before_turn", "before_step", "before_tool_call", "on_chat_response", "on_chat_error"}
)
"""The hooks a server may only observe (``HookServer.observed_hooks``): the deciding ones and the
turn's end hooks."""

NEVER_AWAITED = frozenset({"after_tool_call", "on_step_finish", "on_chunks"})
"""Hooks the sidecar never waits for on a ``HookSession`` anyway (posted; docs/semantics.md §4):
naming one in ``observed_hooks`` declares nothing, which the error says."""


_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}
"""grpc's status codes by number (a ``google.rpc.Status`` code)."""


class _HookFailed(Exception):
    """A hook failed: ``status`` is the failed call's ``google.rpc.Status``."""

    def __init__(self, status: status_pb2.Status) -> None:
        super().__init__(status.message)
        self.status = status


async def _call(server: HookServer, name: str, request: Any) -> Any:
    """Run hook ``name``; its response message (an empty one for ``None``). Raises
    :class:`_HookFailed` when the hook raised (cancellation passes through) or answered with
    another message type."""
    method: Callable[[Any], Awaitable[Any]] = getattr(server, name)
    expected = HOOKS[name].response
    try:
        response = await method(request)
    except Exception as error:
        logger.exception("hook %s failed", name)
        message = str(error) or type(error).__name__
        raise _HookFailed(status_pb2.Status(code=code_pb2.UNKNOWN, message=message)) from error
    if response is None:
        return expected()
    if not isinstance(response, expected):
        message = f"hook {name} returned {type(response).__name__}, not {expected.__name__} or None"
        logger.error(message)
        raise _HookFailed(status_pb2.Status(code=code_pb2.INTERNAL, message=message))
    return response


class _Servicer(hooks_pb2_grpc.TurnHooksServiceServicer):
    """``TurnHooksService`` over a :class:`HookServer`: unary RPCs, ``OnChunks`` and
    ``HookSession`` all call its methods."""

    def __init__(self, server: HookServer) -> None:
        self._server = server
        implemented = server.implemented_hooks()
        self._on_chunks = hooks_pb2.HOOK_ON_CHUNKS in implemented
        _warn_near_misses(server)
        observed = server.observed_hooks
        if isinstance(observed, str | bytes) or not all(isinstance(name, str) for name in observed):
            raise TypeError(
                f"observed_hooks: give a set of hook method names, e.g. frozenset({{'before_step'}}),"
                f" not {observed!r}"
            )
        wrong = set(observed) - OBSERVABLE
        if wrong:
            posted = ", ".join(sorted(wrong & NEVER_AWAITED))
            hint = f"; the sidecar never waits for {posted} on a HookSession anyway" if posted else ""
            raise TypeError(
                f"observed_hooks: {', '.join(sorted(wrong))}"
                f" {'is not a hook' if len(wrong) == 1 else 'are not hooks'} you can observe"
                f" ({', '.join(sorted(OBSERVABLE))}){hint}: leave {'it' if len(wrong) == 1 else 'them'} out"
            )
        missing = [name for name in server.observed_hooks if HOOKS[name].hook not in implemented]
        if missing:
            raise TypeError(
                f"observed_hooks: {', '.join(sorted(missing))} is not implemented by {type(server).__name__}"
            )
        self._observed = server.observed_hooks
        self._warned: set[str] = set()  # observed hooks that answered a change, warned once

    async def _run(self, name: str, request: Any) -> Any:
        """Hook ``name``'s response (:func:`_call`); an observed hook's is emptied (its answer is
        ignored by the sidecar, hooks.proto ``observed_hooks``)."""
        response = await _call(self._server, name, request)
        if name in self._observed and response.ByteSize():
            if name not in self._warned:
                self._warned.add(name)
                logger.warning("hook %s is observed (observed_hooks): its answer is ignored", name)
            return HOOKS[name].response()
        return response

    async def GetHookSubscriptions(self, request: Any, context: Any) -> Any:
        return hooks_pb2.GetHookSubscriptionsResponse(
            hooks=self._server.implemented_hooks(),
            include_messages=self._server.include_messages,
            hook_session=self._server.hook_session,
            # Each session call's turn is taken from the call (below): streams may carry turns
            # one after another.
            reuse_hook_session=self._server.hook_session,
            hook_session_chunks=self._server.hook_session,
            observed_hooks=[HOOKS[name].hook for name in HOOKS if name in self._observed],
        )

    async def _unary(self, name: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        calls.enter(calls.metadata_of(context.invocation_metadata()))
        try:
            return await self._run(name, request)
        except _HookFailed as failure:
            await context.abort(_STATUS_CODES[failure.status.code], failure.status.message)

    async def BeforeTurn(self, request: Any, context: Any) -> Any:
        return await self._unary("before_turn", request, context)

    async def BeforeStep(self, request: Any, context: Any) -> Any:
        return await self._unary("before_step", request, context)

    async def BeforeToolCall(self, request: Any, context: Any) -> Any:
        return await self._unary("before_tool_call", request, context)

    async def AfterToolCall(self, request: Any, context: Any) -> Any:
        return await self._unary("after_tool_call", request, context)

    async def OnStepFinish(self, request: Any, context: Any) -> Any:
        return await self._unary("on_step_finish", request, context)

    async def OnChatResponse(self, request: Any, context: Any) -> Any:
        return await self._unary("on_chat_response", request, context)

    async def ClassifyChatError(self, request: Any, context: Any) -> Any:
        return await self._unary("classify_chat_error", request, context)

    async def OnChatError(self, request: Any, context: Any) -> Any:
        return await self._unary("on_chat_error", request, context)

    async def OnChunks(self, request_iterator: AsyncIterator[Any], context: Any) -> Any:
        calls.enter(calls.metadata_of(context.invocation_metadata()))
        batches = aiter(request_iterator)
        first = await anext(batches, None)
        if first is None:
            return hooks_pb2.OnChunksResponse()

        async def events() -> AsyncIterator[event_pb2.TurnEvent]:
            for event in first.events:
                yield event
            async for batch in batches:
                for event in batch.events:
                    yield event

        stream = events()
        try:
            await self._server.on_chunks(first.turn, stream)
        except Exception:
            logger.exception("hook on_chunks failed")  # observing: the sidecar goes on either way
        async for _ in stream:  # what the hook left unread, so the sidecar's stream can close
            pass
        return hooks_pb2.OnChunksResponse()

    async def HookSession(self, request_iterator: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        # One call at a time, in order (hooks.proto). The stream's metadata names its first turn;
        # each call names its own (a reused stream).
        metadata = calls.metadata_of(context.invocation_metadata())
        chunks: dict[str, _TurnChunks] = {}  # the turns whose on_chunks runs, by parent request id
        try:
            async for request in request_iterator:
                # A request's answers go together once its last call is done: the sidecar waits
                # for at most one call of a request, its last (hooks.proto, HookSessionRequest).
                response = hooks_pb2.HookSessionResponse()
                for call in request.calls:
                    if call.parent_request_id and call.parent_request_id != metadata.get(
                        calls.PARENT_REQUEST_METADATA
                    ):
                        metadata = {**metadata, calls.PARENT_REQUEST_METADATA: call.parent_request_id}
                    calls.enter(metadata, dict(call.trace_context))
                    response.answers.append(await self._session_answer(call, chunks))
                yield response
        finally:
            for turn in chunks.values():
                turn.task.cancel()  # the stream ended before the turn's last batch

    async def _session_answer(self, call: hooks_pb2.HookCall, chunks: dict[str, _TurnChunks]) -> Any:
        """The ``HookAnswer`` of one session call, handled as its unary RPC would be."""
        name = call.WhichOneof("hook")
        answer = hooks_pb2.HookAnswer(id=call.id)
        if name not in HOOKS or (name == "on_chunks" and not self._on_chunks):
            answer.error.code = code_pb2.UNIMPLEMENTED
            answer.error.message = f"unknown hook call {name}"
        elif name == "on_chunks":
            await self._chunk_batch(chunks, call.parent_request_id, call.on_chunks)
            answer.on_chunks.SetInParent()
        else:
            try:
                getattr(answer, name).CopyFrom(await self._run(name, getattr(call, name)))
            except _HookFailed as failure:
                answer.error.CopyFrom(failure.status)
        return answer

    async def _chunk_batch(
        self, chunks: dict[str, _TurnChunks], turn_id: str, batch: hooks_pb2.OnChunksRequest
    ) -> None:
        """One ``OnChunks`` batch on the session (hooks.proto, ``OnChunksRequest.last``): queued
        for the turn's ``on_chunks`` (started by its first batch); the last one ends its input and
        returns once it has returned."""
        turn = chunks.get(turn_id)
        if turn is None:
            turn = chunks[turn_id] = _TurnChunks(self._server, batch.turn)
        turn.put(batch.events)
        if batch.last:
            del chunks[turn_id]
            await turn.finish()


MAX_WAITING_EVENTS = 4096
"""A turn's events on ``HookSession`` waiting for its ``on_chunks`` to read them, at most (the
sidecar's own ``chunks.buffer_events`` default); past it a batch's further events are dropped."""


class _TurnChunks:
    """One turn's ``on_chunks``, run as a task fed from the session's batches: an event queue
    bounded by :data:`MAX_WAITING_EVENTS` (a batch is answered once queued, never after the
    hook's work), ended by the turn's last batch."""

    def __init__(self, server: HookServer, turn: hooks_pb2.TurnInfo) -> None:
        self._queue: asyncio.Queue[event_pb2.TurnEvent | None] = asyncio.Queue()
        self._turn = turn
        self._dropped = 0
        # Started in the first batch's call context (call_info), which the task copies.
        self.task = asyncio.get_running_loop().create_task(self._run(server))

    def put(self, events: Any) -> None:
        """Queue ``events``; those past :data:`MAX_WAITING_EVENTS` waiting are dropped."""
        room = MAX_WAITING_EVENTS - self._queue.qsize()
        for event in events[:room]:
            self._queue.put_nowait(event)
        if len(events) > room:
            if not self._dropped:
                logger.warning(
                    "hook on_chunks of turn %s reads too slowly: events dropped", self._turn.request_id
                )
            self._dropped += len(events) - room

    async def finish(self) -> None:
        """End the hook's input after the queued events and wait for it to return."""
        self._queue.put_nowait(None)
        await self.task

    async def _run(self, server: HookServer) -> None:
        async def events() -> AsyncIterator[event_pb2.TurnEvent]:
            while (event := await self._queue.get()) is not None:
                yield event

        try:
            await server.on_chunks(self._turn, events())
        except Exception:
            logger.exception("hook on_chunks failed")  # observing: answered all the same
