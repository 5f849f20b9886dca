-- fence: bar the holder registry to holders that cannot read format
-- ARGV[1], in the same step that finds none of them holding a lease
-- (upgrade.go, FinishUpgrade). From then on hold.lua refuses such a holder
-- a lease, and every write needs one, so a store that read the old marker
-- just before the switch writes nothing after it.
-- KEYS[1] the region's holder registry (see hold.lua); the bar is its
-- field 'format', a name of id bytes that is never a holder code
-- ARGV[1] the format the region switches to
-- Returns {1, now ms} when the registry is barred (or already was), or
-- {0, now ms, code1, value1, ...}: the holders of an older format whose
-- lease runs, and nothing written.
local now = now_ms()
local to = tonumber(ARGV[1])
local out = {0, now}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local u, f = string.match(all[i + 1], '^[^|]*|(%d+)|%d+|[^|]*|?(%d*)$')
  if u and tonumber(u) > now and (tonumber(f) or 2) < to then
    out[#out + 1] = all[i]
    out[#out + 1] = all[i + 1]
  end
end
if #out > 2 then return out end
if tonumber(redis.call('HGET', KEYS[1], 'format') or '0') < to then
  redis.call('HSET', KEYS[1], 'format', to)
end
out[1] = 1
return out
