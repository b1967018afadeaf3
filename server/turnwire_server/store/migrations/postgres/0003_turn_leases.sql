-- turnwire: readable-by 2
-- Turn ownership and the cross-replica turn queue (issue 11), mirroring
-- migrations/sqlite/0003_turn_leases.sql for the turns columns. Times are BIGINT
-- microseconds since the Unix epoch, UTC.

-- Which replica runs a turn and until when its lease holds; a replica renews the leases of
-- all its running turns in one statement; a turn whose lease lapsed is claimed by another.
ALTER TABLE turns ADD COLUMN owner TEXT COLLATE "C";
ALTER TABLE turns ADD COLUMN lease_until BIGINT;

CREATE INDEX turns_by_owner ON turns (owner) WHERE state = 'running';
CREATE INDEX turns_leases ON turns (lease_until) WHERE state = 'running';

-- The turn queue: one ticket per turn waiting for or holding a conversation's turn lock,
-- across replicas. The lowest live ticket of a conversation holds it (first in, first out by
-- acceptance); a ticket whose lease lapsed (its replica died) is skipped and deleted.
CREATE TABLE turn_queue (
    ticket          BIGSERIAL PRIMARY KEY,
    conversation_id TEXT   COLLATE "C" NOT NULL,
    request_id      TEXT   COLLATE "C" NOT NULL,
    owner           TEXT   COLLATE "C" NOT NULL,
    lease_until     BIGINT NOT NULL
);

CREATE INDEX turn_queue_by_conversation ON turn_queue (conversation_id, ticket);
CREATE INDEX turn_queue_by_owner ON turn_queue (owner);

-- Pending submissions belong to the replica that accepted them (it queued their turns); a
-- replica that dies stops renewing, and another claims them.
ALTER TABLE submissions ADD COLUMN owner TEXT COLLATE "C";
ALTER TABLE submissions ADD COLUMN lease_until BIGINT;
