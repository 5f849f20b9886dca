-- state: set or clear a live session's state. Membership does not change:
-- the result is an update transition, never a leave and a join.
-- KEYS[1] reap index; KEYS[2..9] the room's keys (see lib.lua); KEYS[10] the
-- slot's change log; KEYS[11] the slot's rooms with a grace and KEYS[12]
-- its holders' last writes (both unused here)
-- ARGV[1] publish lease ms, ARGV[2] outbox cap, ARGV[3] room, ARGV[4] user,
-- ARGV[5] session, ARGV[6] state JSON ('' clears), ARGV[7] holder code,
-- ARGV[8] the slot's incarnation the caller saw last ('' if none),
-- ARGV[9] the end of the caller's lease of its code (see lease_ok),
-- ARGV[10] the region's data format, which the state is written in
-- Returns {found, the slot's incarnation, outbox entries this call
-- added...}: found is 1 when the
-- caller holds the session, 0 when it is not live, 2 when another holder
-- has taken it over. Only 1 writes anything: a state write from a node
-- that lost the session cannot overwrite the newer holder's.
local now = now_ms()
local lease, maxo, room, u, sid, state = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local r = room_at(2)
r.c, r.room = KEYS[10], room -- the slot's change log (see mark)
local refused = lease_ok(now, ARGV[9])
if refused then return refused end
local m = u .. ':' .. sid .. ARGV[7]
local key = u .. ':' .. sid
local inc = incarnation(KEYS[1], now, ARGV[8])
local exp = redis.call('ZSCORE', r.s, m)
local found = 0
if exp and tonumber(exp) >= live_s(now) then
  found = 1
  local wfmt = tonumber(ARGV[10])
  local old = state_read(redis.call('HGET', r.st, key)) or ''
  if old ~= state then
    if state == '' then
      redis.call('HDEL', r.st, key)
    else
      redis.call('HSET', r.st, key, state_write(wfmt, state))
    end
    local n = 0
    for _, sc in pairs(user_entries(r, u)) do
      if sc >= live_s(now) then n = n + 1 end
    end
    emit(r, now, 'update', 'state', u, n, sid, state, maxo)
  else
    state_move(wfmt, r.st, key)
  end
elseif moved(r, u, sid, m) then
  found = 2
end
local out = {found, inc}
if #emits > 0 then
  redis.call('ZADD', KEYS[1], 'LT', now + lease, room)
  for _, e in ipairs(emits) do
    out[#out + 1] = e
  end
end
return out
