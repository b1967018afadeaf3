"""Tool hosts: processes serving ``turnwire.v1.ToolExecutorService`` (protos/turnwire/v1/tools.proto).

:class:`RemoteToolHost` is one configured host (``tools.hosts``): a gRPC channel, the host's tools from
its last ``ListTools`` (each a :class:`RemoteTool`), and a watcher that lists again whenever the
channel reconnects (the host restarted, or came back after being unreachable), when a call found
the host unavailable, and every ``refresh_interval_seconds``. Until its first successful listing a
host contributes no tools; afterwards its last listing stays in the tool set while it is
unreachable, and calls of those tools fail fast with a tool error the model reads.

A :class:`RemoteTool` call is one server-streaming ``ExecuteTool``: preliminary results become
preliminary tool results, the final result or error ends the call (docs/semantics.md §3,
streaming tools). Input and output travel as JSON text, so integers of any size stay exact. The
call's deadline is the tool's timeout; cancelling the awaiting task (the turn is cancelled, the
timeout expires) cancels the RPC, which the host sees as a cancelled call. Every call carries the
metadata ``turnwire-parent-request-id: <the turn's request id>`` (docs/semantics.md §5, nesting)
and, when tracing is on, the tool call span's W3C ``traceparent`` (the host's spans join the trace).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal, cast

import grpc
from opentelemetry import propagate

from turnwire.tools import ToolError, ToolExecution
from turnwire.values import dumps, from_struct, loads
from turnwire_client.metadata import PARENT_REQUEST_METADATA
from turnwire_client.v1 import tools_pb2, tools_pb2_grpc
from turnwire_server.tools.listing import OBJECT_SCHEMA, listing_problem
from turnwire_server.tools.settings import ToolHostSettings

log = logging.getLogger("turnwire.tools")

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # gRPC's reconnect backoff grows to 120 s by default; a tool host that comes back should be
    # found within seconds (calls fail fast while the channel waits to reconnect).
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    ("grpc.keepalive_time_ms", 30_000),
]

WATCH_INTERVAL_SECONDS = 1.0
"""How often the watcher looks at the channel when nothing changes (it also wakes on every
state change): a disconnected channel is asked to reconnect at this pace, within gRPC's backoff."""

END_GRACE_SECONDS = 1.0
"""After the final result: how long the call may take to end before it is cancelled."""

_READY = grpc.ChannelConnectivity.READY


class ToolHostError(Exception):
    """A tool host's configuration cannot be used (an unreadable TLS file); the message says which."""


