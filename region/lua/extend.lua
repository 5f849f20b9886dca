-- extend: the sessions of clients that a node refused to admit yet (a
-- reconnect storm) stay as they are while the clients wait: each
-- session's existing entries, whichever holder has them (a released one
-- in its grace too), and its user's until are pushed back to at least
-- now + ARGV[1] ms. Nothing is claimed, created or announced: a session
-- with no live entry, or whose user is no member now, is left alone, and
-- nothing is ever shortened. Live is as reads see it (read_cut): an entry
-- overdue by less than the read slack, its departure not announced yet,
-- is still listed, and extending it is as silent as a refresh would be.
-- A client that stops retrying stops the extensions, and its session
-- then ends as it would have.
-- KEYS[1..] two keys per room, in ARGV order: z and s (u is named from z,
-- as room_of in lib.lua names it)
-- ARGV[1] extension ms, ARGV[2] the read cut ms (0: none) and ARGV[3] the
-- read slack ms (see read_cut), ARGV[4..] per room: k, then k pairs
-- (user, session)
-- Returns the number of sessions extended.
local now = now_ms()
local ext = tonumber(ARGV[1])
local exps = math.ceil((now + ext) / 1000)
local rc = read_cut(now, ARGV[2], ARGV[3])
local n, a, ri = 0, 4, 0
while a <= #ARGV do
  local k = tonumber(ARGV[a])
  a = a + 1
  local z, s = KEYS[1 + ri * 2], KEYS[2 + ri * 2]
  local r = {z = z, s = s, u = z .. ':u'}
  ri = ri + 1
  for _ = 1, k do
    local u, sid = ARGV[a], ARGV[a + 1]
    a = a + 2
    local upto = tonumber(redis.call('ZSCORE', z, u) or '0')
    if upto >= live_s(rc) then
      local done = false
      for _, e in ipairs(session_entries(r, u, sid, '')) do
        if tonumber(redis.call('ZSCORE', s, e)) >= live_s(rc) then
          redis.call('ZADD', s, 'GT', exps, e)
          done = true
        end
      end
      if done then
        redis.call('ZADD', z, 'GT', exps, u)
        -- A grace running ends no sooner either (g holds its end, ms).
        local g = tonumber(redis.call('ZSCORE', z .. ':g', u) or '0')
        if g > 0 and g < exps * 1000 then redis.call('ZADD', z .. ':g', exps * 1000, u) end
        n = n + 1
      end
    end
  end
end
return n
