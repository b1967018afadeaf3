-- turnwire: readable-by 4
-- Per-turn reads independent of history length (issue 17), mirroring
-- migrations/sqlite/0006_history_versions.sql: a reader that keeps a conversation's decoded
-- messages asks only for the messages changed since the version it holds.
-- `conversations.history_version` counts every change to the conversation's messages or parts;
-- `messages.version` is that counter's value at the message's last change (its row or a part);
-- `conversations.history_epoch` counts removals of messages (a reader then reloads everything).
-- Triggers keep them, so a replica on the previous schema, an operator's SQL or any future write
-- path keeps them right too (expand-only: older code never reads these columns). The counter's
-- row lock orders a conversation's writers, so versions commit in increasing order.
-- Rows written before this migration have version 0, which only a full read returns.
ALTER TABLE conversations ADD COLUMN history_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN history_epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
CREATE INDEX messages_by_version ON messages (conversation_id, version);

CREATE FUNCTION turnwire_history_bump(conversation TEXT, removed BOOLEAN) RETURNS BIGINT
LANGUAGE plpgsql AS $$
DECLARE
    bumped BIGINT;
BEGIN
    UPDATE conversations
        SET history_version = history_version + 1,
            history_epoch = history_epoch + CASE WHEN removed THEN 1 ELSE 0 END
        WHERE id = conversation
        RETURNING history_version INTO bumped;
    RETURN COALESCE(bumped, 0);
END $$;

CREATE FUNCTION turnwire_message_versioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM turnwire_history_bump(OLD.conversation_id, TRUE);
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND (OLD.conversation_id, OLD.id) IS DISTINCT FROM (NEW.conversation_id, NEW.id) THEN
        PERFORM turnwire_history_bump(OLD.conversation_id, TRUE);
    END IF;
    NEW.version := turnwire_history_bump(NEW.conversation_id, FALSE);
    RETURN NEW;
END $$;

-- `UPDATE OF` lists every column but `version`, so the part triggers' updates do not fire it.
CREATE TRIGGER messages_versioned
BEFORE INSERT OR UPDATE OF conversation_id, id, seq, role, create_time, create_time_nanos, metadata
ON messages FOR EACH ROW EXECUTE FUNCTION turnwire_message_versioned();
CREATE TRIGGER messages_removed AFTER DELETE ON messages
FOR EACH ROW EXECUTE FUNCTION turnwire_message_versioned();

CREATE FUNCTION turnwire_part_versioned() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        UPDATE messages SET version = turnwire_history_bump(OLD.conversation_id, FALSE)
            WHERE conversation_id = OLD.conversation_id AND id = OLD.message_id;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        UPDATE messages SET version = turnwire_history_bump(NEW.conversation_id, FALSE)
            WHERE conversation_id = NEW.conversation_id AND id = NEW.message_id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER parts_versioned AFTER INSERT OR UPDATE OR DELETE ON parts
FOR EACH ROW EXECUTE FUNCTION turnwire_part_versioned();
