"""A detached sub-agent's events stop joining the calling turn's stream once that turn starts
finishing (``TurnRun.takes_events``; docs/subagents.md, "Detached sub-agents"): the calling turn's
TurnEnd is prepared (numbered, stored) before it is sent and nothing may be sent in between, so a
child's event forwarded then made the TurnEnd unsendable and the caller's stream ended without it
(seen in tests/e2e/test_detached_subagents_e2e.py under load)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from turnwire.subagents import SubagentCall
from turnwire_client.v1 import chat_service_pb2
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.subagents import _forward_while_open, _Forwarder


class Child:
    """A detached child's handle: its channel yields ``responses``; ``detach`` is recorded."""

    def __init__(self, *responses: Any) -> None:
        self.responses = responses
        self.detached = False

    @property
    def channel(self) -> AsyncIterator[Any]:
        async def read() -> AsyncIterator[Any]:
            for response in self.responses:
                yield response

        return read()

    def detach(self) -> None:
        self.detached = True


def _delta(number: int) -> chat_service_pb2.ChatResponse:
    response = chat_service_pb2.ChatResponse()
    response.event.sequence_number = number
    response.event.text_delta.delta = "child's text"
    return response


async def test_a_detached_childs_event_after_the_caller_starts_finishing_is_not_forwarded() -> None:
    channel: EventChannel[Any] = EventChannel(100)
    writer = EventWriter("conv", "r-parent", chat_service_pb2.ChatResponse, channel)
    writer.new().turn_start.message_id = "a"
    end = writer.prepare()  # the caller is finishing: its TurnEnd is numbered
    end.event.turn_end.SetInParent()
    parent = SimpleNamespace(run=SimpleNamespace(takes_events=False, ended=False, writer=writer))
    child = Child(_delta(1), _delta(2))
    call = SubagentCall("call-1", "background", "conv:sub-1", "r-child")
    await _forward_while_open(child, parent, _Forwarder(parent, call))  # type: ignore[arg-type]
    assert child.detached  # it goes on without a reader
    writer.send(end)  # still the next event: nothing was sent in between
    assert writer.sequence_number == 2


async def test_a_detached_childs_event_while_the_caller_runs_is_nested_in_its_stream() -> None:
    channel: EventChannel[Any] = EventChannel(100)
    writer = EventWriter("conv", "r-parent", chat_service_pb2.ChatResponse, channel)
    parent = SimpleNamespace(run=SimpleNamespace(takes_events=True, ended=False, writer=writer))
    child = Child(_delta(1))
    call = SubagentCall("call-1", "background", "conv:sub-1", "r-child")
    await _forward_while_open(child, parent, _Forwarder(parent, call))  # type: ignore[arg-type]
    assert writer.sequence_number == 1 and not child.detached
