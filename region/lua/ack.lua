-- ack: the publisher has delivered these outbox entries. Entries are
-- removed by value, so acknowledging one publisher's events never drops
-- another's that are still on their way.
-- KEYS[1] reap index; KEYS[2..6] the room's keys (see lib.lua)
-- ARGV[1] publish lease ms, ARGV[2] room, ARGV[3..] delivered entries
-- Returns the number of entries removed.
local now = now_ms()
local lease, room = tonumber(ARGV[1]), ARGV[2]
local r = room_at(2)
local n = 0
for i = 3, #ARGV do
  n = n + redis.call('LREM', r.o, 1, ARGV[i])
end
if n > 0 and redis.call('LLEN', r.o) == 0 then
  reindex(KEYS[1], r, room, now, lease)
end
return n
