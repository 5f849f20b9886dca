-- snapshot: one page of a room's live members, by user id, with their live
-- sessions and states, and the sequences that tie it to the event stream.
-- KEYS[1] z, KEYS[2] s, KEYS[3] m, KEYS[4] st of the room
-- ARGV[1] offset, ARGV[2] limit
-- Returns {now, room seq, stream seq, total, epoch, then per member on the page:
-- user, until, k, then k triples (session, expiry seconds, state)}.
local now = now_ms()
local off, lim = tonumber(ARGV[1]), tonumber(ARGV[2])
local live = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES')
local users, upto = {}, {}
for i = 1, #live, 2 do
  users[#users + 1] = live[i]
  upto[live[i]] = live[i + 1]
end
table.sort(users)
local page = {}
for i = off + 1, math.min(off + lim, #users) do
  page[#page + 1] = users[i]
  page[users[i]] = {}
end
if #page > 0 then
  local ss = redis.call('ZRANGEBYSCORE', KEYS[2], live_s(now), '+inf', 'WITHSCORES')
  for i = 1, #ss, 2 do
    local u, sid = string.match(ss[i], '^([^:]*):(.*)$')
    if type(page[u]) == 'table' then
      local l = page[u]
      l[#l + 1] = sid
      l[#l + 1] = ss[i + 1]
      l[#l + 1] = redis.call('HGET', KEYS[4], ss[i]) or ''
    end
  end
end
local meta = redis.call('HMGET', KEYS[3], 'seq', 'jsseq', 'epoch')
local out = {now, meta[1] or '0', meta[2] or '0', #users, meta[3] or '0'}
for i = 1, #page do
  local u = page[i]
  local l = page[u]
  out[#out + 1] = u
  out[#out + 1] = upto[u]
  out[#out + 1] = #l / 3
  for j = 1, #l do
    out[#out + 1] = l[j]
  end
end
return out
