-- lib.lua is prepended to every script of the regional store.
--
-- The keys, their layout and the reap index are documented once, in the
-- package doc (region/doc.go); room_at below reads a room's keys in the
-- order roomKeys.all in keys.go sends them. Room ids cannot contain ':'.
--
-- Holders: a claim (a join) takes a session over from any other holder; a
-- refresh (the heartbeat) never does, and reports the session lost
-- instead; a release or a state write acts only on the caller's own entry.
-- So scripts of two nodes reaching Redis in any order cannot end or change
-- a session the other now holds.
--
-- Released sessions: a release replaces the holder's entry with
-- "user:session" (no holder code) scored at the end of its grace, and keeps its
-- state, so the session stays listed as it was until the grace ends; a
-- claim of the session takes that entry over silently. No node refreshes
-- it, and it never counts as a fresh session of its user.
--
-- Invariants: until >= every expiry of the user's sessions (both in whole
-- seconds) unless a departure is pending (g), so a settle that announces
-- an expiry also drops all of that user's entries; a settle that announces
-- a departure after the grace drops the user's entries left (sessions
-- whose holder stopped refreshing them). Since the user's last clean close
-- (if no session of theirs was touched since) g holds when they leave: the
-- grace's end, or later when a session of theirs goes stale later (see
-- release.lua). So a member always lists a session: the user leaves, in
-- one offline, before their last entry ends. Time is Redis TIME, never the
-- caller's clock, so node clock skew cannot expire a live session.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- read_cut is the liveness cutoff of a read. Only a reaper announces an
-- expiry, so a user overdue by less than slack (a reap interval or two:
-- the reaper has not come round yet) is still a member for reads, as for
-- writes: a session of theirs that is refreshed meanwhile returns without
-- an event, and reads never showed them gone. While the region holds
-- expiries after an outage, cut (when it began) is earlier still. Past
-- that, a dead node's users are gone for reads even if no reaper runs.
local function read_cut(now, cut, slack)
  local c = now - (tonumber(slack or '0') or 0)
  cut = tonumber(cut or '0') or 0
  if cut > 0 and cut < c then c = cut end
  return c
end

-- live_s: entries of s and members of z scored below it are dead. Both
-- are scored in whole seconds (an expiry, an until) rounded up: a score
-- is live while score * 1000 >= now (ms).
local function live_s(now)
  return now / 1000
end

local function room_at(base)
  return {z = KEYS[base], s = KEYS[base + 1], m = KEYS[base + 2], o = KEYS[base + 3],
    st = KEYS[base + 4], g = KEYS[base + 5], u = KEYS[base + 6], mv = KEYS[base + 7]}
end

local ROOM_KEYS = 8

