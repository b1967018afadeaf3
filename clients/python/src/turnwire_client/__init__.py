"""Python client for the Turnwire sidecar.

``turnwire_client.v1`` holds the generated protobuf/gRPC code; this package adds a small asyncio
client on top::

    import asyncio

    from turnwire_client import TurnwireClient, TurnwireError, collect


    async def main() -> None:
        async with TurnwireClient("localhost:50051") as client:
            try:
                result = await collect(client.chat("conv-1", "What's the weather in Paris?"))
            except TurnwireError as error:  # rejected before the turn started
                print(error.code, error.reason, error.field_violations)
                return
            print(result.status_name, result.text)
            for call in result.tool_calls:
                print(call.tool_name, call.input, call.output)


    asyncio.run(main())

To render events as they arrive, iterate the stream instead of collecting it::

    async for event in client.chat("conv-1", "Hi"):
        if event.WhichOneof("event") == "text_delta":
            print(event.text_delta.delta, end="", flush=True)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnwire_client.client import TurnwireClient
    from turnwire_client.errors import ERROR_DOMAIN, ProtocolError, TurnwireError
    from turnwire_client.metadata import PARENT_REQUEST_METADATA
    from turnwire_client.result import TurnResult, collect
    from turnwire_client.stream import TurnStream
    from turnwire_client.tls import TlsOptions

__all__ = [
    "ERROR_DOMAIN",
    "PARENT_REQUEST_METADATA",
    "ProtocolError",
    "TlsOptions",
    "TurnResult",
    "TurnStream",
    "TurnwireClient",
    "TurnwireError",
    "collect",
]

_HOMES = {
    "TurnwireClient": "client",
    "ERROR_DOMAIN": "errors",
    "ProtocolError": "errors",
    "TurnwireError": "errors",
    "PARENT_REQUEST_METADATA": "metadata",
    "TurnResult": "result",
    "collect": "result",
    "TurnStream": "stream",
    "TlsOptions": "tls",
}


def __getattr__(name: str) -> Any:
    # Loaded on first use (PEP 562): importing only the generated messages
    # (turnwire_client.v1.message_pb2, as the sidecar's engine does) loads no gRPC channel code.
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
