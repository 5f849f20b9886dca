-- dueall: rooms due in many slots' reap indexes, all on this node (Redis
-- Cluster only: the script is flagged allow-cross-slot-keys).
-- KEYS[1] one index key of this node (routes the call); ARGV[1] limit per
-- index, ARGV[2..] index keys
-- Returns {i1, room, i2, room, ...}: ARGV position (1-based from ARGV[2]) and
-- room.
local now = now_ms()
local lim = tonumber(ARGV[1])
local out = {}
for i = 2, #ARGV do
  local rooms = redis.call('ZRANGEBYSCORE', ARGV[i], '-inf', now, 'LIMIT', 0, lim)
  for _, room in ipairs(rooms) do
    out[#out + 1] = i - 1
    out[#out + 1] = room
  end
end
return out
