-- turnwire: readable-by 9
-- Placeholder: migration 0010 belongs to another change in flight (the inspector branch takes
-- 0011). Delete this file when that change's 0010 lands.
SELECT 1;
