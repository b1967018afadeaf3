-- turnwire: readable-by 13
-- Versions written by the writer, triggers for everyone else (issue 33: a turn's SQLite writes).
-- Migration 0006's triggers ran two UPDATEs for every message and every part row a write
-- inserted or changed. Turnwire's own message writes now bump `conversations.history_version`
-- once per write (with the conversation's touch) and write their rows at that version; a row
-- written with its version set skips the triggers. The triggers stay, for a row written without
-- one: an older replica (expand-only: it never sets `version`, so its rows are versioned as
-- before), an operator's SQL, a fork's copy-on-write copies.
-- The rule, for any writer that sets a version: it bumped the conversation's `history_version`
-- earlier in the same transaction and writes the bumped value, so every row it changes gets a
-- version above any a reader holds.
-- `parts.version`: the history version of the part's last change, 0 when the triggers versioned
-- it (only its being set is read, by the triggers).
ALTER TABLE parts ADD COLUMN version INTEGER NOT NULL DEFAULT 0;

-- An insert that carries a version (not 0), an update that changes it: the writer's own.
DROP TRIGGER messages_version_on_insert;
CREATE TRIGGER messages_version_on_insert AFTER INSERT ON messages WHEN NEW.version = 0 BEGIN
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.id;
END;
DROP TRIGGER messages_version_on_update;
CREATE TRIGGER messages_version_on_update
AFTER UPDATE OF conversation_id, id, seq, role, create_time, create_time_nanos, metadata ON messages
WHEN NEW.version = OLD.version BEGIN
    UPDATE conversations SET history_version = history_version + 1, history_epoch = history_epoch + 1
        WHERE id = OLD.conversation_id AND (OLD.conversation_id != NEW.conversation_id OR OLD.id != NEW.id);
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.id;
END;
DROP TRIGGER parts_version_on_insert;
CREATE TRIGGER parts_version_on_insert AFTER INSERT ON parts WHEN NEW.version = 0 BEGIN
    UPDATE conversations SET history_version = history_version + 1 WHERE id = NEW.conversation_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.message_id;
END;
DROP TRIGGER parts_version_on_update;
CREATE TRIGGER parts_version_on_update AFTER UPDATE ON parts WHEN NEW.version = OLD.version BEGIN
    UPDATE conversations SET history_version = history_version + 1
        WHERE id IN (OLD.conversation_id, NEW.conversation_id);
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = OLD.conversation_id)
        WHERE conversation_id = OLD.conversation_id AND id = OLD.message_id;
    UPDATE messages SET version = (SELECT history_version FROM conversations WHERE id = NEW.conversation_id)
        WHERE conversation_id = NEW.conversation_id AND id = NEW.message_id;
END;
-- Deletes (rare: a rollback, a shortened reply, a deleted conversation) keep their trigger.
