-- turnwire: readable-by 10
-- Webhooks (issue 41, docs/webhooks.md), mirroring migrations/sqlite/0013_webhooks.sql: a
-- submission may name a webhook target; when it ends, a delivery row is written in the same
-- transaction that records the end (a durable outbox: a replica killed right after the turn's end
-- still has its call made, by whichever replica claims the row next). Times are BIGINT microseconds
-- since the Unix epoch, UTC. Expand-only: older code never reads these columns or tables.

-- The submission's target: a configured endpoint's name, or a per-request URL (one of the two).
ALTER TABLE submissions ADD COLUMN webhook_endpoint TEXT;
ALTER TABLE submissions ADD COLUMN webhook_url TEXT;

-- One row per reported submission end. `id` is the `webhook-id` header of every attempt.
CREATE TABLE webhook_deliveries (
    id                TEXT    PRIMARY KEY,
    submission_id     TEXT    NOT NULL UNIQUE,
    conversation_id   TEXT    NOT NULL,
    endpoint          TEXT,
    url               TEXT,
    -- turn.completed, turn.failed, turn.cancelled, turn.skipped.
    event_type        TEXT    NOT NULL,
    -- The submission's final state and error (serialized google.rpc.Status), copied at its end:
    -- the payload is made from these, the same bytes on every attempt.
    submission_state  TEXT    NOT NULL,
    error             BYTEA,
    create_time       BIGINT  NOT NULL,
    -- pending, delivered, failed.
    state             TEXT    NOT NULL DEFAULT 'pending',
    attempt_count     INTEGER NOT NULL DEFAULT 0,
    next_attempt_time BIGINT,
    end_time          BIGINT,
    -- The replica making an attempt, until when (a lapsed lease is claimed by another).
    owner             TEXT,
    lease_until       BIGINT
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_time) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_conversation ON webhook_deliveries (conversation_id);
CREATE INDEX webhook_deliveries_by_time ON webhook_deliveries (create_time, id);

-- Every attempt: stored when it starts (so an attempt cut short by a crash is still listed),
-- completed when it ends.
CREATE TABLE webhook_attempts (
    delivery_id  TEXT    NOT NULL REFERENCES webhook_deliveries (id) ON DELETE CASCADE,
    attempt      INTEGER NOT NULL,
    start_time   BIGINT  NOT NULL,
    duration_us  BIGINT,
    http_status  INTEGER,
    error        TEXT,
    PRIMARY KEY (delivery_id, attempt)
);
