#!lua flags=allow-oom
-- The least a script does for a fair hand-off over the same keys: no validation, no weights,
-- no kinds, no expiry settling. ACQUIRE id lease_ms -> id, or nil after taking a place;
-- RELEASE id -> 1/0, granting the first in line and telling it on its list.
local NAME, OWNER, COUNTER = KEYS[1], KEYS[2], KEYS[3]
local LINE, PLACES = NAME .. ':line', NAME .. ':places'
local op, id = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function grant(who, lease)
  local ticket = math.max((tonumber(redis.call('GET', COUNTER)) or 0) + 1, now * 1000)
  redis.call('SET', COUNTER, string.format('%.0f', ticket))
  redis.call('ZADD', NAME, now + lease, who)
  redis.call('ZADD', OWNER, string.format('%.0f', ticket), who)
  return ticket
end
if op == 'ACQUIRE' then
  local lease = tonumber(ARGV[3])
  if redis.call('ZCARD', LINE) == 0 and redis.call('ZCOUNT', NAME, now, '+inf') < 1 then
    grant(id, lease)
    return id
  end
  redis.call('ZADD', LINE, 'NX', now, id)
  redis.call('HSET', PLACES, id, lease)
  redis.call('PEXPIRE', LINE, 6000)
  redis.call('PEXPIRE', PLACES, 6000)
  return false
end
local gone = redis.call('ZREM', NAME, id)
redis.call('ZREM', OWNER, id)
local head = redis.call('ZRANGE', LINE, 0, 0)[1]
if head then
  local lease = tonumber(redis.call('HGET', PLACES, head))
  local ticket = grant(head, lease)
  redis.call('ZREM', LINE, head)
  redis.call('HDEL', PLACES, head)
  redis.call('RPUSH', NAME .. ':wake:' .. head, 'G' .. string.format('%.0f', ticket))
  redis.call('PEXPIRE', NAME .. ':wake:' .. head, 6000)
end
return gone
