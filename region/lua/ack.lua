-- ack: the publisher has delivered these outbox entries. Entries are
-- removed by value, so acknowledging one publisher's events never drops
-- another's that are still on their way.
-- KEYS[1] reap index; KEYS[2..9] the room's keys (see lib.lua)
-- ARGV[1] publish lease ms, ARGV[2] room, ARGV[3] seq of the last delivered
-- event, ARGV[4] its stream sequence (0: unknown), ARGV[5..] delivered entries
-- The pair (seq, stream seq) with the highest seq is kept in m (jsroom,
-- jsseq): every later event of the room lands after that stream seq.
-- Returns the number of entries removed.
local now = now_ms()
local lease, room, seq, sseq = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local r = room_at(2)
if sseq > 0 and seq > tonumber(redis.call('HGET', r.m, 'jsroom') or '0') then
  redis.call('HSET', r.m, 'jsroom', seq, 'jsseq', sseq)
end
local n = 0
for i = 5, #ARGV do
  n = n + redis.call('LREM', r.o, 1, ARGV[i])
end
if n > 0 then
  if redis.call('LLEN', r.o) == 0 then
    reindex(KEYS[1], r, room, now, lease, nil)
  elseif #stale(r, now, lease) > 0 then
    -- A backlog from an outage of the bus: the next sweep sends more at
    -- once, rather than a lease later.
    redis.call('ZADD', KEYS[1], 'LT', now, room)
  end
end
return n
