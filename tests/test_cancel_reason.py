"""A turn a plain cancel ended says who cancelled it: its TurnEnd and its stored turn, as
``ListTurns`` shows it (``api/turn_rpcs.turn_proto``), carry reason ``CANCELLED`` with
``cancel_cause`` (docs/semantics.md §10)."""

from __future__ import annotations

import asyncio

from google.rpc import code_pb2, error_details_pb2
from support.engine_harness import EngineFactory, collect, detail, end_of

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.api.turn_rpcs import turn_proto

SLOW = ScriptStep(text="a long answer " * 50, repeat=True)


async def test_a_cancelled_turn_is_listed_with_who_cancelled_it(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [SLOW]}, max_steps=1000)
    handle = await h.start("go", request_id="r-cancelled")
    cancelled: list[bool] = []

    def cancel_at_first_text(kind: str) -> None:
        if kind == "text_delta" and not cancelled:  # its input is stored: a TurnStart came first
            cancelled.append(h.engine.cancel("r-cancelled"))

    end = end_of(await collect(handle, on_event=cancel_at_first_text))
    assert cancelled == [True]
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    records, _ = await h.store.list_turns(handle.conversation_id, 10, "")
    listed = turn_proto(records[0])
    assert listed.status == event_pb2.TURN_STATUS_ABORTED
    for error in (end.error, listed.error):
        assert error.code == code_pb2.CANCELLED
        assert "CancelChat" in error.message
        info = detail(error, error_details_pb2.ErrorInfo)
        assert info.reason == "CANCELLED"
        assert dict(info.metadata) == {"cancel_cause": "cancel_request"}


async def test_a_turn_whose_caller_left_is_listed_so(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts={"main": [SLOW]}, max_steps=1000)
    handle = await h.start("go", request_id="r-left")
    async for response in handle:
        if response.event.HasField("text_delta"):  # its input is stored
            break
    handle.release()  # the call ended under disconnect CANCEL
    await asyncio.wait({handle.task})
    records, _ = await h.store.list_turns(handle.conversation_id, 10, "")
    info = detail(turn_proto(records[0]).error, error_details_pb2.ErrorInfo)
    assert (info.reason, dict(info.metadata)) == ("CANCELLED", {"cancel_cause": "caller_left"})
