-- turnwire: readable-by 1
-- Durable turns (issue 10): resumable event streams, submissions, recovery data.
-- Times are integer microseconds since the Unix epoch, UTC.

-- What a recovery needs to run the turn again: the request's body, client tools
-- and whether it continued, as JSON text (the model is in `model`, the input in
-- `messages`). NULL for turns recorded before this migration.
ALTER TABLE turns ADD COLUMN spec TEXT;

-- One row per turn stream (every request id that sent an event). The stream's
-- events are in turn_events; `end_time` is set with its TurnEnd, and
-- `events_expired` once retention removed its events (so ResumeTurn can say so).
CREATE TABLE turn_streams (
    request_id           TEXT    PRIMARY KEY,
    conversation_id      TEXT    NOT NULL,
    last_sequence_number INTEGER NOT NULL DEFAULT 0,
    create_time          INTEGER NOT NULL,
    end_time             INTEGER,
    events_expired       INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX turn_streams_by_conversation ON turn_streams (conversation_id);
CREATE INDEX turn_streams_by_end ON turn_streams (end_time) WHERE end_time IS NOT NULL AND events_expired = 0;

-- A stream's events, one row per batch (stored at checkpoint cadence): a row per event
-- would cost an insert per token.
CREATE TABLE turn_events (
    request_id            TEXT    NOT NULL REFERENCES turn_streams (request_id) ON DELETE CASCADE,
    first_sequence_number INTEGER NOT NULL,
    last_sequence_number  INTEGER NOT NULL,
    -- The batch's events in order, each framed as its sequence number (8 bytes, big-endian),
    -- its length (4 bytes, big-endian) and the serialized turnwire.v1.TurnEvent.
    data                  BLOB    NOT NULL,
    PRIMARY KEY (request_id, first_sequence_number)
) WITHOUT ROWID;

-- Durable submissions (docs/semantics.md §7). No foreign key to conversations: the
-- conversation is created when the submission's turn runs.
CREATE TABLE submissions (
    -- Also the request id of its turn.
    id               TEXT    PRIMARY KEY,
    conversation_id  TEXT    NOT NULL,
    idempotency_key  TEXT,
    -- pending, running, completed, error, aborted, skipped.
    state            TEXT    NOT NULL,
    -- Serialized turnwire.v1.SubmitMessagesRequest as accepted (ids assigned).
    request          BLOB    NOT NULL,
    -- Order of acceptance, from 1: FIFO and ListSubmissions paging.
    seq              INTEGER NOT NULL UNIQUE,
    create_time      INTEGER NOT NULL,
    start_time       INTEGER,
    end_time         INTEGER,
    -- Serialized google.rpc.Status when it failed or was aborted.
    error            BLOB
);

CREATE UNIQUE INDEX submissions_by_key ON submissions (conversation_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX submissions_by_conversation ON submissions (conversation_id, seq);
CREATE INDEX submissions_open ON submissions (seq) WHERE state IN ('pending', 'running');
