-- Initial schema, mirroring migrations/sqlite/0001_init.sql. Times are BIGINT microseconds
-- since the Unix epoch, UTC; serialized protos are BYTEA; ids are TEXT COLLATE "C" so they order by
-- code point, as in SQLite (list_conversations breaks ties on the id).

CREATE TABLE conversations (
    id            TEXT    COLLATE "C" PRIMARY KEY,
    create_time   BIGINT  NOT NULL,
    update_time   BIGINT  NOT NULL,
    message_count BIGINT  NOT NULL DEFAULT 0
);

-- list_conversations: most recently updated first, keyset on (update_time, id).
CREATE INDEX conversations_by_update ON conversations (update_time, id);

CREATE TABLE messages (
    conversation_id   TEXT    COLLATE "C" NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    id                TEXT    COLLATE "C" NOT NULL,
    -- Append order within the conversation, from 1; kept when the message is replaced.
    seq               BIGINT  NOT NULL,
    -- turnwire.v1.Role enum number (open enum: unknown numbers round-trip).
    role              INTEGER NOT NULL,
    -- Message.create_time in microseconds, NULL when unset; create_time_nanos holds the
    -- sub-microsecond remainder (0..999) so the Timestamp round-trips exactly.
    create_time       BIGINT,
    create_time_nanos INTEGER NOT NULL DEFAULT 0,
    -- Serialized google.protobuf.Struct, NULL when unset.
    metadata          BYTEA,
    PRIMARY KEY (conversation_id, id),
    UNIQUE (conversation_id, seq)
);

CREATE TABLE parts (
    conversation_id TEXT    COLLATE "C" NOT NULL,
    message_id      TEXT    COLLATE "C" NOT NULL,
    idx             INTEGER NOT NULL,
    -- Name of the Part `kind` oneof field set; NULL when none is. Informational: `data` is
    -- authoritative.
    kind            TEXT,
    -- Serialized turnwire.v1.Part: every field, unknown ones included, round-trips.
    data            BYTEA   NOT NULL,
    PRIMARY KEY (conversation_id, message_id, idx),
    FOREIGN KEY (conversation_id, message_id)
        REFERENCES messages (conversation_id, id) ON DELETE CASCADE
);

CREATE TABLE turns (
    request_id           TEXT    COLLATE "C" PRIMARY KEY,
    conversation_id      TEXT    COLLATE "C" NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    assistant_message_id TEXT    COLLATE "C" NOT NULL,
    continuation         INTEGER NOT NULL,
    model                TEXT    NOT NULL,
    -- running, completed, error, aborted, interrupted, skipped.
    state                TEXT    NOT NULL,
    start_time           BIGINT  NOT NULL,
    end_time             BIGINT,
    -- Serialized google.rpc.Status when state is 'error'.
    error                BYTEA,
    recovery_count       INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX turns_by_conversation ON turns (conversation_id);

-- running_turns() after a crash reads only this small subset.
CREATE INDEX turns_running ON turns (start_time) WHERE state = 'running';
