-- members: some members of a room (those a change log named), with their
-- listed sessions and states, as roster reads them: the cross-region
-- publisher reads what changed without reading the whole room.
-- KEYS[1] z, KEYS[2] s, KEYS[3] st, KEYS[4] u of the room; ARGV[1] cut,
-- ARGV[2] slack (see read_cut), ARGV[3..] users
-- Returns {now, user, until ('' when not a member), k, session, state,
-- ... (k pairs), user, ...}.
local at = read_cut(now_ms(), ARGV[1], ARGV[2])
local r = {s = KEYS[2], u = KEYS[4]}
local out = {at}
for i = 3, #ARGV do
  local u = ARGV[i]
  out[#out + 1] = u
  local sc = redis.call('ZSCORE', KEYS[1], u)
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
      out[#out + 1] = redis.call('HGET', KEYS[3], u .. ':' .. sid) or ''
    end
  else
    out[#out + 1] = ''
    out[#out + 1] = 0
  end
end
return out
