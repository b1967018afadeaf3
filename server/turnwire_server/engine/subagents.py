"""Sub-agents: configured models offered to the model as tools, each call a nested turn.

docs/subagents.md is the full rule. In short: a call of sub-agent ``NAME`` (a tool of that name,
input ``{"prompt": …}``) runs a child turn on the child conversation
:func:`child_conversation_id` derives from the caller's, entry path ``subagent``, through the
sub-agent's own middleware chain and tools (:meth:`Subagents.home`). Every event of the child's
stream is forwarded into the calling turn's stream as a ``SubagentEvent`` (the child's event and
the path of calls), numbered, stored and replayed with the caller's own events. The child's final
text, or its structured output parsed as JSON, is the call's result; a child that does not
complete is the call's error (:class:`~turnwire.tools.ToolError`). Cancelling the caller cancels
the child (its stream ends ``ABORTED`` in the caller's stream too); deleting the caller's
conversation deletes its children (:func:`delete_children`). Depth is bounded by
``limits.max_subagent_depth``. The child runs under the caller's principal (tenant and budgets)
and turn budget, and continues its trace.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import propagate, trace

from turnwire.hooks import Middleware, TurnConfig, TurnContext
from turnwire.subagents import SubagentCall, install_runner
from turnwire.tools import Tool, ToolError, ToolExecution
from turnwire.types import last_step_text
from turnwire.values import loads
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.errors import SlowConsumer
from turnwire_server.engine.events import DetachedResponse
from turnwire_server.engine.ids import new_message_id, new_request_id
from turnwire_server.engine.request import TurnRequest
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.tenant_keys import SEPARATOR

if TYPE_CHECKING:
    from turnwire_server.engine.engine import TurnEngine
    from turnwire_server.engine.turn_handle import TurnHandle

log = logging.getLogger("turnwire.subagents")

CHILD_MARK = ":sub-"
"""Between a conversation's id and the digest that names one of its children: a child of
``support`` is ``support:sub-<16 hex digits>`` (docs/subagents.md, "The child conversation")."""

_DIGEST_CHARS = 16
MAX_ID_CHARS = 128
"""The longest conversation id a client may name (docs/semantics.md §11): a child's id fits it."""

INPUT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "What the sub-agent is asked to do."}},
    "required": ["prompt"],
    "additionalProperties": False,
}
"""The input every sub-agent tool takes: the task, as the child conversation's user message."""

_COMPLETED = event_pb2.TURN_STATUS_COMPLETED


def child_conversation_id(conversation_id: str, request_id: str, tool_call_id: str) -> str:
    """The child conversation of the call ``tool_call_id`` of turn ``request_id`` on
    ``conversation_id`` (a store key): ``<conversation_id>:sub-<digest>``, 16 hex digits of the
    SHA-256 of the turn and call ids. The tenant's prefix is the parent's, so the child belongs
    to the parent's tenant, and its id starts with the parent's, so it is listed with it and
    deleted with it (:func:`delete_children`). Raises :class:`ToolError` when the client's part
    of the id would pass :data:`MAX_ID_CHARS`."""
    digest = hashlib.sha256(f"{request_id}\0{tool_call_id}".encode()).hexdigest()[:_DIGEST_CHARS]
    child = f"{conversation_id}{CHILD_MARK}{digest}"
    local = local_id(child)
    if len(local) > MAX_ID_CHARS:
        raise ToolError(
            f"the sub-agent's conversation id would be {len(local)} characters, past the "
            f"{MAX_ID_CHARS} allowed: use a conversation id of at most "
            f"{MAX_ID_CHARS - len(CHILD_MARK) - _DIGEST_CHARS} characters per level of sub-agents"
        )
    return child


def local_id(key: str) -> str:
    """The client's id in a store key (its tenant's prefix removed): what a tool result, which a
    client reads as it is stored, may hold."""
    return key.rpartition(SEPARATOR)[2]


def is_child(conversation_id: str) -> bool:
    """True for a sub-agent's child conversation (its id carries :data:`CHILD_MARK`)."""
    return CHILD_MARK in conversation_id


