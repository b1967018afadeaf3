"""Tools: the interface every tool home implements, and in-process Python tools.

Every tool home exposes :class:`Tool` (today: Python tools, this module's
:class:`PythonTool`); the engine sees nothing else. A tool either returns its
result (any JSON value) or is an async generator whose yields are preliminary
results and whose last yield is the final one (docs/semantics.md §3, Tool calls:
streaming tools).

Python tools take their schema from a pydantic model (``@tool(Model)``) or are
given one explicitly (:class:`PythonTool`); with a model, the input is
validated before the function runs and a validation error becomes the call's
error text, which the model sees.

Where a Python tool runs (``isolation``):

- A plain synchronous function (``def``) runs in a worker thread (the event
  loop's default executor), never on the event loop, so a slow or blocking
  call does not stall the sidecar. A thread cannot be stopped: when the tool
  timeout expires the call fails at once, but the thread runs on until the
  function returns (and a graceful shutdown waits for it). Give a function
  that might never return ``isolation="process"``.
- ``async def`` functions and async generators run on the event loop, which
  every turn, health check and RPC of the process shares. **An async tool must
  not block**: no blocking I/O, no ``time.sleep``, no long computation between
  its ``await``\\ s. Hand blocking work to a thread (``await
  asyncio.to_thread(...)``) and CPU-heavy work to a process-isolated tool.
- ``isolation="process"`` runs a synchronous, module-level function in a pool
  of worker processes. Use it for CPU-heavy work: CPython holds the GIL during
  a single long operation (a big-integer power, a regex with catastrophic
  backtracking), so such work stalls the event loop even from a thread. When
  the call times out or its turn is cancelled, the worker process running it
  is killed (and replaced), so the work really stops.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import multiprocessing
import pickle
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from turnwire.errors import DomainError
from turnwire.types import ToolDefinition

if TYPE_CHECKING:
    from pebble import ProcessPool

NeedsApproval = bool | Callable[[Mapping[str, Any]], bool]
"""Whether a call of a tool waits for the client's approval: always (``True``), never (``False``), or
as a function of the call's input (docs/semantics.md §6)."""

Isolation = Literal["thread", "process"]
"""Where a :class:`PythonTool`'s synchronous function runs: a worker thread, or a worker process."""

TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What a tool's name must match as a whole: what every provider API accepts (client tools and
tools listed by tool hosts and MCP servers are checked against it)."""

DEFAULT_MAX_WORKERS = 2
"""Worker processes per process-isolated tool, unless ``max_workers`` says otherwise."""


@dataclass(slots=True)
class ToolExecution:
    """What a tool gets besides its input.

    ``cancelled`` is set when the turn is cancelled; long-running tools
    should check it (they are also cancelled as asyncio tasks). A
    process-isolated tool gets a copy whose ``cancelled`` is never set: its
    worker process is killed instead.

    ``idempotency_key`` is the call's key, the same for this call on every attempt of its turn,
    every recovery and every replica (a digest of the conversation, the reply and the call id, 32
    hex digits after ``tw-k-``; "" when the caller gave none): hand it to what the tool changes (a payment
    API's ``Idempotency-Key``, a unique column) so that a call made again has its effect once
    (docs/tools.md, "Idempotency keys").

    ``rerun`` is True when this call runs again after a crash interrupted it while it ran: only
    for a tool that declared itself idempotent (:func:`is_idempotent`), with the same
    ``idempotency_key`` as before (docs/semantics.md §8, "Tool effects").
    """

    tool_call_id: str
    conversation_id: str
    request_id: str
    step_number: int
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    idempotency_key: str = ""
    rerun: bool = False


class ToolError(DomainError):
    """Raised by a tool to fail with a message the model sees verbatim.

    The call's error, not the turn's: no client gets it as a status (it has no ``ErrorReason``
    of its own; were it to end a turn, the client would see an ``INTERNAL`` error)."""


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call.

    ``input_schema`` is a JSON Schema object. ``execute`` returns a JSON value
    (dict, list, str, number, bool or None), or returns an async iterator of
    JSON values for a streaming tool. Any exception is the call's error: the
    model sees its message and the turn goes on.

    ``execute`` runs on the event loop that serves every turn of the process,
    so it must not block: it awaits, and moves blocking or CPU-heavy work to a
    thread or a process (see the module docstring).

    A tool may also set ``streaming = True`` to say it streams preliminary
    results; the engine then emits one preliminary result even when a hook
    blocks or substitutes the call (docs/semantics.md §3, Tool calls).

    Two more optional attributes (docs/semantics.md §6), read with
    :func:`requires_approval` and :func:`is_client_executed`:
    ``needs_approval`` (a :data:`NeedsApproval`: a call then stops in
    ``approval-requested`` until the client approves or denies it), and
    ``client_executed = True`` for a tool the client runs (:class:`ClientTool`).
    And ``timeout_seconds`` (a float, read with :func:`tool_timeout`): how long one call may
    run, instead of the sidecar's ``limits.tool_timeout_seconds`` (a remote tool's declared
    timeout, for example). And ``idempotent = True`` (read with :func:`is_idempotent`): running a
    call again with the same ``ToolExecution.idempotency_key`` has its effect once, so a call that
    was running when the process died is run again on recovery (docs/semantics.md §8, "Tool
    effects").
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any | AsyncIterator[Any]:
        """Run the tool on ``input`` (already a JSON object)."""
        ...


def requires_approval(tool: Tool, input: Mapping[str, Any]) -> bool:
    """True when a call of ``tool`` with ``input`` must wait for the client's approval: the tool's
    ``needs_approval`` attribute, called with the input when it is a function (absent: False).

    A ``needs_approval`` function that raises asks for approval (the safe answer).
    docs/semantics.md §6.
    """
    rule = getattr(tool, "needs_approval", False)
    if callable(rule):
        try:
            return bool(rule(input))
        except Exception:
            return True
    return bool(rule)


def tool_timeout(tool: Tool, default: float) -> float:
    """Seconds one call of ``tool`` may run: its ``timeout_seconds`` attribute when it is a positive
    number, else ``default`` (the sidecar's ``limits.tool_timeout_seconds``)."""
    value = getattr(tool, "timeout_seconds", None)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return default


def is_idempotent(tool: Tool) -> bool:
    """True when ``tool`` declares that a call run again with the same idempotency key has its
    effect once (its ``idempotent`` attribute; absent: False). Such a call, interrupted by a crash
    while it ran, is run again on recovery; any other gets the interrupted result
    (docs/semantics.md §8, "Tool effects")."""
    return getattr(tool, "idempotent", False) is True


def is_client_executed(tool: Tool) -> bool:
    """True for a tool the client runs itself (``client_executed = True``, :class:`ClientTool`)."""
    return bool(getattr(tool, "client_executed", False))


class ClientTool:
    """A tool the client runs itself, offered to the model for one turn (docs/semantics.md §6).

    A call of it is streamed to the client and stored in ``input-available`` with
    ``client_executed`` set; the step ends and the turn completes with the call pending.
    ``before_tool_call`` and ``after_tool_call`` never run for it, and the server never
    calls :meth:`execute`.
    """

    client_executed = True
    needs_approval = False
    streaming = False

    def __init__(self, name: str, description: str, input_schema: Mapping[str, Any]) -> None:
        self.name = name
        self.description = description
        self.input_schema = input_schema

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Never called by the engine; raises :class:`ToolError` if something does."""
        raise ToolError(f"tool {self.name!r} runs on the client; send its result with SubmitToolResults")

    def __repr__(self) -> str:
        return f"ClientTool({self.name!r})"


def definition_of(tool: Tool) -> ToolDefinition:
    """The model-facing definition of ``tool``."""
    return ToolDefinition(name=tool.name, description=tool.description, input_schema=tool.input_schema)


def _is_async(function: Callable[..., Any]) -> bool:
    """True when calling ``function`` gives a coroutine or an async generator (it runs on the loop);
    an object whose ``__call__`` is async counts."""
    callable_object: Any = function
    return any(
        inspect.iscoroutinefunction(candidate) or inspect.isasyncgenfunction(candidate)
        for candidate in (function, callable_object.__call__)
    )


class PythonTool:
    """A tool backed by a Python callable.

    ``function(input, execution)`` receives the validated input (an instance of
    ``input_model``, or the raw dict when only ``input_schema`` is given) and
    the :class:`ToolExecution`. It may be:

    - synchronous: it runs in a worker thread (``isolation="thread"``, the
      default) or in a worker process (``isolation="process"``), never on the
      event loop;
    - async, or an async generator (a streaming tool): it runs on the event
      loop and **must not block it** (await I/O; move blocking calls to
      ``asyncio.to_thread`` and CPU-heavy work to a process-isolated tool).

    With ``isolation="process"`` the function runs in one of ``max_workers``
    worker processes (started on the first call, with the ``spawn`` method)
    and must be a synchronous function defined at module level: the worker
    imports it by module and qualified name (decorating it with :func:`tool`
    is fine). The input (the ``input_model`` instance, so the model class must
    be importable too) is pickled to the worker; a copy of the
    :class:`ToolExecution` without its ``cancelled`` event is rebuilt there.
    The result (a pydantic model dumped to JSON there) is pickled back. An
    exception raised there is the call's error, as for any other tool (a
    :class:`ToolError`'s message verbatim). When the awaiting call is
    cancelled (the tool timeout, ``limits.tool_timeout_seconds``, or a
    cancelled turn), the worker process running it is killed and replaced.
    Calls beyond ``max_workers`` wait for a free worker (the wait counts
    toward the tool timeout). Module state may persist between calls that run
    in the same worker. As with any spawned process, a program that embeds the
    engine must guard its main module with ``if __name__ == "__main__":``
    (``turnwire serve`` does).

    ``needs_approval`` (a bool, or a function of the call's input returning one) makes a
    call wait in ``approval-requested`` for the client's answer before it runs
    (docs/semantics.md §6). ``idempotent`` declares that a call run again with the same
    ``ToolExecution.idempotency_key`` has its effect once: a call a crash interrupted while it ran
    is then run again on recovery (docs/semantics.md §8, "Tool effects").

    Raises :class:`ValueError` when neither or both of ``input_model`` and
    ``input_schema`` are given, and when ``isolation="process"`` is given an
    async function or one that is not a module-level function.
    """

    def __init__(
        self,
        name: str,
        description: str,
        function: Callable[[Any, ToolExecution], Any | Awaitable[Any]],
        *,
        input_model: type[BaseModel] | None = None,
        input_schema: Mapping[str, Any] | None = None,
        isolation: Isolation = "thread",
        max_workers: int = DEFAULT_MAX_WORKERS,
        needs_approval: NeedsApproval = False,
        idempotent: bool = False,
    ) -> None:
        if (input_model is None) == (input_schema is None):
            raise ValueError(f"tool {name!r}: give exactly one of input_model or input_schema")
        if isolation not in ("thread", "process"):
            raise ValueError(f"tool {name!r}: isolation must be 'thread' or 'process', not {isolation!r}")
        if max_workers < 1:
            raise ValueError(f"tool {name!r}: max_workers must be at least 1, not {max_workers!r}")
        self.name = name
        self.description = description
        self.function = function
        #: True for an async-generator function: its yields are preliminary results.
        self.streaming = inspect.isasyncgenfunction(function)
        #: Where a synchronous function runs: "thread" or "process".
        self.isolation: Isolation = isolation
        self.max_workers = max_workers
        #: Whether a call waits for the client's approval (docs/semantics.md §6).
        self.needs_approval: NeedsApproval = needs_approval
        self.idempotent = idempotent
        self._runs_on_loop = _is_async(function)
        self._reference: tuple[str, str] | None = None
        self._pool: ProcessPool | None = None
        if isolation == "process":
            self._reference = _module_level_reference(name, function)
        self.input_model = input_model
        if input_model is not None:
            schema = input_model.model_json_schema()
            schema.pop("title", None)
            self.input_schema: Mapping[str, Any] = schema
        else:
            assert input_schema is not None
            self.input_schema = input_schema

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Validate ``input`` and run the function where ``isolation`` says; returns its result
        (or async iterator).

        Raises :class:`ToolError` with pydantic's message when ``input`` does not
        match ``input_model``, and when a process-isolated call cannot reach or
        lost its worker process.
        """
        argument: Any = input
        if self.input_model is not None:
            try:
                argument = self.input_model.model_validate(input)
            except ValidationError as error:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in error.errors()
                )
                raise ToolError(f"invalid input for tool {self.name!r}: {problems}") from None
        if self._reference is not None:
            return await self._execute_in_process(self._reference, argument, execution)
        if self._runs_on_loop:
            result = self.function(argument, execution)
        else:
            result = await asyncio.to_thread(self.function, argument, execution)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, BaseModel):
            return result.model_dump(mode="json")
        return result

    async def _execute_in_process(
        self, reference: tuple[str, str], argument: Any, execution: ToolExecution
    ) -> Any:
        from concurrent.futures.process import BrokenProcessPool

        from pebble import ProcessExpired

        copy = {
            "tool_call_id": execution.tool_call_id,
            "conversation_id": execution.conversation_id,
            "request_id": execution.request_id,
            "step_number": execution.step_number,
            "idempotency_key": execution.idempotency_key,
            "rerun": execution.rerun,
        }
        try:
            payload = pickle.dumps((argument, copy))
        except Exception as error:  # pickle raises PicklingError, TypeError or AttributeError
            raise ToolError(
                f"tool {self.name!r}: its input cannot be sent to a worker process: {error}"
            ) from None
        try:
            future = self._process_pool().schedule(_run_in_worker, args=(reference, payload))
        except RuntimeError as error:  # the pool broke or was closed: start a new one next time
            self._pool = None
            raise ToolError(f"tool {self.name!r}: its worker processes are unavailable ({error})") from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # type: ignore[no-untyped-call]  # a started call: its worker is killed
            raise
        except ProcessExpired as error:
            raise ToolError(
                f"tool {self.name!r}: its worker process ended unexpectedly (exit code {error.exitcode})"
            ) from None
        except BrokenProcessPool as error:
            self._pool = None
            raise ToolError(f"tool {self.name!r}: its worker processes failed ({error})") from None

    def _process_pool(self) -> ProcessPool:
        from pebble import ProcessPool

        if self._pool is None or not self._pool.active:
            # spawn, not fork: the sidecar runs threads (gRPC, the store), and a forked child
            # inherits their locks in whatever state they were.
            self._pool = ProcessPool(
                max_workers=self.max_workers, context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def close(self) -> None:
        """Stop this tool's worker processes, if any (blocking; a call needs new ones again).

        Without it they end when the interpreter exits.
        """
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()  # type: ignore[no-untyped-call]
            pool.join()

    def __repr__(self) -> str:
        return f"PythonTool({self.name!r})"


def _module_level_reference(name: str, function: Callable[..., Any]) -> tuple[str, str]:
    """``(module, qualified name)`` by which a worker process imports ``function``."""
    if _is_async(function):
        raise ValueError(
            f"tool {name!r}: isolation='process' needs a synchronous function; an async tool runs "
            "on the event loop (move its CPU-heavy part into a synchronous process-isolated tool)"
        )
    module = getattr(function, "__module__", None)
    qualified = getattr(function, "__qualname__", "")
    if not inspect.isfunction(function) or not module or "<" in qualified:
        raise ValueError(
            f"tool {name!r}: isolation='process' needs a function defined at module level "
            f"(a worker process imports it by name), not {function!r}"
        )
    return module, qualified


def _run_in_worker(reference: tuple[str, str], payload: bytes) -> Any:
    """In a worker process: import the tool's function, call it, return its result."""
    module_name, qualified = reference
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualified.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise ToolError(f"cannot load {module_name}.{qualified} in the worker process: {error}") from None
    function = target.function if isinstance(target, PythonTool) else target
    try:
        argument, copy = pickle.loads(payload)
    except Exception as error:  # a class the worker cannot import, for example
        raise ToolError(f"the tool input cannot be read in the worker process: {error}") from None
    result = function(argument, ToolExecution(**copy))
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json")
    try:
        pickle.dumps(result)  # said here, not as a pickling failure inside the pool
    except Exception as error:
        raise ToolError(f"the tool result cannot be sent back from the worker process: {error}") from None
    return result


def tool(
    input_model: type[BaseModel],
    *,
    name: str | None = None,
    description: str | None = None,
    isolation: Isolation = "thread",
    max_workers: int = DEFAULT_MAX_WORKERS,
    needs_approval: NeedsApproval = False,
    idempotent: bool = False,
) -> Callable[[Callable[[Any, ToolExecution], Any]], PythonTool]:
    """Decorator: turn ``def f(input: Model, execution) -> ...`` (or ``async def``) into a
    :class:`PythonTool`.

    The name defaults to the function's name, the description to its docstring.
    A synchronous function runs in a worker thread, or with
    ``isolation="process"`` in a worker process that a timeout kills; an async
    one runs on the event loop and must not block it (see :class:`PythonTool`).
    ``needs_approval`` makes its calls wait for the client's approval (docs/semantics.md §6);
    ``idempotent=True`` declares that a call run again with the same idempotency key has its
    effect once, so a call a crash interrupted while it ran is run again on recovery
    (docs/semantics.md §8, "Tool effects").
    """

    def wrap(function: Callable[[Any, ToolExecution], Any]) -> PythonTool:
        return PythonTool(
            name or function.__name__,
            description or inspect.getdoc(function) or "",
            function,
            input_model=input_model,
            isolation=isolation,
            max_workers=max_workers,
            needs_approval=needs_approval,
            idempotent=idempotent,
        )

    return wrap
