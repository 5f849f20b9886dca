-- unhold: end this store's lease now, at its Close: its node has stopped
-- writing. The code stays out of use for the quarantine, as after any
-- lease's end, and a region's switch to another format no longer waits
-- for it (upgrade.go).
-- KEYS[1] the region's holder registry (see hold.lua)
-- ARGV[1] the store's nonce, ARGV[2] its code, ARGV[3] quarantine ms
-- Returns 1 when the lease was this store's and ended, else 0.
local now = now_ms()
local key, nonce, code, quar = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3])
local v = redis.call('HGET', key, code)
if not v then return 0 end
local n, u, rest = string.match(v, '^([^|]*)|(%d+)|%d+|(.*)$')
if n ~= nonce then return 0 end
u = math.min(tonumber(u), now)
redis.call('HSET', key, code, nonce .. '|' .. u .. '|' .. (u + quar) .. '|' .. rest)
return 1
