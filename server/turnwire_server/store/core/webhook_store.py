"""The webhook outbox's store methods, once for both drivers: each driver's store class inherits
:class:`CoreWebhooks` beside :class:`~.writes.CoreWrites` and :class:`~.reads.CoreReads`, whose
``_commit`` and ``_read`` it uses. The contract is
:class:`~turnwire_server.store.webhooks.WebhookStore`'s (docs/webhooks.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from turnwire_server.store.core import webhook_writes
from turnwire_server.store.core.local_lock import LocalTurnLocks
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.sql import Dialect, Program
from turnwire_server.store.core.writes import ALONE, Commit
from turnwire_server.store.webhooks import AttemptResult, WebhookDeliveryRecord

__all__ = ["CoreWebhooks"]

T = TypeVar("T")


class CoreWebhooks:
    """:class:`~turnwire_server.store.webhooks.WebhookStore` on the driver's ``_commit`` and
    ``_read``."""

    _dialect: Dialect
    _locks: LocalTurnLocks | None = None

    async def _commit(self, what: str, program: Callable[[int], Program[T]], how: Commit = ALONE) -> T:
        """The driver's (:meth:`~.writes.CoreWrites._commit`)."""
        raise NotImplementedError

    async def _read(self, what: str, sql: str, params: Sequence[Any]) -> list[Any]:
        """The driver's (:meth:`~.reads.CoreReads._read`)."""
        raise NotImplementedError

    async def claim_webhook_deliveries(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[WebhookDeliveryRecord]:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        now_us, until_us = to_us(now, "now"), to_us(lease_until, "lease_until")
        # One process per store (SQLite: _locks are in memory) means every other owner is dead.
        single = self._locks is not None
        return await self._commit(
            "claim_webhook_deliveries",
            lambda _: webhook_writes.claim_deliveries(
                owner, now_us, until_us, limit, single_process=single, dialect=self._dialect
            ),
        )

    async def finish_webhook_attempt(
        self, delivery_id: str, owner: str, attempt: int, result: AttemptResult, now: dt.datetime
    ) -> bool:
        now_us = to_us(now, "now")
        return await self._commit(
            f"finish_webhook_attempt({delivery_id!r}, {attempt})",
            lambda _: webhook_writes.finish_attempt(
                delivery_id, owner, attempt, result, now_us=now_us, dialect=self._dialect
            ),
        )

    async def list_webhook_deliveries(
        self,
        page_size: int,
        page_token: str,
        *,
        submission_id: str = "",
        conversation_id: str = "",
        state: str = "",
        id_prefix: str = "",
    ) -> tuple[list[WebhookDeliveryRecord], str]:
        filters = {
            "submission_id": submission_id,
            "conversation_id": conversation_id,
            "state": state,
            "id_prefix": id_prefix,
        }
        sql, params = webhook_writes.delivery_page_query(page_size, page_token, **filters)
        rows = await self._read("list_webhook_deliveries", sql, params)
        attempts = {}
        if rows:
            ids = [row[0] for row in rows[:page_size]]
            sql, params = webhook_writes.attempts_query(ids)
            attempts = webhook_writes.attempts_from_rows(
                await self._read("list_webhook_attempts", sql, params)
            )
        return webhook_writes.delivery_page(rows, attempts, page_size, **filters)

    async def delete_webhook_deliveries(self, ended_before: dt.datetime, limit: int) -> int:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        before_us = to_us(ended_before, "ended_before")
        return await self._commit(
            "delete_webhook_deliveries",
            lambda _: webhook_writes.delete_ended_deliveries(before_us, limit, self._dialect),
        )