-- room_of is room_at for a script given only a room's z and s (touch,
-- whose heartbeat path needs no more): the other keys, and the room id,
-- are named from z as roomKeys in keys.go names them (z is the prefix,
-- of plen bytes, then ":{room}"; the others are z plus a suffix, in the
-- room's slot). c is the slot's change log (see mark).
local function room_of(z, s, c, plen)
  return {z = z, s = s, m = z .. ':m', o = z .. ':o', st = z .. ':st', g = z .. ':g', u = z .. ':u',
    mv = z .. ':mv', c = c, room = string.sub(z, plen + 3, -2)}
end

-- An entry of s is "user:session" then its holder's code, '' for a
-- released entry. Ids hold only letters, digits and - _ = @ + ~ (see
-- presence/id.go), codes only other bytes (see holders.go): a session id
-- ends at the first byte outside that set.
local SID = '[0-9A-Za-z_=@+~%-]*'

-- parse splits an entry of s into user, session and holder code.
local function parse(m)
  return string.match(m, '^([^:]*):(' .. SID .. ')(.*)$')
end

-- tok_sid is the session of a token of the member index ("session" then
-- the code).
local function tok_sid(tok)
  return string.match(tok, '^(' .. SID .. ')')
end

-- lease_ok refuses a write under a holder code whose lease (until, Redis
-- ms, from hold.lua) has ended: the registry may have given the code to
-- another store since (see holders.go). lease_end is a string, Redis ms.
local function lease_ok(now, lease_end)
  if now > tonumber(lease_end) then
    return redis.error_reply('PRESENCE_LEASE the holder lease ended at ' .. lease_end .. ', now ' .. now)
  end
  return nil
end

-- Data formats (schema.go, doc.go "Upgrading"). FORMAT, set before this
-- file, is the newest format this release reads; a writing script is
-- given the region's format (wfmt), which is never newer. Format 2
-- stores a session's state in st as its JSON; format 3, a test format
-- (a build with the presenceformat3 tag), stores it behind a '~', which
-- begins no JSON. A release of format 2 would hand that on as the
-- state: it cannot read format 3, so the region writes 3 only once no
-- such release runs in it.
local STATE3 = '~'

-- state_read returns the state JSON of a value of st (nil stays nil), of
-- any format this release reads.
local function state_read(v)
  if FORMAT >= 3 and v and string.sub(v, 1, 1) == STATE3 then return string.sub(v, 2) end
  return v
end

-- state_write returns the value of st for a state JSON in format wfmt.
local function state_write(wfmt, json)
  if wfmt >= 3 then return STATE3 .. json end
  return json
end

-- state_move rewrites a session's state (st, field key) in format wfmt if
-- it is in an older one: the heartbeat moves every held session's state
-- to the region's format once it has switched.
local function state_move(wfmt, st, key)
  if wfmt < 3 then return end
  local v = redis.call('HGET', st, key)
  if v and string.sub(v, 1, 1) ~= STATE3 then redis.call('HSET', st, key, STATE3 .. v) end
end

-- BIG: above this many session entries a room keeps the member index u.
-- Up to it a scan of s is cheap (128 entries are one compact list), and
-- small rooms do not pay u's memory.
local BIG = 512

-- The member index u of a large room is a ZSET, every score 0, with one
-- member per user of z: the user id, then a space and the token
-- "session" then the holder code for each of their entries of s (dead
-- ones included). A
-- space sorts below every id byte, so u in lex order is the members in
-- user id order: pages are ranges of it, and a user's member is the only
-- one in the range "[user" to "(user!".

-- index_get returns the user's member of u, or nil.
local function index_get(r, u)
  local m = redis.call('ZRANGEBYLEX', r.u, '[' .. u, '(' .. u .. '!', 'LIMIT', 0, 1)
  return m[1]
end

-- index_build makes u from z and s when the room becomes large.
local function index_build(r)
  local byu = {}
  for _, u in ipairs(redis.call('ZRANGE', r.z, 0, -1)) do
    byu[u] = u
  end
  for _, m in ipairs(redis.call('ZRANGE', r.s, 0, -1)) do
    local u = parse(m)
    if byu[u] then byu[u] = byu[u] .. ' ' .. string.sub(m, #u + 2) end
  end
  local args = {}
  for _, v in pairs(byu) do
    args[#args + 1] = 0
    args[#args + 1] = v
    if #args >= 1000 then
      redis.call('ZADD', r.u, unpack(args))
      args = {}
    end
  end
  if #args > 0 then redis.call('ZADD', r.u, unpack(args)) end
end

-- index_set replaces the user's member of u (old may be nil).
local function index_set(r, old, new)
  if old then redis.call('ZREM', r.u, old) end
  redis.call('ZADD', r.u, 0, new)
end

-- index_add records a new entry of s (after its ZADD and the user's ZADD
-- to z; tok is the session then the code): in u if the room has it, else by
-- building u if the room just became large.
local function index_add(r, u, tok)
  if redis.call('EXISTS', r.u) == 1 then
    local old = index_get(r, u)
    index_set(r, old, (old or u) .. ' ' .. tok)
  elseif redis.call('ZCARD', r.s) > BIG then
    index_build(r)
  end
end

-- index_sids returns the tokens (session then code) listed in a member of u.
local function index_sids(u, member)
  local out = {}
  for sid in string.gmatch(string.sub(member, #u + 2), '%S+') do
    out[#out + 1] = sid
  end
  return out
end

-- index_remove forgets an entry removed from s (tok: session then code);
-- the user stays in u.
local function index_remove(r, u, tok)
  if not r.u then return end
  local old = index_get(r, u)
  if not old then return end
  local new = u
  for _, ss in ipairs(index_sids(u, old)) do
    if ss ~= tok then new = new .. ' ' .. ss end
  end
  index_set(r, old, new)
end

-- index_replace swaps one entry of the user's for another (tokens:
-- session then code), if the room has u; a user it lacks is added.
local function index_replace(r, u, old_tok, new_tok)
  if redis.call('EXISTS', r.u) == 0 then return end
  local old = index_get(r, u)
  local new = u
  for _, ss in ipairs(old and index_sids(u, old) or {}) do
    if ss ~= old_tok and ss ~= new_tok then new = new .. ' ' .. ss end
  end
  index_set(r, old, new .. ' ' .. new_tok)
end

-- index_drop forgets a user who left the room.
local function index_drop(r, u)
  local old = index_get(r, u)
  if old then redis.call('ZREM', r.u, old) end
end

-- incarnation returns the marker of the slot's data (creating it when
-- missing) and whether it differs from expected, the one the caller saw
-- last: then Redis lost the data since, and the caller's sessions here
-- are gone with it. expected '' means the caller has not written here yet.
local function incarnation(idx, now, expected)
  local m = redis.call('ZRANGEBYSCORE', idx, '+inf', '+inf', 'LIMIT', 0, 1)[1]
  local inc
  if m and string.sub(m, 1, 5) == ':inc:' then
    inc = string.sub(m, 6)
  else
    inc = tostring(now)
    redis.call('ZADD', idx, '+inf', ':inc:' .. inc)
  end
  return inc, expected ~= '' and expected ~= inc
end

-- The change log of a slot (see doc.go): a ZSET "room:user" or
-- "room:" then an entry added ("user:session" then code) -> stamp (ms)
-- that the cross-region publisher reads to find what changed since its
-- last read, without reading the region. Every step that changes a
-- member's listed sessions, their states or the membership marks the
-- member (emit does, for every transition; touch also marks entries it
-- writes silently). It is kept only while a publisher reads it: its reader
-- creates it and sets its expiry, so with no reader no step writes to it.
-- A stamp is never below the log's highest (the reader's own mark, ":",
-- sits at the time of its last read), so a change made after a read is
-- stamped at or after that read's time even if the clock stepped back.
local chg_at = nil -- this script's stamp; false: the log is not kept
local marked = {}

-- mark records that the member u of r (r.c the log, r.room the room id)
-- changed; with u an entry of s, that the entry
-- was added, which also names its member. A reader knows the entries it
-- has seen, and reads a member's listing from those and the added ones
-- without scanning the room. Scripts that change members set r.c and
-- r.room; only touch and release add entries to s, and they mark them.
local function mark(r, u)
  if not r.c then return end
  if chg_at == nil then
    chg_at = false
    if redis.call('EXISTS', r.c) == 1 then
      local top = redis.call('ZRANGE', r.c, -1, -1, 'WITHSCORES')
      chg_at = math.max(now_ms(), tonumber(top[2] or '0'))
    end
  end
  if not chg_at then return end
  local m = r.room .. ':' .. u
  if not marked[m] then
    marked[m] = true
    redis.call('ZADD', r.c, chg_at, m)
  end
end

-- emits holds the entries emit appended to the outbox in this script and
-- still there (an outbox cut at its cap starts it over), in order; a
-- script that writes several rooms starts it anew for each.
local emits = {}

-- emit appends one event to the outbox in the entry format of outbox.go:
-- seq|epoch|kind|reason|user|sessions|at|session|state. Ids cannot
-- contain '|'; the state JSON, which may, comes last.
local function emit(r, now, kind, reason, user, sessions, sid, state, maxo)
  local epoch = tonumber(redis.call('HGET', r.m, 'epoch'))
  if not epoch then
    epoch = now
    redis.call('HSET', r.m, 'epoch', epoch)
  elseif maxo > 0 and redis.call('LLEN', r.o) >= maxo then
    -- The outbox is at its cap (the bus has been out of reach that
    -- long): its events go, and the room starts a new numbering with
    -- this one, which tells readers that missed them to take a new
    -- snapshot. Without a cap (the default) nothing is ever dropped.
    redis.call('DEL', r.o)
    emits = {}
    epoch = math.max(now, epoch + 1)
    redis.call('HSET', r.m, 'epoch', epoch, 'seq', 0, 'jsroom', 0)
  end
  local seq = redis.call('HINCRBY', r.m, 'seq', 1)
  local e = seq .. '|' .. epoch .. '|' .. kind .. '|' .. reason .. '|' ..
    user .. '|' .. sessions .. '|' .. now .. '|' .. (sid or '') .. '|' .. (state or '')
  redis.call('RPUSH', r.o, e)
  emits[#emits + 1] = e
  mark(r, user)
end

-- entry_at returns the at field (ms) of an outbox entry written by emit.
local function entry_at(e)
  return tonumber(string.match(e, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|(%d+)'))
end

-- user_entries returns the user's session entries as a set member -> expiry
-- (seconds) and their number. A large room reads them from u; a small one
-- scans s, which for up to 128 sessions is one compact list. It runs on
-- releases and state changes, never on the heartbeat.
local function user_entries(r, u)
  local set, n, cursor = {}, 0, '0'
  if r.u and redis.call('EXISTS', r.u) == 1 then
    local member = index_get(r, u)
    for _, sid in ipairs(member and index_sids(u, member) or {}) do
      local m = u .. ':' .. sid
      local sc = redis.call('ZSCORE', r.s, m)
      if sc then
        set[m] = tonumber(sc)
        n = n + 1
      end
    end
    return set, n
  end
  repeat
    local res = redis.call('ZSCAN', r.s, cursor, 'MATCH', u .. ':*', 'COUNT', 1000)
    cursor = res[1]
    for i = 1, #res[2], 2 do
      if not set[res[2][i]] then
        set[res[2][i]] = tonumber(res[2][i + 1])
        n = n + 1
      end
    end
  until cursor == '0'
  return set, n
end

-- FEW_CODES bounds the holder codes of a slot (its w) for which
-- session_entries names a session's entries instead of scanning s.
local FEW_CODES = 16

-- session_entries returns the entries of s of one session of a user
-- other than m: those of other holders (normally none; one after a claim
-- raced another node's). w, if given, is the slot's holders' last
-- writes: every code an entry of s can end with is a field of it (only
-- touch writes coded entries, and it writes its code to w first; w loses
-- no field), so with few codes the entries are looked up by name, not
-- found by a scan of s.
local function session_entries(r, u, sid, m, w)
  local out, seen = {}, {}
  if r.u and redis.call('EXISTS', r.u) == 1 then
    local member = index_get(r, u)
    for _, tok in ipairs(member and index_sids(u, member) or {}) do
      local e = u .. ':' .. tok
      if e ~= m and tok_sid(tok) == sid then out[#out + 1] = e end
    end
    return out
  end
  if w and redis.call('HLEN', w) <= FEW_CODES then
    local names = {u .. ':' .. sid} -- released: no code
    for _, code in ipairs(redis.call('HKEYS', w)) do names[#names + 1] = names[1] .. code end
    local scores = redis.call('ZMSCORE', r.s, unpack(names))
    for i, e in ipairs(names) do
      if scores[i] and e ~= m then out[#out + 1] = e end
    end
    return out
  end
  -- The pattern also matches sessions whose id starts with sid: the
  -- parse tells them apart. Ids hold no glob bytes.
  local cursor = '0'
  repeat
    local res = redis.call('ZSCAN', r.s, cursor, 'MATCH', u .. ':' .. sid .. '*', 'COUNT', 1000)
    cursor = res[1]
    for i = 1, #res[2], 2 do
      local e = res[2][i]
      local _, esid = parse(e)
      if e ~= m and esid == sid and not seen[e] then
        seen[e] = true
        out[#out + 1] = e
      end
    end
  until cursor == '0'
  return out
end

-- listed counts the user's listed sessions: entries live at t (ms), released
-- ones inside their grace included.
local function listed(r, u, t)
  local n = 0
  for _, sc in pairs(user_entries(r, u)) do
    if sc >= live_s(t) then n = n + 1 end
  end
  return n
end

-- The staleness rule: a session held by a node does not hold its user
-- against a clean close once that node has written nothing in the slot for
-- the unrefreshed span (1.5 heartbeats): it died or stalls. A late
-- refresh of a session does not end its user while its node writes
-- others in the slot (on one Redis, at every heartbeat tick). st is
-- {w = the key of the slot's holders' last writes, ttl = session TTL ms,
-- unrefreshed = ms}.

-- silent_since is when the holder of a held entry (code h, expiry sc in
-- whole seconds) last wrote, by the slot's record w of it (touch.lua), to
-- the ms; by the entry's own expiry less the TTL (up to a second late)
-- when there is no record, or when the entry's expiry is past what the
-- holder's last write gave it: it was extended since (extend.lua, for a
-- waiting client), and that dates it.
local function silent_since(sc, w, ttl)
  if w and sc <= math.ceil((w + ttl) / 1000) then return w end
  return sc * 1000 - ttl
end

-- stale_at is when the last of u's held entries live at now stops
-- holding u (ms), 0 if u has none: when it goes stale, or expires if that
-- is sooner (its holder writes, but not this entry: its refreshes fail),
-- so that u never outlives their entries.
local function stale_at(r, u, now, st)
  local writes, out = {}, 0
  for e, sc in pairs(user_entries(r, u)) do
    local _, _, h = parse(e)
    if h ~= '' and sc >= live_s(now) then
      if writes[h] == nil then writes[h] = tonumber(redis.call('HGET', st.w, h) or '') or false end
      out = math.max(out, math.min(silent_since(sc, writes[h] or nil, st.ttl) + st.unrefreshed, sc * 1000))
    end
  end
  return out
end

-- held_at reports whether the user has an entry held by some node (not
-- released) that lives at cut (ms).
local function held_at(r, u, cut)
  for e, sc in pairs(user_entries(r, u)) do
    local _, _, h = parse(e)
    if h ~= '' and sc >= live_s(cut) then return true end
  end
  return false
end

-- moved reports whether the session of entry m (user u, session sid) is
-- held by another holder now, or was taken from this one.
local function moved(r, u, sid, m)
  if redis.call('ZSCORE', r.mv, m) then return true end
  return #session_entries(r, u, sid, m) > 0
end

-- graces_over returns the users of r whose grace ended before now (ms).
-- g is a ZSET scored by the grace's end: a churning big room has
-- thousands of graces running, and this reads only the ended ones.
local function graces_over(r, now)
  return redis.call('ZRANGEBYSCORE', r.g, '-inf', '(' .. now)
end

-- grace_due is the first ms at which a grace of r has ended, or nil.
local function grace_due(r)
  local first = redis.call('ZRANGE', r.g, 0, 0, 'WITHSCORES')
  if #first == 0 then return nil end
  return tonumber(first[2]) + 1
end

-- held_departure reports whether the pending departure of u (in g) waits
-- for the region's hold (cut < now, see settle): it came due after the
-- outage began, and a node's session of the user lived then.
local function held_departure(r, u, now, cut)
  if cut >= now then return false end
  local g = redis.call('ZSCORE', r.g, u)
  return g ~= false and tonumber(g) >= cut and held_at(r, u, cut)
end

-- postponed reports whether u's pending departure (in g) waits for a node
-- holding a session of theirs that is not stale yet, and moves it (and
-- u's until) to when it is.
local function postponed(r, u, now, st)
  if not redis.call('ZSCORE', r.g, u) then return false end
  local s = stale_at(r, u, now, st)
  if s <= now then return false end
  redis.call('ZADD', r.g, s, u)
  redis.call('ZADD', r.z, 'GT', math.ceil(s / 1000), u)
  return true
end

-- depart announces u's offline, left (after the grace: the user's
-- entries go with it) or expired, and forgets u.
local function depart(r, u, left, now, maxo)
  redis.call('ZREM', r.z, u)
  local reason = 'expired'
  if left then
    reason = 'left'
    for m in pairs(user_entries(r, u)) do
      local uu, sid = parse(m)
      redis.call('ZREM', r.s, m)
      redis.call('HDEL', r.st, uu .. ':' .. sid)
    end
  end
  index_drop(r, u)
  emit(r, now, 'offline', reason, u, 0, nil, nil, maxo)
end

-- settle announces the departures that are due and drops dead session
-- entries, at most limit of each. It returns true when work is left over.
--
-- A user in g leaves (reason left) once the grace has ended: at the ms g
-- holds (their until in z is that rounded up to a second). Any other user
-- expires once their until is before cut, and an
-- entry is dead once its expiry is before cut. cut is now, except while
-- the region holds expiries after an outage (clock.lua): then it is when
-- the outage began, so nothing that lived then is judged until every node
-- has had a heartbeat's chance to refresh it. Held users are read again on
-- every settle of the hold; it lasts a heartbeat.
--
-- A user whose grace ended may still have entries whose holder stopped
-- refreshing them (not dead yet, but not holding the user either, see
-- release.lua): they go with the departure, so the user's state does too.
-- While the region holds expiries, a departure of a user with such an
-- entry waits too: its holder may not have had its heartbeat's chance to
-- refresh it since Redis answered again, which would cancel it. A pending
-- departure that comes due while a node holding a session of the user
-- has written since (it is alive, its refresh is late) waits until that
-- node has been silent for the unrefreshed span (st, see stale_at).
local function settle(r, now, cut, maxo, limit, st)
  local lim = limit
  if cut < now then lim = -1 end
  local over = redis.call('ZRANGEBYSCORE', r.z, '-inf', '(' .. live_s(now), 'WITHSCORES', 'LIMIT', 0, lim)
  for _, u in ipairs(graces_over(r, now)) do
    local sc = redis.call('ZSCORE', r.z, u)
    if not sc then
      redis.call('ZREM', r.g, u) -- no member: nothing to announce, and the room is not due for it
    elseif tonumber(sc) >= live_s(now) then -- not in over yet
      over[#over + 1] = u
      over[#over + 1] = sc
    end
  end
  local n = 0
  for i = 1, #over, 2 do
    if n >= limit then
      -- Dead entries of unannounced users go with their departure.
      return true
    end
    local u = over[i]
    if not held_departure(r, u, now, cut) and not postponed(r, u, now, st) then
      local left = redis.call('ZREM', r.g, u) == 1
      if left or tonumber(over[i + 1]) < live_s(cut) then
        depart(r, u, left, now, maxo)
        n = n + 1
      end
    end
  end
  if n >= limit then
    return true
  end
  -- A dead entry of a user who stays a member is a session ending: its
  -- grace ended (a released entry: left) or its holder stopped refreshing
  -- it (expired). It takes its state along, in an update that says so.
  local dead = redis.call('ZRANGEBYSCORE', r.s, '-inf', '(' .. live_s(cut), 'LIMIT', 0, limit)
  for _, m in ipairs(dead) do
    redis.call('ZREM', r.s, m)
    local u, sid, h = parse(m)
    index_remove(r, u, string.sub(m, #u + 2))
    if not redis.call('ZSCORE', r.z, u) then
      -- The user's departure is announced: the entry just goes (the usual
      -- case after a node died, so it reads nothing more).
      redis.call('HDEL', r.st, u .. ':' .. sid)
    elseif #session_entries(r, u, sid, m) == 0 then
      redis.call('HDEL', r.st, u .. ':' .. sid)
      local reason = 'expired'
      if h == '' then reason = 'left' end
      emit(r, now, 'update', reason, u, listed(r, u, cut), sid, nil, maxo)
    end
  end
  return #dead == limit
end

-- SETTLE_LIMIT bounds what a join settles for a late reaper.
local SETTLE_LIMIT = 1000

local function first_score(key)
  local a = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if a[2] then
    return tonumber(a[2])
  end
  return nil
end

-- due_ms is when the room first holds something overdue, or nil if empty.
local function due_ms(r)
  local due = nil
  local a, b = first_score(r.z), first_score(r.s)
  if a then due = a * 1000 + 1 end
  if b and (not due or b * 1000 + 1 < due) then due = b * 1000 + 1 end
  local g = grace_due(r)
  if g and (not due or g < due) then due = g end
  return due
end

-- sweep_cut is the cut of a reap (see settle): the clock's, unless the
-- call waited an outage long in a queue (sent before Redis stalled, run
-- when it came back), when it judges nothing that lived when it was sent.
local function sweep_cut(now, cut, sent, gap)
  cut, sent, gap = tonumber(cut), tonumber(sent), tonumber(gap)
  if not cut or cut <= 0 or cut > now then cut = now end
  if sent and sent > 0 and now - sent >= gap and sent < cut then cut = sent end
  return cut
end

local KEEP_MS = 600000

-- reindex sets the room's reap index entry to when it may next hold
-- something overdue, or removes it when the room is empty. The seq and
-- epoch outlive an empty room by KEEP_MS (beyond the event-id dedup window)
-- so event ids stay unique if it is used again. While the region holds
-- expiries (until hold), a room is not due again for a held user or entry
-- before the hold ends, only for a grace that ends sooner.
local function reindex(idx, r, room, now, lease, hold)
  local due = due_ms(r)
  if due and hold and hold > now and due < hold then
    local g = grace_due(r)
    due = hold
    if g and g < due then due = g end
  end
  if redis.call('LLEN', r.o) > 0 and (not due or now + lease < due) then
    due = now + lease
  end
  if due then
    redis.call('ZADD', idx, due, room)
  else
    redis.call('ZREM', idx, room)
    redis.call('PEXPIRE', r.m, KEEP_MS)
  end
end

-- STALE_BATCH bounds the outbox entries one reap hands back for
-- redelivery: after a long outage of the bus a room's outbox can be long.
local STALE_BATCH = 1000

-- stale returns the oldest outbox entries older than lease: ones whose
-- publisher should have acknowledged them by now.
local function stale(r, now, lease)
  local out = {}
  for _, e in ipairs(redis.call('LRANGE', r.o, 0, STALE_BATCH - 1)) do
    local t = entry_at(e)
    if t and t <= now - lease then
      out[#out + 1] = e
    end
  end
  return out
end

