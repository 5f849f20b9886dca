-- hold: take or keep this store's holder code (see holders.go).
-- KEYS[1] the region's holder registry, a HASH: code ->
-- "nonce|until|free|name|format" (until: the lease's end, ms; free: when
-- the code may go to another store, until plus the holder's quarantine;
-- name: Options.Holder; format: the newest data format the holder reads,
-- which the region's switch to a format checks (upgrade.go); releases
-- before it wrote no format, and read format 2); its field 'format', the
-- bar fence.lua writes at a switch: a holder that reads only older
-- formats gets no lease
-- ARGV[1] the store's nonce, ARGV[2] the code it has ('' none), ARGV[3]
-- lease ms, ARGV[4] quarantine ms, ARGV[5] name, ARGV[6] the single-byte
-- codes in order of preference, ARGV[7] format
-- Returns {code, until ms, now ms}, or the error PRESENCE_FORMAT to ...
-- when the region has switched to format to, which this holder cannot
-- read.
--
-- A store keeps its code while the registry names it (or names nobody:
-- Redis lost the registry) however long ago its lease ended: no one else
-- can have had it. Otherwise it takes the shortest code whose free time
-- has passed, one byte before two, two before three.
local now = now_ms()
local key, nonce, cur = KEYS[1], ARGV[1], ARGV[2]
local lease, quar, name, alpha, fmt = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5], ARGV[6], ARGV[7]
local bar = tonumber(redis.call('HGET', key, 'format') or '0')
if tonumber(fmt) < bar then
  return redis.error_reply('PRESENCE_FORMAT ' .. bar .. ' the region switched to format ' .. bar .. ', which this holder cannot read')
end

local function take(code)
  local u = now + lease
  redis.call('HSET', key, code, nonce .. '|' .. u .. '|' .. (u + quar) .. '|' .. name .. '|' .. fmt)
  return {code, u, now}
end

if cur ~= '' then
  local v = redis.call('HGET', key, cur)
  if not v or string.match(v, '^([^|]*)') == nonce then return take(cur) end
end
local busy, nbusy = {}, 0
local all = redis.call('HGETALL', key)
for i = 1, #all, 2 do
  local free = tonumber(string.match(all[i + 1], '^[^|]*|%d+|(%d+)') or '0')
  if free > now then
    busy[all[i]] = true
    nbusy = nbusy + 1
  end
end
-- Fewer busy codes than codes of a length means one of them is free, and
-- the search below stops at it after at most nbusy + 1 tries.
local n = #alpha
local function search(prefix, len)
  for i = 1, n do
    local c = prefix .. string.sub(alpha, i, i)
    if len == 1 then
      if not busy[c] then return c end
    else
      local got = search(c, len - 1)
      if got then return got end
    end
  end
  return nil
end
for len = 1, 3 do
  if nbusy < n ^ len then
    local c = search('', len)
    if c then return take(c) end
  end
end
return redis.error_reply('PRESENCE no free holder code')
