-- renumber: the room's transitions are about to be stored in a stream
-- made after the room's numbering began (the stream's JetStream store was
-- lost and the stream made again), so what readers had of the room may
-- have gone with the old stream. The room starts a new epoch, at least
-- floor, and the events waiting in its outbox are numbered again from 1
-- under it, in order: the room's first transition in the new stream tells
-- every reader to take a fresh snapshot. Idempotent: a room already at or
-- above floor is left as it is.
-- KEYS[1..8] the room's keys (see lib.lua)
-- ARGV[1] floor (unix ms: the stream's creation), ARGV[2] how many
-- entries to return
-- Returns the first ARGV[2] entries of the outbox, renumbered or not.
local floor, want = tonumber(ARGV[1]), tonumber(ARGV[2])
local r = room_at(1)
local epoch = tonumber(redis.call('HGET', r.m, 'epoch'))
if not epoch or epoch >= floor then
  return redis.call('LRANGE', r.o, 0, want - 1)
end
local ne = math.max(now_ms(), floor, epoch + 1)
local es = redis.call('LRANGE', r.o, 0, -1)
for i, e in ipairs(es) do
  -- seq|epoch| then the rest, unchanged (outbox.go)
  es[i] = i .. '|' .. ne .. '|' .. string.match(e, '^[^|]*|[^|]*|(.*)$')
end
redis.call('DEL', r.o)
for i = 1, #es, 1000 do
  redis.call('RPUSH', r.o, unpack(es, i, math.min(i + 999, #es)))
end
-- The stream position of the old numbering means nothing in the new
-- stream: 0 until the first of these is acknowledged.
redis.call('HSET', r.m, 'epoch', ne, 'seq', #es, 'jsroom', 0, 'jsseq', 0)
local out = {}
for i = 1, math.min(want, #es) do out[i] = es[i] end
return out
