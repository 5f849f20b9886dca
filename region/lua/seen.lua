-- seen: write last-seen times, in whole seconds, into one bucket hash.
-- KEYS[1] bucket; ARGV[1] interval ms; ARGV[2..] triples (user, ms, force);
-- ms 0 means Redis's now.
-- A forced write (join, departure) lands unless a later time is stored; an
-- activity write lands only when the stored time is an interval old.
-- Seconds fit listpack's 32-bit integers: 6 bytes a value instead of 10.
-- Returns the number of writes.
local iv = tonumber(ARGV[1]) / 1000
local now = now_ms()
local n = 0
for i = 2, #ARGV, 3 do
  local u, t, force = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2] == '1'
  if t == 0 then t = now end
  t = math.floor(t / 1000)
  local old = tonumber(redis.call('HGET', KEYS[1], u) or '0')
  if (force and t > old) or (not force and t - old >= iv) then
    redis.call('HSET', KEYS[1], u, t)
    n = n + 1
  end
end
return n
