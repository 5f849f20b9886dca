-- switch: move the region's format marker from one format to the next,
-- only if it still names the first (upgrade.go).
-- KEYS[1] the marker; ARGV[1] from, ARGV[2] to
-- Returns the marker's value before the call ('' none).
local v = redis.call('GET', KEYS[1]) or ''
if v == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) end
return v
