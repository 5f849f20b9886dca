-- due: rooms whose reap index entry has come due.
-- KEYS[1] reap index; ARGV[1] limit
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[1]))
