"""New input while a turn runs (issue 18): the per-request strategies ENQUEUE, REJECT, INTERRUPT
and ROLLBACK against a real ``turnwire serve`` process on SQLite (docs/semantics.md §5).

Each test starts a long turn ``A`` (a slow text, or a tool that waits 30 s), sends new input
while it runs, and checks the streams, the stored transcript, the order the turns ran in and
what the hooks were told (``support.hooks:RecordConcurrentInput`` writes one line per call).
The raw stub is used, so the test sees exactly the request field and the statuses.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.endless import endless_step, is_prefix_of_repeats
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.turn_calls import Turn, call_status, chat, error_info, has_reply, stored, transcript
from support.waiting import wait_until

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

WORDS = [f"w{i}" for i in range(200)]
ENDLESS = "".join(f"{word} " for word in WORDS)

ENQUEUE = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE
REJECT = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT
INTERRUPT = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT
ROLLBACK = chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK


def config(record: Path, metrics_port: int) -> dict[str, Any]:
    return {
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
        "providers": {
            "scripted": {
                "scripts": {
                    # About 10 s of text, 50 ms a word, for a test that also needs the turn to
                    # complete by itself: it acts within those 10 s of seeing the first delta.
                    "long": [{"text": " ".join(WORDS), "delay_ms": 50}],
                    # Never ends on its own: the test's interrupt, rollback or cancel ends it.
                    "endless": [endless_step(ENDLESS, 50)],
                    # Text, then a call of a tool that waits 30 s.
                    "tool": [
                        {"text": "let me wait", "tool_calls": [{"name": "wait", "input": {"seconds": 30}}]},
                        {"text": "waited"},
                    ],
                    "short": [{"text": "ok"}],
                    # A call of the client tool get_location: the turn ends with it pending.
                    "client_call": [
                        {"tool_calls": [{"name": "get_location", "input": {}}]},
                        {"text": "unreachable"},
                    ],
                }
            }
        },
        "tools": {"python": ["support.durable_tools:wait"]},
        "checkpoint": {"interval_ms": 20},
        "middleware": [{"path": "support.hooks:RecordConcurrentInput", "options": {"path": str(record)}}],
    }


class Server:
    """A sidecar, the file its hook recorder writes and its metrics port."""

    def __init__(self, sidecar: SidecarProcess, record: Path, metrics_port: int) -> None:
        self.stub = chat_service_pb2_grpc.ChatServiceStub(sidecar.channel())
        self.record = record
        self.metrics_port = metrics_port

    def hook_lines(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.exists() else []

    async def queued(self) -> float:
        """The server's ``turnwire_queued_turns`` gauge: turns admitted and waiting."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
        return sum(
            float(line.split()[-1]) for line in text.splitlines() if line.startswith("turnwire_queued_turns")
        )

    async def wait_queued(self, count: int) -> None:
        """Wait until ``count`` turns wait in the server's queue (admitted, so in line)."""
        await wait_until(lambda: self._queued_is(count), timeout=10, what=f"{count} turns queued")

    async def _queued_is(self, count: int) -> bool:
        return await self.queued() == count


@pytest.fixture
async def server(sidecar_factory: SidecarFactory, tmp_path: Path) -> AsyncIterator[Server]:
    record = tmp_path / "hooks.txt"
    port = free_port()
    sidecar = await sidecar_factory(config(record, port), env=pythonpath_env()).start()
    yield Server(sidecar, record, port)


async def running(turn: Turn, *, tool: bool = False) -> None:
    """Wait until ``turn`` streams text (or, with ``tool``, its tool call runs)."""
    if tool:
        await wait_until(lambda: "tool_input_available" in turn.kinds(), timeout=15, what="the tool runs")
    else:
        await wait_until(turn.text_seen, timeout=15, what="text streams")


