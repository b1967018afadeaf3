-- turnwire: readable-by 14
-- budget_reservations kept lean (issue 37: what budgets cost a turn), mirroring
-- migrations/sqlite/0015_lean_reservations.sql. The table holds only the reservations of steps
-- still running (a charge settles and deletes them, a recovery a lost attempt's, a
-- conversation's deletion its turns'), so it stays as small as the turns in flight, while every
-- budgeted turn inserts and deletes its rows: without the index by conversation each of those
-- maintains one index fewer, and a conversation's deletion scans the few rows instead.
DROP INDEX budget_reservations_by_conversation;
