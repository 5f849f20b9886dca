-- due: rooms of a reap index scored up to ARGV[1] ('now': due ones; '+inf':
-- all of them).
-- KEYS[1] reap index; ARGV[1] 'now' or '+inf', ARGV[2] limit
local upto = ARGV[1]
if upto == 'now' then upto = now_ms() end
-- Rooms only: the incarnation marker sits at +inf.
if upto == '+inf' then upto = '(+inf' end
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', upto, 'LIMIT', 0, tonumber(ARGV[2]))