async def test_reject_refuses_at_once_and_stores_nothing(server: Server) -> None:
    stub = server.stub
    first = chat(stub, "rej", "rej-a", "long")
    await running(first)
    # Its reply stored by its first checkpoint: the transcript compared below is then its whole.
    await wait_until(lambda: has_reply(stub, "rej", "tw-a-rej-a"), timeout=10, what="a checkpoint is stored")
    before = await transcript(stub, "rej")
    rejected = chat(stub, "rej", "rej-b", "short", REJECT)
    await asyncio.wait_for(rejected.task, 10)
    assert rejected.refused is not None and rejected.events == []
    assert rejected.refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = error_info(call_status(rejected.refused))
    assert info.reason == "TURN_IN_PROGRESS"
    assert info.metadata["running_request_id"] == "rej-a"
    assert await transcript(stub, "rej") == before  # nothing of rej-b stored
    # The running turn goes on untouched.
    first_end = await first.end()
    assert first_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert await transcript(stub, "rej") == ["user:u-rej-a", "assistant:tw-a-rej-a"]
    # Idle again: REJECT runs.
    again = chat(stub, "rej", "rej-c", "short", REJECT)
    assert (await again.end()).status == event_pb2.TURN_STATUS_COMPLETED


async def test_reject_sees_a_queued_turn(server: Server) -> None:
    stub = server.stub
    first = chat(stub, "rejq", "rejq-a", "endless")
    await running(first)
    chat(stub, "rejq", "rejq-b", "short")
    await server.wait_queued(1)
    rejected = chat(stub, "rejq", "rejq-c", "short", REJECT)
    await asyncio.wait_for(rejected.task, 10)
    assert rejected.refused is not None
    assert error_info(call_status(rejected.refused)).reason == "TURN_IN_PROGRESS"
    first.task.cancel()


@pytest.mark.parametrize("tool", [False, True], ids=["mid-text", "mid-tool"])
async def test_interrupt_stops_the_running_turn_and_runs_next_ahead_of_the_queue(
    server: Server, tool: bool
) -> None:
    stub = server.stub
    conv = f"int-{tool}"
    first = chat(stub, conv, f"{conv}-a", "tool" if tool else "endless")
    await running(first, tool=tool)
    q1 = chat(stub, conv, f"{conv}-q1", "short", ENQUEUE)
    await server.wait_queued(1)
    q2 = chat(stub, conv, f"{conv}-q2", "short")
    await server.wait_queued(2)
    interrupter = chat(stub, conv, f"{conv}-i", "short", INTERRUPT)

    end = await first.end()
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    info = error_info(end.error)
    assert info.reason == "INTERRUPTED"
    assert info.metadata["interrupting_request_id"] == f"{conv}-i"
    for turn in (interrupter, q1, q2):
        assert (await turn.end()).status == event_pb2.TURN_STATUS_COMPLETED

    # The interrupted turn's partial reply is stored; the interrupter ran next, then the queue.
    assert await transcript(stub, conv) == [
        f"user:u-{conv}-a",
        f"assistant:tw-a-{conv}-a",
        f"user:u-{conv}-i",
        f"assistant:tw-a-{conv}-i",
        f"user:u-{conv}-q1",
        f"assistant:tw-a-{conv}-q1",
        f"user:u-{conv}-q2",
        f"assistant:tw-a-{conv}-q2",
    ]
    partial = (await stored(stub, conv))[1]
    if tool:
        [call] = [p.tool_call for p in partial.parts if p.WhichOneof("kind") == "tool_call"]
        assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
        assert "aborted" in call.error_text
    else:
        text = "".join(p.text.text for p in partial.parts if p.WhichOneof("kind") == "text")
        assert text and is_prefix_of_repeats(text, ENDLESS), text

    lines = server.hook_lines()
    assert f"on_chat_response {conv}-a aborted interrupt {conv}-i" in lines
    assert f"before_turn {conv}-i interrupt {conv}-a" in lines
    assert f"before_turn {conv}-q1 enqueue -" in lines


