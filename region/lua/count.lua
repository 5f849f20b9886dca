-- count: the number of live members of a room, without listing them.
-- KEYS[1] z of the room
return redis.call('ZCOUNT', KEYS[1], now_ms(), '+inf')
