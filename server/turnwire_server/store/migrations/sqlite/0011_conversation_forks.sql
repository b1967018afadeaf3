-- turnwire: readable-by 11
-- Conversation forks (issue 41, docs/forks.md): a fork holds its source's messages up to a point
-- without copying them. Code before this migration would write a forked conversation's shared
-- messages in place and number a fork's new messages from 1, so it may not run on it.
--
-- `fork_ancestors` lists, for a fork, every conversation it reads shared messages from: its source
-- at depth 1, the source's own sources deeper, each with `through_seq`, the last position it
-- shares (the smallest fork point along the chain). A message of an ancestor at a position up to
-- `through_seq` belongs to the fork's history unless the fork or a nearer ancestor holds a
-- message of that id (its own copy, written on the first change: copy-on-write).
-- `conversations.seq_floor` is the position new messages go after: a fork's fork point, and for a
-- source the largest position a fork shares, so a source never reuses a shared position.
-- `forked_from_*` name the fork's source and the message it was forked at (kept when the source
-- is deleted: history, not a reference).
ALTER TABLE conversations ADD COLUMN forked_from_conversation_id TEXT;
ALTER TABLE conversations ADD COLUMN forked_from_message_id TEXT;
ALTER TABLE conversations ADD COLUMN seq_floor INTEGER NOT NULL DEFAULT 0;

CREATE TABLE fork_ancestors (
    conversation_id TEXT    NOT NULL,
    ancestor_id     TEXT    NOT NULL,
    depth           INTEGER NOT NULL,
    through_seq     INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, depth)
);

-- A source's forks (copy-on-write pushes, deletion): by ancestor, nearest first.
CREATE INDEX fork_ancestors_by_ancestor ON fork_ancestors (ancestor_id, depth);
