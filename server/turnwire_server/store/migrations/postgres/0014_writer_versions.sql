-- turnwire: readable-by 13
-- Versions written by the writer, triggers for everyone else (issue 33), mirroring
-- migrations/sqlite/0014_writer_versions.sql: Turnwire's own message writes bump
-- `conversations.history_version` once per write (with the conversation's touch, which holds its
-- row lock to the commit) and write their rows at that version; a row written with its version
-- set skips migration 0006's triggers. The triggers stay for a row written without one: an
-- older replica (expand-only: it never sets `version`), an operator's SQL, a fork's copies.
-- The rule, for any writer that sets a version: it bumped the conversation's `history_version`
-- earlier in the same transaction and writes the bumped value.
-- `parts.version`: the history version of the part's last change, 0 when the triggers versioned
-- it (only its being set is read, by the triggers).
ALTER TABLE parts ADD COLUMN version BIGINT NOT NULL DEFAULT 0;

-- An insert that carries a version (not 0), an update that changes it: the writer's own.
DROP TRIGGER messages_versioned ON messages;
CREATE TRIGGER messages_versioned BEFORE INSERT ON messages
FOR EACH ROW WHEN (NEW.version = 0) EXECUTE FUNCTION turnwire_message_versioned();
CREATE TRIGGER messages_changed
BEFORE UPDATE OF conversation_id, id, seq, role, create_time, create_time_nanos, metadata ON messages
FOR EACH ROW WHEN (NEW.version = OLD.version) EXECUTE FUNCTION turnwire_message_versioned();

DROP TRIGGER parts_versioned ON parts;
CREATE TRIGGER parts_versioned AFTER INSERT ON parts
FOR EACH ROW WHEN (NEW.version = 0) EXECUTE FUNCTION turnwire_part_versioned();
CREATE TRIGGER parts_changed AFTER UPDATE ON parts
FOR EACH ROW WHEN (NEW.version = OLD.version) EXECUTE FUNCTION turnwire_part_versioned();
-- Deletes (rare: a rollback, a shortened reply, a deleted conversation) are versioned as before.
CREATE TRIGGER parts_removed AFTER DELETE ON parts
FOR EACH ROW EXECUTE FUNCTION turnwire_part_versioned();
