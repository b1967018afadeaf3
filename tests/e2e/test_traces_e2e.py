"""Traces from a real ``turnwire serve``: OTLP/gRPC export to a receiver this test runs.

The receiver implements ``TraceService`` from ``opentelemetry-proto``'s generated stubs
(``support.otlp_receiver``). The sidecar runs a turn that calls a tool on a real tool host
process; the client's ``traceparent`` must reach the receiver as the turn span's parent, and the
tool host must receive the tool call span's trace context in its call's metadata.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import grpc
from support.otlp_receiver import otlp_receiver
from support.sidecar import SidecarFactory, free_port
from support.tool_host import ToolHostProcess
from support.traces import CALLER_SPAN_ID, TRACE_ID, TRACEPARENT
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

COLLECTOR_TOKEN = "tok-4f1c2a9e-secret"
SCRIPTS = {"sum": [{"tool_calls": [{"name": "add_big", "input": {"a": 2, "b": 3}}]}, {"text": "It is 5."}]}


async def test_turnwire_serve_exports_the_turns_spans_to_an_otlp_receiver(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    host = await ToolHostProcess(free_port(), tmp_path / "host.jsonl").start()
    try:
        async with otlp_receiver() as receiver:
            sidecar = await sidecar_factory(
                config={
                    "providers": {"scripted": {"scripts": SCRIPTS}},
                    "tools": {"hosts": [{"name": "calc", "address": host.address}]},
                    "tracing": {
                        "enabled": True,
                        "endpoint": receiver.endpoint,
                        "service_name": "turnwire-e2e",
                        "headers": {"x-collector-token": COLLECTOR_TOKEN},
                    },
                },
                # Export each batch at once rather than every 5 s (the SDK's own variable).
                env={"OTEL_BSP_SCHEDULE_DELAY": "50", "TURNWIRE_LOG_LEVEL": "debug"},
            ).start()
            message = message_pb2.Message(role=message_pb2.ROLE_USER)
            message.parts.add().text.text = "2 + 3?"
            async with grpc.aio.insecure_channel(sidecar.target) as channel:
                call = chat_service_pb2_grpc.ChatServiceStub(channel).Chat(
                    chat_service_pb2.ChatRequest(
                        conversation_id="otlp", message=message, model="scripted:sum"
                    ),
                    metadata=(("traceparent", TRACEPARENT),),
                )
                events = [response.event async for response in call]
            assert events[-1].turn_end.status == 1, events[-1]
            await wait_until(
                lambda: receiver.named("invoke_agent turnwire"), what="the turn span at the OTLP receiver"
            )
            await sidecar.terminate()
    finally:
        host.kill()

    # The configured headers go with every export, and never into the log.
    assert receiver.metadata and all(m.get("x-collector-token") == COLLECTOR_TOKEN for m in receiver.metadata)
    assert COLLECTOR_TOKEN not in sidecar.log_text()

    (turn,) = receiver.named("invoke_agent turnwire")
    assert turn.resource["service.name"] == "turnwire-e2e"
    assert int.from_bytes(turn.span.trace_id, "big") == TRACE_ID
    assert int.from_bytes(turn.span.parent_span_id, "big") == CALLER_SPAN_ID
    assert turn.attributes["gen_ai.conversation.id"] == "otlp"
    chats = receiver.named("chat sum")
    (tool,) = receiver.named("execute_tool add_big")
    assert len(chats) == 2
    for span in (*chats, tool):
        assert span.span.trace_id == turn.span.trace_id
        assert span.span.parent_span_id == turn.span.span_id, span.name
    assert tool.attributes["gen_ai.tool.name"] == "add_big"

    # The tool host got the tool span's context with its call.
    (started,) = host.events("started", "add_big")
    _version, trace_id, parent_id, _flags = started["traceparent"].split("-")
    assert (bytes.fromhex(trace_id), bytes.fromhex(parent_id)) == (turn.span.trace_id, tool.span.span_id)
    assert json.loads(started["input_json"]) == {"a": 2, "b": 3}


async def test_a_cancelled_turn_says_who_cancelled_it_in_its_span_and_log(
    sidecar_factory: SidecarFactory,
) -> None:
    """A turn cancelled by ``CancelChat`` and one whose client hung up: before, both ended
    ``aborted`` with nothing else in their spans, their logs or their metrics, so an operator
    could not tell a user's stop button from clients dropping their connections. The turn span's
    ``turnwire.turn.cancel_cause`` and an ``info`` line carrying the turn's ids say which."""
    slow = {"slow": [{"text": " ".join(f"w{n}" for n in range(200)), "delay_ms": 20}]}
    async with otlp_receiver() as receiver:
        sidecar = await sidecar_factory(
            config={
                "providers": {"scripted": {"scripts": slow}},
                "tracing": {"enabled": True, "endpoint": receiver.endpoint},
                "logging": {"format": "json"},
            },
            env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        ).start()
        async with TurnwireClient(sidecar.target) as client:
            stopped = client.chat("stopped", "go", model="scripted:slow", request_id="r-stopped")
            cancelled = False
            async for event in stopped:
                if event.HasField("text_delta") and not cancelled:
                    cancelled = await client.cancel_chat("r-stopped")
            assert cancelled
            left = client.chat("left", "go", model="scripted:slow", request_id="r-left")
            async for event in left:
                if event.HasField("text_delta"):
                    break  # the client hangs up
        await wait_until(
            lambda: len(receiver.named("invoke_agent turnwire")) == 2, what="both turn spans at the receiver"
        )
        await sidecar.terminate()

    causes = {
        span.attributes["turnwire.request_id"]: (
            span.attributes["turnwire.turn.status"],
            span.attributes.get("turnwire.turn.cancel_cause"),
        )
        for span in receiver.named("invoke_agent turnwire")
    }
    assert causes == {"r-stopped": ("aborted", "cancel_request"), "r-left": ("aborted", "caller_left")}
    lines = [json.loads(line) for line in sidecar.log_text().splitlines() if "cancelled: " in line]
    assert {(r["level"], r["conversation_id"], r["request_id"]) for r in lines} == {
        ("INFO", "stopped", "r-stopped"),
        ("INFO", "left", "r-left"),
    }, lines


async def test_the_spans_name_the_replica_that_ran_the_turn(sidecar_factory: SidecarFactory) -> None:
    """Before, each process's spans carried the SDK's random ``service.instance.id``, a UUID
    named nowhere else: with several replicas (or ``--workers``) a trace did not say which one ran
    the turn or recovered it. It is now the replica id the start-up line, the supervisor's worker
    lines and the store's ``application_name`` (``turnwire/<replica id>``) name."""
    async with otlp_receiver() as receiver:
        sidecar = await sidecar_factory(
            config={"tracing": {"enabled": True, "endpoint": receiver.endpoint}},
            env={"OTEL_BSP_SCHEDULE_DELAY": "50"},
        ).start()
        async with TurnwireClient(sidecar.target) as client:
            await collect(client.chat("which", "hi"))
        await wait_until(lambda: receiver.named("invoke_agent turnwire"), what="the turn span")
        await sidecar.terminate()
    replica = re.search(r"replica (replica-[0-9a-f]{12})", sidecar.log_text())
    assert replica is not None, sidecar.log_text()
    (turn,) = receiver.named("invoke_agent turnwire")
    assert turn.resource["service.instance.id"] == replica.group(1)
