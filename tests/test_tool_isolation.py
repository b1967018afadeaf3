"""Tools never stall the event loop (issue 8, item 12).

A synchronous tool runs in a worker thread; an async one runs on the loop; a
process-isolated tool runs in a worker process that the tool timeout (or a
cancelled turn) kills. The demo calculator bounds its numbers, so the message
``what is 1+(((9**99)**99)**99)**99`` is refused at once instead of computing
for minutes. "The loop keeps running" is measured by a heartbeat task's
largest gap between ticks.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import grpc
import psutil
import pytest
from pydantic import BaseModel
from support.engine_harness import (
    CONV,
    EngineFactory,
    collect,
    end_of,
    make_tool,
    of_kind,
    text_of,
    value,
)
from support.waiting import wait_until

from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import PythonTool, ToolError, ToolExecution, tool
from turnwire_client.v1 import event_pb2, tools_pb2
from turnwire_server.engine.ids import tool_idempotency_key
from turnwire_server.tools.demo import DEMO_TOOLS, calculator, evaluate
from turnwire_server.tools.grpc_host import RemoteTool

TOWER = "1+(((9**99)**99)**99)**99"
"""The message of the issue: computed naively, a number of about 300 million digits."""

MAX_GAP_SECONDS = 1.0
"""The heartbeat's largest allowed gap: a blocked loop shows gaps of several seconds."""

BLOCK_SECONDS = 5.0
"""How long the blocking tools block at most (the test releases them earlier)."""


class Heartbeat:
    """A task that ticks every 10 ms on the running loop and records the largest gap."""

    def __init__(self) -> None:
        self.ticks = 0
        self.max_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0.01)
            now = loop.time()
            self.max_gap = max(self.max_gap, now - last)
            self.ticks += 1
            last = now

    async def __aenter__(self) -> Heartbeat:
        self._task = asyncio.create_task(self._beat())
        await wait_until(lambda: self.ticks > 0, what="the heartbeat's first tick")
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def beats(self, count: int) -> None:
        """Wait until ``count`` more ticks happened (they only happen while the loop runs)."""
        target = self.ticks + count
        await wait_until(lambda: self.ticks >= target, what=f"{count} more heartbeats")


def one_call(name: str, input: dict[str, Any] | None = None) -> dict[str, list[ScriptStep]]:
    """A script: call ``name`` once, then answer."""
    call = ScriptedToolCall(name=name, input=input or {})
    return {"main": [ScriptStep(text="Calling.", tool_calls=[call]), ScriptStep(text="Went on.")]}


# --------------------------------------------------------------------------- threads and the loop


@pytest.mark.parametrize("kind", ["sleeps", "computes"])
async def test_a_blocking_sync_tool_runs_off_the_event_loop(
    make_engine: EngineFactory, kind: Literal["sleeps", "computes"]
) -> None:
    started, release = threading.Event(), threading.Event()

    def block(input: dict[str, Any], execution: ToolExecution) -> str:
        started.set()
        if kind == "sleeps":
            release.wait(BLOCK_SECONDS)
        else:  # pure-Python work: the GIL is handed over every few milliseconds
            deadline = time.monotonic() + BLOCK_SECONDS
            while not release.is_set() and time.monotonic() < deadline:
                sum(range(1000))
        return "done"

    h = await make_engine(scripts=one_call("block"), tools=[make_tool("block", block)])
    async with Heartbeat() as heartbeat:
        handle = await h.start("go")
        await wait_until(started.is_set, what="the tool started")
        await heartbeat.beats(20)  # the loop runs while the tool blocks
        release.set()
        events = await collect(handle)
    assert heartbeat.max_gap < MAX_GAP_SECONDS, f"the event loop stalled for {heartbeat.max_gap:.2f} s"
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert [value(e.output) for e in of_kind(events, "tool_output_available")] == ["done"]


async def test_sync_tools_run_in_a_worker_thread_and_async_tools_on_the_loop(
    make_engine: EngineFactory,
) -> None:
    threads: dict[str, int] = {}

    def sync_tool(input: dict[str, Any], execution: ToolExecution) -> str:
        threads["sync"] = threading.get_ident()
        return "sync"

    async def async_tool(input: dict[str, Any], execution: ToolExecution) -> str:
        threads["async"] = threading.get_ident()
        return "async"

    script = [
        ScriptStep(tool_calls=[ScriptedToolCall(name="sync_tool"), ScriptedToolCall(name="async_tool")]),
        ScriptStep(text="ok"),
    ]
    h = await make_engine(
        scripts={"main": script},
        tools=[make_tool("sync_tool", sync_tool), make_tool("async_tool", async_tool)],
    )
    assert end_of(await h.run()).status == event_pb2.TURN_STATUS_COMPLETED
    assert threads["async"] == threading.get_ident()  # the loop's thread
    assert threads["sync"] != threading.get_ident()


