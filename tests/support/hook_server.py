"""A ``turnwire.v1.TurnHooksService`` for tests: records every call, answers as told.

In process (``async with serving(server) as address``) on the test's event loop, or as its own
process (``python -m support.hook_server --port P --record FILE``) that a test can kill. Every
call is recorded server-side (:attr:`RecordingHookServer.calls`; the process also appends one
JSON line per call to ``--record``), so tests count RPCs where they arrive.

Answers: ``server.answers["BeforeToolCall"] = fn`` where ``fn(request, context)`` returns (or
awaits to) the response (``OnChunks``: called with the list of requests once they all came);
:func:`sleep_forever` never answers (a deadline test), :func:`abort` fails with a status.
``server.garbage`` names RPCs answered with bytes that are no protobuf message at all (the client
cannot decode them).

``hook_session=True`` offers the ``HookSession`` stream (docs/semantics.md §4): its requests are
recorded and answered by the same methods as the unary RPCs, in order, one at a time;
``reuse_hook_session=True`` also lets the sidecar carry turns one after another on a stream, each
call's recorded metadata then naming the call's own turn (``HookCall.parent_request_id``), as a
kit does; without it a call records the stream's metadata, as an older server reads it.
``answers_together=True`` answers a request's calls in one response once its last is done (as
the kits do). ``hook_session_chunks=True`` takes a turn's ``OnChunks`` batches on the stream: each is recorded
as an ``OnChunks`` call of its own (``answers["OnChunks"]`` called with the batch), the turn's
last batch (``last``) followed by an ``OnChunks:end`` record.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import signal
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format, message_factory
from google.rpc import status_pb2

from turnwire_client.v1 import hooks_pb2, hooks_pb2_grpc

ALL_HOOKS = tuple(v for v in hooks_pb2.Hook.values() if v != hooks_pb2.HOOK_UNSPECIFIED)

SERVICE = "turnwire.v1.TurnHooksService"

GARBAGE = b"\x0a\xff\xff\xff\x7f"
"""Field 1, length-delimited, with a length far past the end: no message parses from it."""

Answer = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]


@dataclass
class Call:
    """One recorded call: the RPC's name, its request (for OnChunks: the list of requests), the
    metadata it carried, and whether it came on a HookSession stream (``stream``)."""

    rpc: str
    request: Any
    metadata: dict[str, str] = field(default_factory=dict)
    stream: bool = False


async def sleep_forever(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    """An answer that never comes (the caller's deadline ends the call)."""
    await asyncio.Event().wait()


def held(release: asyncio.Event, answer: Any) -> Answer:
    """An answer (``answer``) given once ``release`` is set."""

    async def held_answer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await release.wait()
        return answer

    return held_answer


def abort(code: grpc.StatusCode, details: str = "refused by the test") -> Answer:
    """An answer that fails the call with ``code``."""

    async def answer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, details)

    return answer


