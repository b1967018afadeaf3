"""A synchronous client for scripts: the calls of :class:`~turnwire_client.TurnwireClient`
without ``async``/``await``, on gRPC's own (thread-based) channel::

    from turnwire_client.sync import SyncTurnwireClient

    with SyncTurnwireClient("localhost:50051") as client:
        result = client.chat("conv-1", "What's the weather in Paris?").collect()
        print(result.text)

Every method takes the same arguments and raises the same errors as its async namesake; turn
streams are :class:`SyncTurnStream`, plain iterators of ``TurnEvent``.

:class:`SyncTurnwireClient` is generated from the async client (``_sync_client.py``, by
tools/generate_sync_client.py with unasync; ``make lint`` fails when it is out of date);
:class:`SyncTurnStream` is written by hand (``sync_stream.py``).
"""

from __future__ import annotations

from turnwire_client._sync_client import SyncTurnwireClient
from turnwire_client.sync_stream import SyncTurnStream

__all__ = ["SyncTurnStream", "SyncTurnwireClient"]
