"""The store interface: the role protocols joined for the engine and the application.

One interface, two backends: SQLite (WAL, one process), the embedded default, and
PostgreSQL (``store/postgres/``), which several replicas share: it carries the turn lock of
:meth:`~turnwire_server.store.turns.TurnStore.turn_lock`, turn leases, cancel requests and event
wake-ups across them. The engine calls only what is here and in the role modules, one a role:
``transcripts.py``, ``turns.py`` (with the durability rules, docs/semantics.md §8),
``streams.py``, ``submissions.py``, ``replicas.py``, ``budgets.py``, ``maintenance.py``,
``schedules.py`` and ``webhooks.py``; what they take and return is in ``records.py``, what they
raise in ``errors.py``.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from turnwire_server.store.budgets import BudgetStore
from turnwire_server.store.maintenance import MaintenanceStore
from turnwire_server.store.replicas import ReplicaStore
from turnwire_server.store.schedules import ScheduleStore
from turnwire_server.store.streams import StreamStore
from turnwire_server.store.submissions import SubmissionStore
from turnwire_server.store.transcripts import TranscriptStore
from turnwire_server.store.turns import TurnStore
from turnwire_server.store.webhooks import WebhookStore

__all__ = [
    "EngineStore",
    "ReachableStore",
    "ReplayStore",
    "Store",
    "TurnRunStore",
]


@runtime_checkable
class TurnRunStore(TurnStore, TranscriptStore, BudgetStore, Protocol):
    """What a running turn uses (``engine/turn.py``, ``engine/step_loop.py``): its lifecycle, its
    conversation's transcript and its budgets."""


@runtime_checkable
class ReplayStore(StreamStore, TurnStore, TranscriptStore, Protocol):
    """What following a turn's events uses (``engine/resume.py``): its stream, its record when
    it has no stream yet, and its record and reply when its stream lacks a TurnEnd."""


@runtime_checkable
class EngineStore(
    TranscriptStore,
    TurnStore,
    StreamStore,
    SubmissionStore,
    ReplicaStore,
    MaintenanceStore,
    BudgetStore,
    Protocol,
):
    """Every role, for the engine that hands each collaborator the role it uses; opening and
    closing the store are the application's (:class:`Store`)."""


@runtime_checkable
class ReachableStore(Protocol):
    """A store that knows when its database is gone (PostgreSQL: the listener's round trips,
    docs/operate/outages.md); the application reports it on the health service. A store
    without it (SQLite: a file, never "gone") counts as always reachable."""

    @property
    def reachable(self) -> bool:
        """False while the database is known unreachable (work is refused at once meanwhile)."""
        ...


@runtime_checkable
class Store(EngineStore, ScheduleStore, WebhookStore, Protocol):
    """Persistence for conversations, messages and turns.

    The union of the role protocols (the engine's collaborators take the role they use), plus
    opening and closing. All methods raise :class:`~turnwire_server.store.errors.StoreError` (or
    a subclass) when the backend fails. Messages are ``turnwire.v1.Message`` protos and round-trip
    losslessly.
    """

    async def open(self) -> None:
        """Connect and run pending schema migrations."""
        ...

    async def close(self) -> None:
        """Flush pending writes and disconnect."""
        ...
