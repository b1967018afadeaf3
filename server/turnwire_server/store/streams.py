"""The store's stream role: a turn's event stream, kept for ResumeTurn (docs/semantics.md §8,
resumable streams)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from turnwire_server.store.records import StreamRecord, TurnLease

__all__ = ["StreamStore"]


@runtime_checkable
class StreamStore(Protocol):
    """A turn's event stream, kept for ResumeTurn (docs/semantics.md §8)."""

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
        lease: TurnLease | None = None,
    ) -> None:
        """Durably store ``events`` (``(sequence_number, serialized TurnEvent)``, ascending) of
        a turn's stream, creating the stream on its first batch; ``ended`` marks the batch
        holding its TurnEnd. A batch starting at sequence number 1 for a stream that already
        ended replaces it (a retry under the same request id). With the turn's ``lease`` it
        raises :class:`LeaseLost` (storing nothing) once another replica took the turn over
        (docs/semantics.md §5, "Fencing")."""
        ...

    async def get_stream(self, request_id: str) -> StreamRecord | None:
        """The stream of ``request_id``, or None when none was stored (or it was deleted)."""
        ...

    async def load_events(self, request_id: str, after: int, before: int | None = None) -> list[bytes]:
        """Serialized events with ``after < sequence_number < before`` (no upper bound when
        ``before`` is None), in order."""
        ...

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """Wait until turn ``request_id`` has stored events past ``after`` or ended, at most
        ``timeout_seconds`` (a reader following a turn another replica runs). False when this
        store cannot follow other processes (one process per store: nothing else writes)."""
        ...
