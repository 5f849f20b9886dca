-- touch: create or refresh sessions of one or more rooms (claims for
-- joins, refreshes for the heartbeat).
-- KEYS[1]   reap index of the rooms' slot
-- KEYS[2]   the slot's change log (see mark in lib.lua)
-- KEYS[3]   the z keys of the slot's rooms that may have a departure
--           pending in g (release.lua adds a room at every release; this
--           script drops a room whose g it finds empty): every room with
--           a non-empty g is in it, so a room not in it has no g to look
--           at
-- KEYS[4]   the slot's holders' last writes: holder code -> ms, set to
--           now for the caller (see stale_at in lib.lua)
-- KEYS[5..] two keys per room, in ARGV order: z and s (the others, and
--           the room id, are named from z when a step needs them; see
--           room_of in lib.lua)
-- ARGV[1] session TTL ms, ARGV[2] publish lease ms, ARGV[3] outbox cap,
-- ARGV[4] holder code, ARGV[5] '1' for a claim, '0' for a refresh,
-- ARGV[6] the slot's incarnation the caller saw last ('' if none),
-- ARGV[7] the read cut ms (0: none) and ARGV[8] the read slack ms (see
-- read_cut), ARGV[9] the length of the key prefix, ARGV[10] the end of the
-- caller's lease of its code, Redis ms (see lease_ok), ARGV[11] the
-- unrefreshed span ms (see stale_at in lib.lua), ARGV[12] the format
-- every session written moves its state to (state_move; 0: none): the
-- region's, given to every claim and to refreshes only for a span after
-- their store began writing it (moveFormat in schema.go), so that the
-- heartbeat reads no state once every held session has moved
-- ARGV[13..] per room: k, then k pairs (user, session), a user's pairs
-- adjacent (their until is raised once)
-- Returns the slot's incarnation, then for each room something happened
-- in (most refreshes: none) its position (1-based, in ARGV order) and
-- {events, lost, taken, orphaned}: the outbox entries this call added, the
-- "user:session" refreshes found held by another holder (not written),
-- those a claim took from another holder, and the refreshes found taken
-- from this holder or released but held by no one now (not written).
local now = now_ms()
local ttl, lease, maxo = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local holder, claim = ARGV[4], ARGV[5] == '1'
local idx = KEYS[1]
local refused = lease_ok(now, ARGV[10])
if refused then return refused end
-- This holder writes now: every session it refreshes or claims in this
-- slot was written no later than this (one write per call).
redis.call('HSET', KEYS[4], holder, now)
-- Redis lost this slot's data since the caller last wrote here: its
-- refreshes restore the sessions it held, silently, as readers of the
-- stream saw those users online.
local inc, restoring = incarnation(idx, now, ARGV[6])
local exps = math.ceil((now + ttl) / 1000)
local exp = exps * 1000
local out = {inc}
local rc = read_cut(now, ARGV[7], ARGV[8])
local scut = sweep_cut(now, ARGV[7], 0, 0)
-- Which rooms may have a grace running: one lookup for the whole call,
-- instead of one of each room's g.
local gs = KEYS[3]
local graced = nil
if redis.call('SCARD', gs) > 0 then
  local zs = {}
  for i = 5, #KEYS, 2 do zs[#zs + 1] = KEYS[i] end
  graced = redis.call('SMISMEMBER', gs, unpack(zs))
