-- sessions: one user's live sessions in a room, with expiry and state.
-- KEYS[1] s, KEYS[2] st, KEYS[3] z, KEYS[4] n of the room; ARGV[1] user
-- Returns {now, until or '', session1, expiry1, state1, ...}. The scan
-- stops once it has seen as many entries as n counts for the user.
local now = now_ms()
local u = ARGV[1]
local want = tonumber(redis.call('HGET', KEYS[4], u) or '0')
local out = {now, redis.call('ZSCORE', KEYS[3], u) or ''}
local seen, cursor = 0, '0'
repeat
  if seen >= want then break end
  local res = redis.call('ZSCAN', KEYS[1], cursor, 'MATCH', u .. ':*', 'COUNT', 1000)
  cursor = res[1]
  for i = 1, #res[2], 2 do
    local m, sc = res[2][i], tonumber(res[2][i + 1])
    local sid = string.sub(m, #u + 2)
    if sid ~= '' then
      seen = seen + 1
      if sc >= now then
        out[#out + 1] = sid
        out[#out + 1] = sc
        out[#out + 1] = redis.call('HGET', KEYS[2], m) or ''
      end
    end
  end
until cursor == '0'
return out
