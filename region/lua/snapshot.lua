-- snapshot: one page of a room's live members, by user id, with their live
-- sessions and states, and the sequences that tie it to the event stream.
-- KEYS[1] z, KEYS[2] s, KEYS[3] m, KEYS[4] st, KEYS[5] u of the room
-- ARGV[1] offset, ARGV[2] limit, ARGV[3] cut, ARGV[4] slack (see read_cut)
-- Returns {now, room seq, stream seq, total, epoch, then per member on the page:
-- user, until (seconds), k, then k triples (session, expiry seconds, state)}.
local STATES_AT_ONCE = 256 -- well under Lua's unpack limit
local now = now_ms()
local at = read_cut(now, ARGV[3], ARGV[4])
local off, lim = tonumber(ARGV[1]), tonumber(ARGV[2])
local meta = redis.call('HMGET', KEYS[3], 'seq', 'jsseq', 'epoch')

if redis.call('EXISTS', KEYS[5]) == 1 then
  -- A large room pages its member index, which is in user id order: the
  -- cost follows the page, not the room. Offsets count members that are
  -- overdue but not yet settled (for at most a reap interval); they are
  -- left off the page.
  local out = {now, meta[1] or '0', meta[2] or '0', redis.call('ZCOUNT', KEYS[1], live_s(at), '+inf'), meta[3] or '0'}
  for _, member in ipairs(redis.call('ZRANGE', KEYS[5], off, off + lim - 1)) do
    local u = string.match(member, '^(%S+)')
    local upto = redis.call('ZSCORE', KEYS[1], u)
    if upto and tonumber(upto) >= live_s(at) then
      local l = {}
      for tok in string.gmatch(string.sub(member, #u + 2), '%S+') do
        local sc = redis.call('ZSCORE', KEYS[2], u .. ':' .. tok)
        if sc and tonumber(sc) >= live_s(at) then
          local sid = tok_sid(tok)
          l[#l + 1] = sid
          l[#l + 1] = sc
          l[#l + 1] = state_read(redis.call('HGET', KEYS[4], u .. ':' .. sid)) or ''
        end
      end
      out[#out + 1] = u
      out[#out + 1] = upto
      out[#out + 1] = #l / 3
      for j = 1, #l do
        out[#out + 1] = l[j]
      end
    end
  end
  return out
end

local live = redis.call('ZRANGEBYSCORE', KEYS[1], live_s(at), '+inf', 'WITHSCORES')
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
  local ss = redis.call('ZRANGEBYSCORE', KEYS[2], live_s(at), '+inf', 'WITHSCORES')
  -- The page's states in one HMGET per STATES_AT_ONCE sessions, not one
  -- call each: a join's snapshot is the commonest read.
  local fields, at_l, at_i = {}, {}, {}
  for i = 1, #ss, 2 do
    local u, sid = parse(ss[i])
    if type(page[u]) == 'table' then
      local l = page[u]
      l[#l + 1] = sid
      l[#l + 1] = ss[i + 1]
      l[#l + 1] = ''
      fields[#fields + 1] = u .. ':' .. sid
      at_l[#fields], at_i[#fields] = l, #l
    end
  end
  for from = 1, #fields, STATES_AT_ONCE do
    local to = math.min(from + STATES_AT_ONCE - 1, #fields)
    local vs = redis.call('HMGET', KEYS[4], unpack(fields, from, to))
    for j = from, to do
      at_l[j][at_i[j]] = state_read(vs[j - from + 1]) or ''
    end
  end
end
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
