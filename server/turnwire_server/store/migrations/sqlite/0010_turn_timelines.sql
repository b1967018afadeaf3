-- turnwire: readable-by 10
-- Turn timelines (issue 39, docs/inspector.md): what took a turn's time (queue wait, hooks, model
-- streams with their first token, tool calls, compactions, attempts), a serialized
-- turnwire.v1.TurnTimeline written with the turn's end (finish_turn, roll_back_turn: no write of
-- its own), kept as long as the turn row. NULL: a running turn, or one ended before this.
-- Expand-only: older code never reads the column.
ALTER TABLE turns ADD COLUMN timeline BLOB;
