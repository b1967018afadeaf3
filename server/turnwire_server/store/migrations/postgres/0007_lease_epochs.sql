-- turnwire: readable-by 6
-- Fencing (issue 34), mirroring migrations/sqlite/0007_lease_epochs.sql: a running turn's lease
-- carries a fencing token, (owner, lease_epoch). Every claim (takeover) increments lease_epoch;
-- every write of the turn reads the token in its own transaction, its row locked, and writes
-- nothing when the token is no longer the writer's, so a replica paused or cut off past its
-- lease never writes for a turn another replica took over. Expand-only: older code never reads
-- the column (its claims leave it as it is; the owner still changes, which the check compares).
ALTER TABLE turns ADD COLUMN lease_epoch BIGINT NOT NULL DEFAULT 0;
