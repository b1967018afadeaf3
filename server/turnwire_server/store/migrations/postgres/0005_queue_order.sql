-- turnwire: readable-by 4
-- New input that stops the running turn runs next (issue 18, docs/semantics.md §5): an
-- INTERRUPT or ROLLBACK input's ticket goes right behind the holder and the interrupting
-- tickets before it, ahead of the turns already queued, across replicas.
--
-- The order stays the ticket order, so replicas of schema 4 (which hold the lowest live ticket
-- and know nothing of this) order such a ticket exactly as this schema's code does and never
-- hold the lock beside it. To leave room in that order, the ticket sequence now steps by 65536
-- from a multiple of 65536 (plain tickets are multiples; schema-4 replicas take them too, through
-- the column default), and an interrupting ticket takes the number after the head's (or after the
-- interrupting tickets behind it) within the head's block. `first_in_line` marks those tickets;
-- schema-4 replicas never set it (they queue an interrupting input at the back, as before).
ALTER TABLE turn_queue ADD COLUMN first_in_line BOOLEAN NOT NULL DEFAULT false;

DO $$
DECLARE
    seq TEXT := pg_get_serial_sequence('turn_queue', 'ticket');
    top BIGINT;
BEGIN
    -- First the step: it takes the sequence's lock, so no nextval runs until this commits.
    EXECUTE format('ALTER SEQUENCE %s INCREMENT BY 65536', seq);
    EXECUTE format('SELECT last_value FROM %s', seq) INTO top;
    top := GREATEST(top, (SELECT COALESCE(MAX(ticket), 0) FROM turn_queue));
    EXECUTE format('ALTER SEQUENCE %s RESTART WITH %s', seq, (top / 65536 + 1) * 65536);
END
$$;
