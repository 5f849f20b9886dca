-- clock: the region's view of its own continuity, read by every reaper
-- sweep before it settles rooms.
-- KEYS[1] the clock hash: seen (ms of the last sweep of any node), hold
-- and from (expiries are held until hold for entries alive at from).
-- ARGV[1] outage gap ms, ARGV[2] hold span ms
-- Returns {now, cut, hold}: a sweep expires nothing that lived at cut
-- (now, unless holding), and rooms need no settle for held entries before
-- hold.
--
-- Reapers of live nodes sweep every reap interval, so a gap of ARGV[1]
-- since the last sweep means no node could reach Redis (it was stalled,
-- unreachable, or failing over): sessions were not refreshed through no
-- fault of their nodes. Expiries are then held for a heartbeat and a reap
-- interval, in which every live node refreshes its sessions. (A missing
-- hash, after Redis lost its data, needs no hold: sessions were lost with
-- it, and the nodes restore theirs; see incarnation in lib.lua.)
local now = now_ms()
local gap, span = tonumber(ARGV[1]), tonumber(ARGV[2])
local c = redis.call('HMGET', KEYS[1], 'seen', 'hold', 'from')
local seen, hold, from = tonumber(c[1]), tonumber(c[2] or '0'), tonumber(c[3] or '0')
if seen and now - seen >= gap then
  if hold <= now or seen < from then from = seen end
  hold = now + span
end
redis.call('HSET', KEYS[1], 'seen', now, 'hold', hold, 'from', from)
local cut = now
if now < hold then cut = from end
return {now, cut, hold}
