-- turnwire: readable-by 4
-- Per-turn reads independent of history length (issue 17): a reader that keeps a conversation's
-- decoded messages asks only for the messages changed since the version it holds.
-- `conversations.history_version` counts every change to the conversation's messages or parts;
-- `messages.version` is that counter's value at the message's last change (its row or a part);
-- `conversations.history_epoch` counts removals of messages (a reader then reloads everything).
-- Triggers keep them, so a replica on the previous schema, an operator's SQL or any future
-- write path keeps them right too (expand-only: older code never reads these columns).
-- Rows written before this migration have version 0, which only a full read returns.
ALTER TABLE conversations ADD COLUMN history_version INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN history_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 0;
CREATE INDEX messages_by_version ON messages (conversation_id, version);

-- `UPDATE OF` lists every column but `version`, so the triggers' own updates do not fire them.
CREATE TRIGGER messages_version_on_insert AFTER INSERT ON messages BEGIN
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.id;
END;
CREATE TRIGGER messages_version_on_update
AFTER UPDATE OF conversation_id, id, seq, role, create_time, create_time_nanos, metadata ON messages BEGIN
    UPDATE conversations SET history_version = history_version + 1, history_epoch = history_epoch + 1
        WHERE id = OLD.conversation_id AND (OLD.conversation_id != NEW.conversation_id OR OLD.id != NEW.id);
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.id;
END;
CREATE TRIGGER messages_version_on_delete AFTER DELETE ON messages BEGIN
    UPDATE conversations SET history_version = history_version + 1, history_epoch = history_epoch + 1
        WHERE id = OLD.conversation_id;
END;
CREATE TRIGGER parts_version_on_insert AFTER INSERT ON parts BEGIN
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.message_id;
END;
CREATE TRIGGER parts_version_on_update AFTER UPDATE ON parts BEGIN
    UPDATE conversations SET history_version = history_version + 1
        WHERE id IN (OLD.conversation_id, NEW.conversation_id);
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = OLD.conversation_id)
        WHERE conversation_id = OLD.conversation_id AND id = OLD.message_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.message_id;
END;
CREATE TRIGGER parts_version_on_delete AFTER DELETE ON parts BEGIN
    UPDATE conversations SET history_version = history_version + 1 WHERE id = OLD.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = OLD.conversation_id)
        WHERE conversation_id = OLD.conversation_id AND id = OLD.message_id;
END;
