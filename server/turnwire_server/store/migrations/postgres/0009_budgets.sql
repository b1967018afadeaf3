-- turnwire: readable-by 8
-- Budgets (issue 37, docs/cost.md "Budgets"), mirroring migrations/sqlite/0009_budgets.sql. budget_spend: one row per
-- budget scope (scope: turn, conversation, tenant/day, tenant/month, principal/day,
-- principal/month; scope_key: the request id, conversation id, tenant or tenant/principal; period: '' or the UTC day/month it counts), what was spent
-- (settled steps) and what running steps reserved, and the limits it was last charged under.
-- Each charge locks its rows (in key order) in the transaction that settles the last step and
-- reserves the next, so two replicas never both spend the last of a budget.
-- budget_reservations: what each running step of a turn (request_id) reserved per scope, with
-- the lease epoch of the attempt that took it: a later attempt (a recovery, a takeover)
-- settles a lost attempt's reservation once instead of leaving it reserved or charging it
-- twice. conversation_id: the rows a conversation's deletion removes (NULL for tenant and
-- principal scopes). submissions.principal: who submitted (its turn runs under that principal's
-- budgets). Expand-only: older code never reads the tables or the column.
CREATE TABLE budget_spend (
    scope TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    period TEXT NOT NULL,
    conversation_id TEXT,
    spent_tokens BIGINT NOT NULL DEFAULT 0,
    spent_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
    reserved_tokens BIGINT NOT NULL DEFAULT 0,
    reserved_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
    limit_tokens BIGINT,
    limit_usd DOUBLE PRECISION,
    PRIMARY KEY (scope, scope_key, period)
);
CREATE INDEX budget_spend_by_conversation ON budget_spend (conversation_id);
CREATE TABLE budget_reservations (
    request_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    scope_key TEXT NOT NULL,
    period TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    epoch BIGINT NOT NULL,
    tokens BIGINT NOT NULL,
    usd DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (request_id, scope, scope_key, period)
);
CREATE INDEX budget_reservations_by_conversation ON budget_reservations (conversation_id);
ALTER TABLE submissions ADD COLUMN principal TEXT;