@dataclass(frozen=True, slots=True)
class Subagent:
    """One configured sub-agent (the config's ``subagents:`` entry, docs/subagents.md).

    ``model`` is ``provider:model`` ("" runs on the caller's model); ``system_prompt`` replaces
    the sidecar's (""  keeps it); ``tools`` names the tools it may call (server tools and other
    sub-agents); ``middlewares`` its own chain (first outermost); ``max_steps`` its step limit
    (None: ``limits.max_steps``); ``output`` a JSON Schema its final answer must follow (its
    result is then that JSON value, else its final text); ``detached``: a call returns a handle
    at once and the answer comes as a submission on the parent conversation
    (:mod:`~turnwire_server.engine.detached_subagents`).
    """

    name: str
    description: str
    model: str = ""
    system_prompt: str = ""
    tools: tuple[str, ...] = ()
    middlewares: Sequence[Middleware] = ()
    max_steps: int | None = None
    output: Mapping[str, Any] | None = None
    detached: bool = False
    chain: MiddlewareChain = field(init=False)

    def __post_init__(self) -> None:
        # Its profile first: the sub-agent's own middlewares see (and may change) what it set.
        profile = _Profile(self)
        object.__setattr__(self, "chain", MiddlewareChain([profile, *self.middlewares]))


class _Profile(Middleware):
    """The sub-agent's configuration as the first ``before_turn`` of its chain: system prompt,
    step limit and structured output."""

    def __init__(self, subagent: Subagent) -> None:
        super().__init__()
        self.name = f"subagent:{subagent.name}"  # its name in hook timelines and logs
        self._subagent = subagent

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """The sub-agent's system prompt, step limit and output schema."""
        subagent = self._subagent
        return TurnConfig(
            system=subagent.system_prompt or None,
            max_steps=subagent.max_steps,
            output=subagent.output,
        )


class SubagentTool:
    """Sub-agent ``subagent`` as a tool (:class:`~turnwire.tools.Tool`): its name and
    description, input :data:`INPUT_SCHEMA`; a call runs it (:meth:`Subagents.call`)."""

    input_schema = INPUT_SCHEMA

    def __init__(self, subagent: Subagent, runner: Subagents) -> None:
        self.name = subagent.name
        self.description = subagent.description
        self.subagent = subagent
        self._runner = runner

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Run the sub-agent on ``input["prompt"]``: its result (see :meth:`Subagents.call`)."""
        prompt = input.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ToolError("give the sub-agent its task as a non-empty string in `prompt`")
        return await self._runner.call(self.subagent, prompt, execution)


class ToolsWithSubagents(Mapping[str, Tool]):
    """The server's tools (a live mapping: remote sources re-list) and the sub-agents' tools,
    as one mapping; the names never collide (checked at start)."""

    def __init__(self, tools: Mapping[str, Tool], subagents: Mapping[str, Tool]) -> None:
        self._tools = tools
        self._subagents = subagents

    def __getitem__(self, name: str) -> Tool:
        tool = self._subagents.get(name)
        return tool if tool is not None else self._tools[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._tools
        yield from self._subagents

    def __len__(self) -> int:
        return len(self._tools) + len(self._subagents)

    def __contains__(self, name: object) -> bool:
        return name in self._subagents or name in self._tools


class AnswerDelivery(Protocol):
    """Delivers a detached sub-agent's answer when its turn ends
    (:class:`~turnwire_server.engine.detached_subagents.DetachedResults`)."""

    def watch(self, handle: TurnHandle, subagent: str) -> None:
        """Deliver the answer of ``handle``'s turn, a turn of sub-agent ``subagent``, once it ends."""
        ...


