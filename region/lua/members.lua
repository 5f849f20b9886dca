-- members: some members of rooms (those a change log named), with their
-- listed entries and states, as roster reads them: the cross-region
-- publisher reads what changed without reading whole rooms. Several rooms
-- of one slot go in one call; each room is read atomically all the same.
-- KEYS: four per room: z, s, st, u; ARGV[1] cut, ARGV[2] slack (see
-- read_cut), then per room in KEYS order: k, then k names. A name is an
-- entry of s ("user:session" then a holder code): one the caller knows or the log
-- named, to look up; or a user alone: their entries are found by a scan
-- of the room (or its index), for a member the caller knows no entry of.
-- Returns one reply per room: {now, user, until (seconds; '' when not a member), n,
-- entry, state, ... (n pairs: the user's live entries), user, ...}.
local at = read_cut(now_ms(), ARGV[1], ARGV[2])
local res = {}
local a = 3
for b = 1, #KEYS, 4 do
  local z, st = KEYS[b], KEYS[b + 2]
  local r = {s = KEYS[b + 1], u = KEYS[b + 3]}
  local users, cands = {}, {}
  for _ = 1, tonumber(ARGV[a]) do
    a = a + 1
    local name = ARGV[a]
    local u, rest = string.match(name, '^([^:]*):?(.*)$')
    if not cands[u] then
      cands[u] = {}
      users[#users + 1] = u
    end
    if rest ~= '' then
      cands[u][#cands[u] + 1] = name
    else
      cands[u].scan = true
    end
  end
  a = a + 1
  local out = {at}
  for _, u in ipairs(users) do
    out[#out + 1] = u
    local sc = redis.call('ZSCORE', z, u)
    if sc and tonumber(sc) >= live_s(at) then
      out[#out + 1] = sc
      local live = {}
      local c = cands[u]
      if c.scan then
        for m, e in pairs(user_entries(r, u)) do
          if e >= live_s(at) then live[#live + 1] = m end
        end
      elseif #c > 0 then
        local scores = redis.call('ZMSCORE', r.s, unpack(c))
        for i, m in ipairs(c) do
          if scores[i] and tonumber(scores[i]) >= live_s(at) then live[#live + 1] = m end
        end
      end
      out[#out + 1] = #live
      if #live > 0 then
        local fields = {}
        for i, m in ipairs(live) do
          local _, sid = parse(m)
          fields[i] = u .. ':' .. sid
        end
        local states = redis.call('HMGET', st, unpack(fields))
        for i, m in ipairs(live) do
          out[#out + 1] = m
          out[#out + 1] = state_read(states[i] or nil) or ''
        end
      end
    else
      out[#out + 1] = ''
      out[#out + 1] = 0
    end
  end
  res[#res + 1] = out
end
return res
