-- turnwire: readable-by 2
-- Turn ownership (issue 11): which process runs a turn and until when its lease holds.
-- A replica renews the leases of its running turns in one statement; a turn whose lease
-- lapsed (its process died) is claimed by another for recovery (docs/semantics.md §8).
-- NULL for turns recorded before this migration (treated as lapsed).
ALTER TABLE turns ADD COLUMN owner TEXT;
ALTER TABLE turns ADD COLUMN lease_until INTEGER;

CREATE INDEX turns_by_owner ON turns (owner) WHERE state = 'running';

-- Pending submissions belong to the replica that accepted them (it queued their turns); a
-- replica that dies stops renewing, and another claims them.
ALTER TABLE submissions ADD COLUMN owner TEXT;
ALTER TABLE submissions ADD COLUMN lease_until INTEGER;