class RecordingHookServer(hooks_pb2_grpc.TurnHooksServiceServicer):
    """Subscribes to ``hooks`` (``turnwire.v1.Hook`` values; default all), records every call
    in :attr:`calls` (and as a JSON line in ``record`` when given), answers from :attr:`answers`
    (default: an empty response, i.e. "no change"). ``hook_session``: offer the ``HookSession``
    stream (default :attr:`default_hook_session`, which a test module may switch on)."""

    default_hook_session = False
    default_answers_together = False

    def __init__(
        self,
        hooks: Iterable[hooks_pb2.Hook.ValueType] = ALL_HOOKS,
        *,
        include_messages: bool = False,
        record: Path | None = None,
        hook_session: bool | None = None,
        reuse_hook_session: bool = False,
        hook_session_chunks: bool = False,
        answers_together: bool | None = None,
        observed_hooks: Iterable[hooks_pb2.Hook.ValueType] = (),
    ) -> None:
        self.hooks = list(hooks)
        self.include_messages = include_messages
        self.hook_session = self.default_hook_session if hook_session is None else hook_session
        self.reuse_hook_session = reuse_hook_session
        self.hook_session_chunks = hook_session_chunks
        self.observed_hooks = list(observed_hooks)
        self.answers_together = (
            self.default_answers_together if answers_together is None else answers_together
        )
        self.sessions = 0  # HookSession calls opened
        self.sessions_ended = 0  # HookSession calls the sidecar half-closed (their requests ended)
        self.calls: list[Call] = []
        self.answers: dict[str, Answer] = {}
        self.garbage: set[str] = set()
        self.record = record

    def rpcs(self, *, chunks: bool = True) -> list[str]:
        """The recorded RPC names in order (without OnChunks when ``chunks`` is False)."""
        return [c.rpc for c in self.calls if chunks or c.rpc != "OnChunks"]

    def count(self, rpc: str | None = None) -> int:
        """How many calls arrived (of ``rpc``, when given)."""
        return sum(1 for c in self.calls if rpc is None or c.rpc == rpc)

    def _record(self, rpc: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Call:
        metadata = {
            k: v if isinstance(v, str) else v.decode() for k, v in context.invocation_metadata() or ()
        }
        call = Call(rpc, request, metadata, stream=isinstance(context, _SessionContext))
        self.calls.append(call)
        if self.record is not None:
            line = {"rpc": rpc, "request_id": metadata.get("turnwire-parent-request-id", "")}
            with self.record.open("a") as out:
                out.write(json.dumps(line) + "\n")
        return call

    async def _answer(
        self, rpc: str, request: Any, context: grpc.aio.ServicerContext[Any, Any], default: Any
    ) -> Any:
        self._record(rpc, request, context)
        answer = self.answers.get(rpc)
        if answer is None:
            return default
        result = answer(request, context)
        return await result if inspect.isawaitable(result) else result

    async def GetHookSubscriptions(self, request: Any, context: Any) -> Any:
        subscriptions = hooks_pb2.GetHookSubscriptionsResponse(
            hooks=self.hooks,
            include_messages=self.include_messages,
            hook_session=self.hook_session,
            reuse_hook_session=self.reuse_hook_session,
            hook_session_chunks=self.hook_session_chunks,
            observed_hooks=self.observed_hooks,
        )
        return await self._answer("GetHookSubscriptions", request, context, subscriptions)

    async def BeforeTurn(self, request: Any, context: Any) -> Any:
        return await self._answer("BeforeTurn", request, context, hooks_pb2.BeforeTurnResponse())

    async def BeforeStep(self, request: Any, context: Any) -> Any:
        return await self._answer("BeforeStep", request, context, hooks_pb2.BeforeStepResponse())

    async def BeforeToolCall(self, request: Any, context: Any) -> Any:
        return await self._answer("BeforeToolCall", request, context, hooks_pb2.BeforeToolCallResponse())

    async def AfterToolCall(self, request: Any, context: Any) -> Any:
        return await self._answer("AfterToolCall", request, context, hooks_pb2.AfterToolCallResponse())

    async def OnStepFinish(self, request: Any, context: Any) -> Any:
        return await self._answer("OnStepFinish", request, context, hooks_pb2.OnStepFinishResponse())

    async def OnChunks(self, request_iterator: Any, context: Any) -> Any:
        call = self._record("OnChunks", [], context)
        async for request in request_iterator:
            call.request.append(request)
        # Recorded again at its end, so the order of calls shows when the stream was closed.
        self.calls.append(Call("OnChunks:end", call.request, call.metadata))
        answer = self.answers.get("OnChunks")  # after the requests: the call's answer
        if answer is not None:
            result = answer(call.request, context)
            return await result if inspect.isawaitable(result) else result
        return hooks_pb2.OnChunksResponse()

    async def OnChatResponse(self, request: Any, context: Any) -> Any:
        return await self._answer("OnChatResponse", request, context, hooks_pb2.OnChatResponseResponse())

    async def ClassifyChatError(self, request: Any, context: Any) -> Any:
        return await self._answer(
            "ClassifyChatError", request, context, hooks_pb2.ClassifyChatErrorResponse()
        )

    async def OnChatError(self, request: Any, context: Any) -> Any:
        return await self._answer("OnChatError", request, context, hooks_pb2.OnChatErrorResponse())

    async def HookSession(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        """Each call as its unary RPC would be handled, in order; each answered as it is done (with
        ``answers_together``, as the kits do: a request's answers in one response after its last)."""
        self.sessions += 1
        async for request in request_iterator:
            together = hooks_pb2.HookSessionResponse()
            for call in request.calls:
                member = call.WhichOneof("hook")
                rpc = _RPC_OF[member]
                response = hooks_pb2.HookSessionResponse()
                answer = response.answers.add(id=call.id)
                session_context = _SessionContext(context, call, per_call_turn=self.reuse_hook_session)
                if rpc in self.garbage:
                    self._record(rpc, getattr(call, member), session_context)
                    yield GARBAGE
                    continue
                handler = self._session_chunks if member == "on_chunks" else getattr(self, rpc)
                try:
                    result = await handler(getattr(call, member), session_context)
                except _Aborted as aborted:
                    answer.error.CopyFrom(
                        status_pb2.Status(code=aborted.code.value[0], message=aborted.details)
                    )
                except Exception as error:  # what a unary handler's exception becomes: UNKNOWN
                    answer.error.CopyFrom(
                        status_pb2.Status(code=grpc.StatusCode.UNKNOWN.value[0], message=str(error))
                    )
                else:
                    getattr(answer, member).CopyFrom(result)
                if self.answers_together:
                    together.answers.extend(response.answers)
                else:
                    yield response
            if together.answers:
                yield together
        self.sessions_ended += 1

    async def _session_chunks(self, request: Any, context: Any) -> Any:
        """An ``OnChunks`` batch on the session (``hook_session_chunks``): recorded as an
        ``OnChunks`` call of its own (answered from ``answers["OnChunks"]``, called with the
        batch), the last one followed by an ``OnChunks:end`` record once answered."""
        answer = await self._answer("OnChunks", request, context, hooks_pb2.OnChunksResponse())
        if request.last:
            self.calls.append(Call("OnChunks:end", request, self.calls[-1].metadata, stream=True))
        return answer


_RPC_OF = {
    field.name: "".join(word.capitalize() for word in field.name.split("_"))
    for field in hooks_pb2.HookCall.DESCRIPTOR.oneofs_by_name["hook"].fields
}


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _SessionContext:
    """What a unary handler reads of its context, for a request of a HookSession stream: the
    stream's metadata (with the request's trace context and, ``per_call_turn``, its turn), and
    ``abort`` as an error answer."""

    def __init__(self, context: Any, envelope: Any, *, per_call_turn: bool) -> None:
        self._context = context
        self._envelope = envelope
        self._per_call_turn = per_call_turn

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = [*(self._context.invocation_metadata() or ()), *self._envelope.trace_context.items()]
        if self._per_call_turn:
            pairs = [(k, v) for k, v in pairs if k != "turnwire-parent-request-id"]
            pairs.append(("turnwire-parent-request-id", self._envelope.parent_request_id))
        return tuple(pairs)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise _Aborted(code, details)


class _Handler(grpc.GenericRpcHandler):  # type: ignore[misc]  # grpc is untyped here (Any)
    """Routes every TurnHooksService RPC to ``server`` (decided per call, so a test can switch
    an RPC to garbage while serving); RPCs in ``server.garbage`` answer :data:`GARBAGE` as raw
    bytes, past the response serializer."""

    def __init__(self, server: RecordingHookServer) -> None:
        self.server = server
        service = hooks_pb2.DESCRIPTOR.services_by_name["TurnHooksService"]
        self.methods = {m.name: m for m in service.methods}

    def service(self, handler_call_details: Any) -> Any:
        prefix, _, rpc = handler_call_details.method.rpartition("/")
        method = self.methods.get(rpc)
        if prefix != f"/{SERVICE}" or method is None:
            return None
        request_class = message_factory.GetMessageClass(method.input_type)
        if rpc in self.server.garbage:

            async def garbage(request: Any, context: Any) -> bytes:
                self.server._record(rpc, request, context)
                return GARBAGE

            return grpc.unary_unary_rpc_method_handler(garbage, request_deserializer=request_class.FromString)
        behaviour = getattr(self.server, rpc)
        serialize = message_factory.GetMessageClass(method.output_type).SerializeToString
        if method.client_streaming and method.server_streaming:

            def passing_bytes(message: Any) -> bytes:
                return message if isinstance(message, bytes) else serialize(message)

            return grpc.stream_stream_rpc_method_handler(
                behaviour, request_deserializer=request_class.FromString, response_serializer=passing_bytes
            )
        if method.client_streaming:
            return grpc.stream_unary_rpc_method_handler(
                behaviour, request_deserializer=request_class.FromString, response_serializer=serialize
            )
        return grpc.unary_unary_rpc_method_handler(
            behaviour, request_deserializer=request_class.FromString, response_serializer=serialize
        )


@contextlib.asynccontextmanager
async def serving(server: RecordingHookServer, port: int = 0) -> AsyncIterator[str]:
    """Serve ``server`` on ``127.0.0.1:port`` (0: a free port) in this event loop; yields the
    address; stops it (cancelling open calls) on exit."""
    grpc_server = grpc.aio.server()
    grpc_server.add_generic_rpc_handlers((_Handler(server),))
    bound = grpc_server.add_insecure_port(f"127.0.0.1:{port}")
    await grpc_server.start()
    try:
        yield f"127.0.0.1:{bound}"
    finally:
        await grpc_server.stop(None)


def recorded(path: Path) -> list[dict[str, str]]:
    """The calls a hook server process recorded so far (its ``--record`` file)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def request_json(request: Any) -> dict[str, Any]:
    """A request as JSON data (for readable assertion messages)."""
    return json_format.MessageToDict(request)


async def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--hooks", default="", help="comma-separated Hook names (default: all)")
    parser.add_argument("--sleep", default="", help="comma-separated RPCs that never answer")
    parser.add_argument("--hook-session", action="store_true", help="offer the HookSession stream")
    parser.add_argument(
        "--reuse-hook-session", action="store_true", help="offer the stream and its reuse across turns"
    )
    args = parser.parse_args()
    hooks = [hooks_pb2.Hook.Value(name) for name in args.hooks.split(",") if name] or ALL_HOOKS
    server = RecordingHookServer(
        hooks,
        record=args.record,
        hook_session=args.hook_session or args.reuse_hook_session,
        reuse_hook_session=args.reuse_hook_session,
    )
    for rpc in filter(None, args.sleep.split(",")):
        server.answers[rpc] = sleep_forever
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with serving(server, args.port) as address:
        print(f"serving on {address}", flush=True)
        await stop.wait()


if __name__ == "__main__":
    asyncio.run(_main())
