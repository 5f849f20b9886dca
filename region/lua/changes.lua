-- changes: the members marked in change logs since a cursor (see mark in
-- lib.lua), for the cross-region publisher. On a cluster one call reads
-- every slot's log of one master (the script may touch many slots).
-- KEYS[1] one of the logs (routes the call)
-- ARGV[1] cursor: the stamp a previous call returned (0: none),
-- ARGV[2] keep ms, ARGV[3] the most marks to return, ARGV[4..] the logs
-- Returns {stamp, complete (0|1), "room:user", ...}. complete is 1 when the
-- marks are every change since the cursor: each log was kept all along
-- (it existed) and the cursor is within keep. Otherwise no marks are
-- returned, and the caller reads everything. Either way each log is kept
-- for keep ms more: trimmed to keep, with the reader's mark ":" at stamp,
-- so later marks are stamped at or after it.
local now = now_ms()
local cursor, keep, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local ok = cursor > 0 and cursor >= now - keep
local out = {now, 0}
for i = 4, #ARGV do
  local k = ARGV[i]
  if redis.call('EXISTS', k) == 0 then
    ok = false -- not kept (no reader for keep ms, or Redis lost it)
  else
    redis.call('ZREMRANGEBYSCORE', k, '-inf', '(' .. (now - keep))
    if ok then
      local ms = redis.call('ZRANGEBYSCORE', k, cursor, '+inf', 'LIMIT', 0, most + 2)
      for _, m in ipairs(ms) do
        if m ~= ':' then out[#out + 1] = m end
      end
      if #out - 2 > most then ok = false end
    end
  end
  redis.call('ZADD', k, now, ':')
  redis.call('PEXPIRE', k, keep)
end
if not ok then return {now, 0} end
out[2] = 1
return out
