-- turnwire: readable-by 3
-- Context compaction (issue 12, docs/semantics.md §9): the view of a conversation's history
-- the model is sent once it was compacted. Non-destructive: the messages stay as they are;
-- one row per conversation holds the latest compaction, which covers every earlier one.
-- The model sees `summary` (a serialized turnwire.v1.Message, NULL when none) in place of the
-- messages up to and including `through_message_id`, then the rest, with the outputs of the
-- tool calls in `elided_calls` (a JSON array of [message id, tool call id] pairs) replaced by a placeholder.
CREATE TABLE compactions (
    conversation_id    TEXT    PRIMARY KEY REFERENCES conversations (id) ON DELETE CASCADE,
    through_message_id TEXT    NOT NULL,
    summary            BLOB,
    elided_calls       TEXT    NOT NULL,
    reason             TEXT    NOT NULL,
    strategy           TEXT    NOT NULL,
    tokens_before      INTEGER NOT NULL,
    tokens_after       INTEGER NOT NULL,
    create_time        INTEGER NOT NULL
);