end
local plen = tonumber(ARGV[9])
local st = {w = KEYS[4], ttl = ttl, unrefreshed = tonumber(ARGV[11])}
local wfmt = tonumber(ARGV[12])
local a, ri = 13, 0
while a <= #ARGV do
  local k = tonumber(ARGV[a])
  a = a + 1
  -- The heartbeat's path touches z and s, and g when a grace runs; the
  -- room's id and other keys (r) are named only when a step needs them.
  local kz = 5 + ri * 2
  local z, s = KEYS[kz], KEYS[kz + 1]
  local r = nil
  ri = ri + 1
  local ng = 0 -- users in g: most rooms have no grace running
  if graced and graced[ri] == 1 then
    r = room_of(z, s, KEYS[2], plen)
    ng = redis.call('ZCARD', r.g)
    if ng == 0 then redis.call('SREM', gs, z) end
  end
  emits = {}
  if claim then
    -- The reaper is late: reads already leave out what is overdue beyond
    -- the read slack. A join settles it first, so that its own events
    -- follow the departures readers already see (a return after a grace
    -- that ended is offline then online, as a fresh snapshot shows it).
    -- A grace counts from its end in ms (g), not its until in seconds:
    -- a return more than the slack after it is always announced.
    local z1, s1 = first_score(z), first_score(s)
    local g1 = ng > 0 and grace_due(r)
    if z1 and z1 < live_s(rc) or s1 and s1 < live_s(rc) or g1 and g1 - 1 < rc then
      r = room_of(z, s, KEYS[2], plen)
      settle(r, now, scut, maxo, SETTLE_LIMIT, st)
    end
  end
  local lost, taken, orphaned -- created when needed
  local prev = nil -- the last user whose until was raised
  for _ = 1, k do
    local u, sid = ARGV[a], ARGV[a + 1]
    a = a + 2
    local m = u .. ':' .. sid .. holder
    local wrote = true
    if redis.call('ZADD', s, exps, m) == 1 then
      -- A new entry: a join, a revival (the entry was reaped or lost), or
      -- a session that moved here from another holder.
      r = r or room_of(z, s, KEYS[2], plen)
      local tok = sid .. holder
      local others = session_entries(r, u, sid, m, KEYS[4])
      if not claim and (#others > 0 or redis.call('ZSCORE', r.mv, m)) then
        -- Taken over by another holder, or released: a refresh never
        -- takes it back. Orphaned when no holder has it now, only a
        -- released entry (its taker's connection ended, or this
        -- holder released it itself): the caller may claim it again.
        redis.call('ZREM', r.s, m)
        wrote = false
        local held = false
        for _, o in ipairs(others) do
          local _, _, h = parse(o)
          if h ~= '' then held = true end
        end
        if held or #others == 0 then
          lost = lost or {}
          lost[#lost + 1] = u .. ':' .. sid
        else
          orphaned = orphaned or {}
          orphaned[#orphaned + 1] = u .. ':' .. sid
        end
      else
        if claim then
          local held = false
          for _, o in ipairs(others) do
            redis.call('ZREM', r.s, o)
            index_remove(r, u, string.sub(o, #u + 2))
            local _, _, h = parse(o)
            if h ~= '' then -- not a released entry: a holder's
              redis.call('ZADD', r.mv, now + ttl, o)
              held = true
            end
          end
          if held then
            redis.call('ZREMRANGEBYSCORE', r.mv, '-inf', '(' .. now)
            redis.call('PEXPIRE', r.mv, ttl)
            taken = taken or {}
            taken[#taken + 1] = u .. ':' .. sid
          end
          redis.call('ZREM', r.mv, m)
        end
        -- A session returning inside the grace cancels the departure; one
        -- that was listed (released, or held elsewhere) changes nothing.
        local returning = ng > 0 and redis.call('ZREM', r.g, u) == 1
        if claim or not restoring then
          if not returning and not redis.call('ZSCORE', r.z, u) then
            redis.call('PERSIST', r.m) -- the room may have been empty
            emit(r, now, 'online', 'joined', u, 1, sid, nil, maxo)
          elseif #others == 0 then
            -- A new session of a member.
            emit(r, now, 'update', 'joined', u, listed(r, u, now), sid, nil, maxo)
          end
        end
        redis.call('ZADD', r.z, 'GT', exps, u)
        -- A new entry, listed silently or not (a return, a restore after
        -- Redis lost its data): the publisher learns it from the log.
        mark(r, m)
        index_add(r, u, tok)
        redis.call('ZADD', idx, 'LT', exp + 1, r.room)
        prev = u
      end
    elseif u ~= prev then
      prev = u
      if redis.call('ZADD', z, 'GT', exps, u) == 1 then
        -- Not a member, yet the entry was there: a dead entry of a user
        -- already announced gone, left by a settle cut short at its limit,
        -- has come back. That is a join.
        r = r or room_of(z, s, KEYS[2], plen)
        mark(r, m)
        redis.call('PERSIST', r.m)
        emit(r, now, 'online', 'joined', u, 1, sid, nil, maxo)
        index_add(r, u, sid .. holder)
        redis.call('ZADD', idx, 'LT', exp + 1, r.room)
      elseif ng > 0 then
        -- A session whose holder had stopped refreshing it, so that a
        -- release started the grace without it, is refreshed again: the
        -- user never left.
        redis.call('ZREM', r.g, u)
      end
    end
    if wrote and wfmt >= 3 then state_move(wfmt, z .. ':st', u .. ':' .. sid) end
  end
  if #emits > 0 or lost or taken or orphaned then
    local ev = {}
    if #emits > 0 then
      redis.call('ZADD', idx, 'LT', now + lease, r.room)
      ev = emits
    end
    out[#out + 1] = ri
    out[#out + 1] = {ev, lost or {}, taken or {}, orphaned or {}}
  end
end
return out
