"""A tool host from ``turnwire.tools`` tools: ``ToolExecutorService`` (``protos/turnwire/v1/tools.proto``).

The tools are the sidecar's own kind (:class:`turnwire.tools.Tool`; usually ``@tool(Model)``, whose
input schema comes from the pydantic model and whose input is validated before the function runs),
so one tool runs in the sidecar (``tools.python``) or in a host unchanged. What the contract asks,
and how a tool says it:

- **result**: what ``execute`` returns (any JSON value; integers of any size exact);
- **preliminary results**: an async generator tool; each yield is sent as a preliminary result when
  the next one comes, the last yield is the final result (the sidecar shows it once more as
  preliminary, then as final, as for a streaming tool in the sidecar);
- **errors**: any exception (a :class:`turnwire.tools.ToolError` for a message meant for the model)
  is sent as ``ExecuteToolResponse.error``, its text what the model reads; the RPC ends OK;
- **cancellation**: when the turn is cancelled or the call's deadline passes, the sidecar cancels
  the RPC; ``ToolExecution.cancelled`` is set, then the tool's task gets ``asyncio.CancelledError``
  (so a tool finds the flag set when it handles the error, as in the sidecar's own process);
- ``needs_approval`` (a bool) becomes ``requires_approval``, ``timeout_seconds`` the spec's
  ``timeout``, ``idempotent`` the spec's ``idempotent``; ``ExecuteToolRequest.idempotency_key``
  and ``rerun`` are ``ToolExecution.idempotency_key`` and ``rerun``;
  :func:`turnwire.kit.call_info` gives the call's metadata and trace context.
"""

from __future__ import annotations

import asyncio
import collections.abc
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from google.protobuf import duration_pb2, json_format, struct_pb2

from turnwire.kit import calls
from turnwire.tools import TOOL_NAME_PATTERN, Tool, ToolExecution, is_idempotent
from turnwire.values import dumps, parse_tool_input
from turnwire_client.v1 import tools_pb2, tools_pb2_grpc

logger = logging.getLogger("turnwire.kit")


async def _produce(
    tool: Tool, input: dict[str, Any], execution: ToolExecution, out: asyncio.Queue[Any]
) -> None:
    """Run ``tool`` and put what it gives into ``out``: a plain tool's result, or each yield of a
    streaming one (an async generator), in order; a raised error ends the task with it."""
    result = await tool.execute(input, execution)
    if isinstance(result, collections.abc.AsyncIterator):
        async for value in result:
            await out.put(value)
    else:
        await out.put(result)


def tool_spec(tool: Tool) -> tools_pb2.ToolSpec:
    """``tool`` as the model sees it.

    Raises :class:`ValueError` for a name the sidecar would leave out (not 1-64 of
    ``[A-Za-z0-9_-]``) and for a ``needs_approval`` function (it cannot cross the wire: decide in
    a ``before_tool_call`` hook instead).
    """
    if not TOOL_NAME_PATTERN.fullmatch(tool.name):
        raise ValueError(f"tool name {tool.name!r}: use 1-64 of A-Z a-z 0-9 _ -")
    approval = getattr(tool, "needs_approval", False)
    if not isinstance(approval, bool):
        raise ValueError(f"tool {tool.name!r}: a tool host's needs_approval is True or False, not a function")
    spec = tools_pb2.ToolSpec(
        name=tool.name,
        description=tool.description,
        requires_approval=approval,
        idempotent=is_idempotent(tool),
    )
    spec.input_schema.CopyFrom(json_format.ParseDict(dict(tool.input_schema), struct_pb2.Struct()))
    timeout = getattr(tool, "timeout_seconds", None)
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout > 0:
        spec.timeout.CopyFrom(duration_pb2.Duration(seconds=int(timeout), nanos=int(timeout % 1 * 1e9)))
    return spec


class ToolHost(tools_pb2_grpc.ToolExecutorServiceServicer):
    """``ToolExecutorService`` serving ``tools`` (see the module docstring).

    Raises :class:`ValueError` for two tools of one name and for a tool :func:`tool_spec` refuses.
    """

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._specs = [tool_spec(tool) for tool in tools]
        self._tools = {tool.name: tool for tool in tools}
        if len(self._tools) != len(tools):
            raise ValueError("two tools have the same name")
        self._instance_id = str(uuid.uuid4())  # new per process: the sidecar lists again

    async def ListTools(self, request: Any, context: Any) -> tools_pb2.ListToolsResponse:
        return tools_pb2.ListToolsResponse(tools=self._specs, instance_id=self._instance_id)

    async def ExecuteTool(self, request: Any, context: Any) -> AsyncIterator[tools_pb2.ExecuteToolResponse]:
        calls.enter(calls.metadata_of(context.invocation_metadata()))
        tool = self._tools.get(request.tool_name)
        if tool is None:
            yield tools_pb2.ExecuteToolResponse(error=f"this host has no tool {request.tool_name!r}")
            return
        input, problem = parse_tool_input(request.input_json)
        if input is None:
            yield tools_pb2.ExecuteToolResponse(error=problem or "the tool input is not a JSON object")
            return
        execution = ToolExecution(
            tool_call_id=request.tool_call_id,
            conversation_id=request.conversation_id,
            request_id=request.request_id,
            step_number=request.step_number,
            idempotency_key=request.idempotency_key,
            rerun=request.rerun,
        )
        # The tool runs in a task of its own (one, so a streaming tool keeps its context across
        # its yields): when the RPC is cancelled, the flag is set before the tool's task is
        # cancelled, and the call waits for the tool to stop. Cancelling the RPC's task alone
        # would hand the tool its CancelledError before the flag could be set.
        values: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)  # the tool waits for each send
        running = asyncio.ensure_future(_produce(tool, input, execution, values))
        pending: Any = None  # a streaming tool's last yield is its final result
        started = False
        taking: asyncio.Future[Any] | None = None
        try:
            while True:
                taking = asyncio.ensure_future(values.get())
                await asyncio.wait((taking, running), return_when=asyncio.FIRST_COMPLETED)
                if taking.done():
                    value = taking.result()
                else:  # the tool ended: what it put last, else its end (its error raised below)
                    taking.cancel()
                    if values.empty():
                        break
                    value = values.get_nowait()
                if started:
                    yield tools_pb2.ExecuteToolResponse(preliminary_output_json=dumps(pending))
                pending, started = value, True
            running.result()
            final = dumps(pending)
        except BaseException as error:
            if not isinstance(error, Exception):  # cancelled (the call ended), or the process stops
                execution.cancelled.set()
                if taking is not None:
                    taking.cancel()
                if not running.done():
                    running.cancel()
                    await asyncio.wait((running,))  # the tool stops before the call ends
                if not running.cancelled() and running.exception() is not None:
                    logger.info("tool %s failed while cancelled: %s", request.tool_name, running.exception())
                raise
            logger.info("tool %s failed: %s", request.tool_name, error)
            yield tools_pb2.ExecuteToolResponse(error=str(error) or type(error).__name__)
            return
        yield tools_pb2.ExecuteToolResponse(output_json=final)