async def test_a_blocked_sync_tool_still_times_out_and_the_turn_goes_on(make_engine: EngineFactory) -> None:
    release = threading.Event()

    def stuck(input: dict[str, Any], execution: ToolExecution) -> str:
        release.wait(BLOCK_SECONDS)
        return "late"

    h = await make_engine(
        scripts=one_call("stuck"), tools=[make_tool("stuck", stuck)], tool_timeout_seconds=0.2
    )
    try:
        events = await h.run()
    finally:
        release.set()  # a thread cannot be killed: let it end
    assert [e.error_text for e in of_kind(events, "tool_output_error")] == [
        "tool 'stuck' timed out after 0.2 s"
    ]
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message).endswith("Went on.")


async def test_a_tools_own_timeout_error_is_not_reported_as_the_tool_timeout(
    make_engine: EngineFactory,
) -> None:
    def connect(input: dict[str, Any], execution: ToolExecution) -> str:
        raise TimeoutError("connect timed out")

    h = await make_engine(scripts=one_call("connect"), tools=[make_tool("connect", connect)])
    events = await h.run()
    (error,) = of_kind(events, "tool_output_error")
    assert error.error_text == "connect timed out"  # the tool's own error, not "timed out after 60 s"


# --------------------------------------------------------------------------- process isolation


class Job(BaseModel):
    """Input of ``job``: what the worker process does."""

    action: Literal["pid", "spin", "power", "tool-error", "value-error", "exit", "unpicklable"]
    pid_file: str | None = None


@tool(Job, isolation="process", max_workers=1)
def job(input: Job, execution: ToolExecution) -> dict[str, Any]:
    """Runs in a worker process: reports it, fails, or computes forever."""
    if input.pid_file is not None:
        Path(input.pid_file).write_text(str(os.getpid()))
    if input.action == "pid":
        return {
            "pid": os.getpid(),
            "tool_call_id": execution.tool_call_id,
            "step": execution.step_number,
            "key": execution.idempotency_key,
        }
    if input.action == "tool-error":
        raise ToolError("the job failed as asked")
    if input.action == "value-error":
        raise ValueError("not a good value")
    if input.action == "exit":
        os._exit(3)
    if input.action == "unpicklable":
        return {"lock": threading.Lock()}
    if input.action == "power":  # one long C call, as in the issue
        return {"never": 9 ** (10**8) % 7}
    while True:  # "spin": pure Python, forever
        pass


@pytest.fixture(scope="module", autouse=True)
def stop_job_workers() -> Iterator[None]:
    yield
    job.close()


def gone(pid: int) -> bool:
    """True once process ``pid`` no longer runs (ended and reaped, or a zombie)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def worker_pid() -> int:
    """Start (or reuse) ``job``'s one worker process; its pid. The first call spawns it (no timeout
    here: a slow machine may take a while), so a turn's short tool timeout measures only the call."""
    result = await job.execute({"action": "pid"}, ToolExecution("warm-up", "conv", "r", 0))
    pid = int(result["pid"])
    assert psutil.Process(pid).ppid() == os.getpid(), "the tool did not run in a child process"
    return pid


async def test_a_process_isolated_tool_runs_in_a_child_process(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=one_call("job", {"action": "pid"}), tools=[job])
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (output,) = [value(e.output) for e in of_kind(events, "tool_output_available")]
    assert output["pid"] != os.getpid()
    assert psutil.Process(int(output["pid"])).ppid() == os.getpid()
    # The worker got a copy of the ToolExecution, the call's idempotency key included.
    (call,) = of_kind(events, "tool_input_available")
    assert (output["tool_call_id"], output["step"]) == (call.tool_call_id, 0)
    assert output["key"] == tool_idempotency_key(CONV, end_of(events).message.id, call.tool_call_id)


