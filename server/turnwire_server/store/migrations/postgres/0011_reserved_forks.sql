-- turnwire: readable-by 10
-- PLACEHOLDER on branch `webhooks` only: migration 0011 belongs to the forks branch (issue 41).
-- Drop this file when merging; the forks branch's 0011 replaces it.
SELECT 1;
