-- release: a session closed cleanly. It stays listed, with its state, for
-- the grace; the user stays a member at least as long. The reaper announces
-- the session's end (update, left) or the user's departure (offline, left)
-- if it does not return.
-- KEYS[1] reap index; KEYS[2..9] the room's keys (see lib.lua); KEYS[10] the
-- slot's change log; KEYS[11] the slot's rooms with a grace; KEYS[12] the
-- slot's holders' last writes
-- ARGV[1] publish lease ms, ARGV[2] outbox cap, ARGV[3] grace ms,
-- ARGV[4] room, ARGV[5] user, ARGV[6] session, ARGV[7] holder code,
-- ARGV[8] session TTL ms, ARGV[9] unrefreshed ms, ARGV[10] the slot's
-- incarnation the caller saw last ('' if none), ARGV[11] the end of the
-- caller's lease of its code (see lease_ok)
-- Returns {found (0|1), the slot's incarnation, outbox entries this call
-- added...}. found is 0 when
-- the caller does not hold the session (never did, or another holder took
-- it over): then the session does not change.
--
-- The user leaves (offline, left) when the grace ends and none of their
-- sessions held by a node holds them any more: a session whose holder
-- has written nothing in the slot for the unrefreshed span (1.5
-- heartbeats) is stale, its holder died or stalls. So the departure is
-- pending from the close, due at the grace's end or when the user's last
-- held session goes stale, whichever is later (g holds it, in ms); any
-- touch of a session of the user (its holder's heartbeat, a join) cancels
-- it, and their sessions then end one by one as usual. A live node
-- refreshes its sessions every heartbeat, so its users never wait for the
-- stale time; a dead node's do, and leave in one transition, never
-- through a member with no session.
local now = now_ms()
local lease, maxo, grace = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local idx, room, u, sid = KEYS[1], ARGV[4], ARGV[5], ARGV[6]
local ttl, unrefreshed = tonumber(ARGV[8]), tonumber(ARGV[9])
local refused = lease_ok(now, ARGV[11])
if refused then return refused end
local tok = sid .. ARGV[7]
local m = u .. ':' .. tok
local r = room_at(2)
r.c, r.room = KEYS[10], room -- the slot's change log (see mark)
local inc, lost_data = incarnation(idx, now, ARGV[10])
-- A tombstone of the caller's own entry: a refresh of this holder that was
-- under way when it decided to release lands after this, and must not
-- bring the session back (a later claim of the holder lifts it).
redis.call('ZREMRANGEBYSCORE', r.mv, '-inf', '(' .. now)
redis.call('ZADD', r.mv, now + ttl, m)
redis.call('PEXPIRE', r.mv, ttl)
local found = redis.call('ZREM', r.s, m)
-- Not found, and the user gone, because Redis lost its data while this
-- node held the session (the release is a retry after the outage): the
-- user was online before, and this is their departure.
local lost = found == 0 and lost_data and not redis.call('ZSCORE', r.z, u)
if found == 1 or lost then
  -- The session stays listed, under a new entry (see mark).
  mark(r, u .. ':' .. sid)
  -- The session stays listed, with its state, through its grace: a return
  -- inside it is no change at all (see lib.lua, released sessions). The
  -- released entry takes the holder's place, in s and in the index.
  local gexp = math.ceil((now + grace) / 1000)
  redis.call('ZADD', r.s, gexp, u .. ':' .. sid)
  index_replace(r, u, tok, sid)
  redis.call('ZADD', idx, 'LT', gexp * 1000 + 1, room)
  -- When the last of the user's held sessions goes stale (see stale_at
  -- in lib.lua: its holder silent for the unrefreshed span).
  local leave = math.max(now + grace, stale_at(r, u, now, {w = KEYS[12], ttl = ttl, unrefreshed = unrefreshed}))
  -- g holds when the user leaves (ms), which the departure keeps to;
  -- until in z is that rounded up to a second, no later: a refresh of a
  -- session of theirs raises it again.
  redis.call('ZADD', r.g, leave, u)
  redis.call('SADD', KEYS[11], r.z) -- a departure is pending here (see touch.lua)
  redis.call('ZADD', r.z, math.ceil(leave / 1000), u)
  redis.call('ZADD', idx, 'LT', leave + 1, room)
end
if lost then found = 1 end
local out = {found, inc}
if #emits > 0 then
  redis.call('ZADD', idx, 'LT', now + lease, room)
  for _, e in ipairs(emits) do
    out[#out + 1] = e
  end
end
return out
