-- roster: whole rooms at once, unsorted, for readers of entire rooms (the
-- cross-region publisher). Unlike snapshot it neither sorts nor pages, and
-- it reads the states with one HGETALL instead of one HGET per session.
-- Several rooms of one slot go in one call, which saves a call's fixed
-- cost per room; each room is read atomically all the same.
-- KEYS: four per room: z, s, m, st; ARGV[1] cut, ARGV[2] slack (see
-- read_cut)
-- Returns one reply per room, in KEYS order: {{now, room seq, stream seq,
-- epoch}, {user, until (seconds), ...}, {entry ("user:session" then a holder code),
-- expiry seconds, ...},
-- {"user:session", state, ...}}.
local now = now_ms()
local at = read_cut(now, ARGV[1], ARGV[2])
local out = {}
for b = 1, #KEYS, 4 do
  local z, s, m, st = KEYS[b], KEYS[b + 1], KEYS[b + 2], KEYS[b + 3]
  local meta = redis.call('HMGET', m, 'seq', 'jsseq', 'epoch')
  local users = redis.call('ZRANGEBYSCORE', z, live_s(at), '+inf', 'WITHSCORES')
  local ss, sts = {}, {}
  if #users > 0 then
    ss = redis.call('ZRANGEBYSCORE', s, live_s(at), '+inf', 'WITHSCORES')
    if redis.call('HLEN', st) > 0 then
      sts = redis.call('HGETALL', st)
      for i = 2, #sts, 2 do sts[i] = state_read(sts[i]) end
    end
  end
  out[#out + 1] = {{now, meta[1] or '0', meta[2] or '0', meta[3] or '0'}, users, ss, sts}
end
return out
