-- Initial schema. Times are integer microseconds since the Unix epoch, UTC.

CREATE TABLE conversations (
    id            TEXT    PRIMARY KEY,
    create_time   INTEGER NOT NULL,
    update_time   INTEGER NOT NULL,
    message_count INTEGER NOT NULL DEFAULT 0
);

-- list_conversations: most recently updated first, keyset on (update_time, id).
CREATE INDEX conversations_by_update ON conversations (update_time, id);

CREATE TABLE messages (
    conversation_id   TEXT    NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    id                TEXT    NOT NULL,
    -- Append order within the conversation, from 1; kept when the message is replaced.
    seq               INTEGER NOT NULL,
    -- turnwire.v1.Role enum number (open enum: unknown numbers round-trip).
    role              INTEGER NOT NULL,
    -- Message.create_time in microseconds, NULL when unset; create_time_nanos holds the
    -- sub-microsecond remainder (0..999) so the Timestamp round-trips exactly.
    create_time       INTEGER,
    create_time_nanos INTEGER NOT NULL DEFAULT 0,
    -- Serialized google.protobuf.Struct, NULL when unset.
    metadata          BLOB,
    PRIMARY KEY (conversation_id, id),
    UNIQUE (conversation_id, seq)
);

CREATE TABLE parts (
    conversation_id TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    idx             INTEGER NOT NULL,
    -- Name of the Part `kind` oneof field set (text, reasoning, tool_call, file, source,
    -- data, step_start); NULL when none is. Informational: `data` is authoritative.
    kind            TEXT,
    -- Serialized turnwire.v1.Part: every field, unknown ones included, round-trips.
    data            BLOB    NOT NULL,
    PRIMARY KEY (conversation_id, message_id, idx),
    FOREIGN KEY (conversation_id, message_id)
        REFERENCES messages (conversation_id, id) ON DELETE CASCADE
);

CREATE TABLE turns (
    request_id           TEXT    PRIMARY KEY,
    conversation_id      TEXT    NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    assistant_message_id TEXT    NOT NULL,
    continuation         INTEGER NOT NULL,
    model                TEXT    NOT NULL,
    -- running, completed, error, aborted, interrupted, skipped.
    state                TEXT    NOT NULL,
    start_time           INTEGER NOT NULL,
    end_time             INTEGER,
    -- Serialized google.rpc.Status when state is 'error'.
    error                BLOB,
    recovery_count       INTEGER NOT NULL DEFAULT 0
);

CREATE INDEX turns_by_conversation ON turns (conversation_id);

-- running_turns() after a crash reads only this small subset.
CREATE INDEX turns_running ON turns (start_time) WHERE state = 'running';
