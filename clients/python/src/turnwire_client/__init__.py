"""Python client for the Turnwire sidecar.

``turnwire_client.v1`` holds the generated protobuf/gRPC code; this package adds an asyncio
client (:class:`TurnwireClient`), a synchronous one for scripts (:class:`SyncTurnwireClient`),
and plain Python views of what comes back (:class:`TurnResult`, :class:`ChatMessage`,
:class:`ToolCall`, :class:`Usage`)::

    import asyncio

    from turnwire_client import TurnwireClient, TurnwireError


    async def main() -> None:
        async with TurnwireClient("localhost:50051") as client:
            try:
                result = await client.chat("conv-1", "What's the weather in Paris?").collect()
            except TurnwireError as error:  # rejected before the turn started
                print(error.code, error.reason, error.field_violations)
                return
            print(result.status_name, result.text)
            for call in result.tool_calls:
                print(call.tool_name, call.input, call.output)  # dicts and plain values


    asyncio.run(main())

To render events as they arrive, iterate the stream (protobuf ``TurnEvent``\\ s) instead::

    async for event in client.chat("conv-1", "Hi"):
        if event.WhichOneof("event") == "text_delta":
            print(event.text_delta.delta, end="", flush=True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnwire_client._requests import TurnOptions
    from turnwire_client.client import TurnwireClient
    from turnwire_client.errors import ERROR_DOMAIN, ProtocolError, TlsMismatchError, TurnwireError
    from turnwire_client.metadata import PARENT_REQUEST_METADATA
    from turnwire_client.result import TurnResult, collect, collect_sync
    from turnwire_client.stream import TurnStream
    from turnwire_client.sync import SyncTurnStream, SyncTurnwireClient
    from turnwire_client.tls import TlsOptions
    from turnwire_client.values import (
        STEP_SEPARATOR,
        ChatMessage,
        Citation,
        MessageFile,
        Step,
        ToolCall,
        Usage,
        json_value,
    )

__all__ = [
    "ERROR_DOMAIN",
    "PARENT_REQUEST_METADATA",
    "STEP_SEPARATOR",
    "ChatMessage",
    "Citation",
    "MessageFile",
    "ProtocolError",
    "Step",
    "SyncTurnStream",
    "SyncTurnwireClient",
    "TlsMismatchError",
    "TlsOptions",
    "ToolCall",
    "TurnOptions",
    "TurnResult",
    "TurnStream",
    "TurnwireClient",
    "TurnwireError",
    "Usage",
    "collect",
    "collect_sync",
    "json_value",
]

_HOMES = {
    "TurnOptions": "_requests",
    "TurnwireClient": "client",
    "ERROR_DOMAIN": "errors",
    "ProtocolError": "errors",
    "TlsMismatchError": "errors",
    "TurnwireError": "errors",
    "PARENT_REQUEST_METADATA": "metadata",
    "TurnResult": "result",
    "collect": "result",
    "collect_sync": "result",
    "TurnStream": "stream",
    "SyncTurnStream": "sync",
    "SyncTurnwireClient": "sync",
    "TlsOptions": "tls",
    "STEP_SEPARATOR": "values",
    "ChatMessage": "values",
    "MessageFile": "values",
    "Citation": "values",
    "Step": "values",
    "ToolCall": "values",
    "Usage": "values",
    "json_value": "values",
}


def __getattr__(name: str) -> Any:
    # Loaded on first use (PEP 562): importing only the generated messages
    # (turnwire_client.v1.message_pb2, as the sidecar's engine does) loads no gRPC channel code.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
