"""A call that ends after an OpenAI door stream began ends the stream with OpenAI's ``error`` event
(docs/api/openai.md#events), read by the official ``openai`` SDK, unmodified, over the door's real
routes (server/turnwire_server/http/openai_door.py) in process: the servicer's call is a stand-in
that sends the turn's start and then fails, as a store outage or a lost lease ends a stream.

Before, the error's own ``type`` (``server_error``) replaced the event's ``error``, so the SDK got an
event of no type it knows (``event: server_error``), which ``event.type == "error"`` never matched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx2
import openai
from google.rpc import error_details_pb2, status_pb2
from openai.types.responses import ResponseErrorEvent, ResponseStreamEvent
from pydantic import TypeAdapter
from starlette.applications import Starlette

from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.http.calls import STATUS_DETAILS_KEY, CallEnded
from turnwire_server.http.openai_door import ResponsesDoor

EVENT = TypeAdapter(ResponseStreamEvent)


def _store_outage() -> CallEnded:
    info = error_details_pb2.ErrorInfo(reason="STORE_UNAVAILABLE", domain="turnwire.dev")
    status = status_pb2.Status(code=grpc.StatusCode.UNAVAILABLE.value[0], message="the store is unavailable")
    status.details.add().Pack(info)
    return CallEnded(
        grpc.StatusCode.UNAVAILABLE, status.message, [(STATUS_DETAILS_KEY, status.SerializeToString())]
    )


class _StartsThenFails:
    """Calls whose turn stream sends its TurnStart and then ends with a store outage."""

    async def refusal(self, method: str, call: Any) -> None:
        """No caller is refused (``InProcessCalls.refusal``: the door asks before it reads)."""
        return None

    def stream(self, method: str, request: Any, call: Any) -> AsyncIterator[Any]:
        async def events() -> AsyncIterator[Any]:
            start = event_pb2.TurnEvent(
                conversation_id="c1", request_id=request.request_id, sequence_number=1
            )
            start.turn_start.model = "scripted:echo"
            yield chat_service_pb2.ChatResponse(event=start)
            raise _store_outage()

        return events()


async def test_a_stream_that_fails_after_it_began_ends_with_an_error_event() -> None:
    door = ResponsesDoor(_StartsThenFails(), 1 << 20)  # type: ignore[arg-type]
    app = Starlette(routes=door.routes())
    http = openai.DefaultAsyncHttpxClient(transport=httpx2.ASGITransport(app=app))
    async with openai.AsyncOpenAI(base_url="http://door/v1", api_key="unused", http_client=http) as client:
        stream = await client.responses.create(model="scripted:echo", input="hi", stream=True)
        events = [event.to_dict() async for event in stream]
    for event in events:
        EVENT.validate_python(event)
    assert [event["type"] for event in events] == ["response.created", "response.in_progress", "error"]
    error = ResponseErrorEvent.model_validate(events[-1])
    assert (error.message, error.code, error.param) == ("the store is unavailable", "store_unavailable", None)
    assert error.sequence_number == 2
