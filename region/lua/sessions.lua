-- sessions: one user's live sessions in a room, with expiry and state.
-- KEYS[1] s, KEYS[2] st, KEYS[3] z, KEYS[4] u of the room; ARGV[1] user,
-- ARGV[2] cut, ARGV[3] slack (see read_cut)
-- Returns {cut, until (seconds) or '', session1, expiry1 (seconds), state1,
-- ...}: the user is a member if until * 1000 >= cut.
local now = read_cut(now_ms(), ARGV[2], ARGV[3])
local u = ARGV[1]
local out = {now, redis.call('ZSCORE', KEYS[3], u) or ''}
local set = user_entries({s = KEYS[1], u = KEYS[4]}, u)
for m, sc in pairs(set) do
  if sc >= live_s(now) then
    local _, sid = parse(m)
    out[#out + 1] = sid
    out[#out + 1] = sc
    out[#out + 1] = state_read(redis.call('HGET', KEYS[2], u .. ':' .. sid)) or ''
  end
end
return out
