-- turnwire: readable-by 15
-- The rows of budget periods by period (issue 37: ended periods deleted), mirroring
-- migrations/sqlite/0016_budget_periods.sql. The maintenance sweep deletes the rows of ended
-- days and months (store/core/retention_writes.py, expire_budget_periods) oldest first, a batch
-- at a time: without this index each sweep scans and sorts every budget row, the turns' and
-- conversations' included. Partial: only a period's rows are in it, so a turn's or a
-- conversation's budget row (period '') costs no index entry. Expand-only: older code never
-- reads it.
CREATE INDEX budget_spend_by_period ON budget_spend (period) WHERE period <> '';
