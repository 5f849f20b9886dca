-- reap: settle one room whose index entry is due.
-- KEYS[1] reap index; KEYS[2..9] the room's keys (see lib.lua); KEYS[10] the
-- slot's change log; KEYS[11] the slot's rooms with a grace (unused here);
-- KEYS[12] the slot's holders' last writes
-- ARGV[1] publish lease ms, ARGV[2] outbox cap, ARGV[3] room, ARGV[4] limit,
-- ARGV[5] cut ms and ARGV[6] hold-until ms from clock.lua (0: no hold),
-- ARGV[7] when the sweep read the clock (Redis ms), ARGV[8] outage gap ms,
-- ARGV[9] session TTL ms, ARGV[10] unrefreshed ms (see stale_at in lib.lua)
-- Returns the outbox entries to publish: this call's events and any left
-- unacknowledged for longer than the lease. Empty when the room is not due,
-- which is how concurrent reapers stand aside for each other.
local now = now_ms()
local lease, maxo, room, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local cut, hold, sent, gap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
cut = sweep_cut(now, cut, sent, gap)
local idx = KEYS[1]
local due = redis.call('ZSCORE', idx, room)
if due and tonumber(due) > now then
  return {}
end
local r = room_at(2)
r.c, r.room = KEYS[10], room -- the slot's change log (see mark)
local old = stale(r, now, lease)
local more = settle(r, now, cut, maxo, limit, {w = KEYS[12], ttl = tonumber(ARGV[9]), unrefreshed = tonumber(ARGV[10])})
reindex(idx, r, room, now, lease, hold)
if more then
  redis.call('ZADD', idx, now, room)
end
if #emits > 0 then
  for _, e in ipairs(emits) do
    old[#old + 1] = e
  end
end
return old