class Subagents:
    """The configured sub-agents of one engine: their tools, where their turns run
    (:meth:`home`, the engine's :class:`~turnwire_server.engine.engine.SubagentHomes`), and
    their calls (:meth:`call`). ``tools`` are the server's tools; :meth:`bind` attaches the
    engine (built after this, since its tools include these)."""

    def __init__(
        self,
        subagents: Sequence[Subagent],
        tools: Mapping[str, Tool],
        detached: AnswerDelivery | None = None,
    ) -> None:
        self.tools: dict[str, Tool] = {s.name: SubagentTool(s, self) for s in subagents}
        self._subagents = {s.name: s for s in subagents}
        self.all_tools = ToolsWithSubagents(tools, self.tools)
        self._engine: TurnEngine | None = None
        #: Delivers the answers of detached sub-agents (None: none is detached).
        self.detached = detached
        self._following: set[asyncio.Task[None]] = set()

    def started(self, handle: TurnHandle) -> None:
        """The engine started a sub-agent's turn (a call, or the recovery of one after a crash):
        a detached sub-agent's answer is delivered when it ends."""
        subagent = self._subagents.get(handle.run.request.subagent_path[-1].subagent)
        if subagent is not None and subagent.detached and self.detached is not None:
            self.detached.watch(handle, subagent.name)

    def bind(self, engine: TurnEngine) -> None:
        """Run calls on ``engine``, let it find each sub-agent's chain and tools, and serve
        :func:`turnwire.subagents.call_subagent` in this process."""
        self._engine = engine
        engine.subagents = self
        install_runner(self)

    async def run(
        self, name: str, prompt: str, *, conversation_id: str, request_id: str, call_id: str
    ) -> Any:
        """:func:`turnwire.subagents.call_subagent`: sub-agent ``name`` called as ``call_id`` by
        turn ``request_id`` on ``conversation_id``. Raises :class:`ToolError` for an unknown name
        and as :meth:`call` does."""
        subagent = self._subagents.get(name)
        if subagent is None:
            known = ", ".join(sorted(self._subagents)) or "none"
            raise ToolError(f"no sub-agent is named {name!r} (configured: {known})")
        execution = ToolExecution(
            tool_call_id=call_id, conversation_id=conversation_id, request_id=request_id, step_number=0
        )
        return await self.call(subagent, prompt, execution)

    def home(self, name: str) -> tuple[MiddlewareChain, Mapping[str, Tool]]:
        """Sub-agent ``name``'s chain and the tools it may call (those of its ``tools`` that
        exist now). Raises :class:`KeyError` for a name that is no sub-agent (a recovered turn of
        one removed from the config since: it runs with the engine's chain instead)."""
        subagent = self._subagents[name]
        tools = self.all_tools
        return subagent.chain, {n: tools[n] for n in subagent.tools if n in tools}

    async def call(self, subagent: Subagent, prompt: str, execution: ToolExecution) -> Any:
        """Run ``subagent`` on ``prompt`` as a child turn of the turn ``execution`` belongs to,
        forwarding its events into that turn's stream; returns its final text, or its output as
        a JSON value when it has an ``output`` schema. Raises :class:`ToolError` when it cannot
        start (depth, id length, admission) or does not complete; ``CancelledError`` (after
        cancelling the child and forwarding its end) when the calling turn is cancelled."""
        engine = self._engine
        assert engine is not None, "Subagents.bind was not called"
        parent = engine.handle(execution.request_id)
        parent_request = parent.run.request if parent is not None else None
        path = parent_request.subagent_path if parent_request is not None else ()
        limit = engine.settings.limits.max_subagent_depth
        if len(path) >= limit:
            raise ToolError(
                f"sub-agent {subagent.name!r} not run: {len(path)} sub-agent calls deep already, the "
                f"limit (limits.max_subagent_depth) is {limit}"
            )
        conversation_id = child_conversation_id(
            execution.conversation_id, execution.request_id, execution.tool_call_id
        )
        request_id = new_request_id()
        call = SubagentCall(execution.tool_call_id, subagent.name, conversation_id, request_id)
        message = message_pb2.Message(id=new_message_id(), role=message_pb2.ROLE_USER)
        message.parts.add().text.text = prompt
        request = TurnRequest(
            conversation_id=conversation_id,
            request_id=request_id,
            messages=[message],
            body={},
            model=subagent.model
            or (parent_request.model if parent_request else engine.settings.default_model),
            continuation=False,
            response_type=DetachedResponse,
            # A detached child outlives its caller: a shutdown leaves it for the recovery.
            disconnect="continue" if subagent.detached else "cancel",
            entry="subagent",
            trace_context=_trace_context(parent_request),
            budget=parent_request.budget if parent_request is not None else None,
            principal=parent_request.principal if parent_request is not None else "",
            subagent_path=(*path, call),
        )
        try:
            child = await engine.start(request, parent_request_id=execution.request_id, queue_limit=False)
        except Exception as error:
            raise ToolError(f"sub-agent {subagent.name!r} could not start: {error}") from error
        if subagent.detached:
            return await self._detach(child, parent, call)
        end = await _follow(child, parent, call)
        return _result(subagent, end)

    async def _detach(self, child: TurnHandle, parent: TurnHandle | None, call: SubagentCall) -> Any:
        """A detached call: wait for the child's input to be stored (its TurnStart; a crash from
        there recovers it), forward its events while the calling turn runs, return its handle."""
        forward = _Forwarder(parent, call)
        try:
            async for response in child.channel:
                event = response.event
                if await forward(event) is not None:  # ended before its input was stored
                    raise ToolError(
                        f"sub-agent {call.subagent!r} could not start: {event.turn_end.error.message}"
                    )
                if event.HasField("turn_start"):
                    break
        except asyncio.CancelledError:
            child.cancel()
            raise
        task = asyncio.create_task(
            _forward_while_open(child, parent, forward), name=f"subagent {call.request_id}"
        )
        self._following.add(task)
        task.add_done_callback(self._following.discard)
        return {
            "subagent": call.subagent,
            "conversation_id": local_id(call.conversation_id),
            "request_id": local_id(call.request_id),
            "status": "running",
        }


