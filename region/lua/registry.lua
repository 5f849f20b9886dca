-- registry: the region's holder registry and its clock, read at once.
-- KEYS[1] the registry (see hold.lua)
-- Returns {now ms, code1, value1, ...}.
local out = {now_ms()}
for _, x in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = x
end
return out
