-- dueall: rooms due (or, with ARGV[1] '+inf', all rooms) in many slots'
-- reap indexes, all on this node (Redis Cluster only: the script is
-- flagged allow-cross-slot-keys).
-- KEYS[1] one index key of this node (routes the call); ARGV[1] 'now' or
-- '+inf', ARGV[2] limit per index, ARGV[3..] index keys
-- Returns {i1, room, i2, room, ...}: index position (1-based from ARGV[3])
-- and room.
local upto = ARGV[1]
if upto == 'now' then upto = now_ms() end
-- Rooms only: the incarnation marker sits at +inf.
if upto == '+inf' then upto = '(+inf' end
local lim = tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local rooms = redis.call('ZRANGEBYSCORE', ARGV[i], '-inf', upto, 'LIMIT', 0, lim)
  for _, room in ipairs(rooms) do
    out[#out + 1] = i - 2
    out[#out + 1] = room
  end
end
return out
