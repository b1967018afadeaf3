-- turnwire: readable-by 14
-- budget_reservations kept lean (issue 37: what budgets cost a turn). The table holds only the
-- reservations of steps still running (a charge settles and deletes them, a recovery a lost
-- attempt's, a conversation's deletion its turns'), so it stays as small as the turns in flight,
-- while every budgeted turn inserts and deletes its rows: each commit writes every page those
-- touch. Clustered on its primary key (WITHOUT ROWID: one b-tree, not a table and its key's
-- index) and without the index by conversation (a conversation's deletion scans the few rows
-- instead), a turn's reservation touches one page where it touched three. Same columns: code
-- of schema 14 reads and writes it unchanged.
CREATE TABLE budget_reservations_lean (
    request_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    period TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    epoch INTEGER NOT NULL,
    tokens INTEGER NOT NULL,
    usd REAL NOT NULL,
    PRIMARY KEY (request_id, scope, scope_key, period)
) WITHOUT ROWID;
INSERT INTO budget_reservations_lean (request_id, scope, scope_key, period, conversation_id, epoch, tokens, usd)
    SELECT request_id, scope, scope_key, period, conversation_id, epoch, tokens, usd FROM budget_reservations;
DROP TABLE budget_reservations;
ALTER TABLE budget_reservations_lean RENAME TO budget_reservations;