@pytest.mark.parametrize(
    ("action", "error_text"),
    [
        ("tool-error", "the job failed as asked"),
        ("value-error", "not a good value"),
        ("exit", "tool 'job': its worker process ended unexpectedly (exit code 3)"),
        ("unpicklable", "the tool result cannot be sent back from the worker process: cannot pickle"),
    ],
)
async def test_a_process_isolated_tools_error_is_the_calls_error_text(
    make_engine: EngineFactory, action: str, error_text: str
) -> None:
    h = await make_engine(scripts=one_call("job", {"action": action}), tools=[job])
    events = await h.run()
    (error,) = of_kind(events, "tool_output_error")
    assert error.error_text.startswith(error_text)
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.calls == 2  # the model saw the error and answered


async def test_invalid_input_of_a_process_isolated_tool_fails_before_any_process_work(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=one_call("job", {"action": "dance"}), tools=[job])
    events = await h.run()
    (error,) = of_kind(events, "tool_output_error")
    assert error.error_text.startswith("invalid input for tool 'job': action:")


@pytest.mark.parametrize("action", ["spin", "power"])
async def test_a_process_isolated_tool_computing_forever_is_killed_by_the_tool_timeout(
    make_engine: EngineFactory, tmp_path: Path, action: str
) -> None:
    pid = await worker_pid()
    pid_file = tmp_path / "pid"
    h = await make_engine(
        scripts=one_call("job", {"action": action, "pid_file": str(pid_file)}),
        tools=[job],
        tool_timeout_seconds=1.0,
    )
    async with Heartbeat() as heartbeat:
        events = await h.run()
    assert heartbeat.max_gap < MAX_GAP_SECONDS, f"the event loop stalled for {heartbeat.max_gap:.2f} s"
    assert int(pid_file.read_text()) == pid  # the call ran in that worker...
    await wait_until(lambda: gone(pid), timeout=10, what=f"the worker process {pid} is killed")
    # ...and the turn went on with the timeout as the call's error.
    assert [e.error_text for e in of_kind(events, "tool_output_error")] == ["tool 'job' timed out after 1 s"]
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message).endswith("Went on.")
    # A new worker takes the next call.
    assert await worker_pid() != pid


async def test_cancelling_the_turn_kills_the_process_isolated_call(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    pid = await worker_pid()
    pid_file = tmp_path / "pid"
    h = await make_engine(scripts=one_call("job", {"action": "spin", "pid_file": str(pid_file)}), tools=[job])
    handle = await h.start("go")
    await wait_until(pid_file.exists, timeout=10, what="the call runs in the worker")
    assert handle.cancel()
    events = await collect(handle)
    assert end_of(events).status == event_pb2.TURN_STATUS_ABORTED
    await wait_until(lambda: gone(pid), timeout=10, what=f"the worker process {pid} is killed")


async def local_async(input: Job, execution: ToolExecution) -> str:
    return "async"


def test_process_isolation_takes_only_module_level_sync_functions() -> None:
    def local(input: Job, execution: ToolExecution) -> str:
        return "local"

    with pytest.raises(ValueError, match="needs a synchronous function"):
        PythonTool("a", "an async tool", local_async, input_model=Job, isolation="process")
    with pytest.raises(ValueError, match="defined at module level"):
        PythonTool("b", "a local function", local, input_model=Job, isolation="process")
    with pytest.raises(ValueError, match="defined at module level"):
        PythonTool("c", "a lambda", lambda i, e: i, input_model=Job, isolation="process")
    with pytest.raises(ValueError, match="isolation must be"):
        PythonTool("d", "typo", local, input_model=Job, isolation="fork")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the demo calculator


async def test_the_calculator_refuses_the_tower_of_powers_at_once() -> None:
    started = time.perf_counter()
    with pytest.raises(ToolError) as refused:
        await calculator.execute({"expression": TOWER}, ToolExecution("c", "conv", "r", 0))
    assert time.perf_counter() - started < 1.0
    assert str(refused.value).startswith("number too large: the result would have about 9,353 digits")


@pytest.mark.parametrize(
    ("expression", "result"),
    [
        ("6*7", 42),
        ("(2+3)*4", 20),
        ("2**10", 1024),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7%3", 2),
        ("2**-1", 0.5),
        ("(2**90)**90", 2**8100),  # 2,439 digits: within the bound, exact
    ],
)
async def test_the_calculator_still_computes_normal_arithmetic(expression: str, result: float) -> None:
    output = await calculator.execute({"expression": expression}, ToolExecution("c", "conv", "r", 0))
    assert output == {"expression": expression, "result": result}


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("(9**99)**99", "number too large: the result would have about 9,353 digits"),
        ("(2**90)**90 * (2**90)**90", "number too large: the result would have about 4,878 digits"),
        ("2**101", "exponent too large (at most 100)"),
        ("1" * 101, "number too long (at most 100 digits)"),
        ("-" * 101 + "1", "expression nested too deeply (at most 100 levels)"),
        ("1+" * 100 + "1", "expression too long (at most 200 characters)"),
        ("1e308*10", "number too large (beyond about 1.8e308)"),
        ("(-8)**(1/3)", "the result is not a real number"),
        ("1/0", "division by zero"),
        ("__import__('os')", "unsupported expression element: Call"),
    ],
)
def test_the_calculator_bounds_its_numbers_before_computing(expression: str, error: str) -> None:
    with pytest.raises(ToolError) as refused:
        evaluate(expression)
    assert str(refused.value).startswith(error)


