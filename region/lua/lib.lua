-- lib.lua is prepended to every script of the regional store.
--
-- Keys of room R; all carry the {R} hash tag, so a script touches one slot:
--   z  presence:{R}     ZSET user -> until (ms). A member while until >= now.
--   s  presence:{R}:s   ZSET "user:session" -> expiry (ms); "user:" -> grace
--                       end, present while the user's last session was
--                       closed cleanly and no session has returned.
--   n  presence:{R}:n   HASH user -> session entries in s; ":seq" last event
--                       sequence; ":epoch" first event time of this room;
--                       ":jsroom"/":jsseq" last delivered seq and its stream
--                       sequence.
--   o  presence:{R}:o   LIST events not yet acknowledged by the publisher.
--   st presence:{R}:st  HASH "user:session" -> state JSON.
-- The reap index (KEYS[1] of writing scripts) is a ZSET room -> the first ms
-- at which the room may hold something overdue; it is never later than that.
--
-- Invariants: until >= every expiry of the user's entries in s; n[user]
-- counts the user's session entries in s. Time is Redis TIME, never the
-- caller's clock, so node clock skew cannot expire a live session.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function room_at(base)
  return {z = KEYS[base], s = KEYS[base + 1], n = KEYS[base + 2], o = KEYS[base + 3], st = KEYS[base + 4]}
end

local emitted = 0

-- emit appends one event to the outbox: '|'-separated fields, the state JSON
-- (which may contain '|') last. Ids cannot contain '|'.
local function emit(r, now, kind, reason, user, sessions, sid, state, maxo)
  local seq = redis.call('HINCRBY', r.n, ':seq', 1)
  local epoch = redis.call('HGET', r.n, ':epoch')
  if not epoch then
    epoch = now
    redis.call('HSET', r.n, ':epoch', now)
  end
  redis.call('RPUSH', r.o, seq .. '|' .. epoch .. '|' .. kind .. '|' .. reason .. '|' ..
    user .. '|' .. sessions .. '|' .. now .. '|' .. (sid or '') .. '|' .. (state or ''))
  if redis.call('LLEN', r.o) > maxo then
    redis.call('LTRIM', r.o, -maxo, -1)
  end
  emitted = emitted + 1
end

-- settle announces users whose until has passed and drops dead session
-- entries, at most limit of each. It returns true when work is left over.
local function settle(r, now, maxo, limit)
  local gone = redis.call('ZRANGEBYSCORE', r.z, '-inf', '(' .. now, 'LIMIT', 0, limit)
  for _, u in ipairs(gone) do
    redis.call('ZREM', r.z, u)
    local reason = 'expired'
    if redis.call('ZSCORE', r.s, u .. ':') then
      reason = 'left'
    end
    emit(r, now, 'offline', reason, u, 0, nil, nil, maxo)
  end
  if #gone == limit then
    -- Dead entries of unannounced users carry their reason: keep them.
    return true
  end
  local dead = redis.call('ZRANGEBYSCORE', r.s, '-inf', '(' .. now, 'LIMIT', 0, limit)
  for _, m in ipairs(dead) do
    redis.call('ZREM', r.s, m)
    local u, sid = string.match(m, '^([^:]*):(.*)$')
    if sid ~= '' then
      redis.call('HDEL', r.st, m)
      if redis.call('HINCRBY', r.n, u, -1) <= 0 then
        redis.call('HDEL', r.n, u)
      end
    end
  end
  return #dead == limit
end

local function first_score(key)
  local a = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if a[2] then
    return tonumber(a[2])
  end
  return nil
end

-- settle_if_due settles a room before a write, so a write never builds on
-- an overdue entry (its departure is announced first).
local function settle_if_due(r, now, maxo)
  local a, b = first_score(r.z), first_score(r.s)
  if (a and a < now) or (b and b < now) then
    while settle(r, now, maxo, 1000) do end
  end
end

local KEEP_MS = 600000

-- reindex sets the room's reap index entry to the first ms at which it may
-- hold something overdue, or removes it when the room is empty. The seq and
-- epoch outlive an empty room by KEEP_MS (beyond the event-id dedup window)
-- so event ids stay unique if it is used again.
local function reindex(idx, r, room, now, lease)
  local due = nil
  local a, b = first_score(r.z), first_score(r.s)
  if a then due = a + 1 end
  if b and (not due or b + 1 < due) then due = b + 1 end
  if redis.call('LLEN', r.o) > 0 and (not due or now + lease < due) then
    due = now + lease
  end
  if due then
    redis.call('ZADD', idx, due, room)
  else
    redis.call('ZREM', idx, room)
    redis.call('PEXPIRE', r.n, KEEP_MS)
  end
end

-- stale returns the outbox entries older than lease: ones whose publisher
-- should have acknowledged them by now.
local function stale(r, now, lease)
  local out = {}
  for _, e in ipairs(redis.call('LRANGE', r.o, 0, -1)) do
    local t = tonumber(string.match(e, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|(%d+)'))
    if t and t <= now - lease then
      out[#out + 1] = e
    end
  end
  return out
end