class RemoteToolHost:
    """One ToolExecutorService host (see the module docstring).

    ``default_timeout_seconds`` bounds a call of a tool that declares no timeout when the entry
    sets no ``timeout_seconds`` either. ``on_change`` is called after every successful listing
    (the tool set merges again). Create it inside the running event loop (gRPC channels bind to
    it); raises :class:`ToolHostError` for an unreadable TLS file.
    """

    kind = "tool host"

    def __init__(
        self, settings: ToolHostSettings, *, default_timeout_seconds: float, on_change: Callable[[], None]
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.default_timeout_seconds = settings.timeout_seconds or default_timeout_seconds
        self.instance_id = ""
        self._tools: dict[str, RemoteTool] = {}
        self._on_change = on_change
        self._channel = _open_channel(settings)
        self.stub = tools_pb2_grpc.ToolExecutorServiceStub(self._channel)
        self._stale = True
        self._listed_at = 0.0
        self._failing = False
        self._watcher: asyncio.Task[None] | None = None

    @property
    def tools(self) -> dict[str, RemoteTool]:
        """The tools of the last successful listing by name (empty before the first)."""
        return self._tools

    async def start(self) -> bool:
        """List the tools (within ``startup_timeout_seconds``) and start the watcher; True when
        the listing worked. An unreachable host is logged, not raised: it is listed once it answers."""
        listed = await self._list(self.settings.startup_timeout_seconds)
        self._watcher = asyncio.create_task(self._watch(), name=f"tool host {self.name}")
        return listed

    def mark_stale(self) -> None:
        """List again at the watcher's next look (a call found the host unavailable)."""
        self._stale = True

    async def aclose(self) -> None:
        """Stop watching and close the channel (calls in flight are cancelled). Unbounded here:
        the sidecar's stop bounds it by its deadline and cancels it past that
        (``Sidecar.stop``, docs/operate/stopping.md)."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            # asyncio.wait, not gather: cancelled itself (the stop's deadline), this returns at
            # once instead of waiting on for the watcher.
            await asyncio.wait({watcher})
        await self._channel.close()

    async def _list(self, timeout: float) -> bool:  # noqa: ASYNC109
        try:
            response = await self.stub.ListTools(tools_pb2.ListToolsRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            if not self._failing:  # said once per outage, not at every retry
                log.warning(
                    "tool host %r (%s): ListTools failed (%s: %s); its tools join once it answers",
                    self.name,
                    self.settings.address,
                    error.code().name,
                    error.details(),
                )
            self._failing = True
            return False
        tools: dict[str, RemoteTool] = {}
        for spec in response.tools:
            schema = from_struct(spec.input_schema) if spec.HasField("input_schema") else dict(OBJECT_SCHEMA)
            problem = listing_problem(spec.name, schema)
            if problem is not None:
                log.warning("tool host %r: tool %r left out: %s", self.name, spec.name, problem)
                continue
            tools[spec.name] = RemoteTool(self, spec, schema)
        restarted = bool(self.instance_id) and response.instance_id != self.instance_id
        self.instance_id = response.instance_id
        self._tools = tools
        self._stale, self._failing = False, False
        self._listed_at = time.monotonic()
        log.info(
            "tool host %r (%s)%s: %d tool(s): %s",
            self.name,
            self.settings.address,
            " restarted" if restarted else "",
            len(tools),
            ", ".join(tools) or "none",
        )
        self._on_change()
        return True

    async def _watch(self) -> None:
        refresh = self.settings.refresh_interval_seconds
        while True:
            state = self._channel.get_state(try_to_connect=True)
            if state != _READY:
                self._stale = True  # reconnecting: the host may have restarted, list again once ready
            elif self._stale or (refresh and time.monotonic() - self._listed_at >= refresh):
                await self._list(self.settings.startup_timeout_seconds)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a wait
            # that ended as the task was cancelled, swallowing the cancel (a close that waits
            # forever for a watcher of a flapping connection); timeout passes it on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_INTERVAL_SECONDS):
                    await self._channel.wait_for_state_change(state)

    def __repr__(self) -> str:
        return f"RemoteToolHost({self.name!r}, {self.settings.address!r})"


def _open_channel(settings: ToolHostSettings) -> grpc.aio.Channel:
    tls = settings.tls
    if tls is None:
        return grpc.aio.insecure_channel(settings.address, options=CHANNEL_OPTIONS)

    def read(field: str) -> bytes | None:
        path = getattr(tls, field)
        if path is None:
            return None
        try:
            return cast("bytes", path.read_bytes())
        except OSError as error:
            raise ToolHostError(f"{settings.name!r}: tls.{field}: cannot read {path}: {error}") from None

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("ca_file"), private_key=read("key_file"), certificate_chain=read("cert_file")
    )
    options = list(CHANNEL_OPTIONS)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(settings.address, credentials, options=options)


Outcome = tuple[Literal["preliminary", "final"], Any]


class RemoteTool:
    """A tool of a :class:`RemoteToolHost` (see the module docstring); a ``turnwire.tools.Tool``.

    ``needs_approval`` is the spec's ``requires_approval`` (docs/semantics.md §6), ``idempotent``
    its ``idempotent`` (docs/semantics.md §8, "Tool effects");
    ``timeout_seconds`` is the spec's ``timeout``, else the host's default. ``execute`` returns the
    final result, or, once the host sent a preliminary result, an async iterator of the results
    (the last one final). Every failure is a :class:`~turnwire.tools.ToolError` whose text the
    model reads: the host's ``error``, the host unavailable or dying mid-call, the deadline, a
    result that is not JSON, a stream that ends without a result.
    """

    streaming = False

    def __init__(self, host: RemoteToolHost, spec: tools_pb2.ToolSpec, input_schema: dict[str, Any]) -> None:
        self.host = host
        self.name = spec.name
        self.description = spec.description
        self.input_schema: Mapping[str, Any] = input_schema
        self.needs_approval = spec.requires_approval
        self.idempotent = spec.idempotent
        declared = spec.timeout.ToTimedelta().total_seconds() if spec.HasField("timeout") else 0.0
        self.timeout_seconds = declared if declared > 0 else host.default_timeout_seconds

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any | AsyncIterator[Any]:
        """Call the tool on its host (see the class docstring)."""
        request = tools_pb2.ExecuteToolRequest(
            conversation_id=execution.conversation_id,
            request_id=execution.request_id,
            tool_call_id=execution.tool_call_id,
            tool_name=self.name,
            input_json=dumps(input),
            step_number=execution.step_number,
            idempotency_key=execution.idempotency_key,
            rerun=execution.rerun,
        )
        # The tool call's span continues on the host: its W3C trace context goes with the call.
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        call = self.host.stub.ExecuteTool(
            request,
            timeout=self.timeout_seconds,
            metadata=((PARENT_REQUEST_METADATA, execution.request_id), *carrier.items()),
        )
        try:
            kind, value = await self._read(call)
            if kind == "final":
                await self._end(call)
                return value
        except BaseException:
            call.cancel()  # the turn was cancelled, the timeout expired, or the call failed
            raise
        return self._rest(call, value)

    async def _rest(self, call: Any, first: Any) -> AsyncIterator[Any]:
        try:
            yield first
            while True:
                kind, value = await self._read(call)
                yield value
                if kind == "final":
                    await self._end(call)
                    return
        finally:
            call.cancel()  # a no-op once the call ended

    async def _read(self, call: Any) -> Outcome:
        try:
            message = await call.read()
        except grpc.aio.AioRpcError as error:
            raise self._failure(error) from None
        if message is grpc.aio.EOF:
            raise ToolError(f"tool host {self.host.name!r} ended the call of {self.name!r} without a result")
        field = message.WhichOneof("result")
        host = f"tool host {self.host.name!r}"
        if field == "error":
            raise ToolError(message.error or f"tool {self.name!r} failed ({host})")
        if field is None:
            raise ToolError(f"{host} sent an empty ExecuteToolResponse for {self.name!r}")
        try:
            value = loads(getattr(message, field))
        except ValueError as error:
            raise ToolError(f"{host} sent a result of {self.name!r} that is not JSON ({error})") from None
        return ("preliminary" if field == "preliminary_output_json" else "final"), value

    async def _end(self, call: Any) -> None:
        """After the final result the host ends the call; one that does not is cancelled."""
        with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
            async with asyncio.timeout(END_GRACE_SECONDS):  # not wait_for: see _watch
                await call.read()

    def _failure(self, error: grpc.aio.AioRpcError) -> ToolError:
        code = error.code()
        host = f"tool host {self.host.name!r}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            # The engine's own timer, of the same length, usually ends the call first: one text
            # whichever fires (engine/tool_calls.py), so the model and the client see one wording.
            return ToolError(f"tool {self.name!r} timed out after {self.timeout_seconds:g} s")
        if code == grpc.StatusCode.UNAVAILABLE:
            self.host.mark_stale()
            return ToolError(f"{host} is unavailable: {error.details()}")
        return ToolError(f"{host} failed the call of {self.name!r}: {code.name}: {error.details()}")

    def __repr__(self) -> str:
        return f"RemoteTool({self.name!r}, host={self.host.name!r})"
