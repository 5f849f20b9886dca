-- release: a session closed cleanly. The user stays a member for the grace;
-- the reaper announces the departure if nothing returns.
-- KEYS[1] reap index; KEYS[2..8] the room's keys (see lib.lua)
-- ARGV[1] publish lease ms, ARGV[2] outbox cap, ARGV[3] grace ms,
-- ARGV[4] room, ARGV[5] user, ARGV[6] session
-- Returns {found (0|1), outbox entries this call added...}.
local now = now_ms()
local lease, maxo, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local idx, room, u = KEYS[1], ARGV[4], ARGV[5]
local m = u .. ':' .. ARGV[6]
local r = room_at(2)
settle_if_due(r, now, maxo)
local found = redis.call('ZREM', r.s, m)
if found == 1 then
  redis.call('HDEL', r.st, m)
  index_remove(r, u, ARGV[6])
  local left = 0
  for _, sc in pairs(user_entries(r, u)) do
    if sc >= live_s(now) then left = left + 1 end
  end
  if left == 0 then
    -- Last session: hold the membership for the grace and remember why.
    local g = now + grace
    redis.call('HSET', r.g, u, 1)
    redis.call('ZADD', r.z, g, u)
    redis.call('ZADD', idx, 'LT', g + 1, room)
  end
end
local out = {found}
if emitted > 0 then
  redis.call('ZADD', idx, 'LT', now + lease, room)
  for _, e in ipairs(redis.call('LRANGE', r.o, -emitted, -1)) do
    out[#out + 1] = e
  end
end
return out
