-- turnwire: readable-by 1
-- Durable turns (issue 10), mirroring migrations/sqlite/0002_durable_turns.sql: resumable
-- event streams, submissions, recovery data. Times are BIGINT microseconds since the Unix
-- epoch, UTC.

-- What a recovery needs to run the turn again (JSON text); NULL for older turns.
ALTER TABLE turns ADD COLUMN spec TEXT;

-- One row per turn stream; its events are in turn_events.
CREATE TABLE turn_streams (
    request_id           TEXT    COLLATE "C" PRIMARY KEY,
    conversation_id      TEXT    COLLATE "C" NOT NULL,
    last_sequence_number BIGINT  NOT NULL DEFAULT 0,
    create_time          BIGINT  NOT NULL,
    end_time             BIGINT,
    events_expired       INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX turn_streams_by_conversation ON turn_streams (conversation_id);
CREATE INDEX turn_streams_by_end ON turn_streams (end_time) WHERE end_time IS NOT NULL AND events_expired = 0;

-- A stream's events, one row per batch; `data` frames each event as its sequence number
-- (8 bytes, big-endian), its length (4 bytes, big-endian) and the serialized TurnEvent.
CREATE TABLE turn_events (
    request_id            TEXT    COLLATE "C" NOT NULL REFERENCES turn_streams (request_id) ON DELETE CASCADE,
    first_sequence_number BIGINT  NOT NULL,
    last_sequence_number  BIGINT  NOT NULL,
    data                  BYTEA   NOT NULL,
    PRIMARY KEY (request_id, first_sequence_number)
);

-- Durable submissions (docs/semantics.md §7). No foreign key to conversations: the
-- conversation is created when the submission's turn runs.
CREATE TABLE submissions (
    -- Also the request id of its turn.
    id               TEXT    COLLATE "C" PRIMARY KEY,
    conversation_id  TEXT    COLLATE "C" NOT NULL,
    idempotency_key  TEXT    COLLATE "C",
    -- pending, running, completed, error, aborted, skipped.
    state            TEXT    NOT NULL,
    -- Serialized turnwire.v1.SubmitMessagesRequest as accepted (ids assigned).
    request          BYTEA   NOT NULL,
    -- Order of acceptance, from 1: FIFO and ListSubmissions paging.
    seq              BIGINT  NOT NULL UNIQUE,
    create_time      BIGINT  NOT NULL,
    start_time       BIGINT,
    end_time         BIGINT,
    -- Serialized google.rpc.Status when it failed or was aborted.
    error            BYTEA
);

CREATE UNIQUE INDEX submissions_by_key ON submissions (conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX submissions_by_conversation ON submissions (conversation_id, seq);
CREATE INDEX submissions_open ON submissions (seq) WHERE state IN ('pending', 'running');
