-- turnwire: readable-by 6
-- Fencing (issue 34): a running turn's lease carries a fencing token, (owner, lease_epoch).
-- Every claim (takeover) increments lease_epoch; every write of the turn reads the token in its
-- own transaction and writes nothing when the token is no longer the writer's. Expand-only:
-- older code never reads the column.
ALTER TABLE turns ADD COLUMN lease_epoch INTEGER NOT NULL DEFAULT 0;
