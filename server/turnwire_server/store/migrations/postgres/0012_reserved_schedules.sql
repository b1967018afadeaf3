-- turnwire: readable-by 10
-- PLACEHOLDER on branch `webhooks` only: migration 0012 belongs to the schedules branch (issue 41).
-- Drop this file when merging; the schedules branch's 0012 replaces it.
SELECT 1;
