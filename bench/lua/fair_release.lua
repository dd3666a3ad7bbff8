-- Release for the fair recipe: the holder leaves both sorted sets at once.
-- KEYS: holders zset, owner zset. ARGV: id. Returns 1 if it was a holder.
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return removed
