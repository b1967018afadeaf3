"""The health service follows the store (issue 34, docs/operate/outages.md): NOT_SERVING while
the database is unreachable, SERVING again once it answers.

A load balancer or Kubernetes readiness probe acting on ``grpc.health.v1`` then sends new calls
to replicas that can serve them, while this one refuses its own at once (``UNAVAILABLE`` with a
``RetryInfo`` delay: :class:`~turnwire_server.store.StoreUnreachable`). The store knows (its
``reachable`` flag, :class:`~turnwire_server.store.ReachableStore`); this only reads it every
:data:`POLL_SECONDS`, a plain attribute read, so it costs nothing per call. A store without the
flag (SQLite) is never watched.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from turnwire_server.event_waits import cancelled
from turnwire_server.store import ReachableStore, Store

__all__ = ["POLL_SECONDS", "StoreHealth"]

log = logging.getLogger("turnwire.health")

POLL_SECONDS: Final = 0.25
"""How often the store's reachability is read (a flag; the store's own probe sets it)."""


class StoreHealth:
    """Sets ``services`` (``""`` for the whole server, then each service name) NOT_SERVING on
    ``health`` while ``store`` is unreachable and SERVING when it is back, until :meth:`stop`.

    Started after the sidecar announced SERVING; stopped before draining or shutting down (they
    own the health status from then on).
    """

    def __init__(self, store: Store, health: health_aio.HealthServicer, services: Sequence[str]) -> None:
        self._store = store if isinstance(store, ReachableStore) else None
        self._health = health
        self._services = tuple(services)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start watching (a no-op for a store without a reachability flag, or when started)."""
        if self._store is not None and self._task is None:
            self._task = asyncio.create_task(self._watch(self._store), name="store health")

    async def stop(self) -> None:
        """Stop watching; the health status stays as last set. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            await cancelled(task)

    async def _watch(self, store: ReachableStore) -> None:
        serving = True
        while True:
            await asyncio.sleep(POLL_SECONDS)  # a polling period: the flag has no wake-up
            reachable = store.reachable
            if reachable == serving:
                continue
            serving = reachable
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if serving
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for service in self._services:
                await self._health.set(service, status)
            log.warning(
                "health: %s (the store's database %s)",
                "SERVING" if serving else "NOT_SERVING",
                "answers again" if serving else "is unreachable",
            )
