-- members: some members of rooms (those a change log named), with their
-- listed sessions and states, as roster reads them: the cross-region
-- publisher reads what changed without reading whole rooms. Several rooms
-- of one slot go in one call; each room is read atomically all the same.
-- KEYS: four per room: z, s, st, u; ARGV[1] cut, ARGV[2] slack (see
-- read_cut), then per room in KEYS order: k, then k users
-- Returns one reply per room: {now, user, until ('' when not a member), n,
-- session, state, ... (n pairs), user, ...}.
local at = read_cut(now_ms(), ARGV[1], ARGV[2])
local res = {}
local a = 3
for b = 1, #KEYS, 4 do
  local z, st = KEYS[b], KEYS[b + 2]
  local r = {s = KEYS[b + 1], u = KEYS[b + 3]}
  local out = {at}
  local k = tonumber(ARGV[a])
  a = a + 1
  for _ = 1, k do
    local u = ARGV[a]
    a = a + 1
    out[#out + 1] = u
    local sc = redis.call('ZSCORE', z, u)
    if sc and tonumber(sc) >= at then
      out[#out + 1] = sc
      local sids, seen = {}, {}
      for m, e in pairs(user_entries(r, u)) do
        local _, sid = parse(m)
        if e >= live_s(at) and not seen[sid] then
          seen[sid] = true
          sids[#sids + 1] = sid
        end
      end
      out[#out + 1] = #sids
      for _, sid in ipairs(sids) do
        out[#out + 1] = sid
        out[#out + 1] = redis.call('HGET', st, u .. ':' .. sid) or ''
      end
    else
      out[#out + 1] = ''
      out[#out + 1] = 0
    end
  end
  res[#res + 1] = out
end
return res
