-- turnwire: readable-by 10
-- Turn timelines (issue 39, docs/inspector.md), mirroring migrations/sqlite/0010_turn_timelines.sql:
-- a serialized turnwire.v1.TurnTimeline written with the turn's end (finish_turn, roll_back_turn:
-- no write of its own), kept as long as the turn row. NULL: a running turn, or one ended before
-- this. Expand-only: older code never reads the column.
ALTER TABLE turns ADD COLUMN timeline BYTEA;
