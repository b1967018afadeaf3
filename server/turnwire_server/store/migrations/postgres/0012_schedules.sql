-- turnwire: readable-by 10
-- Schedules (issue 41, docs/schedules.md), mirroring migrations/sqlite/0012_schedules.sql: one row per schedule.
-- id: the key (with its tenant's prefix); state: active, paused, completed; spec: a serialized
-- turnwire.v1.Schedule (timing, input, policies; opaque to the store); next_fire_at: when it
-- fires next, microseconds since the Unix epoch, UTC (NULL once it will not fire again). A fire
-- claims the row (FOR UPDATE SKIP LOCKED on PostgreSQL), creates its submission and moves
-- next_fire_at on in one transaction: exactly once across replicas and restarts.
-- Expand-only: older code never reads the table.
CREATE TABLE schedules (
    id                 TEXT COLLATE "C" PRIMARY KEY,
    state              TEXT    NOT NULL,
    spec               BYTEA   NOT NULL,
    next_fire_at       BIGINT,
    fire_count         BIGINT  NOT NULL DEFAULT 0,
    skipped_count      BIGINT  NOT NULL DEFAULT 0,
    last_fire_at       BIGINT,
    last_submission_id TEXT,
    principal          TEXT,
    create_time        BIGINT  NOT NULL,
    update_time        BIGINT  NOT NULL
);
-- The scheduler's poll: the active schedules that are due, most overdue first.
CREATE INDEX schedules_due ON schedules (next_fire_at) WHERE state = 'active';
