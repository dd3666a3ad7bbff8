-- The widespread non-fair semaphore script: drop expired holders, admit the
-- caller if fewer than `limit` remain, and let the whole key expire with the
-- newest lease. Release is a plain ZREM.
-- KEYS: holders zset. ARGV: limit, id, lease ms, now ms.
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local identifier = ARGV[2]
local lease_ms = tonumber(ARGV[3])
local now = tonumber(ARGV[4])

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - lease_ms)
if redis.call('ZCARD', key) < limit then
  redis.call('ZADD', key, now, identifier)
  redis.call('PEXPIRE', key, lease_ms)
  return 1
end
return 0