async def test_the_demo_model_gets_the_calculators_refusal_without_stalling_the_loop(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(tools=DEMO_TOOLS)
    async with Heartbeat() as heartbeat:
        events = await h.run(f"what is {TOWER}", model="scripted:demo")
    assert heartbeat.max_gap < MAX_GAP_SECONDS
    (error,) = of_kind(events, "tool_output_error")
    assert error.error_text.startswith("number too large")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert "The calculator tool failed: number too large" in text_of(end.message)


async def test_each_call_gets_its_own_stable_idempotency_key(make_engine: EngineFactory) -> None:
    """docs/tools.md, "Idempotency keys": a digest of the conversation, the reply and the call id,
    the same wherever and whenever the call runs, another for another call."""
    keys: dict[str, str] = {}

    async def charge(input: dict[str, Any], execution: ToolExecution) -> str:
        keys[execution.tool_call_id] = execution.idempotency_key
        return "charged"

    calls = [ScriptedToolCall(name="charge"), ScriptedToolCall(name="charge")]
    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=calls), ScriptStep(text="ok")]},
        tools=[make_tool("charge", charge)],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    reply = end_of(events).message.id
    ids = [call.tool_call_id for call in of_kind(events, "tool_input_available")]
    assert len(set(ids)) == 2
    assert keys == {call_id: tool_idempotency_key(CONV, reply, call_id) for call_id in ids}
    assert len(set(keys.values())) == 2
    assert all(key.startswith("tw-k-") and len(key) == 37 for key in keys.values())
    assert tool_idempotency_key("other", reply, ids[0]) != keys[ids[0]], "another conversation, another key"


async def test_a_call_id_seen_again_in_a_later_reply_gets_another_key(make_engine: EngineFactory) -> None:
    """A fresh-user trial: the key was a digest of the conversation and the call id alone, and
    call ids are unique within a reply only (a provider that numbers calls per response, after
    the transcript was compacted; a conversation deleted and started again): a later call of
    the same id got the earlier one's key, so a payment API would have taken a new charge for a
    repeat of the old one and skipped it."""
    keys: list[tuple[str, str]] = []

    async def charge(input: dict[str, Any], execution: ToolExecution) -> str:
        keys.append((execution.tool_call_id, execution.idempotency_key))
        return "charged"

    step = ScriptStep(tool_calls=[ScriptedToolCall(name="charge", id="call_0")])
    h = await make_engine(
        scripts={"main": [step, ScriptStep(text="ok")]},
        tools=[make_tool("charge", charge)],
    )
    for request_id in ("r-first", "r-again"):  # the scripted model gives the id as it is
        events = await h.run(request_id=request_id)
        assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (first_id, first_key), (again_id, again_key) = keys
    assert first_id == again_id == "call_0"
    assert first_key != again_key


def test_a_tool_hosts_deadline_reads_as_any_tools_timeout() -> None:
    # Two timers of one length end a tool host's call: the engine's (usually first) and the gRPC
    # deadline. The deadline's text added "(tool host 'billing')", so the model and the client
    # got one of two wordings for the same timeout, as the race went (docs/tools.md gives one).
    host: Any = SimpleNamespace(name="billing", default_timeout_seconds=30.0)
    remote = RemoteTool(host, tools_pb2.ToolSpec(name="charge"), {"type": "object"})
    deadline = grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata()
    )
    assert str(remote._failure(deadline)) == "tool 'charge' timed out after 30 s"
