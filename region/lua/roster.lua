-- roster: a whole room at once, unsorted, for readers of entire rooms (the
-- cross-region publisher). Unlike snapshot it neither sorts nor pages, and
-- it reads the states with one HGETALL instead of one HGET per session.
-- KEYS[1] z, KEYS[2] s, KEYS[3] m, KEYS[4] st of the room; ARGV[1] cut,
-- ARGV[2] slack (see read_cut)
-- Returns {{now, room seq, stream seq, epoch}, {user, until, ...},
-- {"user:session:holder", expiry seconds, ...}, {"user:session", state, ...}}.
local now = now_ms()
local at = read_cut(now, ARGV[1], ARGV[2])
local meta = redis.call('HMGET', KEYS[3], 'seq', 'jsseq', 'epoch')
local users = redis.call('ZRANGEBYSCORE', KEYS[1], at, '+inf', 'WITHSCORES')
local ss, st = {}, {}
if #users > 0 then
  ss = redis.call('ZRANGEBYSCORE', KEYS[2], live_s(at), '+inf', 'WITHSCORES')
  if redis.call('HLEN', KEYS[4]) > 0 then
    st = redis.call('HGETALL', KEYS[4])
  end
end
return {{now, meta[1] or '0', meta[2] or '0', meta[3] or '0'}, users, ss, st}
