"""Remote hooks end to end with real processes (docs/semantics.md §4, §5).

A ``turnwire serve`` process whose chain is ``middleware: - remote: {address}`` calls a hook
server in this test process; the hook server calls back into the sidecar with the
``turnwire-parent-request-id`` metadata it received, and meets the nesting rule: from inside a
turn, a blocking Chat / SaveMessages / ContinueLastTurn on the same conversation is refused with
FAILED_PRECONDITION (NESTED_TURN), SubmitMessages and AddMessages are accepted; from
``on_chat_response`` (lock released) a SaveMessages on the same conversation is admitted as the
next turn. Separately, a hook server process killed during a call, then started again on its
port: fail-closed blocking, the breaker opening, and closing once the server is back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.engine_harness import MODEL, EngineFactory, echo, end_of, make_tool, tool_parts
from support.hook_server import RecordingHookServer, recorded, serving
from support.hooks import TESTS_DIR, pythonpath_env
from support.port_process import PortProcess
from support.sidecar import SidecarFactory, free_port
from support.waiting import wait_until

from turnwire.hooks import SessionContext
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire_client import TurnStream, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, hooks_pb2, message_pb2
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.remote_hooks.settings import RemoteHookSettings

PARENT = "turnwire-parent-request-id"


def user(text: str, message_id: str = "") -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def texts(messages: Any) -> list[str]:
    return ["".join(p.text.text for p in m.parts if p.WhichOneof("kind") == "text") for m in messages]


def sidecar_config(address: str) -> dict[str, Any]:
    return {
        "default_model": "scripted:main",
        "providers": {"scripted": {"scripts": {"main": [{"text": "Answer."}]}}},
        "middleware": [{"remote": {"address": address, "deadline_seconds": 15}}],
    }


async def test_a_hook_calling_back_from_inside_a_turn_meets_the_nesting_rule(
    sidecar_factory: SidecarFactory,
) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_BEFORE_TURN])
    outcomes: dict[str, Any] = {}
    target: list[str] = []

    async def probe(request: hooks_pb2.BeforeTurnRequest, context: Any) -> hooks_pb2.BeforeTurnResponse:
        if "probe" not in request.turn.body:
            return hooks_pb2.BeforeTurnResponse()
        parent = dict(context.invocation_metadata())[PARENT]
        outcomes["parent"] = parent
        conversation = request.turn.conversation_id
        async with TurnwireClient(target[0], metadata=[(PARENT, parent)]) as client:
            blocking: dict[str, Callable[[], TurnStream]] = {
                "Chat": lambda: client.chat(conversation, "nested"),
                "SaveMessages": lambda: client.save_messages(conversation, [user("nested")]),
                "ContinueLastTurn": lambda: client.continue_last_turn(conversation),
            }
            for name, start in blocking.items():
                try:
                    outcomes[name] = (await collect(start())).status_name
                except TurnwireError as error:
                    outcomes[name] = (error.code, error.reason)
            submitted = await client.submit_messages(conversation, "submitted from the hook")
            outcomes["SubmitMessages"] = submitted.accepted
            added = await client.add_messages(conversation, [user("added by the hook", "m-added")])
            outcomes["AddMessages"] = added.added_count
            other = await collect(client.chat(f"{conversation}-other", "elsewhere"))
            outcomes["Chat elsewhere"] = other.status_name
        return hooks_pb2.BeforeTurnResponse()

    server.answers["BeforeTurn"] = probe
    async with serving(server) as address:
        sidecar = await sidecar_factory(sidecar_config(address)).start()
        target.append(sidecar.target)
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat("nest", "hi", request_id="r-parent", body={"probe": True}))
            assert result.ok, result.error
            refused = (grpc.StatusCode.FAILED_PRECONDITION, "NESTED_TURN")
            assert outcomes == {
                "parent": "r-parent",
                "Chat": refused,
                "SaveMessages": refused,
                "ContinueLastTurn": refused,
                "SubmitMessages": True,
                "AddMessages": 1,
                "Chat elsewhere": "COMPLETED",
            }

            async def settled() -> list[str]:
                stored = texts((await client.get_conversation("nest")).messages)
                return stored if len(stored) == 5 else []

            stored = await wait_until(settled, what="the submitted turn ran after the parent")
    # The submission's turn queued behind the parent and ran after it.
    assert stored[0] == "hi" and "added by the hook" in stored[:3] and "Answer." in stored[:3]
    assert stored[3:] == ["submitted from the hook", "Answer."]


async def test_a_remote_on_chat_response_starts_the_next_turn_with_save_messages(
    sidecar_factory: SidecarFactory,
) -> None:
    server = RecordingHookServer([hooks_pb2.HOOK_ON_CHAT_RESPONSE])
    follow_ups: list[str] = []
    target: list[str] = []

    async def follow_up(request: hooks_pb2.OnChatResponseRequest, context: Any) -> Any:
        if "follow_up" in request.turn.body:
            parent = dict(context.invocation_metadata())[PARENT]
            async with TurnwireClient(target[0], metadata=[(PARENT, parent)]) as client:
                result = await collect(
                    client.save_messages(
                        request.turn.conversation_id, [user("follow-up")], request_id="r-next"
                    )
                )
            follow_ups.append(result.status_name)
        return hooks_pb2.OnChatResponseResponse()

    server.answers["OnChatResponse"] = follow_up
    async with serving(server) as address:
        sidecar = await sidecar_factory(sidecar_config(address)).start()
        target.append(sidecar.target)
        async with TurnwireClient(sidecar.target) as client:
            first = await collect(
                client.chat("chain", "first", request_id="r-first", body={"follow_up": True})
            )
            stored = await client.get_conversation("chain")
    assert first.ok, first.error
    # The hook's SaveMessages ran to its end before the first turn's TurnEnd: admitted next, no deadlock.
    assert follow_ups == ["COMPLETED"]
    assert texts(stored.messages) == ["first", "Answer.", "follow-up", "Answer."]
    responses = [c.request.turn.request_id for c in server.calls if c.rpc == "OnChatResponse"]
    assert sorted(responses) == ["r-first", "r-next"]


# --- a hook server process that dies --------------------------------------------------------


class HookServerProcess(PortProcess):
    """``python -m support.hook_server`` on a fixed port, recording into ``record``."""

    def __init__(self, workdir: Path, port: int) -> None:
        super().__init__(port)
        self.workdir = workdir
        self.record = workdir / "none.jsonl"
        self.generation = 0

    async def start(self, *, sleep: str = "", reuse: bool = False) -> None:
        """Start the process (``sleep``: RPCs that never answer; ``reuse``: offer HookSession and
        its reuse across turns) and wait until it listens."""
        self._spawn(sleep, reuse)
        await wait_until(self.listening, timeout=20, what="the hook server process listening")

    def _spawn(self, sleep: str, reuse: bool = False) -> None:
        self.generation += 1
        self.record = self.workdir / f"calls-{self.generation}.jsonl"
        hooks = "HOOK_BEFORE_TURN,HOOK_BEFORE_TOOL_CALL"
        command = [sys.executable, "-m", "support.hook_server", "--port", str(self.port)]
        command += ["--record", str(self.record), "--hooks", hooks, "--sleep", sleep]
        command += ["--reuse-hook-session"] if reuse else []
        with (self.workdir / f"hook-server-{self.generation}.log").open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=TESTS_DIR, env={**os.environ, **pythonpath_env()}, stdout=log, stderr=log
            )

    def rpcs(self) -> list[str]:
        return [line["rpc"] for line in recorded(self.record)]


@pytest.fixture
def hook_process(tmp_path: Path) -> Iterator[HookServerProcess]:
    process = HookServerProcess(tmp_path, free_port())
    yield process
    process.kill()


@pytest.fixture
async def remote_in_engine(
    make_engine: EngineFactory, hook_process: HookServerProcess
) -> AsyncIterator[tuple[Any, RemoteMiddleware]]:
    await hook_process.start(sleep="BeforeToolCall")
    middleware = RemoteMiddleware(
        RemoteHookSettings(
            address=f"127.0.0.1:{hook_process.port}",
            failure_mode={"before_tool_call": "closed"},
            breaker={"failure_threshold": 2, "open_seconds": 0.2},
        )
    )
    script = [
        ScriptStep(tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
        ScriptStep(text="Done."),
    ]
    harness = await make_engine(
        scripts={"main": script}, tools=[make_tool("echo", echo)], middlewares=[middleware]
    )
    await harness.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
    yield harness, middleware
    await middleware.aclose()


async def test_a_hook_server_killed_mid_call_fails_closed_then_the_breaker_closes_when_it_is_back(
    hook_process: HookServerProcess, remote_in_engine: tuple[Any, RemoteMiddleware]
) -> None:
    harness, middleware = remote_in_engine
    blocked = f'Tool "echo" was blocked: its policy hook ({middleware.name}) was unavailable.'

    handle = await harness.start("go")
    await wait_until(lambda: "BeforeToolCall" in hook_process.rpcs(), what="BeforeToolCall in flight")
    hook_process.kill()  # the process dies while the call waits for its answer
    events = [response.event async for response in handle]
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert [json.loads(p.output_json) for p in tool_parts(end.message)] == [blocked]

    # Down: the next turn's BeforeTurn fails too (open: the turn goes on), which opens the breaker;
    # its tool call then gets the closed outcome without a call.
    end = end_of(await harness.run("again"))
    assert [json.loads(p.output_json) for p in tool_parts(end.message)] == [blocked]
    assert middleware.breaker.state == "open"

    await hook_process.start()  # back, on the same port

    async def answered() -> bool:
        end = end_of(await harness.run("probe"))
        return [json.loads(p.output_json) for p in tool_parts(end.message)] == [{"echo": {"x": 1}}]

    await wait_until(answered, timeout=20, interval=0.1, what="a turn whose hooks the new server answered")
    assert middleware.breaker.state == "closed"  # type: ignore[comparison-overlap]  # mypy keeps the earlier assert's narrowing
    assert "BeforeToolCall" in hook_process.rpcs()


async def test_a_kept_hook_stream_whose_server_restarted_gives_way_to_a_new_one(
    make_engine: EngineFactory, hook_process: HookServerProcess
) -> None:
    # The sidecar keeps a turn's HookSession stream for the next turn (reuse_hook_session). The
    # server process is killed between turns and started again on its port: the kept stream died
    # with it, and once the sidecar reconnects every turn's hooks are answered by the new process,
    # none failed (BeforeTurn fails closed: a call lost on the dead stream would fail its turn).
    await hook_process.start(reuse=True)
    middleware = RemoteMiddleware(
        RemoteHookSettings(
            address=f"127.0.0.1:{hook_process.port}",
            failure_mode={"before_turn": "closed"},
            breaker={"failure_threshold": 1000, "open_seconds": 0.2},
        )
    )
    harness = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
                ScriptStep(text="Done."),
            ]
        },
        tools=[make_tool("echo", echo)],
        middlewares=[middleware],
    )
    try:
        await harness.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
        first = end_of(await harness.run("one", request_id="r-before"))
        assert first.status == event_pb2.TURN_STATUS_COMPLETED
        assert hook_process.rpcs() == ["GetHookSubscriptions", "BeforeTurn", "BeforeToolCall"]
        hook_process.kill()
        await hook_process.start(reuse=True)

        async def completed() -> bool:
            return end_of(await harness.run("probe")).status == event_pb2.TURN_STATUS_COMPLETED

        await wait_until(completed, timeout=20, interval=0.1, what="a turn the restarted server answered")
        for n in range(3):
            end = end_of(await harness.run("after", request_id=f"r-after-{n}"))
            assert end.status == event_pb2.TURN_STATUS_COMPLETED
        answered = [
            line["request_id"] for line in recorded(hook_process.record) if line["rpc"] == "BeforeTurn"
        ]
        assert answered[-3:] == [f"r-after-{n}" for n in range(3)]
    finally:
        await middleware.aclose()
