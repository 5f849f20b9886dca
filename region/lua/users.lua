-- users: some users' presence in a room (a watch list), in the shape of
-- snapshot.lua's reply: only the users who are members, in the order given,
-- and the sequences that tie the read to the event stream.
-- KEYS[1] z, KEYS[2] s, KEYS[3] m, KEYS[4] st, KEYS[5] u of the room
-- ARGV[1] cut, ARGV[2] slack (see read_cut), ARGV[3..] the users
-- Returns {now, room seq, stream seq, members listed, epoch, then per member:
-- user, until (seconds), k, then k triples (session, expiry seconds, state)}.
local now = now_ms()
local at = read_cut(now, ARGV[1], ARGV[2])
local meta = redis.call('HMGET', KEYS[3], 'seq', 'jsseq', 'epoch')
local body, n = {}, 0
for i = 3, #ARGV do
  local u = ARGV[i]
  local upto = redis.call('ZSCORE', KEYS[1], u)
  if upto and tonumber(upto) >= live_s(at) then
    n = n + 1
    local l = {}
    for m, sc in pairs(user_entries({s = KEYS[2], u = KEYS[5]}, u)) do
      if sc >= live_s(at) then
        local _, sid = parse(m)
        l[#l + 1] = sid
        l[#l + 1] = sc
        l[#l + 1] = state_read(redis.call('HGET', KEYS[4], u .. ':' .. sid)) or ''
      end
    end
    body[#body + 1] = u
    body[#body + 1] = upto
    body[#body + 1] = #l / 3
    for j = 1, #l do
      body[#body + 1] = l[j]
    end
  end
end
local out = {now, meta[1] or '0', meta[2] or '0', n, meta[3] or '0'}
for j = 1, #body do
  out[#out + 1] = body[j]
end
return out
