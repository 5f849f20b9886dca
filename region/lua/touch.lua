-- touch: create or refresh sessions of one or more rooms (the heartbeat path).
-- KEYS[1]   reap index of the rooms' slot
-- KEYS[2..] five keys per room, in ARGV order (see lib.lua)
-- ARGV[1] session TTL ms, ARGV[2] publish lease ms, ARGV[3] outbox cap
-- ARGV[4..] per room: room id, k, then k pairs (user, session)
-- Returns one entry per room: 0, or the outbox entries this call added.
local now = now_ms()
local ttl, lease, maxo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local idx = KEYS[1]
local exp = now + ttl
local out = {}
local a, ri = 4, 0
while a <= #ARGV do
  local room, k = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local r = room_at(2 + ri * 5)
  ri = ri + 1
  emitted = 0
  settle_if_due(r, now, maxo)
  for _ = 1, k do
    local u = ARGV[a]
    local m = u .. ':' .. ARGV[a + 1]
    a = a + 2
    if redis.call('ZADD', r.s, exp, m) == 1 then
      local c = redis.call('HINCRBY', r.n, u, 1)
      if c == 1 then
        redis.call('PERSIST', r.n)
      end
      -- A session returning inside the grace cancels the departure.
      local returning = redis.call('ZREM', r.s, u .. ':') == 1
      if not returning and not redis.call('ZSCORE', r.z, u) then
        emit(r, now, 'online', 'joined', u, c, nil, nil, maxo)
      end
      redis.call('ZADD', r.z, 'GT', exp, u)
      redis.call('ZADD', idx, 'LT', exp + 1, room)
    else
      redis.call('ZADD', r.z, 'GT', exp, u)
    end
  end
  if emitted > 0 then
    redis.call('ZADD', idx, 'LT', now + lease, room)
    out[ri] = redis.call('LRANGE', r.o, -emitted, -1)
  else
    out[ri] = 0
  end
end
return out