@pytest.mark.parametrize("tool", [False, True], ids=["mid-text", "mid-tool"])
async def test_rollback_removes_what_the_running_turn_stored(server: Server, tool: bool) -> None:
    stub = server.stub
    conv = f"rb-{tool}"
    earlier = chat(stub, conv, f"{conv}-0", "short")
    assert (await earlier.end()).status == event_pb2.TURN_STATUS_COMPLETED
    before = await transcript(stub, conv)

    first = chat(stub, conv, f"{conv}-a", "tool" if tool else "endless")
    await running(first, tool=tool)
    # Its input and a checkpoint of its partial reply are stored by now.
    await wait_until(
        lambda: has_reply(stub, conv, f"tw-a-{conv}-a"),
        timeout=10,
        what="a checkpoint of the reply is stored",
    )
    q1 = chat(stub, conv, f"{conv}-q1", "short")
    await server.wait_queued(1)
    q2 = chat(stub, conv, f"{conv}-q2", "short")
    await server.wait_queued(2)
    roller = chat(stub, conv, f"{conv}-r", "short", ROLLBACK)

    end = await first.end()
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    info = error_info(end.error)
    assert info.reason == "ROLLED_BACK"
    assert info.metadata["interrupting_request_id"] == f"{conv}-r"
    assert "removed" in end.error.message
    assert not end.HasField("message")
    for turn in (roller, q1, q2):
        assert (await turn.end()).status == event_pb2.TURN_STATUS_COMPLETED

    # Exactly as before the rolled-back input, then the new input, then the queue in order.
    assert await transcript(stub, conv) == [
        *before,
        f"user:u-{conv}-r",
        f"assistant:tw-a-{conv}-r",
        f"user:u-{conv}-q1",
        f"assistant:tw-a-{conv}-q1",
        f"user:u-{conv}-q2",
        f"assistant:tw-a-{conv}-q2",
    ]
    lines = server.hook_lines()
    assert f"on_chat_response {conv}-a aborted rollback {conv}-r" in lines
    assert f"before_turn {conv}-r rollback {conv}-a" in lines


