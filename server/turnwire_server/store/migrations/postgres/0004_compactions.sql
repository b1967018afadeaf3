-- turnwire: readable-by 3
-- Context compaction (issue 12), mirroring migrations/sqlite/0004_compactions.sql: the latest
-- compacted view of each conversation's history (the messages themselves never change).
-- `summary` is a serialized turnwire.v1.Message (NULL when none) standing for the messages up
-- to and including `through_message_id`; `elided_calls` a JSON array of [message id, tool call id] pairs whose
-- outputs the model is no longer sent. Times are BIGINT microseconds since the epoch, UTC.
CREATE TABLE compactions (
    conversation_id    TEXT   COLLATE "C" PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
    through_message_id TEXT   COLLATE "C" NOT NULL,
    summary            BYTEA,
    elided_calls       TEXT   NOT NULL,
    reason             TEXT   NOT NULL,
    strategy           TEXT   NOT NULL,
    tokens_before      BIGINT NOT NULL,
    tokens_after       BIGINT NOT NULL,
    create_time        BIGINT NOT NULL
);
