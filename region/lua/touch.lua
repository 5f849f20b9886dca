-- touch: create or refresh sessions of one or more rooms (the heartbeat path).
-- KEYS[1]   reap index of the rooms' slot
-- KEYS[2..] seven keys per room, in ARGV order (see lib.lua)
-- ARGV[1] session TTL ms, ARGV[2] publish lease ms, ARGV[3] outbox cap
-- ARGV[4..] per room: room id, k, then k pairs (user, session), a user's
-- pairs adjacent (their until is raised once)
-- Returns one entry per room: 0, or the outbox entries this call added.
local now = now_ms()
local ttl, lease, maxo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local idx = KEYS[1]
local exps = math.ceil((now + ttl) / 1000)
local exp = exps * 1000
local out = {}
local a, ri = 4, 0
while a <= #ARGV do
  local room, k = ARGV[a], tonumber(ARGV[a + 1])
  a = a + 2
  local r = room_at(2 + ri * ROOM_KEYS)
  ri = ri + 1
  emitted = 0
  settle_if_due(r, now, maxo)
  local prev = nil
  for _ = 1, k do
    local u, sid = ARGV[a], ARGV[a + 1]
    local m = u .. ':' .. sid
    a = a + 2
    if redis.call('ZADD', r.s, exps, m) == 1 then
      -- A session returning inside the grace cancels the departure.
      local returning = redis.call('HDEL', r.g, u) == 1
      if not returning and not redis.call('ZSCORE', r.z, u) then
        redis.call('PERSIST', r.m) -- the room may have been empty
        emit(r, now, 'online', 'joined', u, 1, nil, nil, maxo)
      end
      redis.call('ZADD', r.z, 'GT', exp, u)
      index_add(r, u, sid)
      redis.call('ZADD', idx, 'LT', exp + 1, room)
    elseif u ~= prev and redis.call('ZADD', r.z, 'GT', exp, u) == 1 then
      -- Not a member, yet the entry was there: a dead entry of a user
      -- already announced gone, left by a settle cut short at its limit,
      -- has come back. That is a join.
      redis.call('PERSIST', r.m)
      emit(r, now, 'online', 'joined', u, 1, nil, nil, maxo)
      index_add(r, u, sid)
      redis.call('ZADD', idx, 'LT', exp + 1, room)
    end
    prev = u
  end
  if emitted > 0 then
    redis.call('ZADD', idx, 'LT', now + lease, room)
    out[ri] = redis.call('LRANGE', r.o, -emitted, -1)
  else
    out[ri] = 0
  end
end
return out