async def _follow(child: TurnHandle, parent: TurnHandle | None, call: SubagentCall) -> event_pb2.TurnEnd:
    """Forward ``child``'s events into ``parent``'s stream until its TurnEnd, which it returns.
    A cancel of the calling task cancels the child first and still forwards its last events."""
    forward = _Forwarder(parent, call)
    end: event_pb2.TurnEnd | None = None
    try:
        async for response in child.channel:
            end = await forward(response.event) or end
            if end is not None:
                break
    except asyncio.CancelledError:
        child.cancel()
        # Its partial reply is stored and its TurnEnd (ABORTED) reaches the caller's stream: the
        # caller's own end follows it, so the nesting stays whole (docs/subagents.md).
        await asyncio.shield(_drain(child, forward))
        raise
    finally:
        child.release()
    if end is None:  # the channel closed without a TurnEnd: the child was let go
        raise ToolError(f"sub-agent {call.subagent!r} ended without an answer")
    return end


async def _forward_while_open(child: TurnHandle, parent: TurnHandle | None, forward: _Forwarder) -> None:
    """A detached child's events, nested in the calling turn's stream until that turn starts
    finishing (``TurnRun.takes_events``: its TurnEnd is numbered after every event before it);
    then the child goes on without a reader (its own stream is stored: ResumeTurn reads it)."""
    async for response in child.channel:
        if parent is None or not parent.run.takes_events:
            child.detach()
            return
        if await forward(response.event) is not None:
            return


async def _drain(child: TurnHandle, forward: _Forwarder) -> None:
    async for response in child.channel:
        if await forward(response.event) is not None:
            return


class _Forwarder:
    """Writes a child's events into the calling turn's stream as ``SubagentEvent``s, with the
    caller's backpressure: a caller's reader that falls behind is waited for, and one that reads
    nothing for ``limits.slow_reader_timeout_seconds`` stops the calling turn (SLOW_CONSUMER),
    which cancels the child."""

    def __init__(self, parent: TurnHandle | None, call: SubagentCall) -> None:
        self._parent = parent
        self._call = call

    async def __call__(self, event: event_pb2.TurnEvent) -> event_pb2.TurnEnd | None:
        """Forward ``event``; its TurnEnd when it is the child's last event, else None."""
        if not event.sequence_number:  # a Progress keepalive: never part of a stream
            return None
        parent = self._parent
        if parent is not None and parent.run.takes_events:
            writer = parent.run.writer
            nested = writer.new().subagent_event
            nested.path.add(
                tool_call_id=self._call.tool_call_id,
                subagent=self._call.subagent,
                conversation_id=self._call.conversation_id,
                request_id=self._call.request_id,
            )
            if event.HasField("subagent_event"):  # a grandchild's: one path, never two wrappers
                nested.path.extend(event.subagent_event.path)
                nested.event.CopyFrom(event.subagent_event.event)
            else:
                nested.event.CopyFrom(event)
            if writer.backlogged:
                await self._wait_for_reader(parent)
        return event.turn_end if event.HasField("turn_end") else None

    @staticmethod
    async def _wait_for_reader(parent: TurnHandle) -> None:
        run = parent.run
        timeout = run.settings.limits.slow_reader_timeout_seconds
        if not await run.writer.drained(timeout):
            if run.request.disconnect == "continue":
                run.writer.channel.detach(SlowConsumer(timeout, stopped=False))
            else:
                run.cancel(SlowConsumer(timeout))


def _result(subagent: Subagent, end: event_pb2.TurnEnd) -> Any:
    """The call's result from the child's TurnEnd: the text of its last step (its structured
    output as JSON with an ``output`` schema). Raises :class:`ToolError` for any other end."""
    if end.status != _COMPLETED:
        status = event_pb2.TurnStatus.Name(end.status).removeprefix("TURN_STATUS_")
        why = f": {end.error.message}" if end.error.message else ""
        raise ToolError(f"sub-agent {subagent.name!r} ended {status}{why}")
    text = last_step_text(end.message)
    if subagent.output is None:
        return text
    try:
        return loads(text)
    except ValueError as error:
        raise ToolError(
            f"sub-agent {subagent.name!r} answered no JSON for its output schema: {error}"
        ) from None


def _trace_context(parent: TurnRequest | None) -> Mapping[str, str]:
    """The W3C trace context the child's turn continues: the current span (the caller's tool
    call, when tracing is on), else the caller's own trace context."""
    if trace.get_current_span().get_span_context().is_valid:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if carrier:
            return carrier
    return dict(parent.trace_context) if parent is not None else {}