async def test_strategies_on_an_idle_conversation_just_run(server: Server) -> None:
    stub = server.stub
    for index, strategy in enumerate((REJECT, INTERRUPT, ROLLBACK)):
        turn = chat(stub, "idle", f"idle-{index}", "short", strategy)
        assert (await turn.end()).status == event_pb2.TURN_STATUS_COMPLETED
    assert len(await transcript(stub, "idle")) == 6
    assert "before_turn idle-1 interrupt -" in server.hook_lines()
    # A REJECT submission on the idle conversation takes its place at once and runs; the place
    # is its turn's, so a Chat after it runs too (nothing left holding the line).
    message = message_pb2.Message(id="u-idle-s", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "submitted"
    await stub.SubmitMessages(
        chat_service_pb2.SubmitMessagesRequest(
            conversation_id="idle",
            submission_id="idle-s",
            messages=[message],
            model="scripted:short",
            concurrent_input_strategy=REJECT,
        )
    )
    await wait_until(lambda: has_reply(stub, "idle", "tw-a-idle-s"), timeout=10, what="the submission ran")
    after = chat(stub, "idle", "idle-after", "short")
    assert (await after.end()).status == event_pb2.TURN_STATUS_COMPLETED
    assert (await transcript(stub, "idle"))[6:] == [
        "user:u-idle-s",
        "assistant:tw-a-idle-s",
        "user:u-idle-after",
        "assistant:tw-a-idle-after",
    ]


async def test_submissions_take_the_strategy_too(server: Server) -> None:
    """SubmitMessages: REJECT on a busy conversation stores no submission; INTERRUPT accepted
    while a turn runs stops it and its turn runs next, ahead of a queued Chat."""
    stub = server.stub
    first = chat(stub, "sub", "sub-a", "endless")
    await running(first)
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "submitted"
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.SubmitMessages(
            chat_service_pb2.SubmitMessagesRequest(
                conversation_id="sub",
                submission_id="sub-rejected",
                messages=[message],
                model="scripted:short",
                concurrent_input_strategy=REJECT,
            )
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(call_status(refused.value)).reason == "TURN_IN_PROGRESS"
    listed = await stub.ListSubmissions(chat_service_pb2.ListSubmissionsRequest(conversation_id="sub"))
    assert list(listed.submissions) == []

    queued = chat(stub, "sub", "sub-q", "short")
    await server.wait_queued(1)
    message.id = "u-sub-i"
    await stub.SubmitMessages(
        chat_service_pb2.SubmitMessagesRequest(
            conversation_id="sub",
            submission_id="sub-i",
            messages=[message],
            model="scripted:short",
            concurrent_input_strategy=INTERRUPT,
        )
    )
    end = await first.end()
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert error_info(end.error).metadata["interrupting_request_id"] == "sub-i"
    assert (await queued.end()).status == event_pb2.TURN_STATUS_COMPLETED
    assert await transcript(stub, "sub") == [
        "user:u-sub-a",
        "assistant:tw-a-sub-a",
        "user:u-sub-i",
        "assistant:tw-a-sub-i",
        "user:u-sub-q",
        "assistant:tw-a-sub-q",
    ]


GET_LOCATION = chat_service_pb2.ClientTool(name="get_location", description="runs on the client")


async def _pending_call(stub: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str) -> str:
    """Run a turn that ends with a call of the client tool pending; its tool call id."""
    message = message_pb2.Message(id=f"u-{conversation_id}-call", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "where am I?"
    request = chat_service_pb2.ChatRequest(
        conversation_id=conversation_id,
        request_id=f"{conversation_id}-call",
        message=message,
        model="scripted:client_call",
        client_tools=[GET_LOCATION],
    )
    assert (await Turn(stub, request).end()).status == event_pb2.TURN_STATUS_COMPLETED
    [call] = [p.tool_call for p in (await stored(stub, conversation_id))[-1].parts if p.HasField("tool_call")]
    return call.tool_call_id


def _results(
    conversation_id: str, call_id: str, request_id: str
) -> chat_service_pb2.SubmitToolResultsRequest:
    return chat_service_pb2.SubmitToolResultsRequest(
        conversation_id=conversation_id,
        request_id=request_id,
        results=[chat_service_pb2.ToolResult(tool_call_id=call_id, output_json='{"city": "Paris"}')],
        auto_continue=True,
        model="scripted:short",
        client_tools=[GET_LOCATION],
        concurrent_input_strategy=REJECT,
    )


async def test_reject_tool_results_are_refused_before_they_are_stored(server: Server) -> None:
    """SubmitToolResults with REJECT: on a busy conversation refused before the results are
    stored; on an idle one the results are stored and the continuation runs, and the place it
    took in line is its turn's (a Chat after it runs)."""
    stub = server.stub
    call_id = await _pending_call(stub, "rej-tools")
    first = chat(stub, "rej-tools", "rej-tools-a", "endless")
    await running(first)
    before = await stored(stub, "rej-tools")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in stub.SubmitToolResults(_results("rej-tools", call_id, "rej-tools-r")):
            pass
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(call_status(refused.value)).reason == "TURN_IN_PROGRESS"
    assert (await stored(stub, "rej-tools"))[:2] == before[:2]  # the call's message: nothing stored
    first.task.cancel()

    call_id = await _pending_call(stub, "idle-tools")
    events = [r.event async for r in stub.SubmitToolResults(_results("idle-tools", call_id, "idle-tools-r"))]
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    after = chat(stub, "idle-tools", "idle-tools-after", "short")
    assert (await after.end()).status == event_pb2.TURN_STATUS_COMPLETED
    assert (await transcript(stub, "idle-tools"))[-2:] == [
        "user:u-idle-tools-after",
        "assistant:tw-a-idle-tools-after",
    ]
