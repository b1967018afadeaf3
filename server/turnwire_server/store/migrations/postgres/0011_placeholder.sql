-- turnwire: readable-by 10
-- Held for the migration 0011 of a change in flight (issue 41's other parts), so that 0012
-- (schedules) runs in order on this branch. Changes nothing; replaced by that change's 0011
-- when both land.
SELECT 1;
