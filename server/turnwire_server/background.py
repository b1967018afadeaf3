"""What a started sidecar runs beside its RPCs: the recovery of the turns a crash interrupted
(docs/semantics.md §8), the maintenance sweep, the scheduler (docs/schedules.md), the webhook
outbox (docs/webhooks.md) and the delivery of detached sub-agents' answers (docs/subagents.md).
:mod:`turnwire_server.app` starts them in order; each is stopped with the sidecar."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from turnwire_server.api.schedule_rpcs import schedule_spec_of
from turnwire_server.api.status import status_of
from turnwire_server.api.submission_rpcs import turn_request_of
from turnwire_server.config import Settings
from turnwire_server.engine import TurnEngine
from turnwire_server.engine.budget_scopes import ended_periods
from turnwire_server.engine.detached_subagents import DetachedResults
from turnwire_server.engine.maintenance import Maintenance
from turnwire_server.engine.schedules import Scheduler
from turnwire_server.engine.settings import DurabilitySettings
from turnwire_server.engine.store_outage import until_stored
from turnwire_server.engine.submissions import Submissions
from turnwire_server.store import Store
from turnwire_server.store.errors import StoreUnreachable
from turnwire_server.webhooks import Signers, WebhookOutbox, WebhookSettings

if TYPE_CHECKING:
    pass


__all__ = [
    "build_scheduler",
    "deliver_detached_answers",
    "recover_turns",
    "start_maintenance",
    "start_webhooks",
    "sweep_detached_answers",
]

log = logging.getLogger("turnwire.server")

_BUDGET_ROWS_PER_SWEEP = 500
"""Budget rows of ended periods one maintenance sweep deletes at most (one transaction)."""


async def deliver_detached_answers(settings: Settings, detached: DetachedResults) -> None:
    """Submit the answers of detached sub-agents that a crash left undelivered: their turn's end
    stored, their submission not (docs/subagents.md, "Detached sub-agents"); those whose stream
    is still kept (``durability.event_retention_seconds``, 0: all). Waits out the database being
    unreachable as the recoveries do (a repeat is safe: the submission id is derived)."""
    names = {entry.name for entry in settings.subagents if entry.detached}
    if not names:
        return
    retention = settings.durability.event_retention_seconds
    since = (
        dt.datetime.now(dt.UTC) - dt.timedelta(seconds=retention)
        if retention > 0
        else dt.datetime.fromtimestamp(0, dt.UTC)
    )
    delivered = await until_stored(
        lambda: detached.reconcile(names, since),
        patience_seconds=settings.durability.store_outage_seconds,
        what="delivering detached sub-agents' answers",
        retry_on=StoreUnreachable,
    )
    if delivered:
        log.warning("delivered %d detached sub-agent answer(s) a crash had left undelivered", delivered)


def sweep_detached_answers(settings: Settings, detached: DetachedResults, maintenance: Maintenance) -> None:
    """Have every sweep deliver the detached answers left undelivered among the children that
    ended lately: another replica's crash in the gap (it may never restart), a delivery the store
    refused. Lately: two sweep intervals and a lease back, so a late sweep or the replicas'
    clocks apart miss none between sweeps (the start-up pass covers the rest)."""
    names = {entry.name for entry in settings.subagents if entry.detached}
    if not names:
        return
    durability = settings.durability
    window = dt.timedelta(seconds=2 * durability.sweep_interval_seconds + durability.lease_seconds)
    maintenance.add_hook("undelivered detached answers", lambda now: detached.reconcile(names, now - window))


async def recover_turns(settings: Settings, engine: TurnEngine, store: Store) -> Submissions:
    """Recover the turns a crash interrupted (``durability.recover_on_start``), then start the
    pending submissions; returns the submissions runner the API and the replica use. Each waits
    out the database being unreachable as the store's opening does (a replica restarted during a
    database restart; a claim is safe to repeat: it takes only what no live replica holds)."""
    patience = settings.durability.store_outage_seconds
    recovered = await until_stored(
        lambda: engine.recover(resume=settings.durability.recover_on_start),
        patience_seconds=patience,
        what="recovering interrupted turns",
        retry_on=StoreUnreachable,
    )
    if recovered:
        log.warning("found %d turn(s) interrupted by a previous crash", recovered)
    submissions = Submissions(
        engine,
        store,
        turn_request=lambda record: turn_request_of(record, settings.default_model),
        max_open=settings.durability.max_pending_submissions_per_conversation,
        max_running=settings.durability.max_running_submissions,
        error_status=status_of,
    )
    restarted = await until_stored(
        submissions.claim,
        patience_seconds=patience,
        what="claiming pending submissions",
        retry_on=StoreUnreachable,
    )
    if restarted:
        log.info("started %d pending submission(s)", restarted)
    return submissions


def build_scheduler(settings: Settings, store: Store, submissions: Submissions) -> Scheduler:
    """The replica's schedule loop (docs/schedules.md), started with the other loops. A fire's
    submission meets the same bound on a conversation's open submissions as SubmitMessages."""
    store.max_open_submissions = settings.durability.max_pending_submissions_per_conversation
    return Scheduler(
        store,
        spec_of=schedule_spec_of,
        claim=submissions.claim,
        poll_interval_seconds=settings.schedules.poll_interval_seconds,
        misfire_grace_seconds=settings.schedules.misfire_grace_seconds,
    )


def start_maintenance(
    durability: DurabilitySettings, engine: TurnEngine, submissions: Submissions
) -> Maintenance:
    """Start the retention sweeps, the expiry of pending submissions and tool calls
    (docs/semantics.md §12) and of ended budget periods' rows (docs/cost.md, "Budgets")."""
    maintenance = Maintenance(
        engine,
        interval_seconds=durability.sweep_interval_seconds,
        conversation_retention_seconds=durability.conversation_retention_seconds,
        event_retention_seconds=durability.event_retention_seconds,
    )
    maintenance.add_hook(
        "expired submissions",
        lambda now: submissions.expire(now, expiry_seconds=durability.pending_expiry_seconds),
    )
    store = engine.store
    # Rows of budget periods that ended (docs/cost.md, "Budgets"): read by nothing, one a day per
    # tenant and principal otherwise.
    maintenance.add_hook(
        "ended budget periods",
        lambda now: store.expire_budget_periods(*ended_periods(now), _BUDGET_ROWS_PER_SWEEP),
    )
    # Turns' own budget rows once their turn ended: read by nothing, one a turn otherwise, for as
    # long as its conversation lives.
    maintenance.add_hook(
        "ended turns' budgets", lambda now: store.expire_turn_budgets(_BUDGET_ROWS_PER_SWEEP)
    )
    if durability.pending_expiry_seconds > 0:
        expiry = dt.timedelta(seconds=durability.pending_expiry_seconds)
        maintenance.add_hook("expired tool calls", lambda now: store.expire_pending_tool_calls(now - expiry))
    maintenance.start()
    return maintenance


def start_webhooks(
    settings: WebhookSettings, store: Store, signers: Signers, replica_id: str, maintenance: Maintenance
) -> WebhookOutbox | None:
    """Start the webhook sender and its retention sweep when any target is configured (else no
    delivery can be made, and none is polled for); docs/webhooks.md."""
    if not settings.endpoints and not settings.allow_request_urls:
        return None
    outbox = WebhookOutbox(store, settings, signers, owner=replica_id)
    if settings.retention_seconds > 0:
        maintenance.add_hook("ended webhook deliveries", outbox.sweep)
    outbox.start()
    return outbox
