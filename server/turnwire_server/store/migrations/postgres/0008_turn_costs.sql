-- turnwire: readable-by 7
-- Cost (issue 37, docs/cost.md), mirroring migrations/sqlite/0008_turn_costs.sql: what a turn
-- cost in US dollars, written with its end. cost_usd NULL: unknown (a usage with no known price,
-- a turn ended before costs were recorded); cost_source: where the prices came from
-- (`genai-prices 0.2.3`, `config`, both joined by ", "). Expand-only: older code never reads the
-- columns (its turns end with them NULL: unknown).
ALTER TABLE turns ADD COLUMN cost_usd DOUBLE PRECISION;
ALTER TABLE turns ADD COLUMN cost_source TEXT;
