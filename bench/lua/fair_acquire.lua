-- The classic fair-semaphore recipe as one script: drop expired holders and
-- their tickets, draw a ticket, and keep the place only if the ticket ranks
-- below the limit among the live ones.
-- KEYS: holders zset, owner zset, counter. ARGV: limit, lease ms, now ms, id.
local holders, owner, counter = KEYS[1], KEYS[2], KEYS[3]
local limit = tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
local id = ARGV[4]

redis.call('ZREMRANGEBYSCORE', holders, '-inf', now - lease_ms)
redis.call('ZINTERSTORE', owner, 2, owner, holders, 'WEIGHTS', 1, 0)
local ticket = redis.call('INCR', counter)
redis.call('ZADD', holders, now, id)
redis.call('ZADD', owner, ticket, id)
if redis.call('ZRANK', owner, id) < limit then
  return 1
end
redis.call('ZREM', holders, id)
redis.call('ZREM', owner, id)
return 0
