"""The hook chain as the engine runs it: ordering, merging, error rules, timelines, loading from config."""
