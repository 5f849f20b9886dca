-- count: the number of live members of a room, without listing them.
-- KEYS[1] z of the room; ARGV[1] cut, ARGV[2] slack (see read_cut)
return redis.call('ZCOUNT', KEYS[1], live_s(read_cut(now_ms(), ARGV[1], ARGV[2])), '+inf')
