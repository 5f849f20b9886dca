-- members: a room's live members with their session entry counts.
-- KEYS[1] z, KEYS[2] n of the room; ARGV[1] offset, ARGV[2] limit
-- Returns {now, user1, until1, count1, user2, ...}; a count of 0 means the
-- user is inside the offline grace.
local now = now_ms()
local m = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES', 'LIMIT', tonumber(ARGV[1]), tonumber(ARGV[2]))
local out = {now}
for i = 1, #m, 2 do
  out[#out + 1] = m[i]
  out[#out + 1] = m[i + 1]
  out[#out + 1] = redis.call('HGET', KEYS[2], m[i]) or '0'
end
return out
